/* ZeRO layout: parameters in backward order, cut into buckets (the rule DDP
 * uses too: dt_bucket_plan), each padded so it splits into N equal shards
 * (64-byte aligned); rank r owns shard r of every bucket. Also the pool of
 * full-size bucket buffers. */
#include <stdlib.h>
#include <string.h>
#include "zero_internal.h"

#define ZERO_ALIGN 16   /* floats: shards start on 64-byte boundaries */

dt_status dt_zero_build_layout(dt_zero *z, size_t first_cap_bytes, size_t cap_bytes) {
    dt_model *m = z->m;
    zlayout *L = &z->lay;
    int n = m->n_params;
    dt_bucket_rule rule = {first_cap_bytes, cap_bytes, (size_t)z->world * ZERO_ALIGN};
    dt_param_plan plan;
    DT_TRY(dt_par_plan_params(m, &rule, DT_PLAN_FROZEN_APART, NULL, &plan));   /* frozen: no optimizer state */
    L->order = malloc((size_t)(n ? n : 1) * sizeof *L->order);
    L->param_bucket = malloc((size_t)(n ? n : 1) * sizeof *L->param_bucket);
    L->b = calloc((size_t)n + 1, sizeof *L->b);
    size_t *off = malloc((size_t)(n ? n : 1) * sizeof *off);
    if (!L->order || !L->param_bucket || !L->b || !off) {
        free(off);
        dt_par_plan_free(&plan);
        return DT_ERR(DT_ENOMEM, "out of memory");
    }
    for (int k = 0; k < n; k++) {
        dt_param *p = L->order[k] = m->params[plan.order[k]];
        off[p->index] = plan.pos[k];
        L->param_bucket[p->index] = plan.bucket_of[k];
        if (p->requires_grad) L->b[plan.bucket_of[k]].n_grad_params++;
    }
    L->nb = plan.nb;
    L->total = 0;
    size_t shard_off = 0;
    for (int i = 0; i < L->nb; i++) {
        dt_zero_bucket *b = &L->b[i].pub;
        b->index = i;
        b->begin = plan.cuts[i].begin;
        b->used = plan.cuts[i].used;
        b->numel = plan.cuts[i].numel;
        b->first_param = plan.cuts[i].first;
        b->n_params = plan.cuts[i].n;
        b->trainable = !plan.cuts[i].cls;   /* frozen parameters are bucketed apart (class 1) */
        b->shard = b->numel / (size_t)z->world;
        b->own_begin = b->begin + (size_t)z->rank * b->shard;
        b->shard_offset = shard_off;
        shard_off += b->shard;
        L->total = b->begin + b->numel;   /* buckets lie back to back */
    }
    L->shard_total = shard_off;
    dt_par_plan_free(&plan);
    dt_status s = dt_model_set_layout(m, off, L->total ? L->total : 1);
    free(off);
    size_t gshard = 0;   /* gradient shards: trainable buckets only */
    for (int i = 0; i < L->nb; i++) {
        zbucket *b = &L->b[i];
        b->grad_begin = dt_model_grad_offset(m, b->pub.begin);   /* (valid while grad_flat exists: stage 1) */
        b->gshard_offset = gshard;
        if (b->pub.trainable) gshard += b->pub.shard;
    }
    L->gshard_total = gshard;
    return s;
}

void dt_zero_point_full_grads(dt_zero *z) {
    float *g = z->m->grad_flat.data;
    for (int i = 0; i < z->lay.nb; i++) {
        zbucket *b = &z->lay.b[i];
        b->full_grad = g && b->pub.trainable ? g + b->grad_begin : NULL;
    }
}

/* Pool of full-size bucket buffers: best fit among free buffers no more than
 * twice the request (so one huge bucket, e.g. an embedding, does not make
 * every small bucket cost as much), else a new exact-size buffer. */
float *dt_zero_pool_get(dt_zero *z, size_t numel) {
    zpool *P = &z->pool;
    int best = -1;
    for (int i = 0; i < P->n; i++) {
        size_t c = P->free_bufs[i].cap;
        if (c >= numel && c <= 2 * numel && (best < 0 || c < P->free_bufs[best].cap)) best = i;
    }
    if (best < 0) return dt_calloc((numel ? numel : 1) * sizeof(float));
    float *buf = P->free_bufs[best].buf;
    P->free_bufs[best] = P->free_bufs[--P->n];
    return buf;
}

void dt_zero_pool_put(dt_zero *z, float *buf, size_t numel) {
    zpool *P = &z->pool;
    if (!buf) return;
    if (P->n == P->cap) {
        int cap = P->cap ? 2 * P->cap : 8;
        zpool_buf *p = realloc(P->free_bufs, (size_t)cap * sizeof *p);
        if (!p) { dt_free(buf); return; }
        P->free_bufs = p;
        P->cap = cap;
    }
    P->free_bufs[P->n++] = (zpool_buf){buf, numel};
}
