/* Join for uneven inputs: a rank without data shadows the others' collectives.
 * Per step an active rank issues: activity allreduce (opts.join), buffer
 * broadcast (if enabled), then one reduction per bucket. A joined rank issues
 * the same with activity 0 and zero gradients, until the activity sum is 0. */
#include <string.h>
#include "ddp_internal.h"

dt_status dt_ddp_join(dt_ddp *d) {
    if (!d->opts.join) return DT_ERR(DT_ESTATE, "ddp: join needs the join option at construction");
    dt_model *m = d->model;
    for (;;) {
        float active = 0.0f;
        DT_TRY(dt_allreduce(d->pg, &active, &active, 1, DT_F32, DT_RED_SUM, NULL));
        if (active == 0.0f) return DT_OK;   /* everyone has joined */
        if (d->opts.broadcast_buffers && !d->opts.sync_bn && m->n_buffers && d->world > 1)
            DT_TRY(dt_ddp_bcast_buffers(d));
        if (d->opts.sync_bn)
            return DT_ERR(DT_EINVAL, "ddp: join with SyncBatchNorm is not supported (its forward collectives depend on the batch)");
        memset(m->grad_flat.data, 0, m->grad_flat.numel * sizeof(float));
        for (int i = 0; i < d->n_buckets; i++) {
            d->buckets[i].ready = 1;
            d->buckets[i].pending = 0;
        }
        d->sync = 1;
        DT_TRY(dt_ddp_launch_ready(d));
        for (int i = 0; i < d->n_buckets; i++) {
            dt_ddp_bucket *b = &d->buckets[i];
            dt_status s = dt_work_wait(b->work);
            b->work = NULL;
            if (s == DT_OK && d->hook.finish) s = d->hook.finish(d->hook.state, d->pg, b);
            DT_TRY(s);
            b->ready = b->launched = 0;
            b->pending = b->n_params;
        }
        d->next_launch = 0;
        memset(m->grad_flat.data, 0, m->grad_flat.numel * sizeof(float));
    }
}
