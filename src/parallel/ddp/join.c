/* Join for uneven inputs: a rank without data shadows the others' collectives.
 * Per optimizer step an active rank issues (on its synchronising micro-step
 * only; no_sync micro-steps issue nothing under opts.dp.join): the activity
 * agreement, the buffer broadcast (if enabled), one reduction per bucket in
 * index order, the used-parameter sum (find_unused_params), and the buffer
 * broadcast after the reductions. A joined rank issues the same with
 * activity 0, zero gradients and no used parameters, until no rank is
 * active.
 *
 * Whose buffers: PyTorch's common rank, the highest rank still active (the
 * activity agreement is an all-gather of rank-or-minus-one, whose maximum
 * every rank takes). A joined rank's BatchNorm statistics are stale, so they
 * must never be broadcast while some rank still trains. At the end every
 * rank takes the parameters and buffers of the highest of the ranks that
 * joined last (they applied every optimizer step). SyncBatchNorm is rejected
 * with join at dt_ddp_create. */
#include <stdlib.h>
#include <string.h>
#include "ddp_internal.h"

dt_status dt_ddp_join_agree(dt_ddp *d, int active, int *any) {
    int top;
    DT_TRY(dt_par_join_agree(d->pg, active, 0.0f, &top, NULL));
    *any = top >= 0;
    if (top >= 0) d->bufs.root = top;
    return DT_OK;
}

/* One shadowed step: zero gradients through every bucket. */
static dt_status shadow_step(dt_ddp *d) {
    dt_model *m = d->model;
    DT_TRY(dt_par_buffers_sync(&d->bufs, &d->opts.dp));
    memset(m->grad_flat.data, 0, m->grad_flat.numel * sizeof(float));
    for (int i = 0; i < d->n_buckets; i++) {
        d->buckets[i].ready = 1;
        d->buckets[i].pending = 0;
    }
    d->next_launch = 0;
    dt_status s = dt_ddp_launch_ready(d);
    int agree_used = d->opts.dp.find_unused_params && d->world > 1;   /* as finish_backward */
    if (agree_used) {
        dt_status su = dt_par_used_start(&d->used, m, d->pg, 0);
        if (s == DT_OK) s = su;
    }
    dt_status sw = dt_ddp_wait_buckets(d);
    if (s == DT_OK) s = sw;
    if (agree_used) {
        sw = dt_par_used_finish(&d->used, NULL);   /* this rank steps nothing */
        if (s == DT_OK) s = sw;
    }
    dt_ddp_reset_buckets(d);
    memset(m->grad_flat.data, 0, m->grad_flat.numel * sizeof(float));
    DT_TRY(s);
    DT_TRY(dt_par_buffers_sync(&d->bufs, &d->opts.dp));
    return DT_OK;
}

/* Everyone has joined: adopt the model of the highest rank that shadowed no
 * step (it joined last, so it applied every optimizer step). */
static dt_status sync_final_model(dt_ddp *d, int64_t shadowed) {
    if (d->world < 2) return DT_OK;
    int any = 0;
    DT_TRY(dt_ddp_join_agree(d, shadowed == 0, &any));
    if (!any) return DT_ERR(DT_ESTATE, "ddp join: no rank joined last (internal error)");
    DT_TRY(dt_ddp_bcast_params(d, d->bufs.root));   /* ignored parameters stay each rank's own */
    return dt_par_buffers_bcast(&d->bufs);
}

dt_status dt_ddp_join(dt_ddp *d) {
    if (!d->opts.dp.join) return DT_ERR(DT_ESTATE, "ddp: join needs the join option at construction");
    for (int64_t shadowed = 0;; shadowed++) {
        int any = 0;
        DT_TRY(dt_ddp_join_agree(d, 0, &any));
        if (!any) return sync_final_model(d, shadowed);
        DT_TRY(shadow_step(d));
    }
}
