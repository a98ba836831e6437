/* dt_op_matmul: 2-D and batched 3-D forward vs naive, gradients vs finite
 * differences, a batched case big enough for the batch-parallel path, bad shapes. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdlib.h>
#include "op_test_util.h"

static dt_tensor *f_matmul(dt_graph *g, dt_param **in, void *ctx) {
    (void)ctx;
    return dt_op_matmul(g, &in[0]->value, &in[1]->value);
}

static void check(int64_t Bt, int64_t M, int64_t K, int64_t N, int batched, int max_checks) {
    int64_t as[3] = {Bt, M, K}, bs[3] = {Bt, K, N};
    dt_param a, b;
    opt_param(&a, "a", batched ? 3 : 2, batched ? as : as + 1, 1 + (uint64_t)M, 1.0f);
    opt_param(&b, "b", batched ? 3 : 2, batched ? bs : bs + 1, 2 + (uint64_t)N, 1.0f);
    dt_graph *g = dt_graph_create();
    dt_tensor *c = dt_op_matmul(g, &a.value, &b.value);
    int64_t cs[3] = {Bt, M, N};
    opt_assert_shape(c, batched ? 3 : 2, batched ? cs : cs + 1);
    double *ref = malloc((size_t)(Bt * M * N) * sizeof *ref);
    const float *ad = dt_f32(&a.value), *bd = dt_f32(&b.value);
    for (int64_t t = 0; t < Bt; t++)
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) {
                double s = 0;
                for (int64_t k = 0; k < K; k++) s += (double)ad[(t * M + i) * K + k] * bd[(t * K + k) * N + j];
                ref[(t * M + i) * N + j] = s;
            }
    assert_true(opt_max_diff(dt_f32(c), ref, Bt * M * N) < 1e-4);
    free(ref);
    dt_graph_free(g);
    dt_param *in[2] = {&a, &b};
    dt_gc_opts o = {.seed = 3, .max_checks = max_checks};
    assert_int_equal(dt_gradcheck(f_matmul, NULL, in, 2, &o), 0);
    dt_param_free(&a); dt_param_free(&b);
}

static void test_2d(void **state) {
    (void)state;
    check(1, 3, 5, 4, 0, 0);
    check(1, 1, 1, 1, 0, 0);
}

static void test_batched(void **state) {
    (void)state;
    check(2, 3, 4, 5, 1, 0);
    check(5, 8, 3, 6, 1, 40);     /* several small slices: batch-parallel path */
    check(2, 70, 90, 80, 1, 40);  /* large slices: threaded SGEMM per slice */
}

static void test_bad_shapes(void **state) {
    (void)state;
    int64_t s23[2] = {2, 3}, s43[2] = {4, 3}, s234[3] = {2, 3, 4}, s345[3] = {3, 4, 5};
    dt_param a, b, c, d;
    opt_param(&a, "a", 2, s23, 1, 1.0f);
    opt_param(&b, "b", 2, s43, 1, 1.0f);
    opt_param(&c, "c", 3, s234, 1, 1.0f);
    opt_param(&d, "d", 3, s345, 1, 1.0f);
    dt_graph *g = dt_graph_create();
    opt_expect_error(dt_op_matmul(g, &a.value, &b.value), "matmul");   /* K 3 vs 4 */
    opt_expect_error(dt_op_matmul(g, &a.value, &c.value), "matmul");   /* 2-D x 3-D */
    opt_expect_error(dt_op_matmul(g, &c.value, &d.value), "matmul");   /* batch 2 vs 3 */
    opt_expect_error(dt_op_matmul(g, &a.value, NULL), "matmul");
    dt_graph_free(g);
    dt_param_free(&a); dt_param_free(&b); dt_param_free(&c); dt_param_free(&d);
}

static void test_inputs_used_twice(void **state) {
    (void)state;
    int64_t as[3] = {3, 2, 4}, bs[3] = {3, 4, 5};
    dt_param a, b;
    opt_param(&a, "a", 3, as, 61, 1.0f);
    opt_param(&b, "b", 3, bs, 62, 1.0f);
    dt_param *in[2] = {&a, &b};
    assert_int_equal(opt_gradcheck_twice(f_matmul, NULL, in, 2), 0);
    dt_param_free(&a); dt_param_free(&b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_2d),
        cmocka_unit_test(test_batched),
        cmocka_unit_test(test_inputs_used_twice),
        cmocka_unit_test(test_bad_shapes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
