/* dt_op_softmax: rows sum to 1 and match a double reference (incl. large
 * logits), gradient vs finite differences, bad input. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include "op_test_util.h"

static dt_tensor *f_softmax(dt_graph *g, dt_param **in, void *ctx) {
    (void)ctx;
    return dt_op_softmax(g, &in[0]->value);
}

static void test_values(void **state) {
    (void)state;
    int64_t s[3] = {2, 3, 9};
    dt_param x;
    opt_param(&x, "x", 3, s, 1, 3.0f);
    float *xd = dt_f32(&x.value);
    for (int j = 0; j < 9; j++) xd[9 + j] += 500.0f;   /* overflow without max-shift */
    dt_graph *g = dt_graph_create();
    dt_tensor *y = dt_op_softmax(g, &x.value);
    opt_assert_shape(y, 3, s);
    for (int r = 0; r < 6; r++) {
        double m = -1e300, z = 0, sum = 0;
        for (int j = 0; j < 9; j++) m = fmax(m, xd[r * 9 + j]);
        for (int j = 0; j < 9; j++) z += exp((double)xd[r * 9 + j] - m);
        for (int j = 0; j < 9; j++) {
            double p = exp((double)xd[r * 9 + j] - m) / z;
            assert_float_equal(dt_f32(y)[r * 9 + j], p, 1e-6 + 1e-5 * p);
            sum += dt_f32(y)[r * 9 + j];
        }
        assert_float_equal(sum, 1.0, 1e-5);
    }
    dt_graph_free(g);
    dt_param_free(&x);
}

static void test_gradcheck(void **state) {
    (void)state;
    int64_t s[2] = {4, 7};
    dt_param x;
    opt_param(&x, "x", 2, s, 2, 1.0f);
    dt_param *in[1] = {&x};
    assert_int_equal(dt_gradcheck(f_softmax, NULL, in, 1, NULL), 0);
    dt_param_free(&x);
    int64_t big[2] = {300, 130};
    opt_param(&x, "x", 2, big, 3, 1.0f);
    dt_gc_opts o = {.seed = 4, .max_checks = 60};
    assert_int_equal(dt_gradcheck(f_softmax, NULL, in, 1, &o), 0);
    dt_param_free(&x);
}

static void test_bad_input(void **state) {
    (void)state;
    dt_graph *g = dt_graph_create();
    opt_expect_error(dt_op_softmax(g, NULL), "softmax");
    dt_tensor *sc = dt_graph_tensor(g, 0, NULL);
    opt_expect_error(dt_op_softmax(g, sc), "softmax");
    dt_graph_free(g);
}

static void test_input_used_twice(void **state) {
    (void)state;
    int64_t s[2] = {3, 6};
    dt_param x;
    opt_param(&x, "x", 2, s, 111, 1.0f);
    dt_param *in[1] = {&x};
    assert_int_equal(opt_gradcheck_twice(f_softmax, NULL, in, 1), 0);
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
