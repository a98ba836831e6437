/* Checkpoints: the full training state in one safetensors file.
 * Parameters and buffers under their own names; optimizer state under
 * "optim.<state>.<param>"; scalars (step, sampler position, RNG) as metadata.
 * Loading goes through dt_ckpt, so a sharded (ZeRO) set loads here too. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "trainer_internal.h"

static const char *state_name(const dt_optim_cfg *c, int k) {
    if (c->kind == DT_OPTIM_SGD) return "momentum";
    return k == 0 ? "exp_avg" : "exp_avg_sq";
}

static void fill_entry(dt_st_entry *e, const char *name, const dt_tensor *like, const void *data) {
    e->name = name;
    e->dtype = DT_F32;
    e->ndim = like->ndim;
    memcpy(e->shape, like->shape, sizeof e->shape);
    e->data = data;
}

static const char *optim_name(const dt_trainer *t) {
    return t->opts.optim.kind == DT_OPTIM_SGD ? "sgd" : "adamw";
}

static void meta_add(dt_ckpt_meta *mb, const char *key, const char *fmt, unsigned long long v) {
    snprintf(mb->v[mb->n], sizeof mb->v[0], fmt, v);
    mb->m[mb->n] = (dt_st_meta){key, mb->v[mb->n]};
    mb->n++;
}

void dt_checkpoint_meta(const dt_trainer *t, int64_t optim_step, dt_ckpt_meta *mb) {
    const dt_model *m = t->model;
    mb->n = 0;
    mb->m[mb->n++] = (dt_st_meta){"format", "dtrain-checkpoint-1"};
    mb->m[mb->n++] = (dt_st_meta){"model", dt_model_kind_name(m->cfg.kind)};
    mb->m[mb->n++] = (dt_st_meta){"optimizer", optim_name(t)};
    meta_add(mb, "step", "%llu", (unsigned long long)t->step);
    meta_add(mb, "optim_step", "%llu", (unsigned long long)optim_step);
    meta_add(mb, "epoch", "%llu", (unsigned long long)t->sampler.epoch);
    meta_add(mb, "cursor", "%llu", (unsigned long long)t->sampler.cursor);
    meta_add(mb, "seed", "%llu", (unsigned long long)t->opts.seed);
    meta_add(mb, "world", "%llu", (unsigned long long)t->strat.world);
    meta_add(mb, "rng0", "%016llx", (unsigned long long)m->dropout_rng.s[0]);
    meta_add(mb, "rng1", "%016llx", (unsigned long long)m->dropout_rng.s[1]);
}

dt_status dt_checkpoint_save(dt_trainer *t, const char *path) {
    dt_model *m = t->model;
    int ns = dt_optim_state_per_elem(&t->optim.cfg);
    int n = m->n_params * (1 + ns) + m->n_buffers;
    dt_st_entry *e = calloc((size_t)n, sizeof *e);
    char (*names)[192] = calloc((size_t)(m->n_params * ns + 1), sizeof *names);
    if (!e || !names) { free(e); free(names); return DT_ERR(DT_ENOMEM, "out of memory"); }
    int k = 0;
    for (int i = 0; i < m->n_params; i++) fill_entry(&e[k++], m->params[i]->name, &m->params[i]->value, m->params[i]->value.data);
    for (int i = 0; i < m->n_buffers; i++) fill_entry(&e[k++], m->buffers[i]->name, &m->buffers[i]->value, m->buffers[i]->value.data);
    for (int s = 0; s < ns; s++)
        for (int i = 0; i < m->n_params; i++) {
            char *nm = names[s * m->n_params + i];
            snprintf(nm, 192, "optim.%s.%s", state_name(&t->optim.cfg, s), m->params[i]->name);
            fill_entry(&e[k++], nm, &m->params[i]->value, t->optim.state[s] + m->offsets[i] - t->optim.state_begin);
        }
    dt_ckpt_meta mb;
    dt_checkpoint_meta(t, t->optim.step, &mb);
    dt_status st = DT_OK;
    if (t->strat.rank == 0) st = dt_safetensors_write(path, e, k, mb.m, mb.n);
    free(e);
    free(names);
    return st;
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

/* format / model / optimizer match this run. */
static dt_status check_identity(const dt_trainer *t, dt_ckpt_meta_get get, const void *src, const char *what) {
    const char *fmt = get(src, "format"), *kind = get(src, "model"), *opt = get(src, "optimizer");
    const char *have = dt_model_kind_name(t->model->cfg.kind);
    if (!fmt || strcmp(fmt, "dtrain-checkpoint-1"))
        return DT_ERR(DT_EFORMAT, "%s: not a dtrain checkpoint (format '%s')", what, fmt ? fmt : "missing");
    if (!kind || strcmp(kind, have))
        return DT_ERR(DT_EFORMAT, "%s: checkpoint is for model '%s', this run is '%s'", what, kind ? kind : "?", have);
    if (!opt || strcmp(opt, optim_name(t)))
        return DT_ERR(DT_EFORMAT, "%s: checkpoint optimizer is '%s', this run uses '%s'", what, opt ? opt : "?",
                      optim_name(t));
    return DT_OK;
}

dt_status dt_checkpoint_apply_meta(dt_trainer *t, dt_ckpt_meta_get get, const void *src,
                                   const char *what, int64_t *optim_step) {
    DT_TRY(check_identity(t, get, src, what));
    uint64_t step, ostep, epoch, cursor, world, r0, r1;
    DT_TRY(meta_u64(get, src, what, "step", 0, &step));
    DT_TRY(meta_u64(get, src, what, "optim_step", 0, &ostep));
    DT_TRY(meta_u64(get, src, what, "epoch", 0, &epoch));
    DT_TRY(meta_u64(get, src, what, "cursor", 0, &cursor));
    DT_TRY(meta_u64(get, src, what, "world", 0, &world));
    DT_TRY(meta_u64(get, src, what, "rng0", 1, &r0));
    DT_TRY(meta_u64(get, src, what, "rng1", 1, &r1));
    if (world < 1 || world > INT32_MAX || cursor > INT64_MAX / world || step > INT64_MAX || ostep > INT64_MAX ||
        epoch > INT64_MAX)
        return DT_ERR(DT_EFORMAT, "%s: metadata out of range (world %llu, cursor %llu)", what,
                      (unsigned long long)world, (unsigned long long)cursor);
    /* Strided sampler: local position p of W ranks is global position p * W. */
    uint64_t global = cursor * world, now = (uint64_t)t->strat.world;
    if (global % now)
        return DT_ERR(DT_EINVAL, "%s: saved at world size %llu after %llu samples of epoch %llu, which %llu ranks "
                      "cannot split evenly (resume with a world size dividing %llu)", what,
                      (unsigned long long)world, (unsigned long long)global, (unsigned long long)epoch,
                      (unsigned long long)now, (unsigned long long)global);
    if (dt_sampler_seek(&t->sampler, (int64_t)epoch, (int64_t)(global / now)) != DT_OK)
        return DT_ERR(DT_EFORMAT, "%s: data position (epoch %llu, cursor %llu at world size %llu) invalid for this "
                      "dataset/world size: %s", what, (unsigned long long)epoch, (unsigned long long)cursor,
                      (unsigned long long)world, dt_error_message());
    t->step = (int64_t)step;
    t->model->dropout_rng.s[0] = r0;
    t->model->dropout_rng.s[1] = r1;
    if (optim_step) *optim_step = (int64_t)ostep;
    return DT_OK;
}

static const char *ckpt_get(const void *src, const char *key) { return dt_ckpt_get_meta(src, key); }

/* The whole tensor `name` (shape of like) into dst. */
static dt_status read_tensor(const dt_ckpt *c, const char *name, const dt_tensor *like, float *dst) {
    DT_TRY(dt_ckpt_expect(c, name, like->ndim, like->shape));
    return dt_ckpt_read(c, name, 0, (size_t)like->numel, dst);
}

static dt_status load_all(dt_trainer *t, const dt_ckpt *c) {
    dt_model *m = t->model;
    const char *what = dt_ckpt_path(c);
    DT_TRY(check_identity(t, ckpt_get, c, what));   /* before tensors: clearer errors */
    for (int i = 0; i < m->n_params; i++) DT_TRY(read_tensor(c, m->params[i]->name, &m->params[i]->value, dt_f32(&m->params[i]->value)));
    for (int i = 0; i < m->n_buffers; i++) DT_TRY(read_tensor(c, m->buffers[i]->name, &m->buffers[i]->value, dt_f32(&m->buffers[i]->value)));
    int ns = dt_optim_state_per_elem(&t->optim.cfg);
    for (int s = 0; s < ns; s++)
        for (int i = 0; i < m->n_params; i++) {
            char nm[192];
            snprintf(nm, sizeof nm, "optim.%s.%s", state_name(&t->optim.cfg, s), m->params[i]->name);
            DT_TRY(read_tensor(c, nm, &m->params[i]->value, t->optim.state[s] + m->offsets[i] - t->optim.state_begin));
        }
    return dt_checkpoint_apply_meta(t, ckpt_get, c, what, &t->optim.step);
}

dt_status dt_checkpoint_load(dt_trainer *t, const char *path) {
    if (t->strat.owns_optimizer)
        return DT_ERR(DT_ESTATE, "%s: strategy '%s' shards the optimizer; load through its load hook", path,
                      t->strat.name ? t->strat.name : "?");
    dt_ckpt *c;
    DT_TRY(dt_ckpt_open(path, &c));
    dt_status s = load_all(t, c);
    dt_ckpt_close(c);
    return s;
}

dt_status dt_model_load_params(dt_model *m, const char *path) {
    dt_ckpt *c;
    DT_TRY(dt_ckpt_open(path, &c));
    dt_status s = DT_OK;
    for (int i = 0; i < m->n_params && s == DT_OK; i++)
        s = read_tensor(c, m->params[i]->name, &m->params[i]->value, dt_f32(&m->params[i]->value));
    for (int i = 0; i < m->n_buffers && s == DT_OK; i++)
        if (dt_ckpt_find(c, m->buffers[i]->name, NULL, NULL))
            s = read_tensor(c, m->buffers[i]->name, &m->buffers[i]->value, dt_f32(&m->buffers[i]->value));
    dt_ckpt_close(c);
    return s;
}

dt_status dt_model_save_params(const dt_model *m, const char *path) {
    int n = m->n_params + m->n_buffers;
    dt_st_entry *e = calloc((size_t)(n ? n : 1), sizeof *e);
    if (!e) return DT_ERR(DT_ENOMEM, "out of memory");
    for (int i = 0; i < m->n_params; i++) fill_entry(&e[i], m->params[i]->name, &m->params[i]->value, m->params[i]->value.data);
    for (int i = 0; i < m->n_buffers; i++) fill_entry(&e[m->n_params + i], m->buffers[i]->name, &m->buffers[i]->value, m->buffers[i]->value.data);
    dt_st_meta meta = {"format", "pt"};
    dt_status s = dt_safetensors_write(path, e, n, &meta, 1);
    free(e);
    return s;
}
