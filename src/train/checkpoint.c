/* Checkpoints: the full training state in one safetensors file.
 * Parameters and buffers under their own names; optimizer state under
 * "optim.<state>.<param>"; scalars (step, sampler position, RNG) as metadata.
 * Loading goes through dt_ckpt, so a sharded (ZeRO) set loads here too. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "trainer_internal.h"

static void fill_entry(dt_st_entry *e, const char *name, const dt_tensor *like, const void *data) {
    e->name = name;
    e->dtype = DT_F32;
    e->ndim = like->ndim;
    memcpy(e->shape, like->shape, sizeof e->shape);
    e->data = data;
}

dt_status dt_checkpoint_save(dt_trainer *t, const char *path) {
    dt_model *m = t->model;
    int ns = dt_optim_state_per_elem(&t->optim.cfg);
    int n = m->n_params * (1 + ns) + m->n_buffers;
    dt_st_entry *e = calloc((size_t)n, sizeof *e);
    char (*names)[192] = calloc((size_t)(m->n_params * ns + 1), sizeof *names);
    if (!e || !names) { free(e); free(names); return DT_ERR(DT_ENOMEM, "out of memory"); }
    dt_status st = dt_optimizer_state_open(&t->optim);   /* bf16 state: written widened to fp32 */
    if (st != DT_OK) { free(e); free(names); return st; }
    int k = 0;
    for (int i = 0; i < m->n_params; i++) fill_entry(&e[k++], m->params[i]->name, &m->params[i]->value, m->params[i]->value.data);
    for (int i = 0; i < m->n_buffers; i++) fill_entry(&e[k++], m->buffers[i]->name, &m->buffers[i]->value, m->buffers[i]->value.data);
    for (int s = 0; s < ns; s++)
        for (int i = 0; i < m->n_params; i++) {
            float *st = dt_optimizer_state_of(&t->optim, s, m->offsets[i]);
            if (!st) continue;   /* frozen: no state */
            char *nm = names[s * m->n_params + i];
            snprintf(nm, 192, "optim.%s.%s", dt_checkpoint_state_name(&t->optim.cfg, s), m->params[i]->name);
            fill_entry(&e[k++], nm, &m->params[i]->value, st);
        }
    dt_ckpt_meta mb;
    dt_checkpoint_meta(&t->run, t->strat.name, t->optim.step, &mb);
    dt_optimizer *opt = &t->optim;
    st = dt_checkpoint_meta_steps(&mb, m, &opt, 1);
    if (st == DT_OK && t->strat.rank == 0) st = dt_safetensors_write(path, e, k, mb.m, mb.n);
    dt_optimizer_state_close(&t->optim, 0);
    free(e);
    free(names);
    return st;
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
    DT_TRY(dt_checkpoint_check_identity(&t->run, ckpt_get, c, what));   /* before tensors: clearer errors */
    for (int i = 0; i < m->n_params; i++) DT_TRY(dt_checkpoint_read_param(c, m->params[i]->name, m->params[i], dt_f32(&m->params[i]->value)));
    for (int i = 0; i < m->n_buffers; i++) DT_TRY(read_tensor(c, m->buffers[i]->name, &m->buffers[i]->value, dt_f32(&m->buffers[i]->value)));
    DT_TRY(dt_checkpoint_apply_meta(&t->run, ckpt_get, c, what, &t->optim.step));
    dt_optimizer *opt = &t->optim;
    DT_TRY(dt_checkpoint_apply_steps(ckpt_get, c, what, m, &opt, 1));
    return dt_checkpoint_read_states(c, what, m, opt);
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
        s = dt_checkpoint_read_param(c, m->params[i]->name, m->params[i], dt_f32(&m->params[i]->value));
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
