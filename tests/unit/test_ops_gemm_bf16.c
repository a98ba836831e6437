/* --precision bf16 (ops.h): the matrix product of bf16-rounded inputs with
 * fp32 accumulation. Rounding is checked against values worked out from the
 * bfloat16 format (8 significant bits, round to nearest even); the product
 * against a double-precision sum over the rounded inputs, for both operand
 * layouts, alpha and beta, and padded leading dimensions. Where oneDNN has no
 * bf16 kernels (CPUs below AVX-512) the same checks hold for the emulation
 * (bf16-rounded inputs into the fp32 GEMM). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include "ops/ops_internal.h"

static void test_rounding(void **st) {
    (void)st;
    assert_true(dt_bf16_round(1.0f) == 1.0f);
    assert_true(dt_bf16_round(-2.5f) == -2.5f);                 /* exact in 8 bits */
    assert_true(dt_bf16_round(1.0f + 0x1p-8f) == 1.0f);        /* halfway, 1.0 is even */
    assert_true(dt_bf16_round(1.0f + 3 * 0x1p-8f) == 1.0f + 0x1p-6f);   /* halfway, up to the even one */
    assert_true(dt_bf16_round(1.0f + 0x1p-8f + 0x1p-20f) == 1.0f + 0x1p-7f);   /* past halfway: up */
    assert_true(dt_bf16_round(0x1.fffffep127f) == INFINITY);   /* FLT_MAX rounds past bf16's largest */
    assert_true(isnan(dt_bf16_round(NAN)));
}

/* C = alpha * op(A)·op(B) + beta * C0 over the bf16-rounded inputs, in double */
static void reference(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
                      int ldb, float beta, const float *C0, int ldc, double *ref, double *mag, double *exact) {
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            double s = 0, a = 0, x = 0;
            for (int k = 0; k < K; k++) {
                float av = ta ? A[k * lda + m] : A[m * lda + k], bv = tb ? B[n * ldb + k] : B[k * ldb + n];
                double p = (double)dt_bf16_round(av) * dt_bf16_round(bv);
                s += p;
                a += fabs(p);
                x += (double)av * bv;
            }
            ref[m * N + n] = alpha * s + beta * C0[m * ldc + n];
            mag[m * N + n] = fabs(alpha) * a + fabs(beta * C0[m * ldc + n]);
            exact[m * N + n] = alpha * x + beta * C0[m * ldc + n];
        }
}

static void test_products(void **st) {
    (void)st;
    const int M = 70, N = 90, K = 130, pad = 3;
    float *A = malloc(sizeof(float) * (K + pad) * (M + pad)), *B = malloc(sizeof(float) * (K + pad) * (N + pad));
    float *C = malloc(sizeof(float) * M * (N + pad)), *C0 = malloc(sizeof(float) * M * (N + pad));
    double *ref = malloc(sizeof(double) * M * N), *mag = malloc(sizeof(double) * M * N), *ex = malloc(sizeof(double) * M * N);
    assert_non_null(A); assert_non_null(B); assert_non_null(C); assert_non_null(C0);
    assert_non_null(ref); assert_non_null(mag); assert_non_null(ex);
    for (int i = 0; i < (K + pad) * (M + pad); i++) A[i] = sinf(0.37f * (float)i) * 1.7f;   /* not bf16 values */
    for (int i = 0; i < (K + pad) * (N + pad); i++) B[i] = cosf(0.11f * (float)i) - 0.3f;
    for (int i = 0; i < M * (N + pad); i++) C0[i] = 0.25f * (float)(i % 7) - 0.5f;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++)
            for (int bi = 0; bi < 2; bi++) {
                float alpha = bi ? 0.5f : 1.0f, beta = bi ? 1.0f : 0.0f;
                int lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
                for (int i = 0; i < M * ldc; i++) C[i] = C0[i];
                assert_true(dt_ops_sgemm_bf16(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc));
                reference(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C0, ldc, ref, mag, ex);
                double far = 0;
                for (int m = 0; m < M; m++)
                    for (int n = 0; n < N; n++) {
                        double got = C[m * ldc + n], want = ref[m * N + n];
                        /* fp32 accumulation of exact bf16 products: a few float ulps of the magnitude */
                        if (fabs(got - want) > 1e-5 * mag[m * N + n] + 1e-30) {
                            fprintf(stderr, "ta %d tb %d alpha %g beta %g: C[%d,%d] = %.9g, want %.9g\n", ta, tb,
                                    alpha, beta, m, n, got, want);
                            fail();
                        }
                        double d = fabs(got - ex[m * N + n]) / (mag[m * N + n] + 1e-30);
                        far = d > far ? d : far;
                    }
                /* the inputs were rounded: the unrounded product is measurably away */
                assert_true(far > 1e-4);
                /* padding columns of C untouched */
                for (int m = 0; m < M; m++)
                    for (int n = N; n < ldc; n++) assert_true(C[m * ldc + n] == C0[m * ldc + n]);
            }
    free(A); free(B); free(C); free(C0); free(ref); free(mag); free(ex);
}

/* dt_sgemm follows the precision: fp32 by default, bf16 when set (forced
 * here, DTRAIN_BF16=force, so every CPU runs it), and small products stay
 * fp32 */
static void test_dispatch(void **st) {
    (void)st;
    const int M = 64, N = 64, K = 128;
    float *A = malloc(sizeof(float) * M * K), *B = malloc(sizeof(float) * K * N);
    float *c32 = calloc((size_t)M * N, sizeof(float)), *c16 = calloc((size_t)M * N, sizeof(float)),
          *cref = calloc((size_t)M * N, sizeof(float));
    assert_non_null(A); assert_non_null(B); assert_non_null(c32); assert_non_null(c16); assert_non_null(cref);
    for (int i = 0; i < M * K; i++) A[i] = sinf(0.3f * (float)i);
    for (int i = 0; i < K * N; i++) B[i] = cosf(0.7f * (float)i);
    assert_int_equal(dt_gemm_precision(), DT_PREC_FP32);
    assert_int_equal(dt_gemm_bf16_active(), 0);
    dt_sgemm(0, 0, M, N, K, 1.0f, A, K, B, N, 0.0f, c32, N);
    assert_int_equal(dt_gemm_set_precision(DT_PREC_BF16), DT_OK);
    assert_true(dt_gemm_bf16_active());   /* forced: by oneDNN or emulated, on every CPU */
    {
        dt_sgemm(0, 0, M, N, K, 1.0f, A, K, B, N, 0.0f, c16, N);
        assert_true(dt_ops_sgemm_bf16(0, 0, M, N, K, 1.0f, A, K, B, N, 0.0f, cref, N));
        assert_memory_equal(c16, cref, sizeof(float) * M * N);   /* the bf16 path ran */
        assert_memory_not_equal(c16, c32, sizeof(float) * M * N);
        /* a product below the threshold (2^18 multiply-adds) stays fp32 */
        float *s32 = calloc(64, sizeof(float)), *s16 = calloc(64, sizeof(float));
        assert_non_null(s32); assert_non_null(s16);
        dt_gemm_set_precision(DT_PREC_FP32);
        dt_sgemm(0, 0, 8, 8, 16, 1.0f, A, K, B, N, 0.0f, s32, 8);
        dt_gemm_set_precision(DT_PREC_BF16);
        dt_sgemm(0, 0, 8, 8, 16, 1.0f, A, K, B, N, 0.0f, s16, 8);
        assert_memory_equal(s16, s32, sizeof(float) * 64);
        free(s32); free(s16);
    }
    assert_int_equal(dt_gemm_set_precision((dt_precision)7), DT_EINVAL);
    dt_error_clear();
    dt_gemm_set_precision(DT_PREC_FP32);
    free(A); free(B); free(c32); free(c16); free(cref);
}

int main(void) {
    /* read once, at the first bf16 question (test_products asks first): set
     * here, or the dispatch test would see it unset */
    setenv("DTRAIN_BF16", "force", 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rounding),
        cmocka_unit_test(test_products),
        cmocka_unit_test(test_dispatch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
