/* Shared helpers for the dense ops in src/ops: argument checks that format
 * "op: ..." messages, a row-major SGEMM wrapper, OpenMP accumulation loops,
 * a vectorisable exp, GELU, and the linear and LayerNorm kernels the fused
 * ops (linear_gelu.c, add_layernorm.c) share with the plain ones.
 *
 * Threading rule: dt_ops_sgemm may be called from outside a parallel region
 * (the GEMM library then uses every OpenMP thread) or from inside one for
 * deliberately small per-task GEMMs (the OpenMP builds of OpenBLAS and oneDNN
 * both see omp_in_parallel() and run on the calling thread alone). */
#ifndef DT_OPS_INTERNAL_H
#define DT_OPS_INTERNAL_H

#include <float.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include "dtrain/ops.h"

/* Loops over fewer elements than this run on one thread. */
#define DT_OPS_PAR_MIN ((int64_t)1 << 15)

/* "[2, 3]" for messages; the buffer lives until the end of the enclosing
 * full expression's block (compound literal). */
#define DT_OPS_SHAPE(t) dt_shape_str((t), (char[96]){0}, 96)

/* Each check returns 0 when fine; otherwise sets DT_EINVAL with a message
 * starting "op: " and returns -1. */
int dt_ops_check_graph(const char *op, const dt_graph *g);
/* t non-NULL, F32, with storage when numel > 0. */
int dt_ops_check_tensor(const char *op, const char *name, const dt_tensor *t);
/* Every value in dims[0..n) fits a BLAS int (the OpenBLAS here is LP64). */
int dt_ops_check_blas(const char *op, int n, const int64_t *dims);

/* conv2d through oneDNN (conv2d_dnnl.c), for arguments dt_op_conv2d checked.
 * 0: oneDNN does not serve this geometry (or DTRAIN_CONV=im2col): use im2col.
 * 1: handled; *out is the result, or NULL with the error set. */
int dt_conv2d_dnnl(dt_graph *g, dt_tensor *x, dt_tensor *w, dt_tensor *b, int stride, int pad, dt_tensor **out);
/* conv2d's bias gradient, both backends: db[oc] += sum over n, p of
 * dy[n, oc, p] (dy [N, OC, P]), summed in double (conv2d.c) */
void dt_ops_conv2d_bias_grad(float *db, const float *dy, int64_t N, int64_t OC, int64_t P);

/* Row-major C[M, N] = alpha * op(A)[M, K] · op(B)[K, N] + beta * C.
 * ta / tb nonzero: A / B are stored transposed. Zero-sized problems are
 * handled here (OpenBLAS would complain about ld = 0). */
void dt_ops_sgemm(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha,
                  const float *A, int64_t lda, const float *B, int64_t ldb,
                  float beta, float *C, int64_t ldc);
/* gemm_backend.c: dnnl_sgemm with dt_ops_sgemm's arguments; 0 if oneDNN
 * refused them. */
int dt_ops_sgemm_onednn(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                        const float *B, int64_t ldb, float beta, float *C, int64_t ldc);
/* gemm_backend.c: hold asynchronous signals back from the calling thread (old:
 * the mask to restore with pthread_sigmask) and, once, from the OpenMP
 * workers: oneDNN's kernels run with rsp in a heap workspace. */
void dt_ops_hold_signals(sigset_t *old);
/* gemm_bf16.c: C = alpha * op(A)·op(B) + beta * C with A and B rounded to
 * bf16, fp32 accumulation (oneDNN matmul); 0 when oneDNN cannot (C then
 * untouched). _applies: the precision is bf16, bf16 runs here (AMX, or
 * DTRAIN_BF16=force) and the product is large enough to gain. */
int dt_ops_sgemm_bf16(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                      const float *B, int64_t ldb, float beta, float *C, int64_t ldc);
int dt_ops_sgemm_bf16_applies(int64_t M, int64_t N, int64_t K);
/* ops_common.c: dt_ops_sgemm's float32 product, whatever the precision
 * (M, N, K > 0). gemm_rounded.c: the same product of A and B rounded to
 * `to` (DT_F16 or DT_BF16) and widened back (fp32 accumulation): fp16's
 * products, and bf16's where oneDNN has none; 0 when out of scratch memory
 * (C untouched). */
void dt_ops_sgemm_f32(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                      const float *B, int64_t ldb, float beta, float *C, int64_t ldc);
int dt_ops_sgemm_rounded(dt_dtype to, int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                         int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc);
/* gemm_small_m.c: A · Bᵀ on at most 64 rows with K >= 2048 computed as
 * (B · Aᵀ)ᵀ, faster there with OpenBLAS's AVX-512 kernels (bitwise the same)
 * and with oneDNN (measurements in the file). _shape and _kernels are the two halves
 * of the rule (pure), _applies both for the library in use (under oneDNN the
 * shape alone decides; under OpenBLAS it must run AVX-512 kernels); _small_m
 * returns 0 when it could not (no memory for its scratch): then take the
 * direct path. */
int dt_ops_sgemm_small_m_shape(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, float beta);
int dt_ops_sgemm_small_m_kernels(const char *core);
int dt_ops_sgemm_small_m_applies(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, float beta);
int dt_ops_sgemm_small_m(int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, const float *B,
                         int64_t ldb, float beta, float *C, int64_t ldc);

/* dst[i] += src[i], i < n (OpenMP). */
void dt_ops_acc(float *restrict dst, const float *restrict src, int64_t n);
/* db[c] += sum_r dy[r, c] for dy[rows, cols] (OpenMP over column blocks,
 * deterministic: each column is summed by one thread in row order). */
void dt_ops_colsum_acc(float *restrict db, const float *restrict dy, int64_t rows, int64_t cols);

/* Output tensor sharing x's storage with a new shape (no copy); arena struct. */
dt_tensor *dt_ops_view(dt_graph *g, dt_tensor *x, int ndim, const int64_t *shape);

/* ---- linear (linear.c), shared with linear_gelu.c: the same checks and
 * the very same SGEMM calls, so a fused op's GEMMs are dt_op_linear's bits ----
 * dims = {N rows, in, out}. */
/* dt_op_linear's argument checks, messages starting "op: ". 0 and dims, or -1. */
int dt_linear_check(const char *op, const dt_graph *g, const dt_tensor *x, const dt_tensor *w,
                    const dt_tensor *b, dt_wlayout layout, int64_t dims[3]);
/* y[N, out] = x · W (+ b): rows start as b (if any), then one SGEMM adds on top. */
void dt_linear_gemm(float *y, const dt_tensor *x, const dt_tensor *w, const dt_tensor *b, dt_wlayout layout,
                    const int64_t dims[3]);
/* From dy[N, out]: dx[N, in] += dy · W^T, dw += x^T · dy (as laid out); either may be NULL. */
void dt_linear_grad_gemm(const float *dy, const dt_tensor *x, const dt_tensor *w, dt_wlayout layout,
                         const int64_t dims[3], float *dx, float *dw);

/* ---- LayerNorm (layernorm.c), shared with add_layernorm.c ----
 * Both ops run these functions (not copies of their loops), so their
 * reductions are the same machine code and the fused op gives the unfused
 * op's bits whatever order the compiler vectorises the sums in. */
/* One row x[C] -> y[C] = (x - mean) rstd w + b (b may be NULL); its mean and
 * rstd are stored in *mean, *rstd. */
void dt_ln_row_forward(const float *x, const float *w, const float *b, float eps, int64_t C, float *y,
                       float *mean, float *rstd);
/* Backward over x[N, C] (N, C >= 1) given mean[N], rstd[N] and dy[N, C]:
 *   dw, db (either may be NULL) += sum_n dy xhat, sum_n dy (per-thread
 *   partials reduced in thread order: deterministic for a thread count);
 *   the input gradient g = rstd (dy w - mean_c(dy w) - xhat mean_c(dy w xhat))
 *   goes to dx += g (layernorm), or, with dx NULL, as t = ds + g (ds NULL:
 *   0 + g), to da += t and dh += t (add_layernorm: x = a + h, ds the
 *   gradient x's other consumers gave it), row by row: the sum a plain
 *   add's backward would read from x's gradient, never stored. */
typedef struct dt_ln_grads {
    const float *x, *w, *mean, *rstd, *dy;
    int64_t N, C;
    float *dx, *dw, *db;
    const float *ds;
    float *da, *dh;
} dt_ln_grads;
/* 0, or -1 with the error set (out of memory for the partial sums). */
int dt_ln_backward(dt_graph *g, const dt_ln_grads *a);

/* exp(x) for float, vectorisable (no libm call): 2^n * poly(r) with
 * r = x - n ln2 in [-ln2/2, ln2/2]; degree-7 Taylor polynomial, about 2 ulp.
 * Inputs are clamped to [-87, 88] (so exp(-inf) ~ 1.6e-38, not 0); NaN
 * propagates. Meant for softmax-style arguments x - max <= 0. */
static inline float dt_ops_expf(float x) {
    x = x < -87.0f ? -87.0f : x;
    x = x > 88.0f ? 88.0f : x;
    /* round(x / ln2) via the 1.5 * 2^23 trick: t's low mantissa bits hold n */
    float t = fmaf(x, 1.44269504088896341f, 12582912.0f);
    float n = t - 12582912.0f;
    float r = fmaf(n, -0.693359375f, x);          /* ln2 split hi/lo: exact first step */
    r = fmaf(n, 2.12194440e-4f, r);
    float p = 1.0f / 5040.0f;
    p = fmaf(p, r, 1.0f / 720.0f);
    p = fmaf(p, r, 1.0f / 120.0f);
    p = fmaf(p, r, 1.0f / 24.0f);
    p = fmaf(p, r, 1.0f / 6.0f);
    p = fmaf(p, r, 0.5f);
    p = fmaf(p, r, 1.0f);
    p = fmaf(p, r, 1.0f);
    uint32_t tb;
    memcpy(&tb, &t, sizeof tb);
    uint32_t sb = (tb - 0x4B400000u + 127u) << 23;   /* 2^n, n in [-126, 127] */
    float s;
    memcpy(&s, &sb, sizeof s);
    return p * s;
}

/* GELU (tanh approximation) through 0.5 (1 + tanh(u)) = sigmoid(2u), see
 * activation.c. Shared by gelu and linear_gelu so the two give the same bits.
 * The gate s = sigmoid(2u); the exponent is capped at 80 so s stays a normal
 * float (>= 1.8e-35) for very negative x. y = x s. */
#define DT_GELU_K 0.7978845608028654f   /* sqrt(2 / pi) */
#define DT_GELU_A 0.044715f
static inline float dt_ops_gelu_gate(float x) {
    float e = -2.0f * DT_GELU_K * fmaf(DT_GELU_A * x * x, x, x);
    e = e > 80.0f ? 80.0f : e;
    return 1.0f / (1.0f + dt_ops_expf(e));
}
/* dy/dx = s + x s (1 - s) * 2k (1 + 3 * 0.044715 x^2) */
static inline float dt_ops_gelu_slope(float x) {
    float s = dt_ops_gelu_gate(x);
    float du = 2.0f * DT_GELU_K * fmaf(3.0f * DT_GELU_A, x * x, 1.0f);
    return fmaf(x * s * (1.0f - s), du, s);
}

/* y[0..n) = softmax(x[0..n)); y may equal x. n >= 1. *stats (optional)
 * gets the row's max m and inv = 1 / sum exp(x - m): y[j] is then
 * exactly dt_ops_expf(x[j] - m) * inv, which recomputes it bit for bit. */
static inline void dt_ops_softmax_row_stats(float *y, const float *x, int64_t n, float *stats) {
    float m = x[0];
#pragma omp simd reduction(max : m)
    for (int64_t j = 0; j < n; j++) m = x[j] > m ? x[j] : m;
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < n; j++) {
        float e = dt_ops_expf(x[j] - m);
        y[j] = e;
        s += e;
    }
    float inv = 1.0f / s;
#pragma omp simd
    for (int64_t j = 0; j < n; j++) y[j] *= inv;
    if (stats) {
        stats[0] = m;
        stats[1] = inv;
    }
}
static inline void dt_ops_softmax_row(float *y, const float *x, int64_t n) { dt_ops_softmax_row_stats(y, x, n, NULL); }

/* Cross-entropy's rows (cross_entropy.c; vocab_parallel.c, where a rank
 * holds columns [start, start + nv) of V and the row statistics are the
 * group's). Targets: < 0 ignores a row, else < V, or -1 + DT_EINVAL naming
 * op, the row and the logits. Row max over x[0..nv) (-FLT_MAX for nv = 0) and
 * the row's sum of exp(x - m). */
int dt_ops_ce_check_targets(const char *op, const int32_t *t, int64_t N, int64_t V, const dt_tensor *logits);
static inline float dt_ops_row_max(const float *x, int64_t nv) {
    float m = -FLT_MAX;
#pragma omp simd reduction(max : m)
    for (int64_t j = 0; j < nv; j++) m = x[j] > m ? x[j] : m;
    return m;
}
static inline float dt_ops_row_sumexp(const float *x, int64_t nv, float m) {
    float z = 0.0f;
#pragma omp simd reduction(+ : z)
    for (int64_t j = 0; j < nv; j++) z += dt_ops_expf(x[j] - m);
    return z;
}
/* A row's gradient, s = dloss / n_valid, si = s / Z, target column t in the
 * row's own columns (or outside [0, nv): another rank's):
 *   dx_j (+)= si exp(x_j - m) - s [j == t] for j < nv; in place (dx == x,
 *   each element read, then written) the columns [nv, C) become 0. */
static inline void dt_ops_ce_row_grad(float *dx, const float *x, int64_t nv, int64_t C, float m, float si, float s,
                                      int64_t t, int in_place) {
    if (in_place) {
#pragma omp simd
        for (int64_t j = 0; j < nv; j++) dx[j] = si * dt_ops_expf(x[j] - m);
        for (int64_t j = nv; j < C; j++) dx[j] = 0.0f;
    } else {
#pragma omp simd
        for (int64_t j = 0; j < nv; j++) dx[j] += si * dt_ops_expf(x[j] - m);
    }
    if (t >= 0 && t < nv) dx[t] -= s;
}

/* Tensor-parallel collectives of the ops (tp.c): the group is usable
 * (need_max: allreduce_max too), else -1 + DT_EINVAL naming op; buf := the
 * group's sum / max in place (size 1: nothing), errors naming op. */
int dt_ops_tp_check(const char *op, const dt_tp_comm *c, int need_max);
dt_status dt_ops_tp_sum(const dt_tp_comm *c, const char *op, float *buf, int64_t n);
dt_status dt_ops_tp_max(const dt_tp_comm *c, const char *op, float *buf, int64_t n);

#endif
