/* Tensor-parallel checkpoints: one safetensors file of whole tensors under
 * their global names, as one process writes it (src/train/checkpoint.c),
 * so one process, DDP, ZeRO or another tp size resumes it. Every split
 * tensor (a parameter's value and its optimizer states) is all-gathered
 * over the TP group and put together by its split (dt_split_copy); world
 * rank 0 keeps the whole tensors and writes. Its peak memory is one process's
 * model + optimizer state; the other ranks hold one gathered tensor at a time.
 * Loading needs no hook: every rank reads the whole tensor and keeps its part
 * (dt_checkpoint_read_param).
 * With ZeRO over the replicas (zero.c) this rank's parts are first put
 * together from its DP group's shards: values and each optimizer state
 * all-gathered into a flat copy of the local layout (dt_zero_gather_local),
 * one at a time on ranks other than world rank 0 (which keeps them until it
 * writes: its replicated tensors point into them); then as above. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "parallel/zero/zero_internal.h"
#include "tp_internal.h"

typedef struct save_set {
    dt_st_entry *e;
    char (*names)[192];
    float **owned;           /* whole tensors this rank allocated (rank 0) */
    int n, n_owned;
} save_set;

/* Entry k: the tensor `local` of p (its value or a state), whole. */
static dt_status add_tensor(dt_tp *s, save_set *ss, const char *name, const dt_param *p, const float *local) {
    dt_st_entry *e = &ss->e[ss->n++];
    e->name = name;
    e->dtype = DT_F32;
    e->ndim = dt_param_full_shape(p, e->shape);
    if (p->split.parts <= 1) { e->data = local; return DT_OK; }
    size_t n = (size_t)p->value.numel, T = (size_t)s->T;
    float *parts = malloc(n * T * sizeof *parts);
    if (!parts) return DT_ERR(DT_ENOMEM, "tp checkpoint: out of memory gathering %s (%zu floats)", name, n * T);
    dt_work *w = NULL;
    dt_status st = dt_allgather(s->tp_pg, local, parts, (int64_t)n, DT_F32, &w);
    if (st == DT_OK) st = dt_work_wait(w);
    if (st != DT_OK || s->rank != 0) { free(parts); return st; }
    float *whole = malloc((size_t)dt_shape_numel(e->ndim, e->shape) * sizeof *whole);   /* without padding */
    if (!whole) { free(parts); return DT_ERR(DT_ENOMEM, "tp checkpoint: out of memory for %s", name); }
    for (int k = 0; k < s->T; k++)   /* rank k of the group holds part k */
        dt_split_copy(&p->split, e->ndim, e->shape, k, whole, parts + (size_t)k * n, 1);
    free(parts);
    ss->owned[ss->n_owned++] = whole;
    e->data = whole;
    return DT_OK;
}

/* ZeRO: this rank's whole parts of values (k < 0) or state k, put together
 * from the DP group's shards into a new flat buffer (collective over it) */
static dt_status zero_local(dt_tp *s, save_set *ss, int k, float **flat) {
    *flat = malloc((s->zero->lay.total ? s->zero->lay.total : 1) * sizeof **flat);
    if (!*flat) return DT_ERR(DT_ENOMEM, "tp checkpoint: out of memory (%zu floats)", s->zero->lay.total);
    ss->owned[ss->n_owned++] = *flat;   /* freed with the set (or at once, by the caller) */
    return dt_zero_gather_local(s->zero, k, *flat);
}

/* A rank other than world rank 0 drops the flat copy it just used. */
static void zero_local_done(dt_tp *s, save_set *ss) {
    if (s->rank == 0 || !ss->n_owned) return;
    free(ss->owned[--ss->n_owned]);
}

dt_status dt_tp_save(dt_tp *s, dt_run *r, const char *path) {
    dt_model *m = r->model;
    dt_optimizer *o = r->optimizer;
    if (!o && !s->zero) return DT_ERR(DT_ESTATE, "tp checkpoint %s: no optimizer", path);
    const dt_optim_cfg *cfg = s->zero ? dt_zero_optim_cfg(s->zero) : &o->cfg;
    int ns = dt_optim_state_per_elem(cfg), cap = m->n_params * (1 + ns) + m->n_buffers;
    /* owned: room for the whole tensors and the flat copies (1 + ns) */
    save_set ss = {.e = calloc((size_t)cap, sizeof *ss.e), .names = calloc((size_t)(m->n_params * ns + 1), sizeof *ss.names),
                   .owned = calloc((size_t)(cap + 1 + ns), sizeof *ss.owned)};
    dt_status st = ss.e && ss.names && ss.owned ? DT_OK : DT_ERR(DT_ENOMEM, "out of memory");
    if (st == DT_OK && s->zero) st = dt_zero_sync_params(s->zero);
    /* bf16 state: written as fp32, through the widened copies of the bracket */
    int open = st == DT_OK && (st = s->zero ? dt_zero_state_open(s->zero) : dt_optimizer_state_open(o)) == DT_OK;
    float *flat = NULL;
    if (st == DT_OK && s->zero) st = zero_local(s, &ss, -1, &flat);
    /* the order of checkpoint.c: parameters, buffers, then each state of every parameter */
    for (int i = 0; i < m->n_params && st == DT_OK; i++)
        st = add_tensor(s, &ss, m->params[i]->name, m->params[i],
                        flat ? flat + m->offsets[i] : dt_f32(&m->params[i]->value));
    if (flat) zero_local_done(s, &ss);
    for (int i = 0; i < m->n_buffers && st == DT_OK; i++) {
        const dt_named_buffer *b = m->buffers[i];
        ss.e[ss.n++] = (dt_st_entry){.name = b->name, .dtype = DT_F32, .ndim = b->value.ndim, .data = b->value.data};
        memcpy(ss.e[ss.n - 1].shape, b->value.shape, sizeof b->value.shape);
    }
    for (int k = 0; k < ns && st == DT_OK; k++) {
        if (s->zero) st = zero_local(s, &ss, k, &flat);
        for (int i = 0; i < m->n_params && st == DT_OK; i++) {
            /* frozen: no state (the same on every rank) */
            const float *state = !s->zero ? dt_optimizer_state_of(o, k, m->offsets[i])
                               : m->params[i]->requires_grad ? flat + m->offsets[i] : NULL;
            if (!state) continue;
            char *nm = ss.names[k * m->n_params + i];
            snprintf(nm, 192, "optim.%s.%s", dt_checkpoint_state_name(cfg, k), m->params[i]->name);
            st = add_tensor(s, &ss, nm, m->params[i], state);
        }
        if (s->zero && st == DT_OK) zero_local_done(s, &ss);
    }
    dt_ckpt_meta mb;
    if (st == DT_OK && s->zero) {   /* every bucket's optimizer: the per-parameter step counts */
        dt_optimizer **opts = malloc((size_t)(s->zero->lay.nb + 1) * sizeof *opts);
        if (!opts) st = DT_ERR(DT_ENOMEM, "out of memory");
        if (st == DT_OK) {
            int n = dt_zero_optimizers(s->zero, opts);
            dt_checkpoint_meta(r, dt_tp_label(s), dt_zero_optim_step(s->zero), &mb);
            st = dt_checkpoint_meta_steps(&mb, m, opts, n);
        }
        free(opts);
    } else if (st == DT_OK) {
        dt_checkpoint_meta(r, dt_tp_label(s), o->step, &mb);
        st = dt_checkpoint_meta_steps(&mb, m, &o, 1);
    }
    if (st == DT_OK && s->rank == 0) st = dt_safetensors_write(path, ss.e, ss.n, mb.m, mb.n);
    if (open) {
        if (s->zero) dt_zero_state_close(s->zero, 0);
        else dt_optimizer_state_close(o, 0);
    }
    for (int k = 0; k < ss.n_owned; k++) free(ss.owned[k]);
    free(ss.owned);
    free(ss.e);
    free(ss.names);
    return st;
}
