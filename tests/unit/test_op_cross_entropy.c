/* dt_op_cross_entropy: loss vs log-sum-exp in double (mean over non-ignored
 * rows, large logits), gradient vs finite differences incl. ignored rows
 * (which must get exactly zero gradient), all-ignored batch, bad targets. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdlib.h>
#include "op_test_util.h"

static dt_tensor *f_ce(dt_graph *g, dt_param **in, void *ctx) {
    return dt_op_cross_entropy(g, &in[0]->value, ctx);
}

static double ce_ref(const float *x, const int32_t *t, int64_t N, int64_t V) {
    double total = 0;
    int64_t valid = 0;
    for (int64_t r = 0; r < N; r++) {
        if (t[r] < 0) continue;
        double m = -1e300, z = 0;
        for (int64_t j = 0; j < V; j++) m = fmax(m, x[r * V + j]);
        for (int64_t j = 0; j < V; j++) z += exp((double)x[r * V + j] - m);
        total += m + log(z) - x[r * V + t[r]];
        valid++;
    }
    return valid ? total / (double)valid : 0.0;
}

static void test_values(void **state) {
    (void)state;
    int64_t s[2] = {6, 11};
    dt_param x;
    opt_param(&x, "logits", 2, s, 1, 2.0f);
    for (int j = 0; j < 11; j++) dt_f32(&x.value)[2 * 11 + j] += 1000.0f;   /* must not overflow */
    int32_t t[6] = {3, -1, 10, 0, -100, 7};
    dt_graph *g = dt_graph_create();
    dt_tensor *loss = dt_op_cross_entropy(g, &x.value, t);
    assert_non_null(loss);
    assert_int_equal(loss->ndim, 0);
    assert_int_equal(loss->numel, 1);
    double ref = ce_ref(dt_f32(&x.value), t, 6, 11);
    assert_float_equal(dt_f32(loss)[0], ref, 1e-5 * fabs(ref) + 1e-6);
    /* mean is over the 4 valid rows, not 6 */
    int32_t t_all[6] = {3, 0, 10, 0, 0, 7};
    double with_all = ce_ref(dt_f32(&x.value), t_all, 6, 11);
    assert_true(fabs(with_all - ref) > 1e-3);
    dt_graph_free(g);
    dt_param_free(&x);
}

static void test_gradcheck_with_ignored(void **state) {
    (void)state;
    int64_t s[2] = {5, 7};
    dt_param x;
    opt_param(&x, "logits", 2, s, 2, 1.0f);
    int32_t t[5] = {6, -1, 0, 3, -1};
    dt_param *in[1] = {&x};
    assert_int_equal(dt_gradcheck(f_ce, t, in, 1, NULL), 0);
    for (int j = 0; j < 7; j++) {
        assert_float_equal(dt_f32(&x.grad)[1 * 7 + j], 0.0f, 0.0);
        assert_float_equal(dt_f32(&x.grad)[4 * 7 + j], 0.0f, 0.0);
    }
    /* each valid row's gradient sums to 0 (softmax - onehot) */
    double rs = 0;
    for (int j = 0; j < 7; j++) rs += dt_f32(&x.grad)[j];
    assert_float_equal(rs, 0.0, 1e-6);
    dt_param_free(&x);
}

static void test_gradcheck_large(void **state) {
    (void)state;
    int64_t s[3] = {4, 64, 257};   /* leading dims flattened into 256 rows */
    dt_param x;
    opt_param(&x, "logits", 3, s, 3, 2.0f);
    int32_t *t = malloc(256 * sizeof *t);
    for (int i = 0; i < 256; i++) t[i] = i % 9 == 0 ? -1 : (int32_t)((i * 37) % 257);
    dt_param *in[1] = {&x};
    dt_gc_opts o = {.seed = 4, .max_checks = 80, .atol = 1e-5};
    assert_int_equal(dt_gradcheck(f_ce, t, in, 1, &o), 0);
    dt_graph *g = dt_graph_create();
    dt_tensor *loss = dt_op_cross_entropy(g, &x.value, t);
    assert_non_null(loss);
    double ref = ce_ref(dt_f32(&x.value), t, 256, 257);
    assert_float_equal(dt_f32(loss)[0], ref, 1e-5 * fabs(ref));
    dt_graph_free(g);
    free(t);
    dt_param_free(&x);
}

static void test_all_ignored(void **state) {
    (void)state;
    int64_t s[2] = {2, 3};
    dt_param x;
    opt_param(&x, "logits", 2, s, 5, 1.0f);
    int32_t t[2] = {-1, -1};
    dt_graph *g = dt_graph_create();
    dt_tensor *loss = dt_op_cross_entropy(g, &x.value, t);
    assert_non_null(loss);
    assert_float_equal(dt_f32(loss)[0], 0.0f, 0.0);
    assert_int_equal(dt_graph_backward(g, loss), DT_OK);
    for (int i = 0; i < 6; i++) assert_float_equal(dt_f32(&x.grad)[i], 0.0f, 0.0);
    dt_graph_free(g);
    dt_param_free(&x);
}

static void test_bad_targets(void **state) {
    (void)state;
    int64_t s[2] = {3, 4};
    dt_param x;
    opt_param(&x, "logits", 2, s, 6, 1.0f);
    int32_t t[3] = {0, 4, 1};
    dt_graph *g = dt_graph_create();
    opt_expect_error(dt_op_cross_entropy(g, &x.value, t), "cross_entropy");
    assert_non_null(strstr(dt_error_message(), "row 1"));
    opt_expect_error(dt_op_cross_entropy(g, &x.value, NULL), "cross_entropy");
    opt_expect_error(dt_op_cross_entropy(g, NULL, t), "cross_entropy");
    dt_graph_free(g);
    dt_param_free(&x);
}

static void test_input_used_twice(void **state) {
    (void)state;
    int64_t s[2] = {3, 5};
    dt_param x;
    opt_param(&x, "logits", 2, s, 141, 1.0f);
    int32_t t[3] = {4, -1, 0};
    dt_param *in[1] = {&x};
    assert_int_equal(opt_gradcheck_twice(f_ce, t, in, 1), 0);
    dt_param_free(&x);
}

/* The _consume form: d(logits) overwrites the logits (a graph input that
 * needs a gradient), bitwise the gradient the plain form accumulates,
 * ignored rows included; a consumer after it that already gave the logits a
 * gradient makes it accumulate as usual. */
static void test_consume_in_place(void **state) {
    (void)state;
    enum { N = 4, V = 7 };
    float data[N * V], keep[N * V];
    for (int i = 0; i < N * V; i++) data[i] = (float)((i * 37) % 23) / 7.f - 1.5f;
    memcpy(keep, data, sizeof data);
    int32_t t[N] = {3, -1, 6, 0};
    int64_t s[2] = {N, V};
    float want[N * V];
    dt_graph *g = dt_graph_create();
    dt_tensor *x = dt_graph_input(g, 2, s, keep, 1);
    assert_int_equal(dt_graph_backward(g, dt_op_cross_entropy(g, x, t)), DT_OK);
    memcpy(want, dt_graph_grad(g, x), sizeof want);
    dt_graph_reset(g);
    x = dt_graph_input(g, 2, s, data, 1);
    dt_tensor *loss = dt_op_cross_entropy_consume(g, x, t);
    assert_non_null(loss);
    assert_int_equal(dt_graph_backward(g, loss), DT_OK);
    assert_ptr_equal(dt_graph_grad(g, x), data);            /* no second buffer */
    assert_memory_equal(data, want, sizeof want);            /* bitwise, row 1 (ignored) zero */
    for (int j = 0; j < V; j++) assert_true(data[V + j] == 0.0f);
    /* x used again after the loss: its gradient exists first, so += */
    memcpy(data, keep, sizeof data);
    dt_graph_reset(g);
    x = dt_graph_input(g, 2, s, data, 1);
    dt_tensor *l1 = dt_op_cross_entropy_consume(g, x, t), *l2 = dt_op_cross_entropy(g, x, t);
    dt_tensor *sum = dt_op_add(g, l1, l2);
    assert_int_equal(dt_graph_backward(g, sum), DT_OK);
    assert_true(dt_graph_grad(g, x) != data);
    assert_memory_equal(data, keep, sizeof keep);            /* values untouched */
    for (int i = 0; i < N * V; i++) assert_float_equal(dt_graph_grad(g, x)[i], 2.f * want[i], 1e-6);
    dt_graph_free(g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_values),
        cmocka_unit_test(test_gradcheck_with_ignored),
        cmocka_unit_test(test_gradcheck_large),
        cmocka_unit_test(test_input_used_twice),
        cmocka_unit_test(test_all_ignored),
        cmocka_unit_test(test_bad_targets),
        cmocka_unit_test(test_consume_in_place),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
