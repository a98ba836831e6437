/* SGD (PyTorch semantics) on one contiguous range.
 *
 * Element-wise only: each element's result depends on its own inputs, so
 * splitting a buffer into ranges or changing the thread count never changes
 * the bits. Loop variants are chosen outside the loops (no per-element
 * branches) so GCC vectorises every inner loop. */
#include "dtrain/optim.h"

/* Below this many elements a range is stepped by the calling thread only. */
#define DT_SGD_PAR_MIN 32768

/* Momentum update; first = 1 on step 1 (buf = g'), nesterov selects d. */
static void sgd_momentum(float *restrict p, const float *restrict g, float *restrict buf,
                         size_t n, float lr, float wd, float mu, float gs, int first,
                         int nesterov) {
    if (first && nesterov) {
        #pragma omp parallel for schedule(static) if (n > DT_SGD_PAR_MIN)
        for (size_t i = 0; i < n; i++) {
            float gi = g[i] * gs + wd * p[i];
            buf[i] = gi;
            p[i] = p[i] - lr * (gi + mu * gi);
        }
    } else if (first) {
        #pragma omp parallel for schedule(static) if (n > DT_SGD_PAR_MIN)
        for (size_t i = 0; i < n; i++) {
            float gi = g[i] * gs + wd * p[i];
            buf[i] = gi;
            p[i] = p[i] - lr * gi;
        }
    } else if (nesterov) {
        #pragma omp parallel for schedule(static) if (n > DT_SGD_PAR_MIN)
        for (size_t i = 0; i < n; i++) {
            float gi = g[i] * gs + wd * p[i];
            float bi = mu * buf[i] + gi;
            buf[i] = bi;
            p[i] = p[i] - lr * (gi + mu * bi);
        }
    } else {
        #pragma omp parallel for schedule(static) if (n > DT_SGD_PAR_MIN)
        for (size_t i = 0; i < n; i++) {
            float gi = g[i] * gs + wd * p[i];
            float bi = mu * buf[i] + gi;
            buf[i] = bi;
            p[i] = p[i] - lr * bi;
        }
    }
}

/* Plain SGD: p -= lr * (g*gs + wd*p). */
static void sgd_plain(float *restrict p, const float *restrict g, size_t n, float lr, float wd,
                      float gs) {
    #pragma omp parallel for schedule(static) if (n > DT_SGD_PAR_MIN)
    for (size_t i = 0; i < n; i++) {
        float gi = g[i] * gs + wd * p[i];
        p[i] = p[i] - lr * gi;
    }
}

/* buf must hold n floats when c->momentum > 0 (ignored otherwise). */
void dt_sgd_step_range(const dt_optim_cfg *c, float lr, int decay, float *p, const float *g,
                       float *buf, size_t n, int64_t step, float grad_scale) {
    if (n == 0) return;
    float wd = decay ? c->weight_decay : 0.0f;
    if (c->momentum > 0.0f)
        sgd_momentum(p, g, buf, n, lr, wd, c->momentum, grad_scale, step <= 1, c->nesterov != 0);
    else
        sgd_plain(p, g, n, lr, wd, grad_scale);
}
