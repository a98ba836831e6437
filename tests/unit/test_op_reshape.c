/* dt_op_reshape / dt_op_flatten: shapes (incl. -1), storage shared without a
 * copy, gradients flow back unchanged, bad shapes. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include "op_test_util.h"

static dt_tensor *f_reshape(dt_graph *g, dt_param **in, void *ctx) {
    (void)ctx;
    /* reshape then an op that mixes elements, so order matters */
    dt_tensor *r = dt_op_reshape(g, &in[0]->value, 2, (int64_t[]){4, 6});
    return r ? dt_op_softmax(g, r) : NULL;
}
static dt_tensor *f_flatten(dt_graph *g, dt_param **in, void *ctx) {
    (void)ctx;
    dt_tensor *r = dt_op_flatten(g, &in[0]->value);
    return r ? dt_op_softmax(g, r) : NULL;
}

static void test_shapes_and_view(void **state) {
    (void)state;
    int64_t s[3] = {2, 3, 4};
    dt_param x;
    opt_param(&x, "x", 3, s, 1, 1.0f);
    dt_graph *g = dt_graph_create();
    dt_tensor *r = dt_op_reshape(g, &x.value, 2, (int64_t[]){6, 4});
    opt_assert_shape(r, 2, (int64_t[]){6, 4});
    assert_ptr_equal(r->data, x.value.data);
    r = dt_op_reshape(g, &x.value, 3, (int64_t[]){4, -1, 2});
    opt_assert_shape(r, 3, (int64_t[]){4, 3, 2});
    r = dt_op_flatten(g, &x.value);
    opt_assert_shape(r, 2, (int64_t[]){2, 12});
    assert_ptr_equal(r->data, x.value.data);
    dt_graph_free(g);
    dt_param_free(&x);
}

static void test_gradcheck(void **state) {
    (void)state;
    int64_t s[3] = {2, 3, 4};
    dt_param x;
    opt_param(&x, "x", 3, s, 2, 1.0f);
    dt_param *in[1] = {&x};
    assert_int_equal(dt_gradcheck(f_reshape, NULL, in, 1, NULL), 0);
    assert_int_equal(dt_gradcheck(f_flatten, NULL, in, 1, NULL), 0);
    dt_param_free(&x);
}

static void test_bad_shapes(void **state) {
    (void)state;
    int64_t s[2] = {2, 3};
    dt_param x;
    opt_param(&x, "x", 2, s, 3, 1.0f);
    dt_graph *g = dt_graph_create();
    opt_expect_error(dt_op_reshape(g, &x.value, 2, (int64_t[]){4, 2}), "reshape");
    opt_expect_error(dt_op_reshape(g, &x.value, 2, (int64_t[]){-1, 4}), "reshape");
    opt_expect_error(dt_op_reshape(g, &x.value, 2, (int64_t[]){-1, -1}), "reshape");
    opt_expect_error(dt_op_reshape(g, &x.value, 5, (int64_t[]){1, 1, 1, 2, 3}), "reshape");
    opt_expect_error(dt_op_flatten(g, NULL), "flatten");
    dt_tensor *sc = dt_graph_tensor(g, 0, NULL);
    opt_expect_error(dt_op_flatten(g, sc), "flatten");
    dt_graph_free(g);
    dt_param_free(&x);
}

static void test_input_used_twice(void **state) {
    (void)state;
    int64_t s[3] = {2, 3, 4};
    dt_param x;
    opt_param(&x, "x", 3, s, 151, 1.0f);
    dt_param *in[1] = {&x};
    assert_int_equal(opt_gradcheck_twice(f_reshape, NULL, in, 1), 0);
    assert_int_equal(opt_gradcheck_twice(f_flatten, NULL, in, 1), 0);
    dt_param_free(&x);
}

/* backward shares the gradient buffer: x's gradient is y's (no copy) when x
 * has none yet; with a later use of x it accumulates into x's own. */
static void test_gradient_shared(void **state) {
    (void)state;
    float xd[6] = {1, 2, 3, 4, 5, 6}, up[6] = {.5f, -1, 2, 0, 3, -2};
    dt_graph *g = dt_graph_create();
    dt_tensor *x = dt_graph_input(g, 2, (int64_t[]){2, 3}, xd, 1);
    dt_tensor *y = dt_op_reshape(g, x, 1, (int64_t[]){6});
    assert_int_equal(dt_graph_backward_from(g, y, up), DT_OK);
    assert_ptr_equal(dt_graph_grad(g, x), dt_f32(y->grad));
    for (int i = 0; i < 6; i++) assert_true(dt_graph_grad(g, x)[i] == up[i]);
    dt_graph_reset(g);
    x = dt_graph_input(g, 2, (int64_t[]){2, 3}, xd, 1);
    y = dt_op_reshape(g, x, 1, (int64_t[]){6});
    dt_tensor *z = dt_op_relu(g, x);   /* recorded after: its backward runs first */
    dt_tensor *zz = dt_op_reshape(g, z, 1, (int64_t[]){6});
    dt_tensor *sum = dt_op_add(g, y, zz);
    assert_int_equal(dt_graph_backward_from(g, sum, up), DT_OK);
    assert_true(dt_graph_grad(g, x) != dt_f32(y->grad));
    for (int i = 0; i < 6; i++) assert_float_equal(dt_graph_grad(g, x)[i], 2 * up[i], 0);
    dt_graph_free(g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shapes_and_view),
        cmocka_unit_test(test_gradcheck),
        cmocka_unit_test(test_input_used_twice),
        cmocka_unit_test(test_bad_shapes),
        cmocka_unit_test(test_gradient_shared),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
