/* Element-wise and shape ops on the op harness (tests/common/op_harness.h):
 * add, bias_add, relu, gelu, softmax, reshape, flatten. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include "op_harness.h"

#define N0(in) ((in)[0]->value.numel)

/* ---- add, bias_add ---- */
static dt_tensor *f_add(dt_graph *g, dt_param **in, void *ctx) {
    (void)ctx;
    return dt_op_add(g, OPH_T(in, 0), OPH_T(in, 1));
}
static dt_tensor *f_add_self(dt_graph *g, dt_param **in, void *ctx) {
    (void)ctx;
    return dt_op_add(g, OPH_T(in, 0), OPH_T(in, 0));
}
static dt_tensor *f_add_nograph(dt_graph *g, dt_param **in, void *ctx) {
    (void)g; (void)ctx;
    return dt_op_add(NULL, OPH_T(in, 0), OPH_T(in, 1));
}
static dt_tensor *f_bias(dt_graph *g, dt_param **in, void *ctx) {
    (void)ctx;
    return dt_op_bias_add(g, OPH_T(in, 0), OPH_T(in, 1));
}
static void r_add(dt_param **in, void *ctx, double *y) {
    (void)ctx;
    for (int64_t i = 0; i < N0(in); i++) y[i] = (double)OPH_V(in, 0)[i] + OPH_V(in, 1)[i];
}
static void r_add_self(dt_param **in, void *ctx, double *y) {
    (void)ctx;
    for (int64_t i = 0; i < N0(in); i++) y[i] = 2.0 * OPH_V(in, 0)[i];
}
/* y[.., c] = x[.., c] + b[c] */
static void r_bias(dt_param **in, void *ctx, double *y) {
    (void)ctx;
    int64_t C = in[1]->value.numel;
    for (int64_t i = 0; i < N0(in); i++) y[i] = (double)OPH_V(in, 0)[i] + OPH_V(in, 1)[i % C];
}

/* ---- relu ---- */
static dt_tensor *f_relu(dt_graph *g, dt_param **in, void *ctx) {
    (void)ctx;
    return dt_op_relu(g, OPH_T(in, 0));
}
static dt_tensor *f_relu_bf16(dt_graph *g, dt_param **in, void *ctx) {
    (void)in; (void)ctx;
    static uint16_t buf[4];
    static dt_tensor t;
    dt_tensor_view(&t, buf, DT_BF16, 1, (int64_t[]){4});
    return dt_op_relu(g, &t);
}
static void r_relu(dt_param **in, void *ctx, double *y) {
    (void)ctx;
    for (int64_t i = 0; i < N0(in); i++) y[i] = OPH_V(in, 0)[i] > 0 ? OPH_V(in, 0)[i] : 0.0;
}
/* |x| >= 0.1 > gradcheck's eps: no finite difference crosses the kink */
static void p_off_kink(dt_param **in, void *ctx) {
    (void)ctx;
    float *x = dt_f32(&in[0]->value);
    for (int64_t i = 0; i < N0(in); i++) x[i] += x[i] >= 0 ? 0.1f : -0.1f;
}
static void cv_relu_mixed(const oph_entry *e, dt_param **in, const dt_tensor *y) {
    (void)e; (void)y;
    int pos = 0;
    for (int64_t i = 0; i < N0(in); i++) pos += OPH_V(in, 0)[i] > 0;
    assert_true(pos > 5 && pos < 55);   /* both sides of the kink are tested */
}

/* ---- gelu (tanh approximation) ---- */
static dt_tensor *f_gelu(dt_graph *g, dt_param **in, void *ctx) {
    (void)ctx;
    return dt_op_gelu(g, OPH_T(in, 0));
}
static void r_gelu(dt_param **in, void *ctx, double *y) {
    (void)ctx;
    for (int64_t i = 0; i < N0(in); i++) {
        double x = OPH_V(in, 0)[i];
        y[i] = 0.5 * x * (1.0 + tanh(sqrt(2.0 / 3.14159265358979323846) * (x + 0.044715 * x * x * x)));
    }
}
static void p_linspace(dt_param **in, void *ctx) {   /* -30 .. 30 */
    (void)ctx;
    int64_t n = N0(in);
    for (int64_t i = 0; i < n; i++) dt_f32(&in[0]->value)[i] = -30.0f + 60.0f * (float)i / (float)(n - 1);
}
static void cv_gelu_ends(const oph_entry *e, dt_param **in, const dt_tensor *y) {
    (void)e;
    int64_t n = N0(in);
    assert_float_equal(dt_f32(y)[0], 0.0f, 1e-30);        /* gelu(-30) ~ 0 */
    assert_float_equal(dt_f32(y)[n - 1], 30.0f, 1e-5);    /* gelu(30) ~ 30 */
}

/* ---- softmax over the last dim ---- */
static dt_tensor *f_softmax(dt_graph *g, dt_param **in, void *ctx) {
    (void)ctx;
    return dt_op_softmax(g, OPH_T(in, 0));
}
static void softmax_rows(const float *x, double *y, int64_t rows, int64_t C) {
    for (int64_t r = 0; r < rows; r++) {
        double m = -1e300, z = 0;
        for (int64_t j = 0; j < C; j++) m = fmax(m, x[r * C + j]);
        for (int64_t j = 0; j < C; j++) z += exp((double)x[r * C + j] - m);
        for (int64_t j = 0; j < C; j++) y[r * C + j] = exp((double)x[r * C + j] - m) / z;
    }
}
static void r_softmax(dt_param **in, void *ctx, double *y) {
    (void)ctx;
    const dt_tensor *x = &in[0]->value;
    int64_t C = x->shape[x->ndim - 1];
    softmax_rows(OPH_V(in, 0), y, x->numel / C, C);
}
static void p_row1_500(dt_param **in, void *ctx) {   /* overflows without the max shift */
    (void)ctx;
    for (int j = 0; j < 9; j++) dt_f32(&in[0]->value)[9 + j] += 500.0f;
}
static void cv_rows_sum_1(const oph_entry *e, dt_param **in, const dt_tensor *y) {
    (void)e; (void)in;
    int64_t C = y->shape[y->ndim - 1];
    for (int64_t r = 0; r < y->numel / C; r++) {
        double sum = 0;
        for (int64_t j = 0; j < C; j++) sum += dt_f32(y)[r * C + j];
        assert_float_equal(sum, 1.0, 1e-5);
    }
}

/* ---- reshape, flatten ---- */
typedef struct reshape_ctx { int ndim; int64_t shape[5]; int softmax; } reshape_ctx;
static dt_tensor *f_reshape(dt_graph *g, dt_param **in, void *ctx) {
    const reshape_ctx *c = ctx;
    dt_tensor *r = dt_op_reshape(g, OPH_T(in, 0), c->ndim, c->shape);
    return r && c->softmax ? dt_op_softmax(g, r) : r;   /* softmax mixes elements: order matters */
}
static dt_tensor *f_flatten(dt_graph *g, dt_param **in, void *ctx) {
    dt_tensor *r = dt_op_flatten(g, OPH_T(in, 0));
    return r && ctx ? dt_op_softmax(g, r) : r;
}
static dt_tensor *f_flatten_scalar(dt_graph *g, dt_param **in, void *ctx) {
    (void)in; (void)ctx;
    return dt_op_flatten(g, dt_graph_tensor(g, 0, NULL));
}
static dt_tensor *f_softmax_scalar(dt_graph *g, dt_param **in, void *ctx) {
    (void)in; (void)ctx;
    return dt_op_softmax(g, dt_graph_tensor(g, 0, NULL));
}
static void r_copy(dt_param **in, void *ctx, double *y) {
    (void)ctx;
    for (int64_t i = 0; i < N0(in); i++) y[i] = OPH_V(in, 0)[i];
}
/* softmax over rows of 6 / of 12 after the reshape / flatten */
static void r_softmax6(dt_param **in, void *ctx, double *y) { (void)ctx; softmax_rows(OPH_V(in, 0), y, 4, 6); }
static void r_softmax12(dt_param **in, void *ctx, double *y) { (void)ctx; softmax_rows(OPH_V(in, 0), y, 2, 12); }
static void cv_is_view(const oph_entry *e, dt_param **in, const dt_tensor *y) {
    (void)e;
    assert_ptr_equal(y->data, in[0]->value.data);   /* storage shared, no copy */
}

static reshape_ctx rs_6x4 = {2, {6, 4}, 0}, rs_4m2 = {3, {4, -1, 2}, 0}, rs_4x6_sm = {2, {4, 6}, 1};
static reshape_ctx rs_bad[4] = {{2, {4, 2}, 0}, {2, {-1, 4}, 0}, {2, {-1, -1}, 0}, {5, {1, 1, 1, 2, 3}, 0}};
static int with_softmax = 1;

static const oph_entry table[] = {
    /* add */
    {.name = "add 2x3x5", .op = "add", .fn = f_add, .n_in = 2,
     .in = {{"a", 3, {2, 3, 5}, 1}, {"b", 3, {2, 3, 5}, 2}},
     .ref = r_add, .exact = 1, .out = OPH_SHAPE(3, 2, 3, 5), .grad = 1},
    {.name = "add a+a", .op = "add", .fn = f_add_self, .n_in = 1, .in = {{"a", 3, {2, 3, 5}, 1}},
     .ref = r_add_self, .exact = 1, .out = OPH_SHAPE(3, 2, 3, 5), .grad = 1},   /* da = 2 dy */
    {.name = "add bad: [2, 3] + [3, 2]", .op = "add", .fn = f_add, .n_in = 2,
     .in = {{"a", 2, {2, 3}, 1}, {"b", 2, {3, 2}, 1}}, .error = ""},
    {.name = "add bad: a NULL", .op = "add", .fn = f_add, .n_in = 2, .in = {OPH_NULL, {"b", 2, {3, 2}, 1}},
     .error = ""},
    {.name = "add bad: graph NULL", .op = "add", .fn = f_add_nograph, .n_in = 2,
     .in = {{"a", 2, {2, 3}, 1}, {"b", 2, {2, 3}, 2}}, .error = "graph"},
    /* bias_add */
    {.name = "bias_add 2x3x7 + 7", .op = "bias_add", .fn = f_bias, .n_in = 2,
     .in = {{"x", 3, {2, 3, 7}, 3}, {"b", 1, {7}, 4}},
     .ref = r_bias, .exact = 1, .out = OPH_SHAPE(3, 2, 3, 7), .grad = 1},
    {.name = "bias_add 300x200 (OpenMP column sums)", .op = "bias_add", .fn = f_bias, .n_in = 2,
     .in = {{"x", 2, {300, 200}, 5}, {"b", 1, {200}, 6}},
     .ref = r_bias, .exact = 1, .out = OPH_SHAPE(2, 300, 200), .grad = 1, .gc = {.seed = 2, .max_checks = 50}},
    {.name = "bias_add twice 3x4", .op = "bias_add", .fn = f_bias, .n_in = 2,
     .in = {{"x", 2, {3, 4}, 71}, {"b", 1, {4}, 72}}, .twice = 1},
    {.name = "bias_add bad: b [4] for x [2, 3]", .op = "bias_add", .fn = f_bias, .n_in = 2,
     .in = {{"a", 2, {2, 3}, 1}, {"c", 1, {4}, 1}}, .error = ""},
    {.name = "bias_add bad: b 2-D", .op = "bias_add", .fn = f_bias, .n_in = 2,
     .in = {{"a", 2, {2, 3}, 1}, {"b", 2, {3, 2}, 1}}, .error = ""},
    /* relu */
    {.name = "relu 3x4x5", .op = "relu", .fn = f_relu, .n_in = 1, .in = {{"x", 3, {3, 4, 5}, 1}},
     .prep = p_off_kink, .ref = r_relu, .exact = 1, .out = OPH_SHAPE(3, 3, 4, 5), .check_values = cv_relu_mixed, .grad = 1},
    {.name = "relu twice 4x5", .op = "relu", .fn = f_relu, .n_in = 1, .in = {{"x", 2, {4, 5}, 81}},
     .prep = p_off_kink, .twice = 1},
    {.name = "relu bad: NULL", .op = "relu", .fn = f_relu, .n_in = 1, .in = {OPH_NULL}, .error = ""},
    {.name = "relu bad: bf16", .op = "relu", .fn = f_relu_bf16, .n_in = 0, .error = ""},
    /* gelu */
    {.name = "gelu -30..30 (100000)", .op = "gelu", .fn = f_gelu, .n_in = 1, .in = {{"x", 1, {100000}, 0}},
     .prep = p_linspace, .ref = r_gelu, .atol = 2e-11, .rtol = 2e-5,   /* |y-r|/(1e-6+|r|) < 2e-5 */
     .out = OPH_SHAPE(1, 100000), .check_values = cv_gelu_ends},
    {.name = "gelu 3x7", .op = "gelu", .fn = f_gelu, .n_in = 1, .in = {{"x", 2, {3, 7}, 4, 2}}, .grad = 1,
     .ref = r_gelu, .atol = 2e-11, .rtol = 2e-5, .out = OPH_SHAPE(2, 3, 7)},
    {.name = "gelu 200x300 (OpenMP)", .op = "gelu", .fn = f_gelu, .n_in = 1, .in = {{"x", 2, {200, 300}, 5, 3}},
     .grad = 1, .gc = {.seed = 1, .max_checks = 60}},
    {.name = "gelu twice 4x5", .op = "gelu", .fn = f_gelu, .n_in = 1, .in = {{"x", 2, {4, 5}, 91, 1.5f}},
     .twice = 1},
    {.name = "gelu bad: NULL", .op = "gelu", .fn = f_gelu, .n_in = 1, .in = {OPH_NULL}, .error = ""},
    /* softmax */
    {.name = "softmax 2x3x9 (a row +500)", .op = "softmax", .fn = f_softmax, .n_in = 1,
     .in = {{"x", 3, {2, 3, 9}, 1, 3}}, .prep = p_row1_500, .ref = r_softmax, .atol = 1e-6, .rtol = 1e-5,
     .out = OPH_SHAPE(3, 2, 3, 9), .check_values = cv_rows_sum_1},
    {.name = "softmax 4x7", .op = "softmax", .fn = f_softmax, .n_in = 1, .in = {{"x", 2, {4, 7}, 2}},
     .grad = 1, .ref = r_softmax, .atol = 1e-6, .rtol = 1e-5, .out = OPH_SHAPE(2, 4, 7)},
    {.name = "softmax 300x130 (OpenMP)", .op = "softmax", .fn = f_softmax, .n_in = 1,
     .in = {{"x", 2, {300, 130}, 3}}, .grad = 1, .gc = {.seed = 4, .max_checks = 60}},
    {.name = "softmax twice 3x6", .op = "softmax", .fn = f_softmax, .n_in = 1, .in = {{"x", 2, {3, 6}, 111}},
     .twice = 1},
    {.name = "softmax bad: NULL", .op = "softmax", .fn = f_softmax, .n_in = 1, .in = {OPH_NULL}, .error = ""},
    {.name = "softmax bad: scalar", .op = "softmax", .fn = f_softmax_scalar, .n_in = 0, .error = ""},
    /* reshape, flatten */
    {.name = "reshape 2x3x4 -> 6x4", .op = "reshape", .fn = f_reshape, .ctx = &rs_6x4, .n_in = 1,
     .in = {{"x", 3, {2, 3, 4}, 1}}, .ref = r_copy, .exact = 1, .out = OPH_SHAPE(2, 6, 4), .check_values = cv_is_view},
    {.name = "reshape 2x3x4 -> 4x-1x2", .op = "reshape", .fn = f_reshape, .ctx = &rs_4m2, .n_in = 1,
     .in = {{"x", 3, {2, 3, 4}, 1}}, .ref = r_copy, .exact = 1, .out = OPH_SHAPE(3, 4, 3, 2), .check_values = cv_is_view},
    {.name = "flatten 2x3x4", .op = "flatten", .fn = f_flatten, .n_in = 1, .in = {{"x", 3, {2, 3, 4}, 1}},
     .ref = r_copy, .exact = 1, .out = OPH_SHAPE(2, 2, 12), .check_values = cv_is_view},
    {.name = "reshape 4x6 + softmax", .op = "reshape", .fn = f_reshape, .ctx = &rs_4x6_sm, .n_in = 1,
     .in = {{"x", 3, {2, 3, 4}, 2}}, .ref = r_softmax6, .atol = 1e-6, .rtol = 1e-5, .out = OPH_SHAPE(2, 4, 6),
     .grad = 1},
    {.name = "flatten + softmax", .op = "flatten", .fn = f_flatten, .ctx = &with_softmax, .n_in = 1,
     .in = {{"x", 3, {2, 3, 4}, 2}}, .ref = r_softmax12, .atol = 1e-6, .rtol = 1e-5, .out = OPH_SHAPE(2, 2, 12),
     .grad = 1},
    {.name = "reshape twice 4x6 + softmax", .op = "reshape", .fn = f_reshape, .ctx = &rs_4x6_sm, .n_in = 1,
     .in = {{"x", 3, {2, 3, 4}, 151}}, .twice = 1},
    {.name = "flatten twice + softmax", .op = "flatten", .fn = f_flatten, .ctx = &with_softmax, .n_in = 1,
     .in = {{"x", 3, {2, 3, 4}, 151}}, .twice = 1},
    {.name = "reshape bad: [2, 3] -> [4, 2]", .op = "reshape", .fn = f_reshape, .ctx = &rs_bad[0], .n_in = 1,
     .in = {{"x", 2, {2, 3}, 3}}, .error = ""},
    {.name = "reshape bad: [2, 3] -> [-1, 4]", .op = "reshape", .fn = f_reshape, .ctx = &rs_bad[1], .n_in = 1,
     .in = {{"x", 2, {2, 3}, 3}}, .error = ""},
    {.name = "reshape bad: two -1", .op = "reshape", .fn = f_reshape, .ctx = &rs_bad[2], .n_in = 1,
     .in = {{"x", 2, {2, 3}, 3}}, .error = ""},
    {.name = "reshape bad: 5 dims", .op = "reshape", .fn = f_reshape, .ctx = &rs_bad[3], .n_in = 1,
     .in = {{"x", 2, {2, 3}, 3}}, .error = ""},
    {.name = "flatten bad: NULL", .op = "flatten", .fn = f_flatten, .n_in = 1, .in = {OPH_NULL}, .error = ""},
    {.name = "flatten bad: scalar", .op = "flatten", .fn = f_flatten_scalar, .n_in = 0, .error = ""},
};

/* Backward shares the gradient buffer: x's gradient is y's (no copy) when x
 * has none yet; with a later use of x it accumulates into x's own. */
static void test_reshape_gradient_shared(void **state) {
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
    const struct CMUnitTest extra[] = {cmocka_unit_test(test_reshape_gradient_shared)};
    return OPH_RUN("ops_elementwise", table, extra);
}
