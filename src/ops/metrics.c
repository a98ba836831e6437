/* Non-differentiable helpers. */
#include "ops_internal.h"

/* Rows of logits[N, V] whose first argmax equals labels[row]. -1 on bad input. */
int64_t dt_count_correct(const dt_tensor *logits, const int32_t *labels) {
    if (dt_ops_check_tensor("count_correct", "logits", logits)) return -1;
    if (logits->ndim < 1 || logits->shape[logits->ndim - 1] == 0) {
        DT_ERR(DT_EINVAL, "count_correct: logits must be [N, V] with V > 0, got %s", DT_OPS_SHAPE(logits));
        return -1;
    }
    int64_t V = logits->shape[logits->ndim - 1], N = logits->numel / V, correct = 0;
    if (N > 0 && !labels) {
        DT_ERR(DT_EINVAL, "count_correct: labels is NULL for logits %s", DT_OPS_SHAPE(logits));
        return -1;
    }
    const float *x = dt_f32(logits);
#pragma omp parallel for schedule(static) reduction(+ : correct) if (N * V >= DT_OPS_PAR_MIN)
    for (int64_t r = 0; r < N; r++) {
        const float *xr = x + r * V;
        int64_t best = 0;
        for (int64_t j = 1; j < V; j++)
            if (xr[j] > xr[best]) best = j;
        correct += best == labels[r];
    }
    return correct;
}
