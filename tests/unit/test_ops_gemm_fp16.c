/* --precision fp16 (ops.h): matrix products of inputs rounded to IEEE half
 * with fp32 accumulation. The rounding is checked against values worked out
 * from the format (11 significant bits, round to nearest even, largest finite
 * 65504, subnormals down to 2^-24); dt_sgemm at fp16 is the fp32 product of
 * the rounded inputs (rounded by dt_round_to, whose F16C and scalar paths
 * give the same bits: test_tensor_convert), and an input beyond the half
 * range makes the product not finite (what loss scaling watches for). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ops/ops_internal.h"

static void test_rounding(void **st) {
    (void)st;
    assert_true(dt_fp16_round(65504.0f) == 65504.0f);                 /* the largest half */
    assert_true(dt_fp16_round(65519.0f) == 65504.0f);                 /* below halfway to 2^16 */
    assert_true(dt_fp16_round(65520.0f) == INFINITY);                 /* halfway: rounds to even, past the range */
    assert_true(dt_fp16_round(-65520.0f) == -INFINITY);
    assert_true(dt_fp16_round(1e30f) == INFINITY);
    assert_true(dt_fp16_round(1.0f + 0x1p-11f) == 1.0f);              /* halfway, 1.0 is even */
    assert_true(dt_fp16_round(1.0f + 3 * 0x1p-11f) == 1.0f + 0x1p-9f);   /* halfway, up to the even one */
    assert_true(dt_fp16_round(1.0f + 0x1p-11f + 0x1p-20f) == 1.0f + 0x1p-10f);   /* past halfway: up */
    assert_true(dt_fp16_round(0x1p-14f) == 0x1p-14f);                 /* smallest normal */
    assert_true(dt_fp16_round(1023 * 0x1p-24f) == 1023 * 0x1p-24f);   /* largest subnormal */
    assert_true(dt_fp16_round(0x1p-24f) == 0x1p-24f);                 /* smallest subnormal */
    assert_true(dt_fp16_round(0x1p-25f) == 0.0f);                     /* halfway to 2^-24: to even, zero */
    assert_true(dt_fp16_round(3 * 0x1p-25f) == 0x1p-23f);             /* 1.5 units: to even, 2 units */
    assert_true(dt_fp16_round(0x1p-25f + 0x1p-30f) == 0x1p-24f);      /* past halfway: up */
    assert_true(dt_fp16_round(-0x1p-26f) == 0.0f && signbit(dt_fp16_round(-0x1p-26f)));
    assert_true(isnan(dt_fp16_round(NAN)));
}

/* dt_sgemm at fp16 == the fp32 product of the rounded, compacted inputs,
 * both layouts, alpha / beta, padded leading dimensions */
static void test_products(void **st) {
    (void)st;
    const int M = 37, N = 29, K = 53, pad = 3;
    float *A = malloc(sizeof(float) * (K + pad) * (M + pad)), *B = malloc(sizeof(float) * (K + pad) * (N + pad));
    float *Ar = malloc(sizeof(float) * K * M), *Br = malloc(sizeof(float) * K * N);
    float *C = malloc(sizeof(float) * M * (N + pad)), *R = malloc(sizeof(float) * M * (N + pad));
    assert_non_null(A); assert_non_null(B); assert_non_null(Ar); assert_non_null(Br); assert_non_null(C); assert_non_null(R);
    for (int i = 0; i < (K + pad) * (M + pad); i++) A[i] = sinf(0.37f * (float)i) * 1.7f;
    for (int i = 0; i < (K + pad) * (N + pad); i++) B[i] = cosf(0.11f * (float)i) * 3.1f;
    assert_int_equal(dt_gemm_set_precision(DT_PREC_FP16), DT_OK);
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            int64_t lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
            int64_t ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
            for (int64_t r = 0; r < ar; r++)
                for (int64_t c = 0; c < ac; c++) Ar[r * ac + c] = dt_fp16_round(A[r * lda + c]);
            for (int64_t r = 0; r < br; r++)
                for (int64_t c = 0; c < bc; c++) Br[r * bc + c] = dt_fp16_round(B[r * ldb + c]);
            for (int i = 0; i < M * (N + pad); i++) C[i] = R[i] = 0.25f * (float)(i % 7);
            dt_sgemm(ta, tb, M, N, K, 0.5f, A, lda, B, ldb, 2.0f, C, ldc);
            dt_ops_sgemm_f32(ta, tb, M, N, K, 0.5f, Ar, ac, Br, bc, 2.0f, R, ldc);
            assert_memory_equal(C, R, sizeof(float) * M * (N + pad));
        }
    /* beyond the half range: the product is not finite */
    A[0] = 70000.0f;
    dt_sgemm(0, 0, 1, 1, 1, 1.0f, A, 1, B, 1, 0.0f, C, 1);
    assert_false(isfinite(C[0]));
    assert_int_equal(dt_gemm_set_precision(DT_PREC_FP32), DT_OK);   /* fp32: finite */
    dt_sgemm(0, 0, 1, 1, 1, 1.0f, A, 1, B, 1, 0.0f, C, 1);
    assert_true(isfinite(C[0]));
    free(A); free(B); free(Ar); free(Br); free(C); free(R);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rounding),
        cmocka_unit_test(test_products),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
