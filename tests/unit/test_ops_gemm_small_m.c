/* dt_ops_sgemm's small-batch path (src/ops/gemm_small_m.c): which calls the
 * rule takes (M <= 64 rows, K >= 2048, x · Wᵀ, alpha 1, beta 0 or 1; with
 * OpenBLAS's AVX-512 kernels only), and that a call it takes gives bitwise
 * what the direct cblas_sgemm gives, for beta 0 (forward) and 1 (onto a
 * bias), odd sizes and a leading dimension larger than the row. On a machine
 * whose OpenBLAS runs other kernels the path is off and the bitwise checks
 * are skipped (cmocka reports them as skipped). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <cblas.h>
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

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rule),
        cmocka_unit_test(test_bitwise_forward),
        cmocka_unit_test(test_bitwise_accumulate),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
