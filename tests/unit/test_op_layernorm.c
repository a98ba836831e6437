/* dt_op_layernorm: values vs a double reference (C = 7, 2-D and 3-D x),
 * gradients for x, w, b vs finite differences, a large case on the OpenMP
 * path, bad shapes. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdlib.h>
#include "op_test_util.h"

static dt_tensor *f_ln(dt_graph *g, dt_param **in, void *ctx) {
    (void)ctx;
    return dt_op_layernorm(g, &in[0]->value, &in[1]->value, &in[2]->value, 1e-5f);
}

static void ln_ref(const float *x, const float *w, const float *b, double *y, int64_t N, int64_t C,
                   double eps) {
    for (int64_t r = 0; r < N; r++) {
        double m = 0, v = 0;
        for (int64_t c = 0; c < C; c++) m += x[r * C + c];
        m /= (double)C;
        for (int64_t c = 0; c < C; c++) v += (x[r * C + c] - m) * (x[r * C + c] - m);
        v /= (double)C;
        for (int64_t c = 0; c < C; c++) y[r * C + c] = (x[r * C + c] - m) / sqrt(v + eps) * w[c] + b[c];
    }
}

static void test_values(void **state) {
    (void)state;
    int64_t xs[3] = {2, 3, 7}, cs[1] = {7};
    dt_param x, w, b;
    opt_param(&x, "x", 3, xs, 1, 2.0f);
    opt_param(&w, "w", 1, cs, 2, 1.0f);
    opt_param(&b, "b", 1, cs, 3, 1.0f);
    float *xd = dt_f32(&x.value);
    for (int i = 0; i < 7; i++) xd[i] += 100.0f;   /* large mean in one row */
    dt_graph *g = dt_graph_create();
    dt_tensor *y = dt_op_layernorm(g, &x.value, &w.value, &b.value, 1e-5f);
    opt_assert_shape(y, 3, xs);
    double ref[42];
    ln_ref(xd, dt_f32(&w.value), dt_f32(&b.value), ref, 6, 7, 1e-5);
    assert_true(opt_max_diff(dt_f32(y), ref, 42) < 1e-4);
    dt_graph_free(g);
    dt_param_free(&x); dt_param_free(&w); dt_param_free(&b);
}

static void test_gradcheck(void **state) {
    (void)state;
    int64_t xs[2] = {3, 7}, cs[1] = {7};
    dt_param x, w, b;
    opt_param(&x, "x", 2, xs, 4, 1.0f);
    opt_param(&w, "w", 1, cs, 5, 1.0f);
    opt_param(&b, "b", 1, cs, 6, 1.0f);
    dt_param *in[3] = {&x, &w, &b};
    dt_gc_opts o = {.seed = 9, .eps = 3e-3};
    assert_int_equal(dt_gradcheck(f_ln, NULL, in, 3, &o), 0);
    dt_param_free(&x); dt_param_free(&w); dt_param_free(&b);
}

static void test_gradcheck_large(void **state) {
    (void)state;
    int64_t xs[3] = {4, 100, 96}, cs[1] = {96};
    dt_param x, w, b;
    opt_param(&x, "x", 3, xs, 7, 1.0f);
    opt_param(&w, "w", 1, cs, 8, 1.0f);
    opt_param(&b, "b", 1, cs, 9, 1.0f);
    dt_param *in[3] = {&x, &w, &b};
    dt_gc_opts o = {.seed = 10, .eps = 3e-3, .max_checks = 48};
    assert_int_equal(dt_gradcheck(f_ln, NULL, in, 3, &o), 0);
    dt_param_free(&x); dt_param_free(&w); dt_param_free(&b);
}

static void test_bad_shapes(void **state) {
    (void)state;
    int64_t xs[2] = {3, 7}, c6[1] = {6}, c7[1] = {7};
    dt_param x, w6, w7;
    opt_param(&x, "x", 2, xs, 1, 1.0f);
    opt_param(&w6, "w6", 1, c6, 1, 1.0f);
    opt_param(&w7, "w7", 1, c7, 1, 1.0f);
    dt_graph *g = dt_graph_create();
    opt_expect_error(dt_op_layernorm(g, &x.value, &w6.value, &w7.value, 1e-5f), "layernorm");
    opt_expect_error(dt_op_layernorm(g, &x.value, &w7.value, &w6.value, 1e-5f), "layernorm");
    opt_expect_error(dt_op_layernorm(g, &x.value, &w7.value, &w7.value, -1.0f), "layernorm");
    opt_expect_error(dt_op_layernorm(g, &x.value, NULL, &w7.value, 1e-5f), "layernorm");
    dt_graph_free(g);
    dt_param_free(&x); dt_param_free(&w6); dt_param_free(&w7);
}

static void test_inputs_used_twice(void **state) {
    (void)state;
    int64_t xs[2] = {3, 7}, cs[1] = {7};
    dt_param x, w, b;
    opt_param(&x, "x", 2, xs, 101, 1.0f);
    opt_param(&w, "w", 1, cs, 102, 1.0f);
    opt_param(&b, "b", 1, cs, 103, 1.0f);
    dt_param *in[3] = {&x, &w, &b};
    assert_int_equal(opt_gradcheck_twice(f_ln, NULL, in, 3), 0);
    dt_param_free(&x); dt_param_free(&w); dt_param_free(&b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_values),
        cmocka_unit_test(test_gradcheck),
        cmocka_unit_test(test_gradcheck_large),
        cmocka_unit_test(test_inputs_used_twice),
        cmocka_unit_test(test_bad_shapes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
