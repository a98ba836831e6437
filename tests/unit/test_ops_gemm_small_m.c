/* dt_ops_sgemm's small-batch path (src/ops/gemm_small_m.c): which calls the
 * rule takes (M <= 64 rows, K >= 2048, x · Wᵀ, alpha 1, beta 0 or 1; with
 * OpenBLAS's AVX-512 kernels or with oneDNN), and that with OpenBLAS a call it
 * takes gives bitwise what the direct cblas_sgemm gives, for beta 0 (forward)
 * and 1 (onto a bias), odd sizes and a leading dimension larger than the row.
 * On a machine whose OpenBLAS runs other kernels the path is off there and
 * the bitwise checks are skipped (cmocka reports them as skipped). With
 * oneDNN the path is taken on any CPU and checked against a double-precision
 * product. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "ops/ops_internal.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float urand(void) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)(rng >> 40) / (float)(1u << 24) - 0.5f;
}

static void test_rule(void **st) {
    (void)st;
    static const struct { int ta, tb; int64_t M, N, K; float alpha, beta; int want; } c[] = {
        {0, 1, 64, 2048, 2048, 1.f, 0.f, 1},  {0, 1, 1, 8, 2048, 1.f, 1.f, 1},
        {0, 1, 65, 2048, 2048, 1.f, 0.f, 0},  /* more rows: direct measured faster */
        {0, 1, 64, 2048, 2047, 1.f, 0.f, 0},  /* shorter K (784: direct twice as fast) */
        {0, 1, 64, 7, 2048, 1.f, 0.f, 0},     /* too narrow to matter */
        {0, 0, 64, 2048, 2048, 1.f, 0.f, 0},  /* NN: already fast */
        {1, 1, 64, 2048, 2048, 1.f, 0.f, 0},
        {0, 1, 64, 2048, 2048, 2.f, 0.f, 0},  /* alpha != 1 */
        {0, 1, 64, 2048, 2048, 1.f, 0.5f, 0}, /* beta other than 0 / 1 */
    };
    for (size_t i = 0; i < sizeof c / sizeof *c; i++)
        assert_int_equal(dt_ops_sgemm_small_m_shape(c[i].ta, c[i].tb, c[i].M, c[i].N, c[i].K, c[i].alpha, c[i].beta),
                         c[i].want);
    assert_true(dt_ops_sgemm_small_m_kernels("SkylakeX"));
    assert_true(dt_ops_sgemm_small_m_kernels("cooperlake"));
    assert_false(dt_ops_sgemm_small_m_kernels("Haswell"));   /* rounds differently there */
    assert_false(dt_ops_sgemm_small_m_kernels("Zen"));
    assert_false(dt_ops_sgemm_small_m_kernels("Prescott"));
    assert_false(dt_ops_sgemm_small_m_kernels(NULL));
}

static int path_on(void) { return dt_ops_sgemm_small_m_kernels(openblas_get_corename()); }

static void check_shape(int64_t M, int64_t N, int64_t K, int64_t ldc, float beta) {
    float *A = malloc((size_t)(M * K) * sizeof *A), *B = malloc((size_t)(N * K) * sizeof *B);
    float *C = malloc((size_t)(M * ldc) * sizeof *C), *D = malloc((size_t)(M * ldc) * sizeof *D);
    for (int64_t i = 0; i < M * K; i++) A[i] = urand();
    for (int64_t i = 0; i < N * K; i++) B[i] = urand();
    for (int64_t i = 0; i < M * ldc; i++) C[i] = D[i] = urand();
    assert_true(dt_ops_sgemm_small_m_applies(0, 1, M, N, K, 1.0f, beta));
    dt_ops_sgemm(0, 1, M, N, K, 1.0f, A, K, B, K, beta, C, ldc);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)M, (int)N, (int)K, 1.0f, A, (int)K, B, (int)K, beta, D,
                (int)ldc);
    assert_memory_equal(C, D, (size_t)(M * ldc) * sizeof *C);   /* (the columns past N untouched in both) */
    free(A); free(B); free(C); free(D);
}

static void test_bitwise_forward(void **st) {
    (void)st;
    if (!path_on()) skip();
    check_shape(64, 2048, 2048, 2048, 0.0f);   /* W3's hidden layers */
    check_shape(64, 10, 2048, 10, 0.0f);       /* its head */
    check_shape(37, 129, 2051, 131, 0.0f);     /* odd sizes, ldc > N */
    check_shape(1, 8, 4096, 8, 0.0f);
}

static void test_bitwise_accumulate(void **st) {
    (void)st;
    if (!path_on()) skip();
    check_shape(64, 2048, 2048, 2048, 1.0f);
    check_shape(17, 33, 2048, 40, 1.0f);
}

/* oneDNN: the rule takes the shape whatever OpenBLAS's kernels, and the
 * swapped product is the product (to float rounding of a K-term sum). */
static void test_onednn(void **st) {
    (void)st;
    assert_int_equal(dt_gemm_set_backend("onednn"), DT_OK);
    assert_true(dt_ops_sgemm_small_m_applies(0, 1, 64, 2048, 2048, 1.0f, 0.0f));
    assert_false(dt_ops_sgemm_small_m_applies(0, 1, 65, 2048, 2048, 1.0f, 0.0f));
    const int64_t M = 37, N = 129, K = 2051, ldc = 131;
    for (int bi = 0; bi < 2; bi++) {
        float beta = (float)bi;
        float *A = malloc((size_t)(M * K) * sizeof *A), *B = malloc((size_t)(N * K) * sizeof *B);
        float *C = malloc((size_t)(M * ldc) * sizeof *C), *C0 = malloc((size_t)(M * ldc) * sizeof *C0);
        for (int64_t i = 0; i < M * K; i++) A[i] = urand();
        for (int64_t i = 0; i < N * K; i++) B[i] = urand();
        for (int64_t i = 0; i < M * ldc; i++) C[i] = C0[i] = urand();
        dt_ops_sgemm(0, 1, M, N, K, 1.0f, A, K, B, K, beta, C, ldc);
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < ldc; j++) {
                if (j >= N) { assert_true(C[i * ldc + j] == C0[i * ldc + j]); continue; }   /* untouched */
                double ref = beta * (double)C0[i * ldc + j], mag = fabs(ref);
                for (int64_t k = 0; k < K; k++) {
                    ref += (double)A[i * K + k] * B[j * K + k];
                    mag += fabs((double)A[i * K + k] * B[j * K + k]);
                }
                if (fabs(C[i * ldc + j] - ref) > 2e-5 * mag + 1e-6)
                    fail_msg("beta %g C[%lld, %lld] = %g, want %g", beta, (long long)i, (long long)j, C[i * ldc + j], ref);
            }
        free(A); free(B); free(C); free(C0);
    }
    assert_int_equal(dt_gemm_set_backend("openblas"), DT_OK);
}

int main(void) {
    /* the bitwise checks compare with cblas_sgemm: hold dt_ops_sgemm to OpenBLAS */
    if (dt_gemm_set_backend("openblas") != DT_OK) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rule),
        cmocka_unit_test(test_bitwise_forward),
        cmocka_unit_test(test_bitwise_accumulate),
        cmocka_unit_test(test_onednn),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
