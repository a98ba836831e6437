/* SGD (PyTorch semantics) on one contiguous range.
 *
 * Element-wise only: each element's result depends on its own inputs, so
 * splitting a buffer into ranges or changing the thread count never changes
 * the bits. Loop variants are chosen outside the loops (no per-element
 * branches) so GCC vectorises every inner loop. The momentum loops run on a
 * block at a time: OpenMP splits a range into blocks, and bf16 state
 * (optim.h) is widened into fp32 scratch per chunk, stepped by the same
 * loops, and rounded back. */
#include "dtrain/optim.h"
#include "bf16_state.h"

/* Below this many elements a range is stepped by the calling thread only. */
#define DT_SGD_PAR_MIN 32768
#define DT_SGD_BLOCK 4096   /* OpenMP work unit of the momentum paths */

typedef struct sgd_k { float lr, wd, mu, gs; int first, nesterov; } sgd_k;

/* Momentum update on one block, serial; first = 1 on step 1 (buf = g'),
 * nesterov selects d. */
static void sgd_momentum_block(const sgd_k *k, float *restrict p, const float *restrict g, float *restrict buf,
                               size_t n) {
    const float lr = k->lr, wd = k->wd, mu = k->mu, gs = k->gs;
    if (k->first && k->nesterov) {
        for (size_t i = 0; i < n; i++) {
            float gi = g[i] * gs + wd * p[i];
            buf[i] = gi;
            p[i] = p[i] - lr * (gi + mu * gi);
        }
    } else if (k->first) {
        for (size_t i = 0; i < n; i++) {
            float gi = g[i] * gs + wd * p[i];
            buf[i] = gi;
            p[i] = p[i] - lr * gi;
        }
    } else if (k->nesterov) {
        for (size_t i = 0; i < n; i++) {
            float gi = g[i] * gs + wd * p[i];
            float bi = mu * buf[i] + gi;
            buf[i] = bi;
            p[i] = p[i] - lr * (gi + mu * bi);
        }
    } else {
        for (size_t i = 0; i < n; i++) {
            float gi = g[i] * gs + wd * p[i];
            float bi = mu * buf[i] + gi;
            buf[i] = bi;
            p[i] = p[i] - lr * bi;
        }
    }
}

/* The same on bf16 state, a chunk at a time through fp32 scratch. */
static void sgd_momentum_block_bf16(const sgd_k *k, float *restrict p, const float *restrict g,
                                    uint16_t *restrict buf16, size_t n) {
    float tb[DT_BF16_STATE_CHUNK];
    for (size_t i = 0; i < n; i += DT_BF16_STATE_CHUNK) {
        size_t len = n - i < DT_BF16_STATE_CHUNK ? n - i : DT_BF16_STATE_CHUNK;
        if (!k->first) dt_bf16s_widen_n(tb, buf16 + i, len);   /* step 1 does not read buf */
        sgd_momentum_block(k, p + i, g + i, tb, len);
        dt_bf16s_round_n(buf16 + i, tb, len);
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

static sgd_k sgd_consts(const dt_optim_cfg *c, float lr, int decay, int64_t step, float grad_scale) {
    return (sgd_k){lr, decay ? c->weight_decay : 0.0f, c->momentum, grad_scale, step <= 1, c->nesterov != 0};
}

/* buf (float, or bfloat16 when bf16) must hold n values when c->momentum > 0
 * (ignored otherwise). */
static void sgd_range(const dt_optim_cfg *c, float lr, int decay, float *p, const float *g, void *buf, size_t n,
                      int64_t step, float grad_scale, int bf16) {
    if (n == 0) return;
    sgd_k k = sgd_consts(c, lr, decay, step, grad_scale);
    if (!(c->momentum > 0.0f)) {
        sgd_plain(p, g, n, lr, k.wd, grad_scale);
        return;
    }
    size_t nb = (n + DT_SGD_BLOCK - 1) / DT_SGD_BLOCK;
    #pragma omp parallel for schedule(static) if (n > DT_SGD_PAR_MIN)
    for (size_t b = 0; b < nb; b++) {
        size_t lo = b * DT_SGD_BLOCK, len = n - lo < DT_SGD_BLOCK ? n - lo : DT_SGD_BLOCK;
        if (bf16) sgd_momentum_block_bf16(&k, p + lo, g + lo, (uint16_t *)buf + lo, len);
        else sgd_momentum_block(&k, p + lo, g + lo, (float *)buf + lo, len);
    }
}

void dt_sgd_step_range(const dt_optim_cfg *c, float lr, int decay, float *p, const float *g,
                       float *buf, size_t n, int64_t step, float grad_scale) {
    sgd_range(c, lr, decay, p, g, buf, n, step, grad_scale, 0);
}

void dt_sgd_step_range_bf16(const dt_optim_cfg *c, float lr, int decay, float *p, const float *g,
                            uint16_t *buf, size_t n, int64_t step, float grad_scale) {
    sgd_range(c, lr, decay, p, g, buf, n, step, grad_scale, 1);
}
