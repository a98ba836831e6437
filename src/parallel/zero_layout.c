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
    int n = m->n_params;
    dt_bucket_rule rule = {first_cap_bytes, cap_bytes, (size_t)z->world * ZERO_ALIGN};
    dt_param_plan plan;
    DT_TRY(dt_par_plan_params(m, &rule, 0, &plan));
    z->order = malloc((size_t)(n ? n : 1) * sizeof *z->order);
    z->param_bucket = malloc((size_t)(n ? n : 1) * sizeof *z->param_bucket);
    z->b = calloc((size_t)n + 1, sizeof *z->b);
    size_t *off = malloc((size_t)(n ? n : 1) * sizeof *off);
    if (!z->order || !z->param_bucket || !z->b || !off) {
        free(off);
        dt_par_plan_free(&plan);
        return DT_ERR(DT_ENOMEM, "out of memory");
    }
    for (int k = 0; k < n; k++) {
        dt_param *p = z->order[k] = m->params[plan.order[k]];
        off[p->index] = plan.pos[k];
        z->param_bucket[p->index] = plan.bucket_of[k];
        if (p->requires_grad) z->b[plan.bucket_of[k]].n_grad_params++;
    }
    z->nb = plan.nb;
    z->total = 0;
    size_t shard_off = 0;
    for (int i = 0; i < z->nb; i++) {
        dt_zero_bucket *b = &z->b[i].pub;
        b->index = i;
        b->begin = plan.cuts[i].begin;
        b->used = plan.cuts[i].used;
        b->numel = plan.cuts[i].numel;
        b->first_param = plan.cuts[i].first;
        b->n_params = plan.cuts[i].n;
        b->shard = b->numel / (size_t)z->world;
        b->own_begin = b->begin + (size_t)z->rank * b->shard;
        b->shard_offset = shard_off;
        shard_off += b->shard;
        if (b->numel > z->max_bucket) z->max_bucket = b->numel;
        z->total = b->begin + b->numel;   /* buckets lie back to back */
    }
    z->shard_total = shard_off;
    dt_par_plan_free(&plan);
    dt_status s = dt_model_set_layout(m, off, z->total ? z->total : 1);
    free(off);
    return s;
}

/* Pool of full-size bucket buffers: best fit among free buffers no more than
 * twice the request (so one huge bucket, e.g. an embedding, does not make
 * every small bucket cost as much), else a new exact-size buffer. */
float *dt_zero_pool_get(dt_zero *z, size_t numel) {
    int best = -1;
    for (int i = 0; i < z->n_pool; i++) {
        size_t c = z->pool[i].cap;
        if (c >= numel && c <= 2 * numel && (best < 0 || c < z->pool[best].cap)) best = i;
    }
    if (best < 0) return dt_calloc((numel ? numel : 1) * sizeof(float));
    float *buf = z->pool[best].buf;
    z->pool[best] = z->pool[--z->n_pool];
    return buf;
}

void dt_zero_pool_put(dt_zero *z, float *buf, size_t numel) {
    if (!buf) return;
    if (z->n_pool == z->cap_pool) {
        int cap = z->cap_pool ? 2 * z->cap_pool : 8;
        zpool_buf *p = realloc(z->pool, (size_t)cap * sizeof *p);
        if (!p) { dt_free(buf); return; }
        z->pool = p;
        z->cap_pool = cap;
    }
    z->pool[z->n_pool++] = (zpool_buf){buf, numel};
}
