/* Gradient norm pieces: sum of squares and the clipping factor. */
#include "dtrain/optim.h"
#ifdef _OPENMP
#include <omp.h>
#endif

#define DT_SUMSQ_PAR_MIN 65536
#define DT_SUMSQ_MAX_THREADS 256

/* Serial sum of squares with 8 independent double accumulators, so the
 * compiler can vectorise it (a single accumulator would be latency-bound). */
static double sumsq_serial(const float *restrict x, size_t n) {
    double acc[8] = {0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) acc[j] += (double)x[i + j] * (double)x[i + j];
    for (; i < n; i++) acc[i & 7] += (double)x[i] * (double)x[i];
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

/* Each thread sums a contiguous slice; the partials are then added in thread
 * order, so the result is reproducible for a given thread count. It may differ
 * in the last bits between thread counts (a different grouping of the sum);
 * that is acceptable because it only feeds gradient clipping. */
double dt_sumsq(const float *x, size_t n) {
    if (n == 0) return 0.0;
#ifdef _OPENMP
    int want = n > DT_SUMSQ_PAR_MIN ? omp_get_max_threads() : 1;
    if (want > DT_SUMSQ_MAX_THREADS) want = DT_SUMSQ_MAX_THREADS;
    if (want > 1) {
        double part[DT_SUMSQ_MAX_THREADS];
        int used = 1;
        #pragma omp parallel num_threads(want)
        {
            int t = omp_get_thread_num(), k = omp_get_num_threads();
            size_t chunk = (n + (size_t)k - 1) / (size_t)k;
            size_t lo = (size_t)t * chunk < n ? (size_t)t * chunk : n;
            size_t hi = n - lo < chunk ? n : lo + chunk;
            part[t] = sumsq_serial(x + lo, hi - lo);
            if (t == 0) used = k;
        }
        double s = 0.0;
        for (int t = 0; t < used; t++) s += part[t];
        return s;
    }
#endif
    return sumsq_serial(x, n);
}

float dt_clip_scale(double norm, float max_norm) {
    if (!(max_norm > 0.0f)) return 1.0f;
    double s = (double)max_norm / (norm + 1e-6);
    return s < 1.0 ? (float)s : 1.0f;
}
