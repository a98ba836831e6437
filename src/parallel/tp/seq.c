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
#include <stdlib.h>
#include <string.h>
#include "tp_internal.h"

dt_status dt_tp_sum_replicated_grads(dt_tp *s, dt_model *m) {
    size_t n = 0;
    for (int i = 0; i < m->n_params; i++) {
        const dt_param *p = m->params[i];
        if (p->split.parts <= 1 && p->grad.data) n += (size_t)p->grad.numel;
    }
    if (!n) return DT_OK;
    float *buf = malloc(n * sizeof *buf);
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
    free(buf);
    return st;
}
