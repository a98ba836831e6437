/* Sequence parallelism's gradient rule (tp_internal.h): a replicated
 * parameter used on the sequence shards (wpe, the LayerNorms, the
 * row-parallel biases: every parameter that is not split) receives on each
 * rank the part of its gradient from that rank's positions, so after
 * backward those parts are summed over the TP group. The replicated
 * gradients are packed into one buffer (one all-reduce per step, counted in
 * dt_tp_stats), summed, and unpacked. The all-reduce gives every rank of
 * the group the same bits (comm.c), so afterwards the replicated gradients
 * are equal on every rank again, as clipping (norm.c) and the identical
 * optimizer steps assume. Under DDP it runs after DDP's average (whose
 * buckets may reduce during backward): both are sums, so the order changes
 * only float rounding, and every replica sums the same averaged values. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "parallel/common/common_internal.h"
#include "parallel/zero/zero_internal.h"
#include "tp_internal.h"

/* The pack buffer, kept across steps (the same size every step). */
static float *sum_buf(dt_tp *s, size_t n) {
    if (n > s->sum_n) {
        float *b = realloc(s->sum_buf, n * sizeof *b);
        if (!b) return NULL;
        s->sum_buf = b;
        s->sum_n = n;
    }
    return s->sum_buf;
}

dt_status dt_tp_sum_replicated_grads(dt_tp *s, dt_model *m) {
    size_t n = 0;
    for (int i = 0; i < m->n_params; i++) {
        const dt_param *p = m->params[i];
        if (p->split.parts <= 1 && p->grad.data) n += (size_t)p->grad.numel;
    }
    if (!n) return DT_OK;
    float *buf = sum_buf(s, n);
    if (!buf) return DT_ERR(DT_ENOMEM, "tp: out of memory summing %zu replicated gradients (sequence parallelism)", n);
    size_t at = 0;
    for (int i = 0; i < m->n_params; i++) {
        const dt_param *p = m->params[i];
        if (p->split.parts > 1 || !p->grad.data) continue;
        memcpy(buf + at, p->grad.data, (size_t)p->grad.numel * sizeof *buf);
        at += (size_t)p->grad.numel;
    }
    dt_status st = s->comm.allreduce_sum(s->comm.ctx, buf, (int64_t)n);
    at = 0;
    for (int i = 0; st == DT_OK && i < m->n_params; i++) {
        dt_param *p = m->params[i];
        if (p->split.parts > 1 || !p->grad.data) continue;
        memcpy(p->grad.data, buf + at, (size_t)p->grad.numel * sizeof *buf);
        at += (size_t)p->grad.numel;
    }
    return st;
}

/* Under ZeRO (tp/zero.c, pipe/dp.c) the gradients are reduced over the DP
 * group to owned shards before the sum could run, and a replicated
 * parameter's whole gradient exists nowhere any more. But the DP groups of
 * a TP group's ranks have the same layout (equal parts, replicated
 * parameters identical; checked at setup, dt_tp_check_replicated_shards), so
 * ZeRO rank d of every tp rank owns the same ranges of each replicated
 * parameter: the owned range of its reduced gradient is summed over the TP
 * group instead. Sum-then-reduce and reduce-then-sum are both sums (only the
 * float rounding order differs), and afterwards the owned replicated ranges
 * are the same bits on every rank of the group, as the norm (counted on tp
 * rank 0 only) and the identical shard steps assume. walk visits the
 * owned replicated ranges in layout order: it counts them, packs them into
 * buf, unpacks buf back, or hashes their geometry. */
enum walk_op { WALK_COUNT, WALK_PACK, WALK_UNPACK };

static size_t walk_owned(dt_zero *z, enum walk_op op, float *buf, uint32_t *hash) {
    size_t at = 0;
    for (int i = 0; i < z->lay.nb; i++) {
        const dt_zero_bucket *b = &z->lay.b[i].pub;
        float *g = dt_zero_shard_grad_ptr(z, i);
        if (!g) continue;   /* frozen bucket: no gradient */
        for (int k = b->first_param; k < b->first_param + b->n_params; k++) {
            const dt_param *p = z->lay.order[k];
            if (p->split.parts > 1 || !p->requires_grad) continue;
            size_t off = z->m->offsets[p->index], end = off + (size_t)p->value.numel;
            size_t lo = off > b->own_begin ? off : b->own_begin;
            size_t hi = end < b->own_begin + b->shard ? end : b->own_begin + b->shard;
            if (lo >= hi) continue;
            size_t n = hi - lo;
            float *shard = g + (lo - b->own_begin);
            if (op == WALK_PACK) memcpy(buf + at, shard, n * sizeof *buf);
            else if (op == WALK_UNPACK) memcpy(shard, buf + at, n * sizeof *buf);
            if (hash) {
                int x[5] = {i, (int)(uint32_t)lo, (int)(uint32_t)((uint64_t)lo >> 32), (int)(uint32_t)n,
                            (int)(uint32_t)((uint64_t)n >> 32)};
                *hash = dt_par_hash_ints(*hash, x, 5);
            }
            at += n;
        }
    }
    return at;
}

dt_status dt_tp_sum_replicated_shards(dt_tp *s, dt_zero *z) {
    size_t n = walk_owned(z, WALK_COUNT, NULL, NULL);
    /* every rank of the group owns the same n (the check at setup), so a rank
     * that owns no replicated range skips the all-reduce on every rank alike */
    if (!n) return DT_OK;
    float *buf = sum_buf(s, n);
    if (!buf)
        return DT_ERR(DT_ENOMEM, "tp: out of memory summing %zu elements of replicated gradient shards (sequence "
                      "parallelism with ZeRO)", n);
    walk_owned(z, WALK_PACK, buf, NULL);
    dt_status st = s->comm.allreduce_sum(s->comm.ctx, buf, (int64_t)n);
    if (st == DT_OK) walk_owned(z, WALK_UNPACK, buf, NULL);
    return st;
}

dt_status dt_tp_check_replicated_shards(dt_tp *s, dt_zero *z) {
    uint32_t h = 2166136261u;
    size_t n = walk_owned(z, WALK_COUNT, NULL, &h);
    dt_agree a;
    dt_agree_init(&a);
    dt_agree_add(&a, "tp.zero.replicated_shards", "%zu elements, layout %08x", n, (unsigned)h);
    dt_status st = dt_pg_agree(s->tp_pg, &a);
    dt_agree_free(&a);
    if (st != DT_OK)
        return DT_ERR(DT_EINVAL, "tp with ZeRO and sequence parallelism: the tensor-parallel ranks' ZeRO layouts own "
                      "different ranges of the replicated parameters, so their gradient shards cannot be summed "
                      "over the group (%s)", dt_error_message());
    return DT_OK;
}
