/* Checkpoint metadata shared by every checkpoint writer (the trainer's single
 * file, ZeRO's sharded and consolidated sets, pipeline sets): run identity,
 * architecture, strategy, position, dropout seed. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dtrain/strategy.h"

const char *dt_checkpoint_state_name(const dt_optim_cfg *c, int k) {
    if (c->kind == DT_OPTIM_SGD) return "momentum";
    return k == 0 ? "exp_avg" : "exp_avg_sq";
}

static const char *optim_name(const dt_run *r) {
    return r->optim->kind == DT_OPTIM_SGD ? "sgd" : "adamw";
}

static void meta_add(dt_ckpt_meta *mb, const char *key, const char *fmt, unsigned long long v) {
    snprintf(mb->v[mb->n], sizeof mb->v[0], fmt, v);
    mb->m[mb->n] = (dt_st_meta){key, mb->v[mb->n]};
    mb->n++;
}

/* the shortest %g text that reads back as x ("0.05", not "0.0500000007") */
static void short_float(float x, char buf[24]) {
    for (int prec = 6; prec <= 9; prec++) {
        snprintf(buf, 24, "%.*g", prec, (double)x);
        if (strtof(buf, NULL) == x) return;
    }
}

void dt_checkpoint_meta(const dt_run *r, const char *strategy, int64_t optim_step, dt_ckpt_meta *mb) {
    const dt_model *m = r->model;
    mb->n = 0;
    mb->m[mb->n++] = (dt_st_meta){"format", "dtrain-checkpoint-1"};
    mb->m[mb->n++] = (dt_st_meta){"model", m->name};
    mb->m[mb->n++] = (dt_st_meta){"optimizer", optim_name(r)};
    const dt_optim_cfg *oc = r->optim;   /* its settings: a resume continues with them (PyTorch's param_groups) */
    char lr[24], wd[24], a[24], b[24], e[24];
    short_float(oc->lr, lr);
    short_float(oc->weight_decay, wd);
    if (oc->kind == DT_OPTIM_SGD) {
        short_float(oc->momentum, a);
        snprintf(mb->v[mb->n], sizeof mb->v[0], "lr=%s,weight_decay=%s,momentum=%s,nesterov=%d", lr, wd, a, oc->nesterov);
    } else {
        short_float(oc->beta1, a);
        short_float(oc->beta2, b);
        short_float(oc->eps, e);
        snprintf(mb->v[mb->n], sizeof mb->v[0], "lr=%s,weight_decay=%s,beta1=%s,beta2=%s,eps=%s", lr, wd, a, b, e);
    }
    mb->m[mb->n] = (dt_st_meta){"optimizer_settings", mb->v[mb->n]};
    mb->n++;
    mb->m[mb->n++] = (dt_st_meta){"strategy", strategy ? strategy : "?"};
    if (r->data) {   /* what the tokens are: "text" = bytes; "shard" = a tokenizer's ids */
        snprintf(mb->v[mb->n], sizeof mb->v[0], "%s", r->data);
        mb->m[mb->n] = (dt_st_meta){"data", mb->v[mb->n]};
        mb->n++;
    }
    int na = dt_model_arch_fields(&m->cfg, mb->arch);
    for (int i = 0; i < na; i++) mb->m[mb->n++] = (dt_st_meta){mb->arch[i].key, mb->arch[i].value};
    snprintf(mb->v[mb->n], sizeof mb->v[0], "%d:%08x", m->arch_n, (unsigned)m->arch_crc);
    mb->m[mb->n] = (dt_st_meta){"arch.params", mb->v[mb->n]};
    mb->n++;
    meta_add(mb, "step", "%llu", (unsigned long long)*r->step);
    meta_add(mb, "optim_step", "%llu", (unsigned long long)optim_step);
    meta_add(mb, "epoch", "%llu", (unsigned long long)r->sampler->epoch);
    meta_add(mb, "cursor", "%llu", (unsigned long long)r->sampler->cursor);
    meta_add(mb, "seed", "%llu", (unsigned long long)r->seed);
    meta_add(mb, "world", "%llu", (unsigned long long)r->world);
    /* dropout masks are keyed by (dropout_seed, step, sample): no generator
     * state to keep (checkpoints before that carried rng0 / rng1: ignored) */
    meta_add(mb, "dropout_seed", "%016llx", (unsigned long long)m->dropout_seed);
    if (r->scaler) {   /* loss scaling's state (strategy.h): a resume goes on with the same scale */
        snprintf(mb->v[mb->n], sizeof mb->v[0], "%.9g", (double)r->scaler->scale);
        mb->m[mb->n] = (dt_st_meta){"loss_scale", mb->v[mb->n]};
        mb->n++;
        meta_add(mb, "loss_scale_good", "%llu", (unsigned long long)r->scaler->good);
    }
}


static dt_status meta_u64(dt_ckpt_meta_get get, const void *src, const char *what, const char *key, int hex,
                          uint64_t *out) {
    const char *v = get(src, key);
    if (!v) return DT_ERR(DT_EFORMAT, "%s: checkpoint metadata lacks '%s'", what, key);
    char *end;
    *out = strtoull(v, &end, hex ? 16 : 10);
    if (*v == 0 || *end || *v == '-') return DT_ERR(DT_EFORMAT, "%s: metadata '%s' = '%s' is not a number", what, key, v);
    return DT_OK;
}

/* Architecture: the config fields first (they name a setting), then the
 * parameter fingerprint (a user's model; anything the fields miss). Keys a
 * checkpoint lacks (written before they existed) are not checked. */
static dt_status check_arch(const dt_model *m, dt_ckpt_meta_get get, const void *src, const char *what) {
    dt_arch_field f[DT_ARCH_FIELDS_MAX];
    int n = dt_model_arch_fields(&m->cfg, f);
    for (int i = 0; i < n; i++) {
        const char *v = get(src, f[i].key);
        if (v && strcmp(v, f[i].value))
            return DT_ERR(DT_EINVAL, "checkpoint %s was saved with %s %s, this run has %s", what, f[i].key, v,
                          f[i].value);
    }
    const char *v = get(src, "arch.params");
    char mine[32];
    snprintf(mine, sizeof mine, "%d:%08x", m->arch_n, (unsigned)m->arch_crc);
    if (v && strcmp(v, mine)) {
        int cn = atoi(v);
        return DT_ERR(DT_EINVAL, "checkpoint %s was saved from a model '%s' with other parameters (%d parameters "
                      "and buffers, names and shapes CRC-32 %s), this run's has %d (%08x): another architecture",
                      what, m->name, cn, strchr(v, ':') ? strchr(v, ':') + 1 : v, m->arch_n, (unsigned)m->arch_crc);
    }
    return DT_OK;
}

/* format / model / optimizer / architecture match this run. */
dt_status dt_checkpoint_check_identity(const dt_run *r, dt_ckpt_meta_get get, const void *src, const char *what) {
    const char *fmt = get(src, "format"), *kind = get(src, "model"), *opt = get(src, "optimizer");
    const char *have = r->model->name;
    if (!fmt || strcmp(fmt, "dtrain-checkpoint-1")) {
        const char *base = strrchr(what, '/') ? strrchr(what, '/') + 1 : what;   /* one rank's file of a set */
        int shard = !fmt && !strncmp(base, "shard-", 6) && strstr(base, ".safetensors");
        return DT_ERR(DT_EFORMAT, "%s: not a dtrain checkpoint (format '%s')%s", what, fmt ? fmt : "missing",
                      shard ? "; it looks like one rank's shard of a sharded checkpoint: give its directory" : "");
    }
    if (!kind || strcmp(kind, have))
        return DT_ERR(DT_EFORMAT, "%s: checkpoint is for model '%s', this run is '%s'", what, kind ? kind : "?", have);
    if (!opt || strcmp(opt, optim_name(r)))
        return DT_ERR(DT_EFORMAT, "%s: checkpoint optimizer is '%s', this run uses '%s'", what, opt ? opt : "?",
                      optim_name(r));
    return check_arch(r->model, get, src, what);
}

/* A dynamic scaler continues from the checkpoint's scale and clean-step
 * count; a fixed one keeps this run's scale. Checkpoints without them (fp32
 * runs, older files) leave the scaler as this run set it up. */
static dt_status apply_scaler(dt_run *r, dt_ckpt_meta_get get, const void *src, const char *what) {
    const char *v = get(src, "loss_scale");
    if (!r->scaler || !r->scaler->dynamic || !v) return DT_OK;
    char *end;
    float s = strtof(v, &end);
    if (*v == 0 || *end || !(s > 0.0f) || !isfinite(s))
        return DT_ERR(DT_EFORMAT, "%s: metadata 'loss_scale' = '%s' is not a positive finite number", what, v);
    uint64_t good = 0;
    if (get(src, "loss_scale_good")) DT_TRY(meta_u64(get, src, what, "loss_scale_good", 0, &good));
    if (good > INT64_MAX) return DT_ERR(DT_EFORMAT, "%s: metadata 'loss_scale_good' out of range", what);
    r->scaler->scale = s < DT_LOSS_SCALE_MAX ? s : DT_LOSS_SCALE_MAX;   /* (saved before the cap: past it) */
    r->scaler->good = (int64_t)good;
    return DT_OK;
}

dt_status dt_checkpoint_apply_meta(dt_run *r, dt_ckpt_meta_get get, const void *src,
                                   const char *what, int64_t *optim_step) {
    DT_TRY(dt_checkpoint_check_identity(r, get, src, what));
    uint64_t step = 0, ostep = 0, epoch = 0, cursor = 0, world = 0, dseed = r->model->dropout_seed;
    DT_TRY(meta_u64(get, src, what, "step", 0, &step));
    DT_TRY(meta_u64(get, src, what, "optim_step", 0, &ostep));
    DT_TRY(meta_u64(get, src, what, "epoch", 0, &epoch));
    DT_TRY(meta_u64(get, src, what, "cursor", 0, &cursor));
    DT_TRY(meta_u64(get, src, what, "world", 0, &world));
    /* the masks continue as the saved run drew them: its seed (older
     * checkpoints: "seed", their generator state rng0 / rng1 is unused) */
    if (get(src, "dropout_seed")) DT_TRY(meta_u64(get, src, what, "dropout_seed", 1, &dseed));
    else if (get(src, "seed")) DT_TRY(meta_u64(get, src, what, "seed", 0, &dseed));
    if (world < 1 || world > INT32_MAX || cursor > INT64_MAX / world || step > INT64_MAX || ostep > INT64_MAX ||
        epoch > INT64_MAX)
        return DT_ERR(DT_EFORMAT, "%s: metadata out of range (world %llu, cursor %llu)", what,
                      (unsigned long long)world, (unsigned long long)cursor);
    /* Strided sampler: local position p of W ranks is global position p * W. */
    uint64_t global = cursor * world, now = (uint64_t)r->world;
    if (global % now)
        return DT_ERR(DT_EINVAL, "%s: saved at world size %llu after %llu samples of epoch %llu, which %llu ranks "
                      "cannot split evenly (resume with a world size dividing %llu)", what,
                      (unsigned long long)world, (unsigned long long)global, (unsigned long long)epoch,
                      (unsigned long long)now, (unsigned long long)global);
    if (dt_sampler_seek(r->sampler, (int64_t)epoch, (int64_t)(global / now)) != DT_OK) {
        char why[512];
        snprintf(why, sizeof why, "%s", dt_error_message());
        return DT_ERR(DT_EFORMAT, "%s: data position (epoch %llu, cursor %llu at world size %llu) invalid for this "
                      "dataset/world size: %s", what, (unsigned long long)epoch, (unsigned long long)cursor,
                      (unsigned long long)world, why);
    }
    DT_TRY(apply_scaler(r, get, src, what));
    *r->step = (int64_t)step;
    r->model->dropout_seed = dseed;
    if (optim_step) *optim_step = (int64_t)ostep;
    return DT_OK;
}

