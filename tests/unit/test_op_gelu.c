/* dt_op_gelu (tanh approximation): values vs the tanh formula in double over
 * a wide range (incl. large |x|), gradient vs finite differences, on a size
 * that takes the OpenMP path too. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdlib.h>
#include "op_test_util.h"

static dt_tensor *f_gelu(dt_graph *g, dt_param **in, void *ctx) {
    (void)ctx;
    return dt_op_gelu(g, &in[0]->value);
}

static double gelu_ref(double x) {
    return 0.5 * x * (1.0 + tanh(sqrt(2.0 / 3.14159265358979323846) * (x + 0.044715 * x * x * x)));
}

static void test_values(void **state) {
    (void)state;
    int64_t n = 100000, s[1] = {n};
    dt_param x;
    assert_int_equal(dt_param_init(&x, "x", 1, s), DT_OK);
    float *xd = dt_f32(&x.value);
    for (int64_t i = 0; i < n; i++) xd[i] = -30.0f + 60.0f * (float)i / (float)(n - 1);
    dt_graph *g = dt_graph_create();
    dt_tensor *y = dt_op_gelu(g, &x.value);
    opt_assert_shape(y, 1, s);
    double worst = 0;
    for (int64_t i = 0; i < n; i++) {
        double r = gelu_ref(xd[i]);
        worst = fmax(worst, fabs(dt_f32(y)[i] - r) / (1e-6 + fabs(r)));
        assert_false(isnan(dt_f32(y)[i]));
    }
    assert_true(worst < 2e-5);
    assert_float_equal(dt_f32(y)[0], 0.0f, 1e-30);         /* gelu(-30) ~ 0 */
    assert_float_equal(dt_f32(y)[n - 1], 30.0f, 1e-5);     /* gelu(30) ~ 30 */
    dt_graph_free(g);
    dt_param_free(&x);
}

static void test_gradcheck(void **state) {
    (void)state;
    int64_t s[2] = {3, 7};
    dt_param x;
    opt_param(&x, "x", 2, s, 4, 2.0f);
    dt_param *in[1] = {&x};
    assert_int_equal(dt_gradcheck(f_gelu, NULL, in, 1, NULL), 0);
    dt_param_free(&x);
    int64_t big[2] = {200, 300};
    opt_param(&x, "x", 2, big, 5, 3.0f);
    dt_gc_opts o = {.seed = 1, .max_checks = 60};
    assert_int_equal(dt_gradcheck(f_gelu, NULL, in, 1, &o), 0);
    dt_param_free(&x);
}

static void test_bad_input(void **state) {
    (void)state;
    dt_graph *g = dt_graph_create();
    opt_expect_error(dt_op_gelu(g, NULL), "gelu");
    dt_graph_free(g);
}

static void test_input_used_twice(void **state) {
    (void)state;
    int64_t s[2] = {4, 5};
    dt_param x;
    opt_param(&x, "x", 2, s, 91, 1.5f);
    dt_param *in[1] = {&x};
    assert_int_equal(opt_gradcheck_twice(f_gelu, NULL, in, 1), 0);
    dt_param_free(&x);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_values),
        cmocka_unit_test(test_gradcheck),
        cmocka_unit_test(test_input_used_twice),
        cmocka_unit_test(test_bad_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
