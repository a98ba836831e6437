/* Join for uneven inputs: a rank without data shadows the others' collectives.
 * Per optimizer step an active rank issues (on its synchronising micro-step
 * only; no_sync micro-steps issue nothing under opts.join): the activity
 * allreduce, the buffer broadcast (if enabled), one reduction per bucket in
 * index order, and the buffer broadcast after the reductions. A joined rank
 * issues the same with activity 0 and zero gradients, until the activity sum
 * is 0. A joined rank skipped the optimizer steps of the later iterations, so
 * at the end every rank takes the parameters and buffers of a rank that was
 * active longest (the lowest-numbered one). SyncBatchNorm is rejected with
 * join at dt_ddp_create. */
#include <stdlib.h>
#include <string.h>
#include "ddp_internal.h"

/* One shadowed step: zero gradients through every bucket. */
static dt_status shadow_step(dt_ddp *d) {
    dt_model *m = d->model;
    if (dt_ddp_bcast_buffers_enabled(d)) DT_TRY(dt_ddp_bcast_buffers(d));
    memset(m->grad_flat.data, 0, m->grad_flat.numel * sizeof(float));
    for (int i = 0; i < d->n_buckets; i++) {
        d->buckets[i].ready = 1;
        d->buckets[i].pending = 0;
    }
    d->next_launch = 0;
    dt_status s = dt_ddp_launch_ready(d);
    dt_status sw = dt_ddp_wait_buckets(d);
    if (s == DT_OK) s = sw;
    dt_ddp_reset_buckets(d);
    memset(m->grad_flat.data, 0, m->grad_flat.numel * sizeof(float));
    DT_TRY(s);
    if (dt_ddp_bcast_buffers_enabled(d)) DT_TRY(dt_ddp_bcast_buffers(d));
    return DT_OK;
}

/* Everyone has joined: adopt the model of the lowest rank that shadowed the
 * fewest steps (it applied every optimizer step). */
static dt_status sync_final_model(dt_ddp *d, int64_t shadowed) {
    if (d->world < 2) return DT_OK;
    float mine = (float)(shadowed < (1 << 24) ? shadowed : (1 << 24)), *all = malloc((size_t)d->world * sizeof *all);
    if (!all) return DT_ERR(DT_ENOMEM, "out of memory");
    dt_status s = dt_allgather(d->pg, &mine, all, 1, DT_F32, NULL);
    int root = 0;
    for (int r = 1; s == DT_OK && r < d->world; r++)
        if (all[r] < all[root]) root = r;
    free(all);
    DT_TRY(s);
    dt_model *m = d->model;
    DT_TRY(dt_broadcast(d->pg, m->param_flat.data, (int64_t)m->param_flat.numel, DT_F32, root, NULL));
    return dt_ddp_bcast_buffers_from(d, root);
}

dt_status dt_ddp_join(dt_ddp *d) {
    if (!d->opts.join) return DT_ERR(DT_ESTATE, "ddp: join needs the join option at construction");
    for (int64_t shadowed = 0;; shadowed++) {
        float active = 0.0f;
        DT_TRY(dt_allreduce(d->pg, &active, &active, 1, DT_F32, DT_RED_SUM, NULL));
        if (active == 0.0f) return sync_final_model(d, shadowed);
        DT_TRY(shadow_step(d));
    }
}
