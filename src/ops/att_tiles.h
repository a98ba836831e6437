/* Register-blocked micro-kernels for attention's products (attention.c).
 *
 * Each computes one output tile of ATT_R rows x ATT_C columns:
 *   att_tile_nn: C[r][c] = sum_k A[r, k] · B[k, c]   (A row-major, stride lda)
 *   att_tile_tn: C[r][c] = sum_k A[k, r] · B[k, c]   (A's ATT_R columns contiguous)
 * B is row-major with stride ldb; C is written (not accumulated) with stride ldc.
 *
 * Invariant, on every instruction set: each C[r][c] is the chain
 *   acc = 0; for k = 0 .. K-1: acc = fma(a_k, b_k, acc)
 * in increasing k, one rounding per step, so the AVX-512, the AVX2 and the
 * portable kernel give the same bits for the same K (finite inputs: which
 * of several NaNs comes out is the instruction's choice). The causal mask's zeros
 * inside a tile add zero terms: leading ones (acc stays +0) change nothing;
 * a trailing one changes nothing either (fma(0, b, acc) == acc for finite b)
 * except a -0 sum, which it turns into +0 (a sum that underflows below zero,
 * or one flushed to zero). A non-finite b makes 0 * b a NaN, so an inf in a
 * row of v, k, q or dy reaches every row of its tile: the sum was non-finite
 * anyway, but within 8 rows now where the 4 x 32 tiles before kept it to 4.
 *
 * Why 8 x 32 with AVX-512: 16 accumulators, two loads of B and eight
 * broadcasts of A per k: enough independent FMAs to cover the FMA latency on
 * CPUs with two 512-bit FMA ports, and fewer loads than FMAs (the 4 x 32
 * tile it replaces re-loaded B for every row: 12 loads per 8 FMAs, load-bound
 * where two FMAs issue per cycle). With AVX2 and FMA (16 ymm registers)
 * the tile runs as four 4 x 16 quarters of 8 accumulators each; plain C
 * there (two 4 x 32 halves, the previous kernel) spilled two accumulators
 * every k. Without AVX2 + FMA the portable kernel runs the two halves.
 * ATT_KERNEL names the kernel this build compiled. */
#ifndef DT_OPS_ATT_TILES_H
#define DT_OPS_ATT_TILES_H

#include <math.h>
#include <stdint.h>
#if defined(__AVX__)
#include <immintrin.h>
#endif

#define ATT_R 8    /* rows per tile */
#define ATT_C 32   /* columns per tile */
_Static_assert(ATT_R == 8, "attention.c packs k and v in blocks of ATT_R rows with att_transpose8");

#if defined(__AVX512F__)
#define ATT_KERNEL "AVX-512"

static inline void att_tile_nn(const float *restrict A, int64_t lda, const float *restrict B, int64_t ldb, int64_t K,
                               float *restrict C, int64_t ldc) {
    __m512 lo[ATT_R], hi[ATT_R];
    for (int r = 0; r < ATT_R; r++) lo[r] = hi[r] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k++) {
        const __m512 b0 = _mm512_loadu_ps(B + k * ldb), b1 = _mm512_loadu_ps(B + k * ldb + 16);
        for (int r = 0; r < ATT_R; r++) {
            const __m512 a = _mm512_set1_ps(A[r * lda + k]);
            lo[r] = _mm512_fmadd_ps(a, b0, lo[r]);
            hi[r] = _mm512_fmadd_ps(a, b1, hi[r]);
        }
    }
    for (int r = 0; r < ATT_R; r++) {
        _mm512_storeu_ps(C + r * ldc, lo[r]);
        _mm512_storeu_ps(C + r * ldc + 16, hi[r]);
    }
}

static inline void att_tile_tn(const float *restrict A, int64_t lda, const float *restrict B, int64_t ldb, int64_t K,
                               float *restrict C, int64_t ldc) {
    __m512 lo[ATT_R], hi[ATT_R];
    for (int r = 0; r < ATT_R; r++) lo[r] = hi[r] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k++) {
        const float *a = A + k * lda;
        const __m512 b0 = _mm512_loadu_ps(B + k * ldb), b1 = _mm512_loadu_ps(B + k * ldb + 16);
        for (int r = 0; r < ATT_R; r++) {
            const __m512 ar = _mm512_set1_ps(a[r]);
            lo[r] = _mm512_fmadd_ps(ar, b0, lo[r]);
            hi[r] = _mm512_fmadd_ps(ar, b1, hi[r]);
        }
    }
    for (int r = 0; r < ATT_R; r++) {
        _mm512_storeu_ps(C + r * ldc, lo[r]);
        _mm512_storeu_ps(C + r * ldc + 16, hi[r]);
    }
}

#elif defined(__AVX2__) && defined(__FMA__)
#define ATT_KERNEL "AVX2"

/* C[4][16] = A[4 rows] x B[K][16]: 8 accumulators, two loads of B and four
 * broadcasts per k in the source (gcc folds the B loads into the FMAs, which
 * Zen's three load ports absorb) -- what fits 16 ymm registers without
 * spilling. A tile is four of them. tn: A's element (r, k) at
 * A[k * lda + r], else at A[r * lda + k]. */
static inline void att_quarter_avx2(int tn, const float *restrict A, int64_t lda, const float *restrict B,
                                    int64_t ldb, int64_t K, float *restrict C, int64_t ldc) {
    __m256 lo[4], hi[4];
    for (int r = 0; r < 4; r++) lo[r] = hi[r] = _mm256_setzero_ps();
    for (int64_t k = 0; k < K; k++) {
        const __m256 b0 = _mm256_loadu_ps(B + k * ldb), b1 = _mm256_loadu_ps(B + k * ldb + 8);
        for (int r = 0; r < 4; r++) {
            const __m256 a = _mm256_broadcast_ss(tn ? A + k * lda + r : A + r * lda + k);
            lo[r] = _mm256_fmadd_ps(a, b0, lo[r]);
            hi[r] = _mm256_fmadd_ps(a, b1, hi[r]);
        }
    }
    for (int r = 0; r < 4; r++) {
        _mm256_storeu_ps(C + r * ldc, lo[r]);
        _mm256_storeu_ps(C + r * ldc + 8, hi[r]);
    }
}

static inline void att_tile_nn(const float *restrict A, int64_t lda, const float *restrict B, int64_t ldb, int64_t K,
                               float *restrict C, int64_t ldc) {
    for (int r0 = 0; r0 < ATT_R; r0 += 4)
        for (int c0 = 0; c0 < ATT_C; c0 += 16)
            att_quarter_avx2(0, A + r0 * lda, lda, B + c0, ldb, K, C + r0 * ldc + c0, ldc);
}

static inline void att_tile_tn(const float *restrict A, int64_t lda, const float *restrict B, int64_t ldb, int64_t K,
                               float *restrict C, int64_t ldc) {
    for (int r0 = 0; r0 < ATT_R; r0 += 4)
        for (int c0 = 0; c0 < ATT_C; c0 += 16)
            att_quarter_avx2(1, A + r0, lda, B + c0, ldb, K, C + r0 * ldc + c0, ldc);
}

#else /* portable: two 4 x 32 halves */
#define ATT_KERNEL "portable C"

enum { ATT_H = ATT_R / 2 };

static inline void att_half_nn(const float *restrict A, int64_t lda, const float *restrict B, int64_t ldb, int64_t K,
                               float *restrict C, int64_t ldc) {
    float acc[ATT_H][ATT_C] = {{0}};
    for (int64_t k = 0; k < K; k++) {
        const float *b = B + k * ldb;
        for (int r = 0; r < ATT_H; r++) {
            float a = A[r * lda + k];
            for (int c = 0; c < ATT_C; c++) acc[r][c] = fmaf(a, b[c], acc[r][c]);
        }
    }
    for (int r = 0; r < ATT_H; r++)
        for (int c = 0; c < ATT_C; c++) C[r * ldc + c] = acc[r][c];
}

static inline void att_half_tn(const float *restrict A, int64_t lda, const float *restrict B, int64_t ldb, int64_t K,
                               float *restrict C, int64_t ldc) {
    float acc[ATT_H][ATT_C] = {{0}};
    for (int64_t k = 0; k < K; k++) {
        const float *a = A + k * lda, *b = B + k * ldb;
        for (int r = 0; r < ATT_H; r++)
            for (int c = 0; c < ATT_C; c++) acc[r][c] = fmaf(a[r], b[c], acc[r][c]);
    }
    for (int r = 0; r < ATT_H; r++)
        for (int c = 0; c < ATT_C; c++) C[r * ldc + c] = acc[r][c];
}

static inline void att_tile_nn(const float *restrict A, int64_t lda, const float *restrict B, int64_t ldb, int64_t K,
                               float *restrict C, int64_t ldc) {
    att_half_nn(A, lda, B, ldb, K, C, ldc);
    att_half_nn(A + ATT_H * lda, lda, B, ldb, K, C + ATT_H * ldc, ldc);
}

static inline void att_tile_tn(const float *restrict A, int64_t lda, const float *restrict B, int64_t ldb, int64_t K,
                               float *restrict C, int64_t ldc) {
    att_half_tn(A, lda, B, ldb, K, C, ldc);
    att_half_tn(A + ATT_H, lda, B, ldb, K, C + ATT_H * ldc, ldc);
}

#endif

/* dst[c][j] = src[j][c] for an 8 x 8 block (strides in floats): a copy, so
 * the same values on every instruction set. With AVX: eight row loads,
 * three shuffle stages, eight row stores, instead of 64 strided scalars. */
static inline void att_transpose8(const float *restrict src, int64_t lds, float *restrict dst, int64_t ldd) {
#if defined(__AVX__)
    __m256 r[8], t[8];
    for (int j = 0; j < 8; j++) r[j] = _mm256_loadu_ps(src + j * lds);
    for (int j = 0; j < 8; j += 2) {
        t[j] = _mm256_unpacklo_ps(r[j], r[j + 1]);       /* a0 b0 a1 b1 | a4 b4 a5 b5 */
        t[j + 1] = _mm256_unpackhi_ps(r[j], r[j + 1]);   /* a2 b2 a3 b3 | a6 b6 a7 b7 */
    }
    for (int j = 0; j < 8; j += 4) {
        r[j] = _mm256_shuffle_ps(t[j], t[j + 2], 0x44);         /* a0 b0 c0 d0 | a4 .. */
        r[j + 1] = _mm256_shuffle_ps(t[j], t[j + 2], 0xEE);     /* a1 b1 c1 d1 | a5 .. */
        r[j + 2] = _mm256_shuffle_ps(t[j + 1], t[j + 3], 0x44); /* a2 .. | a6 .. */
        r[j + 3] = _mm256_shuffle_ps(t[j + 1], t[j + 3], 0xEE); /* a3 .. | a7 .. */
    }
    for (int c = 0; c < 4; c++) {
        _mm256_storeu_ps(dst + c * ldd, _mm256_permute2f128_ps(r[c], r[c + 4], 0x20));
        _mm256_storeu_ps(dst + (c + 4) * ldd, _mm256_permute2f128_ps(r[c], r[c + 4], 0x31));
    }
#else
    for (int c = 0; c < 8; c++)
        for (int j = 0; j < 8; j++) dst[c * ldd + j] = src[j * lds + c];
#endif
}

#endif
