/* SyncBatchNorm's all-reduce for DDP and ZeRO: the per-channel sums of one
 * BatchNorm (forward: sum x, then sum (x - mean)^2; backward: sum dy, sum dy*xhat, see
 * src/ops/batchnorm.c) and the element count travel as one float message
 * [sums..., count] summed over the group, in rank order when deterministic.
 * One exchange for both strategies, so ZeRO with sync_bn computes DDP's
 * statistics bit for bit. */
#include <stdlib.h>
#include <string.h>
#include "common_internal.h"

dt_status dt_par_bn_sync(float *data, int64_t n, double *count, void *user) {
    dt_par_bn *bn = user;
    if (n < 0) return DT_ERR(DT_EINVAL, "SyncBatchNorm: negative statistic count %lld", (long long)n);
    if (bn->cap < n + 1) {
        float *s = realloc(bn->scratch, (size_t)(n + 1) * sizeof *s);
        if (!s) return DT_ERR(DT_ENOMEM, "SyncBatchNorm: out of memory for %lld statistics", (long long)n);
        bn->scratch = s;
        bn->cap = n + 1;
    }
    memcpy(bn->scratch, data, (size_t)n * sizeof(float));
    bn->scratch[n] = (float)*count;   /* exact below 2^24 elements per rank */
    DT_TRY(dt_allreduce(bn->pg, bn->scratch, bn->scratch, n + 1, DT_F32, DT_RED_SUM | bn->red_flags, NULL));
    memcpy(data, bn->scratch, (size_t)n * sizeof(float));
    *count = bn->scratch[n];
    return DT_OK;
}

void dt_par_bn_free(dt_par_bn *bn) {
    free(bn->scratch);
    *bn = (dt_par_bn){0};
}
