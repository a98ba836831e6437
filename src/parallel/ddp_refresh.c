/* DDP refresh_trainable: after requires_grad changed between steps, cut the
 * buckets again over the trainable (and not ignored) parameters, in layout
 * order. Collective: the ranks first agree they have the same trainable set
 * (trainable_agree.c). The gradients are laid out again for the new set
 * (dt_model_refresh_grads: kept values carried over, in place when
 * node-shared, frozen parameters holding none); a static graph is recorded again in the next backward, as
 * its ready order now covers other parameters. */
#include "ddp_internal.h"

dt_status dt_ddp_refresh_trainable(dt_ddp *d) {
    if (!d) return DT_ERR(DT_EINVAL, "dt_ddp_refresh_trainable: no DDP");
    int busy = 0;
    for (int i = 0; i < d->n_buckets; i++) busy |= d->buckets[i].launched || d->buckets[i].work != NULL;
    /* local misuse, but the refresh is collective: agree before failing so no rank waits alone */
    dt_status s = busy ? DT_ERR(DT_ESTATE, "ddp: refresh_trainable while a reduction is in flight (call it between steps)") : DT_OK;
    DT_TRY(dt_par_agree(d->pg, s, "ddp refresh_trainable"));
    DT_TRY(dt_par_agree_trainable(d->model, d->pg, "ddp refresh_trainable"));
    dt_ddp_free_buckets(d);   /* collective if static_graph staged them in node-shared memory */
    d->recording = d->recorded = d->rebuilt = 0;
    /* gradient memory for the trainable set of now (a node-shared window
     * sized for it: the old one goes, the new one is made after the buckets) */
    int shared = d->shm_grads != NULL;
    dt_ddp_unshare_grads(d);
    DT_TRY(dt_model_refresh_grads(d->model));
    DT_TRY(dt_ddp_build_buckets(d));
    return shared ? dt_ddp_share_grads(d) : DT_OK;
}
