/* ZeRO join for uneven inputs (stages 1/2): a rank without data shadows the
 * active ranks' collectives, as DDP's join does (ddp/join.c).
 *
 * Per optimizer step an active rank issues, on its synchronising micro-step
 * only (no_sync micro-steps issue nothing on z->pg under join):
 *   z->ag_pg  last step's parameter all-gathers, finished before the
 *             agreement (a joined rank issues the same queue, in the same
 *             order, at the top of its loop; finishing them first means
 *             neither side waits on z->pg for a rank blocked on z->ag_pg);
 *   z->pg     the activity agreement (all-gather of rank-or-minus-one, LR);
 *             the buffer broadcast (if enabled) from the highest active rank;
 *             the used-parameter sum (find_unused_params), before the first
 *             reduce-scatter; one reduce-scatter per bucket in index order;
 *             the buffer broadcast after the reductions; the global norm
 *             (clip > 0);
 *   z->ag_pg  the stepped shards' all-gathers (issued, queued or waited as
 *             the overlap mode says; the order is bucket-determined).
 * A joined rank issues the same with zero gradients, contributing no used
 * parameter, until the agreement finds no rank active.
 *
 * Why a joined rank still steps: under ZeRO the shard a rank owns is stepped
 * by that rank alone and reaches the others only through its all-gather. A
 * joined rank that only reduced would leave its shards -- 1/N of every
 * bucket -- frozen on every rank while the others train. So the shadow step
 * is a whole ZeRO step: the reduced (averaged) gradients of its shards, the
 * optimizer step at the active ranks' learning rate (carried by the
 * agreement, since a joined rank does not follow the LR schedule), and the
 * all-gather. Which parameters are stepped follows the active ranks: with
 * find_unused_params the agreed used-parameter map sets has_grad as on them;
 * without it every active rank used every trainable parameter (else the
 * step fails there), so has_grad = requires_grad.
 *
 * The average divides by the world size, joined ranks counting as zeros:
 * DDP's join does the same (AVG over the group), so ZeRO + join equals DDP +
 * join (bitwise where ZeRO equals DDP: N = 2 or deterministic).
 *
 * Whose buffers: the highest rank still active (PyTorch's common rank); a
 * joined rank's BatchNorm statistics are stale. At the end every rank takes
 * the buffers of the highest rank that joined last (it ran every step).
 * Parameters need no such exchange: every rank stepped its shards at every
 * step, and the last all-gathers are finished before the final agreement.
 * Stage 3 and SyncBatchNorm are rejected with join at dt_zero_create. */
#include <stdlib.h>
#include <string.h>
#include "zero_internal.h"

dt_status dt_zero_join_agree(dt_zero *z, int active, int *any) {
    DT_TRY(dt_zero_wait_all_gathers(z));
    int top;
    float lr = z->lr;   /* the active ranks' LR: a joined rank does not follow the schedule */
    DT_TRY(dt_par_join_agree(z->pg, active, z->lr, &top, &lr));
    *any = top >= 0;
    if (top >= 0) {
        z->bufs.root = top;
        z->lr = lr;
    }
    return DT_OK;
}

/* One shadowed step: the active ranks' before_forward (after the agreement),
 * finish_backward and step, with no forward and zero gradients. */
static dt_status shadow_step(dt_zero *z) {
    dt_model *m = z->m;
    DT_TRY(dt_par_buffers_sync(&z->bufs, &z->opts.dp));
    for (int i = 0; i < z->lay.nb; i++) {
        zbucket *b = &z->lay.b[i];
        /* stage 1: the flat gradient; stage 2: a buffer left by an unfinished
         * accumulation (normally none: launch gives a zeroed one) */
        if (b->full_grad) memset(b->full_grad, 0, b->pub.numel * sizeof(float));
        b->pending = 0;
        b->ready = 1;
    }
    for (int i = 0; i < m->n_params; i++)
        m->params[i]->has_grad = z->opts.dp.find_unused_params ? 0 : m->params[i]->requires_grad;
    z->rd.sync = 1;
    z->rd.graph = NULL;   /* no forward: no unused-parameter search */
    z->rd.tick_err = DT_OK;
    z->rd.unused_checked = 1;
    z->rd.hold_steps = 0;
    DT_TRY(dt_zero_finish_backward(z));
    return dt_zero_step(z, NULL);
}

/* Everyone has joined: buffers of the highest rank that shadowed no step. */
static dt_status finish_join(dt_zero *z, int64_t shadowed) {
    if (z->world < 2) return DT_OK;
    int any = 0;
    DT_TRY(dt_zero_join_agree(z, shadowed == 0, &any));
    if (!any) return DT_ERR(DT_ESTATE, "zero join: no rank joined last (internal error)");
    if (z->m->n_buffers == 0) return DT_OK;
    return dt_par_buffers_bcast(&z->bufs);
}

dt_status dt_zero_join(dt_zero *z) {
    if (!z->opts.dp.join) return DT_ERR(DT_ESTATE, "zero: join needs the join option at creation");
    if (z->rd.reduced) return DT_ERR(DT_ESTATE, "zero: join between finish_backward and step (step first)");
    for (int64_t shadowed = 0;; shadowed++) {
        int any = 0;
        DT_TRY(dt_zero_join_agree(z, 0, &any));
        if (!any) return finish_join(z, shadowed);
        DT_TRY(shadow_step(z));
    }
}
