/* Data parallel across the D replicas of a pipeline stage: DDP or ZeRO-1/2/3
 * over the stage's own parameters, on the stage's data-parallel group.
 *
 * The reducer is the one plain data parallelism uses (dt_ddp / dt_zero),
 * driven from the pipeline's tapes instead of the trainer's:
 *  - every micro-batch but a chunk's last runs on a non-final tape, so its
 *    gradients only accumulate (no_sync); the last one's tape is final and its
 *    B (or W, when deferred) fires grad-ready, which fills the buckets and
 *    launches their reductions while the rest of the schedule computes;
 *  - the tapes' tick moves them along (dt_pipe_dp_tick);
 *  - a tied parameter's total is known only after the authority folded the
 *    last micro-batch's rows and shared the total (pipe/tie.c), so its
 *    grad-ready is held (a no-op hook while the schedule runs) and fired by
 *    dt_pipe_dp_finish once the total is in place, on every holder alike;
 *  - unused parameters: the probe knows the stage's uses, so the reducer
 *    runs without a tape to search (dt_*_begin_external).
 * Holders of a tied parameter reduce the same D totals in the same order, so
 * their copies stay bit-identical; with ZeRO each steps its own shards of it
 * with the same optimizer state.
 *
 * ZeRO-3: the replicas keep only their shards of the stage's parameters.
 * The gather policy is ZeRO-3's own, per module and per action: every F and
 * every B gathers each module's buckets in that module's pre-forward /
 * pre-backward hook and frees them when the next module enters, and the
 * next `zero.prefetch` modules are gathered ahead in the order the last
 * step's actions ran them (one order over F and B: dt_zero3_pipeline_mode),
 * so the last module of an action prefetches the first of the next action,
 * whichever chunk it belongs to. Why not keep a chunk gathered from its
 * first F to its last B or W: with one chunk per rank (gpipe, 1f1b, zb-h1)
 * that holds the whole stage through the whole step — --zero 2's parameter
 * memory, which --zero 2 already gives without the gathers. Per action the
 * gathered memory is a few modules (the prefetch window), at the cost of
 * 2 gathers per module per micro-batch, as ZeRO-3 with gradient
 * accumulation pays. A W (zb-h1; the authority's tied use) gathers nothing:
 * weight gradients read activations and output gradients only (dW = dy^T x,
 * LayerNorm's from x-hat, an embedding's rows), never a parameter's value.
 * The tied wte needs nothing of its own: the lm-head enters wte's module
 * like the embedding does, so each holder gathers its own copy's buckets.
 * Outside steps nothing is gathered but what no module owns
 * (dt_pipe_dp_sync): evaluation forwards gather per module like training
 * ones, so the strategy says its forwards are collective and the trainer
 * has every replica run as many (a replica past the end repeats a batch
 * and counts nothing); checkpoints hold values as owned ranges (pipe/ckpt.c). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "parallel/ddp/ddp_internal.h"
#include "pipe_internal.h"
#include "parallel/zero/zero_internal.h"

static dt_status hold_tied(dt_param *q, void *user) {
    (void)q;
    (void)user;
    return DT_OK;   /* fired by dt_pipe_dp_finish */
}

int dt_pipe_dp_active(const dt_pipe *p) { return p->dp.ddp || p->dp.zero; }

dt_status dt_pipe_dp_setup(dt_pipe *p, dt_run *r) {
    dt_model *m = p->m;
    if (p->o.zero_stage < 0 || p->o.zero_stage > 3)
        return DT_ERR(DT_EINVAL, "pipeline: ZeRO stage %d is not available across stages (1, 2 or 3)", p->o.zero_stage);
    if (p->o.zero_stage) {
        dt_zero_opts zo = p->o.zero;
        zo.stage = p->o.zero_stage;
        zo.clip = 0;   /* the pipeline clips over all stages */
        zo.param_dtype = p->o.param_dtype;
        if ((r->clip > 0 || r->scaler) && zo.overlap_step == DT_ZERO_OVERLAP_INTERLEAVED)
            return DT_ERR(DT_EINVAL, "pipeline: gradient clipping and loss scaling need the global norm before any shard is stepped, "
                          "so it cannot be combined with ZeRO's interleaved step overlap (use after-backward or off)");
        if (p->o.sequence_parallel && p->lay.T > 1 && zo.overlap_step == DT_ZERO_OVERLAP_INTERLEAVED)
            return DT_ERR(DT_EINVAL, "pipeline: sequence parallelism sums the replicated parameters' gradient shards "
                          "over each stage's tensor-parallel group in the step, before any shard may be stepped, so "
                          "it cannot be combined with ZeRO's interleaved step overlap (use after-backward or off)");
        DT_TRY(dt_zero_create(m, p->dp.pg, r->optim, &zo, &p->dp.zero));
        p->dp.zero->trace = r->trace;
        if (zo.stage == 3) dt_zero3_pipeline_mode(p->dp.zero);
    } else if (p->lay.D > 1) {
        DT_TRY(dt_ddp_create(m, p->dp.pg, &p->o.ddp, &p->dp.ddp));
        p->dp.ddp->trace = r->trace;
    } else {
        return DT_OK;
    }
    for (int t = 0; t < p->ties.n; t++) {
        dt_param *q = p->ties.list[t].p;
        p->ties.list[t].ready_fn = q->on_grad_ready;
        if (q->on_grad_ready) q->on_grad_ready = hold_tied;
    }
    return DT_OK;
}

void dt_pipe_dp_free(dt_pipe *p) {
    if (p->dp.pg) dt_pg_set_trace(p->dp.pg, NULL);
    for (int t = 0; t < p->ties.n; t++) {
        dt_pipe_tie *e = &p->ties.list[t];
        if (e->ready_fn && e->p->on_grad_ready == hold_tied) e->p->on_grad_ready = e->ready_fn;
    }
    if (p->dp.zero) dt_zero_free(p->dp.zero);
    if (p->dp.ddp) dt_ddp_free(p->dp.ddp);
    free(p->dp.skip_split);
    free(p->dp.skip_whole);
    p->dp.skip_split = p->dp.skip_whole = NULL;
    p->dp.zero = NULL;
    p->dp.ddp = NULL;
}

dt_status dt_pipe_dp_begin(dt_pipe *p, dt_run *r) {
    if (r->trace && dt_pipe_dp_active(p)) dt_pg_set_trace(p->dp.pg, r->trace);   /* reductions on the trace's comm row */
    if (p->dp.zero) {
        p->dp.zero->trace = r->trace;
        dt_zero_set_lr(p->dp.zero, r->lr);
        DT_TRY(dt_zero_begin_external(p->dp.zero));
        /* a bucket whose owning module runs on another stage (the lm-head's
         * use of wte) is waited here, not by a module hook */
        for (int t = 0; t < p->ties.n; t++) {
            dt_param *q = p->ties.list[t].p;
            DT_TRY(dt_zero_wait_gather(p->dp.zero, p->dp.zero->lay.param_bucket[q->index]));
            /* stage 2: the tied gradient's bucket buffer exists from now to its
             * reduction, so a holder's redirect around B (pipe/tie.c) is never
             * undone by the bucket being acquired inside that B */
            if (!q->grad.data && q->on_grad_alloc) DT_TRY(q->on_grad_alloc(q, q->on_grad_ready_user));
        }
        return DT_OK;
    }
    if (p->dp.ddp) {
        p->dp.ddp->trace = r->trace;
        return dt_ddp_begin_external(p->dp.ddp);
    }
    return DT_OK;
}

void dt_pipe_dp_tick(dt_pipe *p) {
    if (p->dp.zero) dt_zero_tick(p->dp.zero);
}

dt_status dt_pipe_dp_finish(dt_pipe *p) {
    if (!dt_pipe_dp_active(p)) return DT_OK;
    dt_status s = DT_OK;
    for (int t = 0; t < p->ties.n && s == DT_OK; t++) {
        dt_param *q = p->ties.list[t].p;
        if (p->ties.list[t].ready_fn) s = p->ties.list[t].ready_fn(q, q->on_grad_ready_user);
    }
    /* finish on every rank even after a failure: the replicas wait for it */
    dt_status f = p->dp.zero ? dt_zero_finish_backward(p->dp.zero) : dt_ddp_finish_backward(p->dp.ddp);
    return s != DT_OK ? s : f;
}

double dt_pipe_dp_sumsq(dt_pipe *p, const unsigned char *skip) {
    if (p->lay.T <= 1) return dt_zero_owned_sumsq(p->dp.zero, skip);
    int np = p->m->n_params;
    if (!p->dp.skip_split) {
        p->dp.skip_split = calloc((size_t)np + 1, 1);
        p->dp.skip_whole = calloc((size_t)np + 1, 1);
        if (!p->dp.skip_split || !p->dp.skip_whole) return NAN;   /* every rank's verdict: not finite */
        for (int i = 0; i < np; i++) {
            int split = p->m->params[i]->split.parts > 1;
            p->dp.skip_split[i] = (unsigned char)((skip && skip[i]) || split);
            p->dp.skip_whole[i] = (unsigned char)((skip && skip[i]) || !split);
        }
    }
    double x = dt_zero_owned_sumsq(p->dp.zero, p->dp.skip_whole);   /* split parts: every tp rank's own */
    if (p->lay.tp_rank == 0) x += dt_zero_owned_sumsq(p->dp.zero, p->dp.skip_split);
    return x;
}

dt_status dt_pipe_dp_step(dt_pipe *p, float lr, float scale) {
    dt_zero_set_lr(p->dp.zero, lr);
    return dt_zero_step_scaled(p->dp.zero, scale);
}

dt_status dt_pipe_dp_skip(dt_pipe *p) { return dt_zero_skip_step(p->dp.zero); }

dt_status dt_pipe_dp_sync(dt_pipe *p) { return p->dp.zero ? dt_zero_sync_params(p->dp.zero) : DT_OK; }

void dt_pipe_dp_memory(const dt_pipe *p, size_t *param, size_t *grad, size_t *optim) {
    dt_zero_memory mem = dt_zero_get_memory(p->dp.zero);
    *param = mem.param_bytes;
    *grad = mem.grad_bytes;
    *optim = mem.optim_bytes;
}
