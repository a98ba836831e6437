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
 * writes: its replicated tensors point into them); then as above.
 * Every buffer is allocated before the first gather and the allocations
 * agreed over the world: a rank short of memory fails the save on every
 * rank at once, instead of leaving the gathers its peers then wait in until
 * the collective timeout. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "parallel/common/common_internal.h"
#include "parallel/zero/zero_internal.h"
#include "tp_internal.h"

typedef struct save_set {
    dt_st_entry *e;
    char (*names)[192];
    int n;
    float *parts;            /* the T parts of one split tensor (room for the largest) */
    float **whole;           /* world rank 0: [(1 + ns) x n_params] split tensors put together (else NULL) */
    float **flat;            /* ZeRO: flat copies of the local layout: rank 0 [1 + ns] (kept), others [1] (reused) */
    int n_flat;
} save_set;

/* Entry: the tensor `local` of p (its value or a state), whole; for a split
 * p, gathered into ss->parts and (rank 0) put together in `whole`. */
static dt_status add_tensor(dt_tp *s, save_set *ss, const char *name, const dt_param *p, const float *local,
                            float *whole) {
    dt_st_entry *e = &ss->e[ss->n++];
    e->name = name;
    e->dtype = DT_F32;
    e->ndim = dt_param_full_shape(p, e->shape);
    if (p->split.parts <= 1) { e->data = local; return DT_OK; }
    size_t n = (size_t)p->value.numel;
    dt_work *w = NULL;
    dt_status st = dt_allgather(s->tp_pg, local, ss->parts, (int64_t)n, DT_F32, &w);
    if (st == DT_OK) st = dt_work_wait(w);
    if (st != DT_OK || s->rank != 0) return st;
    for (int k = 0; k < s->T; k++)   /* rank k of the group holds part k; whole: without padding */
        dt_split_copy(&p->split, e->ndim, e->shape, k, whole, ss->parts + (size_t)k * n, 1);
    e->data = whole;
    return DT_OK;
}

/* state k of parameter i (k < 0: its value) as this rank holds it, given
 * the ZeRO flat copy (NULL without ZeRO); NULL: the parameter has none */
static const float *local_of(dt_tp *s, dt_optimizer *o, const dt_model *m, int i, int k, const float *flat) {
    if (flat) return k >= 0 && !m->params[i]->requires_grad ? NULL : flat + m->offsets[i];   /* frozen: no state */
    if (s->zero) return NULL;   /* (not reached: ZeRO passes its flat copy) */
    return k < 0 ? dt_f32(&m->params[i]->value) : dt_optimizer_state_of(o, k, m->offsets[i]);
}

/* Every buffer of the save (see the top); the optimizer's state is open */
static dt_status alloc_set(dt_tp *s, dt_optimizer *o, const dt_model *m, int ns, save_set *ss) {
    int cap = m->n_params * (1 + ns) + m->n_buffers;
    ss->e = calloc((size_t)cap, sizeof *ss->e);
    ss->names = calloc((size_t)(m->n_params * ns + 1), sizeof *ss->names);
    ss->whole = calloc((size_t)(m->n_params * (1 + ns) + 1), sizeof *ss->whole);
    ss->flat = calloc((size_t)(2 + ns), sizeof *ss->flat);
    if (!ss->e || !ss->names || !ss->whole || !ss->flat) return DT_ERR(DT_ENOMEM, "tp checkpoint: out of memory");
    size_t most = 1;
    for (int i = 0; i < m->n_params; i++) {
        const dt_param *p = m->params[i];
        if (p->split.parts <= 1) continue;
        if ((size_t)p->value.numel * (size_t)s->T > most) most = (size_t)p->value.numel * (size_t)s->T;
        if (s->rank != 0) continue;
        int64_t shape[DT_MAX_DIMS];
        size_t whole = (size_t)dt_shape_numel(dt_param_full_shape(p, shape), shape);
        for (int k = -1; k < ns; k++) {
            int has = s->zero ? k < 0 || p->requires_grad : local_of(s, o, m, i, k, NULL) != NULL;
            if (has && !(ss->whole[(k + 1) * m->n_params + i] = malloc(whole * sizeof(float))))
                return DT_ERR(DT_ENOMEM, "tp checkpoint: out of memory for %s (%zu floats)", p->name, whole);
        }
    }
    if (!(ss->parts = malloc(most * sizeof *ss->parts)))
        return DT_ERR(DT_ENOMEM, "tp checkpoint: out of memory gathering tensors of %zu floats", most);
    if (s->zero) {
        ss->n_flat = s->rank == 0 ? 1 + ns : 1;
        size_t total = s->zero->lay.total ? s->zero->lay.total : 1;
        for (int f = 0; f < ss->n_flat; f++)
            if (!(ss->flat[f] = malloc(total * sizeof(float))))
                return DT_ERR(DT_ENOMEM, "tp checkpoint: out of memory (%zu floats)", total);
    }
    return DT_OK;
}

static void free_set(save_set *ss, const dt_model *m, int ns) {
    for (int j = 0; ss->whole && j < m->n_params * (1 + ns); j++) free(ss->whole[j]);
    for (int f = 0; ss->flat && f < ss->n_flat; f++) free(ss->flat[f]);
    free(ss->whole);
    free(ss->flat);
    free(ss->parts);
    free(ss->e);
    free(ss->names);
}

dt_status dt_tp_save(dt_tp *s, dt_run *r, const char *path) {
    dt_model *m = r->model;
    dt_optimizer *o = r->optimizer;
    if (!o && !s->zero) return DT_ERR(DT_ESTATE, "tp checkpoint %s: no optimizer", path);
    const dt_optim_cfg *cfg = s->zero ? dt_zero_optim_cfg(s->zero) : &o->cfg;
    int ns = dt_optim_state_per_elem(cfg);
    save_set ss = {0};
    dt_status st = s->zero ? dt_zero_sync_params(s->zero) : DT_OK;
    /* bf16 state: written as fp32, through the widened copies of the bracket */
    int open = st == DT_OK && (st = s->zero ? dt_zero_state_open(s->zero) : dt_optimizer_state_open(o)) == DT_OK;
    if (st == DT_OK) st = alloc_set(s, o, m, ns, &ss);
    st = dt_par_agree(s->world, st, "tp checkpoint");
    /* the order of checkpoint.c: parameters, buffers, then each state of every parameter */
    for (int k = -1; k < ns && st == DT_OK; k++) {
        float *flat = s->zero ? ss.flat[s->rank == 0 ? k + 1 : 0] : NULL;
        if (flat) st = dt_zero_gather_local(s->zero, k, flat);   /* collective over the DP group */
        for (int i = 0; i < m->n_params && st == DT_OK; i++) {
            const float *local = local_of(s, o, m, i, k, flat);
            if (!local) continue;
            const char *name = m->params[i]->name;
            if (k >= 0) {
                char *nm = ss.names[k * m->n_params + i];
                snprintf(nm, 192, "optim.%s.%s", dt_checkpoint_state_name(cfg, k), name);
                name = nm;
            }
            st = add_tensor(s, &ss, name, m->params[i], local, ss.whole[(k + 1) * m->n_params + i]);
        }
        for (int i = 0; k < 0 && i < m->n_buffers && st == DT_OK; i++) {
            const dt_named_buffer *b = m->buffers[i];
            ss.e[ss.n++] = (dt_st_entry){.name = b->name, .dtype = DT_F32, .ndim = b->value.ndim, .data = b->value.data};
            memcpy(ss.e[ss.n - 1].shape, b->value.shape, sizeof b->value.shape);
        }
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
    free_set(&ss, m, ns);
    return st;
}
