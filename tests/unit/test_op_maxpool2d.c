/* dt_op_maxpool2d: forward vs naive, backward via finite differences on
 * tie-free inputs (odd sizes, windows that do not tile the input), routing,
 * bad args. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "dtrain/ops.h"
#include "gradcheck.h"

typedef struct pool_case { int k, s; } pool_case;

/* Distinct values 0.05 apart in shuffled order: no ties, and a +-1e-2 finite
 * difference step can never change which element of a window is the max. */
static void fill_distinct(dt_param *p, uint64_t seed) {
    int64_t n = p->value.numel;
    float *x = dt_f32(&p->value);
    for (int64_t i = 0; i < n; i++) x[i] = 0.05f * (float)(i - n / 2);
    dt_rng r;
    dt_rng_seed(&r, seed);
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)dt_rng_below(&r, (uint64_t)i + 1);
        float t = x[i]; x[i] = x[j]; x[j] = t;
    }
}

static void naive_pool(const float *x, float *y, int N, int C, int H, int W, int k, int s) {
    int OH = (H - k) / s + 1, OW = (W - k) / s + 1;
    for (int pl = 0; pl < N * C; pl++)
        for (int oh = 0; oh < OH; oh++)
            for (int ow = 0; ow < OW; ow++) {
                float m = -INFINITY;
                for (int i = 0; i < k; i++)
                    for (int j = 0; j < k; j++)
                        m = fmaxf(m, x[(pl * H + oh * s + i) * W + ow * s + j]);
                y[(pl * OH + oh) * OW + ow] = m;
            }
}

static const pool_case cases[] = {
    {2, 2},   /* 7x5 -> 3x2: last row and column never pooled */
    {3, 2},   /* overlapping windows: an input can win two windows */
    {2, 1},
    {3, 3},   /* 7x5 -> 2x1 */
};

static void test_maxpool2d_forward_matches_naive(void **state) {
    (void)state;
    const int N = 2, C = 3, H = 7, W = 5;
    for (size_t t = 0; t < sizeof cases / sizeof *cases; t++) {
        int k = cases[t].k, s = cases[t].s;
        dt_param x;
        assert_int_equal(dt_param_init(&x, "x", 4, (int64_t[]){N, C, H, W}), DT_OK);
        dt_gc_fill(&x, 7 + t, 1.0f);
        dt_graph *g = dt_graph_create();
        dt_tensor *y = dt_op_maxpool2d(g, &x.value, k, s);
        assert_non_null(y);
        int OH = (H - k) / s + 1, OW = (W - k) / s + 1;
        assert_int_equal(y->shape[0], N);
        assert_int_equal(y->shape[1], C);
        assert_int_equal(y->shape[2], OH);
        assert_int_equal(y->shape[3], OW);
        float ref[2 * 3 * 7 * 5];
        naive_pool(dt_f32(&x.value), ref, N, C, H, W, k, s);
        for (int64_t i = 0; i < y->numel; i++) assert_true(dt_f32(y)[i] == ref[i]);
        dt_graph_free(g);
        dt_param_free(&x);
    }
}

static dt_tensor *pool_fn(dt_graph *g, dt_param **in, void *ctx) {
    const pool_case *pc = ctx;
    return dt_op_maxpool2d(g, &in[0]->value, pc->k, pc->s);
}

static void test_maxpool2d_gradcheck(void **state) {
    (void)state;
    for (size_t t = 0; t < sizeof cases / sizeof *cases; t++) {
        dt_param x;
        assert_int_equal(dt_param_init(&x, "x", 4, (int64_t[]){2, 3, 7, 5}), DT_OK);
        fill_distinct(&x, 40 + t);
        dt_param *in[1] = {&x};
        dt_gc_opts o = {.seed = 50 + t};
        /* max is piecewise linear and no step crosses a kink (see fill_distinct),
         * so numeric and analytic gradients agree to float rounding. */
        if (dt_gradcheck(pool_fn, (void *)&cases[t], in, 1, &o))
            fail_msg("maxpool2d gradcheck failed (k %d s %d)", cases[t].k, cases[t].s);
        if (cases[t].k == 2 && cases[t].s == 2) {   /* last row (ih = 6) and column (iw = 4) get no gradient */
            const float *gx = dt_f32(&x.grad);
            for (int pl = 0; pl < 6; pl++) {
                for (int iw = 0; iw < 5; iw++) assert_true(gx[(pl * 7 + 6) * 5 + iw] == 0.f);
                for (int ih = 0; ih < 7; ih++) assert_true(gx[(pl * 7 + ih) * 5 + 4] == 0.f);
            }
        }
        dt_param_free(&x);
    }
}

/* L = sum(y * R). */
static void wsum_bw(dt_graph *g, dt_node *n) {
    float *dx = dt_grad_of(g, n->in[0]);
    const float *R = n->saved;
    float d = dt_f32(n->out->grad)[0];
    if (dx) for (int64_t i = 0; i < n->in[0]->numel; i++) dx[i] += d * R[i];
}
static dt_tensor *wsum(dt_graph *g, dt_tensor *x, const float *R) {
    dt_tensor *out = dt_graph_tensor(g, 0, NULL);
    dt_f32(out)[0] = 0;
    dt_node *n = dt_graph_record(g, "wsum", wsum_bw, out, 1, &x);
    if (n) n->saved = (void *)R;
    return out;
}

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
    assert_int_equal(dt_graph_backward(g, wsum(g, y, R)), DT_OK);
    for (int i = 0; i < 15; i++) assert_true(dt_f32(&x.grad)[i] == (i == 7 ? 2.5f : 0.f));
    dt_graph_free(g);
    dt_param_free(&x);
}

static void expect_error(dt_tensor *y, const char *needle) {
    assert_null(y);
    assert_int_equal(dt_error_code(), DT_EINVAL);
    if (!strstr(dt_error_message(), "maxpool2d") || !strstr(dt_error_message(), needle))
        fail_msg("unexpected message: %s", dt_error_message());
    dt_error_clear();
}

static void test_maxpool2d_bad_args(void **state) {
    (void)state;
    dt_param x, x3;
    assert_int_equal(dt_param_init(&x, "x", 4, (int64_t[]){2, 3, 7, 5}), DT_OK);
    assert_int_equal(dt_param_init(&x3, "x3", 3, (int64_t[]){3, 7, 5}), DT_OK);
    dt_graph *g = dt_graph_create();
    expect_error(dt_op_maxpool2d(g, &x.value, 0, 1), "window 0");
    expect_error(dt_op_maxpool2d(g, &x.value, 2, 0), "stride 0");
    expect_error(dt_op_maxpool2d(g, &x.value, 6, 1), "[2, 3, 7, 5]");   /* 6 > W = 5 */
    expect_error(dt_op_maxpool2d(g, &x3.value, 2, 2), "[3, 7, 5]");
    expect_error(dt_op_maxpool2d(g, NULL, 2, 2), "required");
    assert_non_null(dt_op_maxpool2d(g, &x.value, 5, 1));   /* window == W is fine */
    dt_graph_free(g);
    dt_param_free(&x);
    dt_param_free(&x3);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_maxpool2d_forward_matches_naive),
        cmocka_unit_test(test_maxpool2d_gradcheck),
        cmocka_unit_test(test_maxpool2d_overlap_routes_to_argmax),
        cmocka_unit_test(test_maxpool2d_bad_args),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
