/* One rank's optimizer onto every rank: the state arrays, the step count and
 * each segment's skipped steps. The ranks must have the same segment table
 * (the same trainable set: agreed at every refresh). */
#include "parallel_internal.h"

dt_status dt_par_bcast_optimizer(dt_pg *pg, dt_optimizer *o, int root) {
    for (int k = 0; k < 2; k++)
        if (o->state[k] && o->state_len)
            DT_TRY(dt_broadcast(pg, o->state[k], (int64_t)o->state_len, DT_F32, root, NULL));
    /* int64 counts as pairs of float32 words: a broadcast copies bytes and
     * does no arithmetic, so every bit pattern arrives unchanged */
    if (o->n_segs) DT_TRY(dt_broadcast(pg, o->skipped, 2 * (int64_t)o->n_segs, DT_F32, root, NULL));
    return dt_broadcast(pg, &o->step, 2, DT_F32, root, NULL);
}
