/* Inverted dropout: y = x * mask / (1 - p), mask ~ Bernoulli(1 - p).
 *
 * Identity (returns x itself, nothing recorded) when the graph is not training
 * or p == 0. Otherwise the mask is drawn deterministically from `rng`: two
 * u32 draws form a 64-bit base, and element block b (DT_DROPOUT_BLOCK values)
 * uses its own generator seeded with base + b*K. The mask therefore depends
 * only on the rng state and numel (not on the thread count), and the caller's
 * rng advances by exactly two draws per call. Element i is kept when its
 * uniform [0, 1) draw is >= p. The mask (uint8 [numel]) is saved for backward:
 * dx += dy * mask * scale with the same float scale as the forward. */
#include <stdint.h>
#include "dtrain/ops.h"

#define DT_DROPOUT_BLOCK 4096
#define DT_DROPOUT_STREAM 0xD1B54A32D192ED03ull   /* odd; spaces the per-block seeds */

static void dropout_backward(dt_graph *g, dt_node *n) {
    float *dx = dt_grad_of(g, n->in[0]);
    if (!dx) return;
    const uint8_t *mask = n->saved;
    const float scale = n->f[0];
    const float *dy = dt_f32(n->out->grad);
    const int64_t numel = n->out->numel;
    #pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < numel; i++)
        if (mask[i]) dx[i] += dy[i] * scale;
}

dt_tensor *dt_op_dropout(dt_graph *g, dt_tensor *x, float p, dt_rng *rng) {
    char sx[64];
    if (!g || !x) { DT_ERR(DT_EINVAL, "dropout: graph and x are required"); return NULL; }
    dt_shape_str(x, sx, sizeof sx);
    if (x->dtype != DT_F32 || !x->data) { DT_ERR(DT_EINVAL, "dropout: x%s must be an F32 tensor with data", sx); return NULL; }
    if (!(p >= 0.f && p < 1.f)) { DT_ERR(DT_EINVAL, "dropout: p = %g must be in [0, 1) (x%s)", p, sx); return NULL; }
    if (!dt_graph_training(g) || p == 0.f) return x;
    if (!rng) { DT_ERR(DT_EINVAL, "dropout: training with p = %g needs an rng (x%s)", p, sx); return NULL; }

    int64_t shape[DT_MAX_DIMS];
    for (int i = 0; i < x->ndim; i++) shape[i] = x->shape[i];
    dt_tensor *y = dt_graph_tensor(g, x->ndim, shape);
    const int64_t numel = x->numel;
    uint8_t *mask = dt_graph_scratch(g, (size_t)numel);
    if (!y || !mask) return NULL;

    uint64_t base = (uint64_t)dt_rng_u32(rng) << 32;
    base |= dt_rng_u32(rng);
    const float scale = 1.0f / (1.0f - p);
    const float *xd = dt_f32(x);
    float *yd = dt_f32(y);
    const int64_t nblocks = (numel + DT_DROPOUT_BLOCK - 1) / DT_DROPOUT_BLOCK;
    #pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < nblocks; b++) {
        dt_rng r;
        dt_rng_seed(&r, base + (uint64_t)b * DT_DROPOUT_STREAM);
        int64_t end = (b + 1) * DT_DROPOUT_BLOCK < numel ? (b + 1) * DT_DROPOUT_BLOCK : numel;
        for (int64_t i = b * DT_DROPOUT_BLOCK; i < end; i++) {
            uint8_t keep = dt_rng_uniform(&r) >= p;
            mask[i] = keep;
            yd[i] = keep ? xd[i] * scale : 0.f;
        }
    }
    dt_node *n = dt_graph_record(g, "dropout", dropout_backward, y, 1, &x);
    if (n) {
        n->saved = mask;
        n->f[0] = scale;
    }
    return y;
}
