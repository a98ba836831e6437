/* Small-batch "x · Wᵀ" (a linear layer's forward, weights [out, in]): on a
 * few rows with a long inner dimension, OpenBLAS 0.3.21 runs C[M, N] =
 * A[M, K] · B[N, K]ᵀ well below its rate, and computing the same product as
 * Cᵀ[N, M] = B · Aᵀ, then transposing it back, is faster. Measured in one
 * run (AMD Zen 4, Cooperlake kernels, 2 threads), GFLOP/s direct / swapped:
 *   M 64,  N 2048, K 2048: 140 / 157      M 32, N 2048, K 2048: 104 / 143
 *   M 64,  N 10,   K 2048:  16 / 27       M 128, N 2048, K 2048: 170 / 154
 *   M 64,  N 2048, K 784:  164 / 78       M 256+ or K <= 1536: direct wins
 * hence the rule below (M <= 64 and K >= 2048). With OpenBLAS's AVX-512
 * kernels (SkylakeX, Cooperlake, SapphireRapids) each element is the same dot
 * product summed over k in the same order either way, so the result is
 * bitwise the same (test_ops_gemm_small_m checks it); the AVX2 and older
 * kernels round some elements differently, and there the swap is slower
 * (AMD Zen 3, Zen kernels, 2 threads, direct / swapped: M 64, N 2048,
 * K 2048: 88 / 60 GFLOP/s; M 32: 64 / 43; only N 10 gains, 14 / 19), so
 * they keep the direct call. oneDNN's direct product is slower still on
 * these shapes (68 GFLOP/s on 64 x 2048 x 2048, same machine), so the rule
 * holds for it too, with x copied out transposed so that oneDNN runs its NN
 * kernel (211 GFLOP/s; its NT one on the swapped shape: 157). No bitwise
 * claim there: all ranks take the same path, which is what equivalence
 * needs. The transposed product (and, for oneDNN, xᵀ) goes through a
 * per-thread scratch buffer kept between calls (M * N floats, plus M * K for
 * oneDNN: 512 KiB each for W3's layers). */
#include <stdlib.h>
#include <strings.h>
#include <cblas.h>
#include "ops_internal.h"

#define SMALL_M_MAX 64
#define SMALL_M_MIN_K 2048
#define TILE 16

static _Thread_local float *scratch;
static _Thread_local size_t scratch_cap;

/* dst[c, r] = src[r, c] for src [rows, cols] (leading dimensions given), in
 * TILE x TILE tiles */
static void transpose(const float *src, int64_t lds, int64_t rows, int64_t cols, float *dst, int64_t ldd) {
    for (int64_t r0 = 0; r0 < rows; r0 += TILE)
        for (int64_t c0 = 0; c0 < cols; c0 += TILE) {
            int64_t r1 = r0 + TILE < rows ? r0 + TILE : rows, c1 = c0 + TILE < cols ? c0 + TILE : cols;
            for (int64_t c = c0; c < c1; c++)
                for (int64_t r = r0; r < r1; r++) dst[c * ldd + r] = src[r * lds + c];
        }
}

int dt_ops_sgemm_small_m_shape(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, float beta) {
    return !ta && tb && M <= SMALL_M_MAX && K >= SMALL_M_MIN_K && N >= 8 && alpha == 1.0f &&
           (beta == 0.0f || beta == 1.0f) && M * N <= INT32_MAX;
}

int dt_ops_sgemm_small_m_kernels(const char *core) {
    static const char *const ok[] = {"SkylakeX", "Cooperlake", "SapphireRapids"};
    for (size_t i = 0; core && i < sizeof ok / sizeof *ok; i++)
        if (!strcasecmp(core, ok[i])) return 1;
    return 0;
}

int dt_ops_sgemm_small_m_applies(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, float beta) {
    return dt_ops_sgemm_small_m_shape(ta, tb, M, N, K, alpha, beta) &&
           (dt_gemm_backend_in_use() == DT_GEMM_ONEDNN || dt_ops_sgemm_small_m_kernels(openblas_get_corename()));
}

int dt_ops_sgemm_small_m(int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, const float *B,
                         int64_t ldb, float beta, float *C, int64_t ldc) {
    int onednn = dt_gemm_backend_in_use() == DT_GEMM_ONEDNN;
    size_t need = (size_t)(M * N) + (onednn ? (size_t)(M * K) : 0);
    if (need > scratch_cap) {
        float *s = realloc(scratch, need * sizeof *s);
        if (!s) return 0;   /* the caller takes the direct path */
        scratch = s;
        scratch_cap = need;
    }
    float *T = scratch;   /* Cᵀ [N, M] */
    /* beta 1: C goes in first, as the direct call accumulates each K block
     * onto it (adding it afterwards would round differently) */
    if (beta != 0.0f) transpose(C, ldc, M, N, T, M);
    int done = 0;
    if (onednn) {   /* Cᵀ = B · (Aᵀ), Aᵀ copied out: oneDNN's NN product (211 GFLOP/s) beats its NT (157) */
        float *AT = scratch + M * N;   /* [K, M] */
        transpose(A, lda, M, K, AT, M);
        done = dt_ops_sgemm_onednn(0, 0, N, M, K, 1.0f, B, ldb, AT, M, beta, T, M);
    }
    if (!done)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)N, (int)M, (int)K, 1.0f, B, (int)ldb, A, (int)lda,
                    beta, T, (int)M);
    transpose(T, M, N, M, C, ldc);
    return 1;
}
