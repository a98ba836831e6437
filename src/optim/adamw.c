/* AdamW (PyTorch semantics) on one contiguous range.
 *
 * Single pass: p, g, m, v are each read once and p, m, v written once.
 * Bias corrections are computed in double once per call. Every element goes
 * through the same instruction sequence, so the result does not depend on how
 * a buffer is split into ranges or threads.
 *
 * Why intrinsics: without -fno-math-errno GCC will not vectorise sqrtf (it
 * keeps an errno branch per element), so the x86 path is written by hand. */
#include <math.h>
#include <string.h>
#include "dtrain/optim.h"
#include "bf16_state.h"
#if defined(__AVX__)
#include <immintrin.h>
#endif

#define DT_ADAMW_PAR_MIN 32768  /* serial below this many elements */
#define DT_ADAMW_BLOCK 4096     /* OpenMP work unit; a multiple of the vector width */

typedef struct adamw_k {
    float keep;        /* 1 - lr*wd (1 without decay) */
    float b1, omb1;    /* beta1, 1 - beta1 */
    float b2, omb2;    /* beta2, 1 - beta2 */
    float step_size;   /* lr / (1 - beta1^t) */
    float inv_bc2s;    /* 1 / sqrt(1 - beta2^t) */
    float eps, gs;
} adamw_k;

#if defined(__AVX__)
/* Eight elements. The tail of a block goes through this same code on padded
 * copies, so every element sees identical instructions whatever the
 * compiler's FP-contraction mode. */
static inline void adamw_vec8(const adamw_k *k, float *restrict p, const float *restrict g,
                              float *restrict m, float *restrict v) {
    const __m256 keep = _mm256_set1_ps(k->keep), b1 = _mm256_set1_ps(k->b1),
                 omb1 = _mm256_set1_ps(k->omb1), b2 = _mm256_set1_ps(k->b2),
                 omb2 = _mm256_set1_ps(k->omb2), ss = _mm256_set1_ps(k->step_size),
                 ib = _mm256_set1_ps(k->inv_bc2s), eps = _mm256_set1_ps(k->eps),
                 gs = _mm256_set1_ps(k->gs);
    __m256 gi = _mm256_mul_ps(_mm256_loadu_ps(g), gs);
    __m256 mi = _mm256_add_ps(_mm256_mul_ps(b1, _mm256_loadu_ps(m)), _mm256_mul_ps(omb1, gi));
    __m256 vi = _mm256_add_ps(_mm256_mul_ps(b2, _mm256_loadu_ps(v)),
                              _mm256_mul_ps(omb2, _mm256_mul_ps(gi, gi)));
    __m256 pi = _mm256_mul_ps(_mm256_loadu_ps(p), keep);
    __m256 den = _mm256_add_ps(_mm256_mul_ps(_mm256_sqrt_ps(vi), ib), eps);
    _mm256_storeu_ps(m, mi);
    _mm256_storeu_ps(v, vi);
    _mm256_storeu_ps(p, _mm256_sub_ps(pi, _mm256_div_ps(_mm256_mul_ps(ss, mi), den)));
}

static void adamw_block(const adamw_k *k, float *restrict p, const float *restrict g,
                        float *restrict m, float *restrict v, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) adamw_vec8(k, p + i, g + i, m + i, v + i);
    size_t r = n - i;
    if (r) {   /* zero padding is harmless: 0/(0+eps) = 0 */
        float tp[8] = {0}, tg[8] = {0}, tm[8] = {0}, tv[8] = {0};
        memcpy(tp, p + i, r * sizeof(float));
        memcpy(tg, g + i, r * sizeof(float));
        memcpy(tm, m + i, r * sizeof(float));
        memcpy(tv, v + i, r * sizeof(float));
        adamw_vec8(k, tp, tg, tm, tv);
        memcpy(p + i, tp, r * sizeof(float));
        memcpy(m + i, tm, r * sizeof(float));
        memcpy(v + i, tv, r * sizeof(float));
    }
}
#else
/* Portable path (not vectorised by GCC because of sqrtf's errno). */
static void adamw_block(const adamw_k *k, float *restrict p, const float *restrict g,
                        float *restrict m, float *restrict v, size_t n) {
    for (size_t i = 0; i < n; i++) {
        float gi = g[i] * k->gs;
        float mi = k->b1 * m[i] + k->omb1 * gi;
        float vi = k->b2 * v[i] + k->omb2 * (gi * gi);
        float pi = p[i] * k->keep;
        float den = sqrtf(vi) * k->inv_bc2s + k->eps;
        m[i] = mi;
        v[i] = vi;
        p[i] = pi - (k->step_size * mi) / den;
    }
}
#endif

/* bf16 state: chunks widened into fp32 scratch, stepped by adamw_block (the
 * fp32 path's instructions, so an element's fp32 m and v before rounding are
 * what the fp32 kernel computes from the same inputs), rounded back. */
static void adamw_block_bf16(const adamw_k *k, float *restrict p, const float *restrict g,
                             uint16_t *restrict m16, uint16_t *restrict v16, size_t n) {
    float tm[DT_BF16_STATE_CHUNK], tv[DT_BF16_STATE_CHUNK];
    for (size_t i = 0; i < n; i += DT_BF16_STATE_CHUNK) {
        size_t len = n - i < DT_BF16_STATE_CHUNK ? n - i : DT_BF16_STATE_CHUNK;
        dt_bf16s_widen_n(tm, m16 + i, len);
        dt_bf16s_widen_n(tv, v16 + i, len);
        adamw_block(k, p + i, g + i, tm, tv, len);
        dt_bf16s_round_n(m16 + i, tm, len);
        dt_bf16s_round_n(v16 + i, tv, len);
    }
}

/* The per-call constants (bias corrections in double). */
static adamw_k adamw_consts(const dt_optim_cfg *c, float lr, int decay, int64_t step, float grad_scale) {
    double t = step < 1 ? 1.0 : (double)step;
    double bc1 = 1.0 - pow((double)c->beta1, t);
    double bc2 = 1.0 - pow((double)c->beta2, t);
    adamw_k k = {
        .keep = decay ? (float)(1.0 - (double)lr * (double)c->weight_decay) : 1.0f,
        .b1 = c->beta1, .omb1 = (float)(1.0 - (double)c->beta1),
        .b2 = c->beta2, .omb2 = (float)(1.0 - (double)c->beta2),
        .step_size = (float)((double)lr / bc1),
        .inv_bc2s = (float)(1.0 / sqrt(bc2)),
        .eps = c->eps, .gs = grad_scale,
    };
    return k;
}

/* The range in OpenMP blocks; m and v are float (bf16 = 0) or bfloat16 arrays.
 * step is 1-based; values < 1 are treated as 1. */
static void adamw_range(const dt_optim_cfg *c, float lr, int decay, float *p, const float *g, void *m, void *v,
                        size_t n, int64_t step, float grad_scale, int bf16) {
    if (n == 0) return;
    adamw_k k = adamw_consts(c, lr, decay, step, grad_scale);
    size_t nb = (n + DT_ADAMW_BLOCK - 1) / DT_ADAMW_BLOCK;
    #pragma omp parallel for schedule(static) if (n > DT_ADAMW_PAR_MIN)
    for (size_t b = 0; b < nb; b++) {
        size_t lo = b * DT_ADAMW_BLOCK;
        size_t len = n - lo < DT_ADAMW_BLOCK ? n - lo : DT_ADAMW_BLOCK;
        if (bf16) adamw_block_bf16(&k, p + lo, g + lo, (uint16_t *)m + lo, (uint16_t *)v + lo, len);
        else adamw_block(&k, p + lo, g + lo, (float *)m + lo, (float *)v + lo, len);
    }
}

void dt_adamw_step_range(const dt_optim_cfg *c, float lr, int decay, float *p, const float *g,
                         float *m, float *v, size_t n, int64_t step, float grad_scale) {
    adamw_range(c, lr, decay, p, g, m, v, n, step, grad_scale, 0);
}

void dt_adamw_step_range_bf16(const dt_optim_cfg *c, float lr, int decay, float *p, const float *g,
                              uint16_t *m, uint16_t *v, size_t n, int64_t step, float grad_scale) {
    adamw_range(c, lr, decay, p, g, m, v, n, step, grad_scale, 1);
}
