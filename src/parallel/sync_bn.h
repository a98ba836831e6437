#ifndef DT_PARALLEL_SYNC_BN_H
#define DT_PARALLEL_SYNC_BN_H
/* SyncBatchNorm's exchange (ops.h dt_bn_sync) over a process group: the
 * per-channel sums and the element count summed across ranks. Install as
 * model->bn_sync = (dt_bn_sync){dt_par_bn_sync, &state}. */
#include "dtrain/dist.h"

typedef struct dt_par_bn {
    dt_pg *pg;
    int red_flags;           /* DT_RED_DETERMINISTIC or 0 */
    float *scratch;          /* [n sums..., count]: one message per exchange */
    int64_t cap;
} dt_par_bn;

/* data[0..n) and *count summed over bn->pg (a blocking collective: every
 * rank calls it at the same op of its forward / backward). */
dt_status dt_par_bn_sync(float *data, int64_t n, double *count, void *user);
void dt_par_bn_free(dt_par_bn *bn);
#endif
