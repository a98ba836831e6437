/* fp16 matrix products with fp32 accumulation (--precision fp16).
 *
 * dt_sgemm's contract stays float32 in and out; with the precision set to
 * fp16 both inputs are rounded to IEEE half (round to nearest even; beyond
 * ±65504 they become ±inf, small values go subnormal or zero) and back to
 * float32 in scratch buffers, and the fp32 GEMM multiplies those. The
 * product of two halves is exact in float32 (11 + 11 significant bits), so
 * the result is an fp16 product with fp32 accumulation, as autocast's fp16
 * matmul computes, and an overflow shows up as inf / nan in the output
 * (what dynamic loss scaling watches for: strategy.h).
 *
 * Why not fp16 kernels: Debian's oneDNN 2.6.3 has no f16 matmul on CPU
 * (dnnl_primitive_desc_create answers unimplemented, also on an avx512_fp16
 * Xeon), so the numerics are fp16's and the speed fp32's plus two
 * conversions; the start-up line says so. Every product is rounded, whatever
 * its size, so the numerics never depend on the shapes.
 *
 * The conversion uses F16C (8 lanes, round to nearest even by the immediate,
 * whatever MXCSR says) where the CPU has it, else dt_f32_to_f16 /
 * dt_f16_to_f32 (tensor.h, the wire's conversions); both give the same bits
 * (test_ops_gemm_fp16). */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include "ops_internal.h"
#include "tensor/convert_internal.h"

float dt_fp16_round(float f) { return dt_f16_to_f32(dt_f32_to_f16(f)); }

__attribute__((target("avx,f16c"))) static void round_f16c(float *d, const float *s, int64_t n) {
    int64_t c = 0;
    for (; c + 8 <= n; c += 8) {
        __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(s + c), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm256_storeu_ps(d + c, _mm256_cvtph_ps(h));
    }
    for (; c < n; c++) d[c] = dt_fp16_round(s[c]);
}

static void round_soft(float *d, const float *s, int64_t n) {
    for (int64_t c = 0; c < n; c++) d[c] = dt_fp16_round(s[c]);
}

int dt_ops_fp16_hw(void) { return dt_cpu_f16c(); }   /* tensor/convert.c */

void dt_ops_round_fp16(float *dst, const float *src, int64_t rows, int64_t cols, int64_t ld, int hw) {
#pragma omp parallel for schedule(static) if (rows * cols >= DT_OPS_PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        if (hw) round_f16c(dst + r * cols, src + r * ld, cols);
        else round_soft(dst + r * cols, src + r * ld, cols);
    }
}

static _Thread_local float *tl_buf;
static _Thread_local size_t tl_cap;

int dt_ops_sgemm_fp16(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                      const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    int64_t ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
    size_t n = (size_t)(ar * ac + br * bc);
    if (n > tl_cap) {
        float *b = realloc(tl_buf, n * sizeof *b);
        if (!b) return 0;
        tl_buf = b;
        tl_cap = n;
    }
    float *a = tl_buf, *b = tl_buf + ar * ac;
    int hw = dt_ops_fp16_hw();
    dt_ops_round_fp16(a, A, ar, ac, lda, hw);
    dt_ops_round_fp16(b, B, br, bc, ldb, hw);
    dt_ops_sgemm_f32(ta, tb, M, N, K, alpha, a, ac, b, bc, beta, C, ldc);
    return 1;
}
