/* dt_op_relu: values, gradient (inputs kept away from the kink), bad input. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include "op_test_util.h"

static dt_tensor *f_relu(dt_graph *g, dt_param **in, void *ctx) {
    (void)ctx;
    return dt_op_relu(g, &in[0]->value);
}

static void test_relu(void **state) {
    (void)state;
    int64_t s[3] = {3, 4, 5};
    dt_param x;
    opt_param(&x, "x", 3, s, 1, 1.0f);
    float *xd = dt_f32(&x.value);
    for (int i = 0; i < 60; i++) xd[i] += xd[i] >= 0 ? 0.1f : -0.1f;   /* |x| >= 0.1 > eps */
    dt_graph *g = dt_graph_create();
    dt_tensor *y = dt_op_relu(g, &x.value);
    opt_assert_shape(y, 3, s);
    int pos = 0;
    for (int i = 0; i < 60; i++) {
        assert_float_equal(dt_f32(y)[i], xd[i] > 0 ? xd[i] : 0.0f, 0.0);
        pos += xd[i] > 0;
    }
    assert_true(pos > 5 && pos < 55);
    dt_graph_free(g);
    dt_param *in[1] = {&x};
    assert_int_equal(dt_gradcheck(f_relu, NULL, in, 1, NULL), 0);
    dt_param_free(&x);
}

static void test_bad_input(void **state) {
    (void)state;
    dt_graph *g = dt_graph_create();
    opt_expect_error(dt_op_relu(g, NULL), "relu");
    dt_tensor t;
    int64_t s[1] = {4};
    uint16_t buf[4] = {0};
    dt_tensor_view(&t, buf, DT_BF16, 1, s);
    opt_expect_error(dt_op_relu(g, &t), "relu");
    dt_graph_free(g);
}

static void test_input_used_twice(void **state) {
    (void)state;
    int64_t s[2] = {4, 5};
    dt_param x;
    opt_param(&x, "x", 2, s, 81, 1.0f);
    float *xd = dt_f32(&x.value);
    for (int i = 0; i < 20; i++) xd[i] += xd[i] >= 0 ? 0.1f : -0.1f;
    dt_param *in[1] = {&x};
    assert_int_equal(opt_gradcheck_twice(f_relu, NULL, in, 1), 0);
    dt_param_free(&x);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_relu),
        cmocka_unit_test(test_input_used_twice),
        cmocka_unit_test(test_bad_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
