/* dt_op_add and dt_op_bias_add: values, gradients (incl. add(a, a) and a
 * 3-D x for bias_add), bad shapes. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include "op_test_util.h"

static dt_tensor *f_add(dt_graph *g, dt_param **in, void *ctx) {
    (void)ctx;
    return dt_op_add(g, &in[0]->value, &in[1]->value);
}
static dt_tensor *f_add_self(dt_graph *g, dt_param **in, void *ctx) {
    (void)ctx;
    return dt_op_add(g, &in[0]->value, &in[0]->value);
}
static dt_tensor *f_bias(dt_graph *g, dt_param **in, void *ctx) {
    (void)ctx;
    return dt_op_bias_add(g, &in[0]->value, &in[1]->value);
}

static void test_add(void **state) {
    (void)state;
    int64_t s[3] = {2, 3, 5};
    dt_param a, b;
    opt_param(&a, "a", 3, s, 1, 1.0f);
    opt_param(&b, "b", 3, s, 2, 1.0f);
    dt_graph *g = dt_graph_create();
    dt_tensor *y = dt_op_add(g, &a.value, &b.value);
    opt_assert_shape(y, 3, s);
    for (int i = 0; i < 30; i++)
        assert_float_equal(dt_f32(y)[i], dt_f32(&a.value)[i] + dt_f32(&b.value)[i], 0.0);
    dt_graph_free(g);
    dt_param *in[2] = {&a, &b};
    assert_int_equal(dt_gradcheck(f_add, NULL, in, 2, NULL), 0);
    assert_int_equal(dt_gradcheck(f_add_self, NULL, in, 1, NULL), 0);   /* da = 2 dy */
    dt_param_free(&a); dt_param_free(&b);
}

static void test_bias_add(void **state) {
    (void)state;
    int64_t xs[3] = {2, 3, 7}, bs[1] = {7};
    dt_param x, b;
    opt_param(&x, "x", 3, xs, 3, 1.0f);
    opt_param(&b, "b", 1, bs, 4, 1.0f);
    dt_graph *g = dt_graph_create();
    dt_tensor *y = dt_op_bias_add(g, &x.value, &b.value);
    opt_assert_shape(y, 3, xs);
    for (int i = 0; i < 42; i++)
        assert_float_equal(dt_f32(y)[i], dt_f32(&x.value)[i] + dt_f32(&b.value)[i % 7], 0.0);
    dt_graph_free(g);
    dt_param *in[2] = {&x, &b};
    assert_int_equal(dt_gradcheck(f_bias, NULL, in, 2, NULL), 0);
    dt_param_free(&x); dt_param_free(&b);
}

/* Big enough for the OpenMP column-sum path (several column blocks). */
static void test_bias_add_large(void **state) {
    (void)state;
    int64_t xs[2] = {300, 200}, bs[1] = {200};
    dt_param x, b;
    opt_param(&x, "x", 2, xs, 5, 1.0f);
    opt_param(&b, "b", 1, bs, 6, 1.0f);
    dt_param *in[2] = {&x, &b};
    dt_gc_opts o = {.seed = 2, .max_checks = 50};
    assert_int_equal(dt_gradcheck(f_bias, NULL, in, 2, &o), 0);
    dt_param_free(&x); dt_param_free(&b);
}

static void test_bad_shapes(void **state) {
    (void)state;
    int64_t s1[2] = {2, 3}, s2[2] = {3, 2}, b4[1] = {4};
    dt_param a, b, c;
    opt_param(&a, "a", 2, s1, 1, 1.0f);
    opt_param(&b, "b", 2, s2, 1, 1.0f);
    opt_param(&c, "c", 1, b4, 1, 1.0f);
    dt_graph *g = dt_graph_create();
    opt_expect_error(dt_op_add(g, &a.value, &b.value), "add");
    opt_expect_error(dt_op_bias_add(g, &a.value, &c.value), "bias_add");
    opt_expect_error(dt_op_bias_add(g, &a.value, &b.value), "bias_add");
    opt_expect_error(dt_op_add(g, NULL, &b.value), "add");
    dt_graph_free(g);
    dt_param_free(&a); dt_param_free(&b); dt_param_free(&c);
}

static void test_inputs_used_twice(void **state) {
    (void)state;
    int64_t xs[2] = {3, 4}, bs[1] = {4};
    dt_param x, b;
    opt_param(&x, "x", 2, xs, 71, 1.0f);
    opt_param(&b, "b", 1, bs, 72, 1.0f);
    dt_param *in[2] = {&x, &b};
    assert_int_equal(opt_gradcheck_twice(f_bias, NULL, in, 2), 0);
    dt_param_free(&x); dt_param_free(&b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_add),
        cmocka_unit_test(test_bias_add),
        cmocka_unit_test(test_bias_add_large),
        cmocka_unit_test(test_inputs_used_twice),
        cmocka_unit_test(test_bad_shapes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
