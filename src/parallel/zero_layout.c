/* ZeRO layout: parameters in backward order, cut into buckets, each padded so
 * it splits into N equal shards (64-byte aligned); rank r owns shard r of
 * every bucket. Also the pool of full-size bucket buffers. */
#include <stdlib.h>
#include <string.h>
#include "zero_internal.h"

#define ZERO_ALIGN 16   /* floats: shards start on 64-byte boundaries */

static size_t round_up(size_t x, size_t m) { return (x + m - 1) / m * m; }

dt_status dt_zero_build_layout(dt_zero *z, size_t first_cap_bytes, size_t cap_bytes) {
    dt_model *m = z->m;
    int n = m->n_params;
    z->order = malloc((size_t)(n ? n : 1) * sizeof *z->order);
    z->param_bucket = malloc((size_t)(n ? n : 1) * sizeof *z->param_bucket);
    z->b = calloc((size_t)n + 1, sizeof *z->b);
    size_t *off = malloc((size_t)(n ? n : 1) * sizeof *off);
    if (!z->order || !z->param_bucket || !z->b || !off) { free(off); return DT_ERR(DT_ENOMEM, "out of memory"); }
    for (int i = 0; i < n; i++) z->order[i] = m->params[i];
    for (int i = 1; i < n; i++) {   /* insertion sort by current offset: the model's backward order */
        dt_param *x = z->order[i];
        int j = i - 1;
        while (j >= 0 && m->offsets[z->order[j]->index] > m->offsets[x->index]) { z->order[j + 1] = z->order[j]; j--; }
        z->order[j + 1] = x;
    }
    size_t pos = 0, unit = (size_t)z->world * ZERO_ALIGN;
    zbucket *cur = NULL;
    for (int k = 0; k < n; k++) {
        dt_param *p = z->order[k];
        size_t numel = (size_t)p->value.numel, bytes = numel * sizeof(float);
        size_t cap = z->nb <= 1 && cur == &z->b[0] ? first_cap_bytes : cap_bytes;
        if (!cur || (cur->pub.used > 0 && (cur->pub.used * sizeof(float) + bytes > cap))) {
            if (cur) pos += round_up(cur->pub.used, unit);
            cur = &z->b[z->nb];
            cur->pub.index = z->nb++;
            cur->pub.begin = pos;
            cur->pub.first_param = k;
        }
        off[p->index] = pos + cur->pub.used;
        cur->pub.used += numel;
        cur->pub.n_params++;
        if (p->requires_grad) cur->n_grad_params++;
        z->param_bucket[p->index] = cur->pub.index;
    }
    if (cur) pos += round_up(cur->pub.used ? cur->pub.used : 1, unit);
    z->total = pos;
    size_t shard_off = 0;
    for (int i = 0; i < z->nb; i++) {
        dt_zero_bucket *b = &z->b[i].pub;
        b->numel = round_up(b->used ? b->used : 1, unit);
        b->shard = b->numel / (size_t)z->world;
        b->own_begin = b->begin + (size_t)z->rank * b->shard;
        b->shard_offset = shard_off;
        shard_off += b->shard;
        if (b->numel > z->max_bucket) z->max_bucket = b->numel;
    }
    z->shard_total = shard_off;
    dt_status s = dt_model_set_layout(m, off, z->total ? z->total : 1);
    free(off);
    return s;
}

float *dt_zero_pool_get(dt_zero *z) {
    if (z->n_pool > 0) return z->pool[--z->n_pool];
    return dt_calloc(z->max_bucket * sizeof(float));
}

void dt_zero_pool_put(dt_zero *z, float *buf) {
    if (!buf) return;
    if (z->n_pool == z->cap_pool) {
        int cap = z->cap_pool ? 2 * z->cap_pool : 8;
        float **p = realloc(z->pool, (size_t)cap * sizeof *p);
        if (!p) { dt_free(buf); return; }
        z->pool = p;
        z->cap_pool = cap;
    }
    z->pool[z->n_pool++] = buf;
}
