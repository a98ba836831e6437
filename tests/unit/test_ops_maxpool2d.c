/* maxpool2d on the op harness (tests/common/op_harness.h): forward vs naive,
 * backward via finite differences on tie-free inputs (odd sizes, windows that
 * do not tile the input), routing to the argmax, bad args. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include "op_harness.h"

typedef struct pool_ctx { int k, s; uint64_t distinct_seed; } pool_ctx;

static dt_tensor *f_pool(dt_graph *g, dt_param **in, void *ctx) {
    const pool_ctx *pc = ctx;
    return dt_op_maxpool2d(g, OPH_T(in, 0), pc->k, pc->s);
}

/* y[pl, oh, ow] = max over the k x k window at (oh*s, ow*s) */
static void r_pool(dt_param **in, void *ctx, double *y) {
    const pool_ctx *pc = ctx;
    const int64_t *xs = in[0]->value.shape;
    int64_t H = xs[2], W = xs[3], k = pc->k, s = pc->s, OH = (H - k) / s + 1, OW = (W - k) / s + 1;
    const float *x = OPH_V(in, 0);
    for (int64_t pl = 0; pl < xs[0] * xs[1]; pl++)
        for (int64_t oh = 0; oh < OH; oh++)
            for (int64_t ow = 0; ow < OW; ow++) {
                double m = -INFINITY;
                for (int64_t i = 0; i < k; i++)
                    for (int64_t j = 0; j < k; j++) m = fmax(m, x[(pl * H + oh * s + i) * W + ow * s + j]);
                y[(pl * OH + oh) * OW + ow] = m;
            }
}

/* Distinct values 0.05 apart in shuffled order: no ties, and a +-1e-2 finite
 * difference step can never change which element of a window is the max, so
 * numeric and analytic gradients agree to float rounding. */
static void p_distinct(dt_param **in, void *ctx) {
    const pool_ctx *pc = ctx;
    int64_t n = in[0]->value.numel;
    float *x = dt_f32(&in[0]->value);
    for (int64_t i = 0; i < n; i++) x[i] = 0.05f * (float)(i - n / 2);
    dt_rng r;
    dt_rng_seed(&r, pc->distinct_seed);
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)dt_rng_below(&r, (uint64_t)i + 1);
        float t = x[i]; x[i] = x[j]; x[j] = t;
    }
}

/* k 2 s 2 on 7x5: the last row (ih = 6) and column (iw = 4) get no gradient */
static void cg_last_row_col_zero(const oph_entry *e, dt_param **in, const dt_tensor *y) {
    (void)e; (void)y;
    const float *gx = dt_f32(&in[0]->grad);
    for (int pl = 0; pl < 6; pl++) {
        for (int iw = 0; iw < 5; iw++) assert_true(gx[(pl * 7 + 6) * 5 + iw] == 0.f);
        for (int ih = 0; ih < 7; ih++) assert_true(gx[(pl * 7 + ih) * 5 + 4] == 0.f);
    }
}

static pool_ctx pools[] = {{2, 2, 40}, {3, 2, 41}, {2, 1, 42}, {3, 3, 43}};
static pool_ctx bad_k0 = {0, 1, 0}, bad_s0 = {2, 0, 0}, bad_k6 = {6, 1, 0}, k2s2 = {2, 2, 0}, k5s1 = {5, 1, 0};

/* forward: x seed 7 + case; gradients: distinct values from seed 40 + case, gradcheck seed 50 + case */
static const oph_entry table[] = {
    {.name = "maxpool2d k2 s2 (7x5 -> 3x2: last row and column never pooled)", .op = "maxpool2d", .fn = f_pool, .ctx = &pools[0], .n_in = 1,
     .in = {{"x", 4, {2, 3, 7, 5}, 7}}, .ref = r_pool, .exact = 1, .out = OPH_SHAPE(4, 2, 3, 3, 2)},
    {.name = "maxpool2d k3 s2 (overlapping windows: an input can win two windows)", .op = "maxpool2d", .fn = f_pool, .ctx = &pools[1], .n_in = 1,
     .in = {{"x", 4, {2, 3, 7, 5}, 8}}, .ref = r_pool, .exact = 1, .out = OPH_SHAPE(4, 2, 3, 3, 2)},
    {.name = "maxpool2d k2 s1", .op = "maxpool2d", .fn = f_pool, .ctx = &pools[2], .n_in = 1,
     .in = {{"x", 4, {2, 3, 7, 5}, 9}}, .ref = r_pool, .exact = 1, .out = OPH_SHAPE(4, 2, 3, 6, 4)},
    {.name = "maxpool2d k3 s3 (7x5 -> 2x1)", .op = "maxpool2d", .fn = f_pool, .ctx = &pools[3], .n_in = 1,
     .in = {{"x", 4, {2, 3, 7, 5}, 10}}, .ref = r_pool, .exact = 1, .out = OPH_SHAPE(4, 2, 3, 2, 1)},
    {.name = "maxpool2d grad k2 s2", .op = "maxpool2d", .fn = f_pool, .ctx = &pools[0], .n_in = 1,
     .in = {{"x", 4, {2, 3, 7, 5}, 0}}, .prep = p_distinct, .grad = 1, .gc = {.seed = 50}, .check_grad = cg_last_row_col_zero},
    {.name = "maxpool2d grad k3 s2", .op = "maxpool2d", .fn = f_pool, .ctx = &pools[1], .n_in = 1,
     .in = {{"x", 4, {2, 3, 7, 5}, 0}}, .prep = p_distinct, .grad = 1, .gc = {.seed = 51}},
    {.name = "maxpool2d grad k2 s1", .op = "maxpool2d", .fn = f_pool, .ctx = &pools[2], .n_in = 1,
     .in = {{"x", 4, {2, 3, 7, 5}, 0}}, .prep = p_distinct, .grad = 1, .gc = {.seed = 52}},
    {.name = "maxpool2d grad k3 s3", .op = "maxpool2d", .fn = f_pool, .ctx = &pools[3], .n_in = 1,
     .in = {{"x", 4, {2, 3, 7, 5}, 0}}, .prep = p_distinct, .grad = 1, .gc = {.seed = 53}},
    {.name = "maxpool2d bad: window 0", .op = "maxpool2d", .fn = f_pool, .ctx = &bad_k0, .n_in = 1,
     .in = {{"x", 4, {2, 3, 7, 5}, 1}}, .error = "window 0"},
    {.name = "maxpool2d bad: stride 0", .op = "maxpool2d", .fn = f_pool, .ctx = &bad_s0, .n_in = 1,
     .in = {{"x", 4, {2, 3, 7, 5}, 1}}, .error = "stride 0"},
    {.name = "maxpool2d bad: window 6 > W 5", .op = "maxpool2d", .fn = f_pool, .ctx = &bad_k6, .n_in = 1,
     .in = {{"x", 4, {2, 3, 7, 5}, 1}}, .error = "[2, 3, 7, 5]"},
    {.name = "maxpool2d bad: 3-D x", .op = "maxpool2d", .fn = f_pool, .ctx = &k2s2, .n_in = 1,
     .in = {{"x3", 3, {3, 7, 5}, 1}}, .error = "[3, 7, 5]"},
    {.name = "maxpool2d bad: x NULL", .op = "maxpool2d", .fn = f_pool, .ctx = &k2s2, .n_in = 1, .in = {OPH_NULL},
     .error = "required"},
    {.name = "maxpool2d ok: window == W", .op = "maxpool2d", .fn = f_pool, .ctx = &k5s1, .n_in = 1,
     .in = {{"x", 4, {2, 3, 7, 5}, 1}}, .ref = r_pool, .exact = 1, .out = OPH_SHAPE(4, 2, 3, 3, 1)},
};

/* Overlapping windows: one input that is the max of two windows receives both
 * output gradients; total gradient mass equals the sum of dy. */
static void test_maxpool2d_overlap_routes_to_argmax(void **state) {
    (void)state;
    dt_param x;
    assert_int_equal(dt_param_init(&x, "x", 4, (int64_t[]){1, 1, 3, 5}), DT_OK);
    float *xd = dt_f32(&x.value);
    for (int i = 0; i < 15; i++) xd[i] = (float)i * 0.01f;
    xd[1 * 5 + 2] = 10.f;   /* centre column: inside both 3x3 windows with stride 2 */
    dt_graph *g = dt_graph_create();
    dt_tensor *y = dt_op_maxpool2d(g, &x.value, 3, 2);
    assert_non_null(y);
    assert_int_equal(y->shape[2], 1);
    assert_int_equal(y->shape[3], 2);
    assert_true(dt_f32(y)[0] == 10.f && dt_f32(y)[1] == 10.f);
    float R[2] = {0.5f, 2.0f};
    assert_int_equal(dt_graph_backward(g, oph_wsum(g, y, R)), DT_OK);
    for (int i = 0; i < 15; i++) assert_true(dt_f32(&x.grad)[i] == (i == 7 ? 2.5f : 0.f));
    dt_graph_free(g);
    dt_param_free(&x);
}

int main(void) {
    const struct CMUnitTest extra[] = {cmocka_unit_test(test_maxpool2d_overlap_routes_to_argmax)};
    return OPH_RUN("ops_maxpool2d", table, extra);
}
