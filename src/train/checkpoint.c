/* Checkpoints: the full training state in one safetensors file.
 * Parameters and buffers under their own names; optimizer state under
 * "optim.<state>.<param>"; scalars (step, sampler position, RNG) as metadata. */
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

#define META_MAX 16
typedef struct meta_buf { dt_st_meta m[META_MAX]; char v[META_MAX][64]; int n; } meta_buf;
static void meta_add(meta_buf *mb, const char *key, const char *fmt, unsigned long long v) {
    snprintf(mb->v[mb->n], sizeof mb->v[0], fmt, v);
    mb->m[mb->n] = (dt_st_meta){key, mb->v[mb->n]};
    mb->n++;
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
    meta_buf mb = {0};
    mb.m[mb.n++] = (dt_st_meta){"format", "dtrain-checkpoint-1"};
    mb.m[mb.n++] = (dt_st_meta){"model", dt_model_kind_name(m->cfg.kind)};
    mb.m[mb.n++] = (dt_st_meta){"optimizer", t->optim.cfg.kind == DT_OPTIM_SGD ? "sgd" : "adamw"};
    meta_add(&mb, "step", "%llu", (unsigned long long)t->step);
    meta_add(&mb, "optim_step", "%llu", (unsigned long long)t->optim.step);
    meta_add(&mb, "epoch", "%llu", (unsigned long long)t->sampler.epoch);
    meta_add(&mb, "cursor", "%llu", (unsigned long long)t->sampler.cursor);
    meta_add(&mb, "seed", "%llu", (unsigned long long)t->opts.seed);
    meta_add(&mb, "world", "%llu", (unsigned long long)t->strat.world);
    meta_add(&mb, "rng0", "%016llx", (unsigned long long)m->dropout_rng.s[0]);
    meta_add(&mb, "rng1", "%016llx", (unsigned long long)m->dropout_rng.s[1]);
    dt_status st = DT_OK;
    if (t->strat.rank == 0) st = dt_safetensors_write(path, e, k, mb.m, mb.n);
    free(e);
    free(names);
    return st;
}

static dt_status meta_u64(const dt_safetensors *st, const char *key, int hex, uint64_t *out) {
    const char *v = dt_safetensors_meta(st, key);
    if (!v) return DT_ERR(DT_EFORMAT, "%s: checkpoint metadata lacks '%s'", st->path, key);
    char *end;
    *out = strtoull(v, &end, hex ? 16 : 10);
    if (*v == 0 || *end) return DT_ERR(DT_EFORMAT, "%s: metadata '%s' = '%s' is not a number", st->path, key, v);
    return DT_OK;
}

static dt_status copy_tensor(const dt_safetensors *st, const char *name, const dt_tensor *like, float *dst) {
    const dt_st_tensor *x;
    DT_TRY(dt_safetensors_expect(st, name, DT_F32, like->ndim, like->shape, &x));
    memcpy(dst, x->data, x->nbytes);
    return DT_OK;
}

static dt_status load_all(dt_trainer *t, const dt_safetensors *st) {
    dt_model *m = t->model;
    const char *fmt = dt_safetensors_meta(st, "format");
    if (!fmt || strcmp(fmt, "dtrain-checkpoint-1"))
        return DT_ERR(DT_EFORMAT, "%s: not a dtrain checkpoint (format '%s')", st->path, fmt ? fmt : "missing");
    const char *kind = dt_safetensors_meta(st, "model"), *opt = dt_safetensors_meta(st, "optimizer");
    if (!kind || strcmp(kind, dt_model_kind_name(m->cfg.kind)))
        return DT_ERR(DT_EFORMAT, "%s: checkpoint is for model '%s', this run is '%s'", st->path,
                      kind ? kind : "?", dt_model_kind_name(m->cfg.kind));
    const char *want = t->optim.cfg.kind == DT_OPTIM_SGD ? "sgd" : "adamw";
    if (!opt || strcmp(opt, want))
        return DT_ERR(DT_EFORMAT, "%s: checkpoint optimizer is '%s', this run uses '%s'", st->path, opt ? opt : "?", want);
    for (int i = 0; i < m->n_params; i++) DT_TRY(copy_tensor(st, m->params[i]->name, &m->params[i]->value, dt_f32(&m->params[i]->value)));
    for (int i = 0; i < m->n_buffers; i++) DT_TRY(copy_tensor(st, m->buffers[i]->name, &m->buffers[i]->value, dt_f32(&m->buffers[i]->value)));
    int ns = dt_optim_state_per_elem(&t->optim.cfg);
    for (int s = 0; s < ns; s++)
        for (int i = 0; i < m->n_params; i++) {
            char nm[192];
            snprintf(nm, sizeof nm, "optim.%s.%s", state_name(&t->optim.cfg, s), m->params[i]->name);
            DT_TRY(copy_tensor(st, nm, &m->params[i]->value, t->optim.state[s] + m->offsets[i] - t->optim.state_begin));
        }
    uint64_t step, ostep, epoch, cursor, r0, r1;
    DT_TRY(meta_u64(st, "step", 0, &step));
    DT_TRY(meta_u64(st, "optim_step", 0, &ostep));
    DT_TRY(meta_u64(st, "epoch", 0, &epoch));
    DT_TRY(meta_u64(st, "cursor", 0, &cursor));
    DT_TRY(meta_u64(st, "rng0", 1, &r0));
    DT_TRY(meta_u64(st, "rng1", 1, &r1));
    t->step = (int64_t)step;
    t->optim.step = (int64_t)ostep;
    m->dropout_rng.s[0] = r0;
    m->dropout_rng.s[1] = r1;
    if (dt_sampler_seek(&t->sampler, (int64_t)epoch, (int64_t)cursor) != DT_OK)
        return DT_ERR(DT_EFORMAT, "%s: data position (epoch %llu, cursor %llu) invalid for this dataset/world size: %s",
                      st->path, (unsigned long long)epoch, (unsigned long long)cursor, dt_error_message());
    return DT_OK;
}

dt_status dt_checkpoint_load(dt_trainer *t, const char *path) {
    dt_safetensors st;
    DT_TRY(dt_safetensors_load(path, &st));
    dt_status s = load_all(t, &st);
    dt_safetensors_free(&st);
    return s;
}

dt_status dt_model_load_params(dt_model *m, const char *path) {
    dt_safetensors st;
    DT_TRY(dt_safetensors_load(path, &st));
    dt_status s = DT_OK;
    for (int i = 0; i < m->n_params && s == DT_OK; i++)
        s = copy_tensor(&st, m->params[i]->name, &m->params[i]->value, dt_f32(&m->params[i]->value));
    for (int i = 0; i < m->n_buffers && s == DT_OK; i++)
        if (dt_safetensors_find(&st, m->buffers[i]->name))
            s = copy_tensor(&st, m->buffers[i]->name, &m->buffers[i]->value, dt_f32(&m->buffers[i]->value));
    dt_safetensors_free(&st);
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
