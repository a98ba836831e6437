/* ZeRO optimizer step: every rank steps the shards it owns (last bucket
 * first), then all-gathers (or queues, AFTER_BACKWARD) the updated
 * parameters (zero/gather.c). INTERLEAVED steps a shard from inside backward
 * as soon as its reduction finished (zero/reduce.c). Clipping needs the
 * global norm first: one bit-exact exchange of per-rank partial sums. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "zero_internal.h"

dt_status dt_zero_step_bucket(dt_zero *z, int i, float scale) {
    zbucket *b = &z->lay.b[i];
    if (!b->pub.trainable) {   /* frozen: values never change, so nothing to step or gather */
        b->stepped = 1;
        return DT_OK;
    }
    float *ps = dt_zero_shard_param_ptr(z, i);
    /* a gather of the last step no forward waited for (a skipped module)
     * still reads the shard: finish it first */
    if (b->ag || b->ag_queued) DT_TRY(dt_zero_wait_gather(z, i));
    /* which parameters have a gradient on some rank (find_unused_params;
     * INTERLEAVED steps from inside backward): the shard skips the others */
    DT_TRY(dt_par_used_finish(&z->rd.used, z->m));
    double t0 = dt_trace_now_us(z->trace);
    dt_optimizer_step_owned(&b->opt, z->lr, ps, dt_zero_shard_grad_ptr(z, i), scale);
    if (z->trace) {
        char name[48];
        snprintf(name, sizeof name, "step shard %d", i);
        dt_trace_event(z->trace, name, "compute", 0, t0, dt_trace_now_us(z->trace));
    }
    b->stepped = 1;
    if (z->stage == 1) memset(b->full_grad, 0, b->pub.numel * sizeof(float));   /* next accumulation */
    return dt_zero_gather_stepped(z, i);
}

int dt_zero_interleaving(const dt_zero *z) {
    return z->rd.sync && z->opts.overlap_step == DT_ZERO_OVERLAP_INTERLEAVED && !z->rd.hold_steps;
}

/* Global gradient norm over the owned shards: per-rank partial sums in
 * double exchanged bit-exactly and added in rank order (same on every rank). */
double dt_zero_owned_sumsq(dt_zero *z, const unsigned char *skip) {
    double local = 0;
    for (int i = 0; i < z->lay.nb; i++) {
        const dt_zero_bucket *b = &z->lay.b[i].pub;
        const float *g = dt_zero_shard_grad_ptr(z, i);
        if (!g) continue;   /* frozen bucket: no gradient */
        if (!skip) {
            local += dt_sumsq(g, b->shard);
            continue;
        }
        /* each parameter's part of [own_begin, own_begin + shard) */
        for (int k = b->first_param; k < b->first_param + b->n_params; k++) {
            const dt_param *p = z->lay.order[k];
            size_t off = z->m->offsets[p->index], end = off + (size_t)p->value.numel;
            size_t lo = off > b->own_begin ? off : b->own_begin;
            size_t hi = end < b->own_begin + b->shard ? end : b->own_begin + b->shard;
            if (lo < hi && !skip[p->index]) local += dt_sumsq(g + (lo - b->own_begin), hi - lo);
        }
    }
    return local;
}

dt_status dt_zero_global_sumsq(dt_zero *z, double *sumsq) {
    double local = dt_zero_owned_sumsq(z, NULL);
    double *all = malloc((size_t)z->world * sizeof *all);
    if (!all) return DT_ERR(DT_ENOMEM, "out of memory");
    dt_status s = dt_allgather(z->pg, &local, all, 2, DT_F32, NULL);   /* 8 bytes as 2 floats, unchanged */
    double sum = 0;
    for (int r = 0; r < z->world; r++) sum += all[r];
    free(all);
    *sumsq = sum;
    return s;
}

static dt_status global_norm(dt_zero *z, double *norm) {
    double ss = 0;
    dt_status s = dt_zero_global_sumsq(z, &ss);
    *norm = sqrt(ss);
    return s;
}

dt_status dt_zero_skip_step(dt_zero *z) {
    if (!z->rd.reduced) return DT_ERR(DT_ESTATE, "zero: step before finish_backward reduced the gradients");
    z->rd.reduced = 0;
    /* as step_impl: the last step's queued gathers are done before anything new (none here) */
    dt_status s = z->opts.overlap_step == DT_ZERO_OVERLAP_AFTER_BACKWARD ? dt_zero_wait_all_gathers(z) : DT_OK;
    dt_status su = dt_par_used_finish(&z->rd.used, NULL);
    if (s == DT_OK) s = su;
    if (z->stage == 1)   /* stage 1 accumulates into full buffers, cleared after a step; 2/3 reduce into fresh ones */
        for (int i = 0; i < z->lay.nb; i++)
            if (z->lay.b[i].pub.trainable && z->lay.b[i].full_grad)
                memset(z->lay.b[i].full_grad, 0, z->lay.b[i].pub.numel * sizeof(float));
    dt_zero_reset_buckets(z);
    return s;
}

/* scale < 0: clip by the options (global norm here), else the caller's scale. */
static dt_status step_impl(dt_zero *z, float scale, double *grad_norm) {
    if (grad_norm) *grad_norm = -1;
    if (!z->rd.reduced) return DT_ERR(DT_ESTATE, "zero: step before finish_backward reduced the gradients");
    z->rd.reduced = 0;
    double t0 = dt_par_now_us();
    int own_norm = scale < 0;
    if (own_norm) scale = 1.0f;
    /* AFTER_BACKWARD: every gather queued by the last step is issued (in
     * queue order) and done before this step queues any, so the issue order
     * on ag_pg never depends on timing. Normally the forward waited them all. */
    dt_status s = z->opts.overlap_step == DT_ZERO_OVERLAP_AFTER_BACKWARD ? dt_zero_wait_all_gathers(z) : DT_OK;
    if (own_norm && z->opts.clip > 0) {   /* collective: on every rank, whatever s */
        double norm = 0;
        dt_status sn = global_norm(z, &norm);
        if (s == DT_OK) s = sn;
        scale = dt_clip_scale(norm, z->opts.clip);
        if (grad_norm) *grad_norm = norm;
    }
    /* last bucket first: its all-gather (the model's first layers, in
     * reverse-registration layout) is the one the next forward needs first */
    z->gq.queueing = z->opts.overlap_step == DT_ZERO_OVERLAP_AFTER_BACKWARD;
    for (int i = z->lay.nb - 1; i >= 0 && s == DT_OK; i--)
        if (!z->lay.b[i].stepped) s = dt_zero_step_bucket(z, i, scale);
    if (s == DT_OK) s = dt_zero_pump_gathers(z, INT_MAX);
    z->gq.queueing = 0;
    for (int i = 0; i < z->lay.nb; i++) dt_optimizer_finish_step(&z->lay.b[i].opt);
    z->stats.steps++;
    dt_zero_reset_buckets(z);
    if (s == DT_OK && z->opts.overlap_step == DT_ZERO_OVERLAP_OFF) s = dt_zero_sync_params(z);
    z->stats.step_us += dt_par_now_us() - t0;
    return s;
}

dt_status dt_zero_step(dt_zero *z, double *grad_norm) { return step_impl(z, -1.0f, grad_norm); }

dt_status dt_zero_step_scaled(dt_zero *z, float scale) {
    if (z->opts.clip > 0) return DT_ERR(DT_ESTATE, "zero: a caller-scaled step with the options' clip set");
    return step_impl(z, scale < 0 ? 0.0f : scale, NULL);
}
