/* Matrix products of inputs rounded to 16 bits, multiplied by the fp32 GEMM:
 * every product under --precision fp16, and bf16's where oneDNN has no bf16
 * kernels (DTRAIN_BF16=force below AVX-512, gemm_bf16.c).
 *
 * dt_sgemm's contract stays float32 in and out. Both inputs are rounded to
 * the 16-bit type (round to nearest even; fp16: beyond ±65504 they become
 * ±inf, small values go subnormal or zero) and widened back to float32 into
 * a compact per-thread scratch, and the fp32 GEMM multiplies those. The
 * product of two 16-bit values is exact in float32 (11 + 11 or 8 + 8
 * significant bits), so the result is a 16-bit product with fp32
 * accumulation, as autocast's matmul computes; only the order of the
 * additions may differ from a 16-bit kernel. An fp16 overflow shows up as
 * inf / nan in the output (what dynamic loss scaling watches for:
 * strategy.h).
 *
 * Why not fp16 kernels: Debian's oneDNN 2.6.3 has no f16 matmul on CPU
 * (dnnl_primitive_desc_create answers unimplemented, also on an avx512_fp16
 * Xeon), so the numerics are fp16's and the speed fp32's plus two
 * conversions; the start-up line says so. Every fp16 product is rounded,
 * whatever its size, so the numerics never depend on the shapes.
 *
 * The rounding is dt_round_to's (tensor.h): F16C for fp16 where the CPU has
 * it, else the scalar conversion, the same bits (test_tensor_convert). */
#include <stdint.h>
#include <stdlib.h>
#include "ops_internal.h"
#include "tensor/convert_internal.h"

float dt_fp16_round(float f) { return dt_f16_to_f32(dt_f32_to_f16(f)); }

/* rows x cols of src (leading dimension ld) rounded to `to`, compact in dst */
static void round_rows(float *dst, const float *src, int64_t rows, int64_t cols, int64_t ld, dt_dtype to) {
    if (ld == cols) {   /* one run, split over the threads by dt_round_to */
        dt_round_to(dst, src, to, (size_t)(rows * cols));
        return;
    }
#pragma omp parallel for schedule(static) if (rows * cols >= DT_OPS_PAR_MIN)
    for (int64_t r = 0; r < rows; r++) dt_round_to(dst + r * cols, src + r * ld, to, (size_t)cols);
}

static _Thread_local float *tl_buf;
static _Thread_local size_t tl_cap;

int dt_ops_sgemm_rounded(dt_dtype to, int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                         int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    int64_t ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
    size_t n = (size_t)(ar * ac + br * bc);
    if (n > tl_cap) {
        float *b = realloc(tl_buf, n * sizeof *b);
        if (!b) return 0;
        tl_buf = b;
        tl_cap = n;
    }
    float *a = tl_buf, *b = tl_buf + ar * ac;
    round_rows(a, A, ar, ac, lda, to);
    round_rows(b, B, br, bc, ldb, to);
    dt_ops_sgemm_f32(ta, tb, M, N, K, alpha, a, ac, b, bc, beta, C, ldc);
    return 1;
}
