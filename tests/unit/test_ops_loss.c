/* cross_entropy on the op harness (tests/common/op_harness.h): the loss vs
 * log-sum-exp in double (mean over non-ignored rows, large logits), gradients
 * vs finite differences incl. ignored rows (exactly zero gradient), an
 * all-ignored batch, bad targets; the in-place _consume form; and
 * dt_count_correct (argmax, first on ties, vs labels). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include "op_harness.h"

/* ctx: the targets (int32_t[rows], -1 and below ignored) */
static dt_tensor *f_ce(dt_graph *g, dt_param **in, void *ctx) {
    return dt_op_cross_entropy(g, OPH_T(in, 0), ctx);
}

static double ce(const float *x, const int32_t *t, int64_t N, int64_t V) {
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
static void r_ce(dt_param **in, void *ctx, double *y) {
    const dt_tensor *x = &in[0]->value;
    int64_t V = x->shape[x->ndim - 1];
    y[0] = ce(OPH_V(in, 0), ctx, x->numel / V, V);
}

static void p_row2_1000(dt_param **in, void *ctx) {   /* must not overflow */
    (void)ctx;
    for (int j = 0; j < 11; j++) dt_f32(&in[0]->value)[2 * 11 + j] += 1000.0f;
}
/* the mean is over the 4 valid rows, not 6 (it would visibly differ) */
static void cv_mean_over_valid(const oph_entry *e, dt_param **in, const dt_tensor *y) {
    assert_int_equal(y->numel, 1);
    int32_t t_all[6] = {3, 0, 10, 0, 0, 7};
    assert_true(fabs(ce(OPH_V(in, 0), t_all, 6, 11) - ce(OPH_V(in, 0), e->ctx, 6, 11)) > 1e-3);
}
/* ignored rows 1 and 4 get exactly zero; a valid row's gradient sums to 0 (softmax - onehot) */
static void cg_ignored_rows(const oph_entry *e, dt_param **in, const dt_tensor *y) {
    (void)e; (void)y;
    const float *gx = dt_f32(&in[0]->grad);
    for (int j = 0; j < 7; j++) {
        assert_float_equal(gx[1 * 7 + j], 0.0f, 0.0);
        assert_float_equal(gx[4 * 7 + j], 0.0f, 0.0);
    }
    double rs = 0;
    for (int j = 0; j < 7; j++) rs += gx[j];
    assert_float_equal(rs, 0.0, 1e-6);
}
static void cg_all_zero(const oph_entry *e, dt_param **in, const dt_tensor *y) {
    (void)e; (void)y;
    for (int64_t i = 0; i < in[0]->grad.numel; i++) assert_float_equal(dt_f32(&in[0]->grad)[i], 0.0f, 0.0);
}
static int32_t t_large[256];
static void p_targets_large(dt_param **in, void *ctx) {   /* leading dims flattened into 256 rows */
    (void)in;
    int32_t *t = ctx;
    for (int i = 0; i < 256; i++) t[i] = i % 9 == 0 ? -1 : (int32_t)((i * 37) % 257);
}

static int32_t t_values[6] = {3, -1, 10, 0, -100, 7}, t_grad[5] = {6, -1, 0, 3, -1}, t_none[2] = {-1, -1};
static int32_t t_twice[3] = {4, -1, 0}, t_bad[3] = {0, 4, 1};

static const oph_entry table[] = {
    {.name = "cross_entropy 6x11 (ignored rows, a row +1000)", .op = "cross_entropy", .fn = f_ce, .ctx = t_values,
     .n_in = 1, .in = {{"logits", 2, {6, 11}, 1, 2.0f}}, .prep = p_row2_1000, .ref = r_ce, .atol = 1e-6,
     .rtol = 1e-5, .out = OPH_SCALAR, .check_values = cv_mean_over_valid},
    {.name = "cross_entropy grad 5x7 (ignored rows)", .op = "cross_entropy", .fn = f_ce, .ctx = t_grad, .n_in = 1,
     .in = {{"logits", 2, {5, 7}, 2}}, .ref = r_ce, .atol = 1e-6, .rtol = 1e-5, .out = OPH_SCALAR, .grad = 1,
     .check_grad = cg_ignored_rows},
    {.name = "cross_entropy 4x64x257", .op = "cross_entropy", .fn = f_ce, .ctx = t_large, .n_in = 1,
     .in = {{"logits", 3, {4, 64, 257}, 3, 2.0f}}, .prep = p_targets_large, .ref = r_ce, .rtol = 1e-5,
     .out = OPH_SCALAR, .grad = 1, .gc = {.seed = 4, .max_checks = 80, .atol = 1e-5}},
    {.name = "cross_entropy all rows ignored", .op = "cross_entropy", .fn = f_ce, .ctx = t_none, .n_in = 1,
     .in = {{"logits", 2, {2, 3}, 5}}, .ref = r_ce, .exact = 1, .out = OPH_SCALAR, .grad = 1,
     .check_grad = cg_all_zero},
    {.name = "cross_entropy twice 3x5", .op = "cross_entropy", .fn = f_ce, .ctx = t_twice, .n_in = 1,
     .in = {{"logits", 2, {3, 5}, 141}}, .twice = 1},
    {.name = "cross_entropy bad: target 4 of 4 classes", .op = "cross_entropy", .fn = f_ce, .ctx = t_bad, .n_in = 1,
     .in = {{"logits", 2, {3, 4}, 6}}, .error = "row 1"},
    {.name = "cross_entropy bad: targets NULL", .op = "cross_entropy", .fn = f_ce, .ctx = NULL, .n_in = 1,
     .in = {{"logits", 2, {3, 4}, 6}}, .error = ""},
    {.name = "cross_entropy bad: logits NULL", .op = "cross_entropy", .fn = f_ce, .ctx = t_bad, .n_in = 1,
     .in = {OPH_NULL}, .error = ""},
};

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

static void test_count_correct(void **state) {
    (void)state;
    float v[4 * 3] = {0.1f, 0.9f, 0.0f,    /* argmax 1 */
                      2.0f, 2.0f, 1.0f,    /* tie -> 0 */
                      -1.0f, -3.0f, -0.5f, /* argmax 2 */
                      5.0f, 0.0f, 0.0f};   /* argmax 0 */
    dt_tensor t;
    dt_tensor_view(&t, v, DT_F32, 2, (int64_t[]){4, 3});
    int32_t labels[4] = {1, 0, 1, -1};
    assert_int_equal(dt_count_correct(&t, labels), 2);
    int32_t all[4] = {1, 0, 2, 0};
    assert_int_equal(dt_count_correct(&t, all), 4);
    int32_t tie1[4] = {0, 1, 0, 1};
    assert_int_equal(dt_count_correct(&t, tie1), 0);
}

static void test_count_correct_bad(void **state) {
    (void)state;
    float v[3] = {0};
    dt_tensor t;
    dt_tensor_view(&t, v, DT_F32, 2, (int64_t[]){1, 3});
    assert_int_equal(dt_count_correct(&t, NULL), -1);
    assert_non_null(strstr(dt_error_message(), "count_correct"));
    assert_int_equal(dt_count_correct(NULL, (int32_t[]){0}), -1);
}

int main(void) {
    const struct CMUnitTest extra[] = {
        cmocka_unit_test(test_consume_in_place),
        cmocka_unit_test(test_count_correct),
        cmocka_unit_test(test_count_correct_bad),
    };
    return OPH_RUN("ops_loss", table, extra);
}
