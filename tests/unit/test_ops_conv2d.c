/* conv2d on the op harness (tests/common/op_harness.h): forward vs a naive
 * direct convolution, backward via finite differences, bad args, and (not
 * table entries) chunked-batch backward vs per-image, accumulation, no-grad
 * recording nothing — every case under both backends (oneDNN, im2col);
 * oneDNN against im2col on the demo CNN's shapes; 16-bit precision rounds
 * every product's inputs on both. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdlib.h>
#include "op_harness.h"

typedef struct conv_ctx { int stride, pad, bias; } conv_ctx;

static dt_tensor *f_conv(dt_graph *g, dt_param **in, void *ctx) {
    const conv_ctx *c = ctx;
    return dt_op_conv2d(g, OPH_T(in, 0), OPH_T(in, 1), c->bias ? OPH_T(in, 2) : NULL, c->stride, c->pad);
}

/* y[n, oc, oh, ow] = b[oc] + sum_{c, kh, kw} x[n, c, oh*s-p+kh, ow*s-p+kw] * w[oc, c, kh, kw] */
static void r_conv(dt_param **in, void *ctx, double *y) {
    const conv_ctx *cc = ctx;
    const int64_t *xs = in[0]->value.shape, *ws = in[1]->value.shape;
    int64_t N = xs[0], C = xs[1], H = xs[2], W = xs[3], OC = ws[0], KH = ws[2], KW = ws[3], s = cc->stride, p = cc->pad;
    int64_t OH = (H + 2 * p - KH) / s + 1, OW = (W + 2 * p - KW) / s + 1;
    const float *x = OPH_V(in, 0), *w = OPH_V(in, 1), *b = cc->bias ? OPH_V(in, 2) : NULL;
    for (int64_t n = 0; n < N; n++)
        for (int64_t oc = 0; oc < OC; oc++)
            for (int64_t oh = 0; oh < OH; oh++)
                for (int64_t ow = 0; ow < OW; ow++) {
                    double acc = b ? b[oc] : 0.0;
                    for (int64_t c = 0; c < C; c++)
                        for (int64_t kh = 0; kh < KH; kh++)
                            for (int64_t kw = 0; kw < KW; kw++) {
                                int64_t ih = oh * s - p + kh, iw = ow * s - p + kw;
                                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                                acc += (double)x[((n * C + c) * H + ih) * W + iw] * w[((oc * C + c) * KH + kh) * KW + kw];
                            }
                    y[((n * OC + oc) * OH + oh) * OW + ow] = acc;
                }
}

/* no gradient reached the bias the op was not given */
static void cg_b_untouched(const oph_entry *e, dt_param **in, const dt_tensor *y) {
    (void)e; (void)y;
    for (int i = 0; i < 4; i++) assert_true(dt_f32(&in[2]->grad)[i] == 0.f);
}

static conv_ctx cv_s1p0 = {1, 0, 0}, cv_s1p0b = {1, 0, 1}, cv_s1p1 = {1, 1, 0}, cv_s1p1b = {1, 1, 1}, cv_s1p2 = {1, 2, 0},
                cv_s2p0 = {2, 0, 0}, cv_s2p0b = {2, 0, 1}, cv_s2p1 = {2, 1, 0}, cv_s2p1b = {2, 1, 1}, cv_s3p2b = {3, 2, 1};
static conv_ctx cv_s0p0 = {0, 0, 0}, cv_s1pm1 = {1, -1, 0};

/* Forward: x seed 1, w seed 2, b seed 3. Gradients: x seed 11, w 12, b 13 —
 * conv is linear in each input, so central differences are exact up to
 * float rounding: gradcheck's default tolerances are loose. */
static const oph_entry table[] = {
    {.name = "conv2d 2x3x7x5 * 4x3x3x3 s1 p0", .op = "conv2d", .fn = f_conv, .ctx = &cv_s1p0, .n_in = 2,
     .in = {{"x", 4, {2, 3, 7, 5}, 1}, {"w", 4, {4, 3, 3, 3}, 2}}, .ref = r_conv, .atol = 1e-4,
     .out = OPH_SHAPE(4, 2, 4, 5, 3)},
    {.name = "conv2d 2x3x7x5 * 4x3x3x3 s1 p0 bias", .op = "conv2d", .fn = f_conv, .ctx = &cv_s1p0b, .n_in = 3,
     .in = {{"x", 4, {2, 3, 7, 5}, 1}, {"w", 4, {4, 3, 3, 3}, 2}, {"b", 1, {4}, 3}}, .ref = r_conv, .atol = 1e-4,
     .out = OPH_SHAPE(4, 2, 4, 5, 3)},
    {.name = "conv2d 2x3x7x5 * 4x3x3x3 s1 p1", .op = "conv2d", .fn = f_conv, .ctx = &cv_s1p1, .n_in = 2,
     .in = {{"x", 4, {2, 3, 7, 5}, 1}, {"w", 4, {4, 3, 3, 3}, 2}}, .ref = r_conv, .atol = 1e-4,
     .out = OPH_SHAPE(4, 2, 4, 7, 5)},
    {.name = "conv2d 2x3x7x5 * 4x3x3x3 s1 p1 bias", .op = "conv2d", .fn = f_conv, .ctx = &cv_s1p1b, .n_in = 3,
     .in = {{"x", 4, {2, 3, 7, 5}, 1}, {"w", 4, {4, 3, 3, 3}, 2}, {"b", 1, {4}, 3}}, .ref = r_conv, .atol = 1e-4,
     .out = OPH_SHAPE(4, 2, 4, 7, 5)},
    {.name = "conv2d 2x3x7x5 * 4x3x3x3 s2 p0", .op = "conv2d", .fn = f_conv, .ctx = &cv_s2p0, .n_in = 2,
     .in = {{"x", 4, {2, 3, 7, 5}, 1}, {"w", 4, {4, 3, 3, 3}, 2}}, .ref = r_conv, .atol = 1e-4,
     .out = OPH_SHAPE(4, 2, 4, 3, 2)},
    {.name = "conv2d 2x3x7x5 * 4x3x3x3 s2 p0 bias", .op = "conv2d", .fn = f_conv, .ctx = &cv_s2p0b, .n_in = 3,
     .in = {{"x", 4, {2, 3, 7, 5}, 1}, {"w", 4, {4, 3, 3, 3}, 2}, {"b", 1, {4}, 3}}, .ref = r_conv, .atol = 1e-4,
     .out = OPH_SHAPE(4, 2, 4, 3, 2)},
    {.name = "conv2d 2x3x7x5 * 4x3x3x3 s2 p1", .op = "conv2d", .fn = f_conv, .ctx = &cv_s2p1, .n_in = 2,
     .in = {{"x", 4, {2, 3, 7, 5}, 1}, {"w", 4, {4, 3, 3, 3}, 2}}, .ref = r_conv, .atol = 1e-4,
     .out = OPH_SHAPE(4, 2, 4, 4, 3)},
    {.name = "conv2d 2x3x7x5 * 4x3x3x3 s2 p1 bias", .op = "conv2d", .fn = f_conv, .ctx = &cv_s2p1b, .n_in = 3,
     .in = {{"x", 4, {2, 3, 7, 5}, 1}, {"w", 4, {4, 3, 3, 3}, 2}, {"b", 1, {4}, 3}}, .ref = r_conv, .atol = 1e-4,
     .out = OPH_SHAPE(4, 2, 4, 4, 3)},
    {.name = "conv2d 3x2x6x9 * 5x2x2x4 s3 p2 bias (non-square kernel)", .op = "conv2d", .fn = f_conv, .ctx = &cv_s3p2b, .n_in = 3,
     .in = {{"x", 4, {3, 2, 6, 9}, 1}, {"w", 4, {5, 2, 2, 4}, 2}, {"b", 1, {5}, 3}}, .ref = r_conv, .atol = 1e-4,
     .out = OPH_SHAPE(4, 3, 5, 3, 4)},
    {.name = "conv2d 1x1x28x28 * 8x1x5x5 s1 p2 (CNN first layer)", .op = "conv2d", .fn = f_conv, .ctx = &cv_s1p2, .n_in = 2,
     .in = {{"x", 4, {1, 1, 28, 28}, 1}, {"w", 4, {8, 1, 5, 5}, 2}}, .ref = r_conv, .atol = 1e-4,
     .out = OPH_SHAPE(4, 1, 8, 28, 28)},
    {.name = "conv2d 2x1x1x1 * 2x1x3x3 s1 p1 bias (1x1 image: all padding but the centre)", .op = "conv2d", .fn = f_conv, .ctx = &cv_s1p1b, .n_in = 3,
     .in = {{"x", 4, {2, 1, 1, 1}, 1}, {"w", 4, {2, 1, 3, 3}, 2}, {"b", 1, {2}, 3}}, .ref = r_conv, .atol = 1e-4,
     .out = OPH_SHAPE(4, 2, 2, 1, 1)},
    {.name = "conv2d grad s1 p0 (b unused)", .op = "conv2d", .fn = f_conv, .ctx = &cv_s1p0, .n_in = 3,
     .in = {{"x", 4, {2, 3, 7, 5}, 11}, {"w", 4, {4, 3, 3, 3}, 12}, {"b", 1, {4}, 13}}, .grad = 1,
     .gc = {.seed = 104}, .check_grad = cg_b_untouched},
    {.name = "conv2d grad s1 p0 bias", .op = "conv2d", .fn = f_conv, .ctx = &cv_s1p0b, .n_in = 3,
     .in = {{"x", 4, {2, 3, 7, 5}, 11}, {"w", 4, {4, 3, 3, 3}, 12}, {"b", 1, {4}, 13}}, .grad = 1,
     .gc = {.seed = 105}},
    {.name = "conv2d grad s1 p1 (b unused)", .op = "conv2d", .fn = f_conv, .ctx = &cv_s1p1, .n_in = 3,
     .in = {{"x", 4, {2, 3, 7, 5}, 11}, {"w", 4, {4, 3, 3, 3}, 12}, {"b", 1, {4}, 13}}, .grad = 1,
     .gc = {.seed = 106}, .check_grad = cg_b_untouched},
    {.name = "conv2d grad s1 p1 bias", .op = "conv2d", .fn = f_conv, .ctx = &cv_s1p1b, .n_in = 3,
     .in = {{"x", 4, {2, 3, 7, 5}, 11}, {"w", 4, {4, 3, 3, 3}, 12}, {"b", 1, {4}, 13}}, .grad = 1,
     .gc = {.seed = 107}},
    {.name = "conv2d grad s2 p0 (b unused)", .op = "conv2d", .fn = f_conv, .ctx = &cv_s2p0, .n_in = 3,
     .in = {{"x", 4, {2, 3, 7, 5}, 11}, {"w", 4, {4, 3, 3, 3}, 12}, {"b", 1, {4}, 13}}, .grad = 1,
     .gc = {.seed = 108}, .check_grad = cg_b_untouched},
    {.name = "conv2d grad s2 p0 bias", .op = "conv2d", .fn = f_conv, .ctx = &cv_s2p0b, .n_in = 3,
     .in = {{"x", 4, {2, 3, 7, 5}, 11}, {"w", 4, {4, 3, 3, 3}, 12}, {"b", 1, {4}, 13}}, .grad = 1,
     .gc = {.seed = 109}},
    {.name = "conv2d grad s2 p1 (b unused)", .op = "conv2d", .fn = f_conv, .ctx = &cv_s2p1, .n_in = 3,
     .in = {{"x", 4, {2, 3, 7, 5}, 11}, {"w", 4, {4, 3, 3, 3}, 12}, {"b", 1, {4}, 13}}, .grad = 1,
     .gc = {.seed = 110}, .check_grad = cg_b_untouched},
    {.name = "conv2d grad s2 p1 bias", .op = "conv2d", .fn = f_conv, .ctx = &cv_s2p1b, .n_in = 3,
     .in = {{"x", 4, {2, 3, 7, 5}, 11}, {"w", 4, {4, 3, 3, 3}, 12}, {"b", 1, {4}, 13}}, .grad = 1,
     .gc = {.seed = 111}},
    {.name = "conv2d bad: C 2 vs 3", .op = "conv2d", .fn = f_conv, .ctx = &cv_s1p0, .n_in = 2,
     .in = {{"x", 4, {2, 3, 7, 5}, 1}, {"w2", 4, {4, 2, 3, 3}, 5}}, .error = "[2, 3, 7, 5]"},
    {.name = "conv2d bad: 3-D x", .op = "conv2d", .fn = f_conv, .ctx = &cv_s1p0, .n_in = 2,
     .in = {{"x3", 3, {3, 7, 5}, 4}, {"w", 4, {4, 3, 3, 3}, 2}}, .error = "[3, 7, 5]"},
    {.name = "conv2d bad: bias [5]", .op = "conv2d", .fn = f_conv, .ctx = &cv_s1p0b, .n_in = 3,
     .in = {{"x", 4, {2, 3, 7, 5}, 1}, {"w", 4, {4, 3, 3, 3}, 2}, {"b", 1, {5}, 3}}, .error = "bias [5]"},
    {.name = "conv2d bad: stride 0", .op = "conv2d", .fn = f_conv, .ctx = &cv_s0p0, .n_in = 2,
     .in = {{"x", 4, {2, 3, 7, 5}, 1}, {"w", 4, {4, 3, 3, 3}, 2}}, .error = "stride 0"},
    {.name = "conv2d bad: pad -1", .op = "conv2d", .fn = f_conv, .ctx = &cv_s1pm1, .n_in = 2,
     .in = {{"x", 4, {2, 3, 7, 5}, 1}, {"w", 4, {4, 3, 3, 3}, 2}}, .error = "pad -1"},
    {.name = "conv2d bad: kernel 9 taller than 7", .op = "conv2d", .fn = f_conv, .ctx = &cv_s1p0, .n_in = 2,
     .in = {{"x", 4, {2, 3, 7, 5}, 1}, {"wbig", 4, {4, 3, 9, 3}, 6}}, .error = "[4, 3, 9, 3]"},
    {.name = "conv2d bad: x NULL", .op = "conv2d", .fn = f_conv, .ctx = &cv_s1p0, .n_in = 2,
     .in = {OPH_NULL, {"w", 4, {4, 3, 3, 3}, 2}}, .error = "required"},
    {.name = "conv2d ok: kernel 9 fits 7 padded by 1", .op = "conv2d", .fn = f_conv, .ctx = &cv_s1p1, .n_in = 2,
     .in = {{"x", 4, {2, 3, 7, 5}, 1}, {"wbig", 4, {4, 3, 9, 3}, 6}}, .ref = r_conv, .atol = 1e-4,
     .out = OPH_SHAPE(4, 2, 4, 1, 5)},
};

/* Backward for a batch processed in several im2col chunks must equal the sum
 * of single-image backwards (dw, db) and the per-image dx. The batch's im2col
 * (K = C*5*5 rows by N*H*W columns) is several times the conv's chunk budget
 * (8M floats), so it is split: into chunks of several images, or, when one
 * image alone exceeds the budget, one image per chunk (want_nb1). */
static void check_chunked(int N, int C, int H, int W, int OC, int want_nb1) {
    const int KS = 5;
    dt_param x, w, b;
    oph_param(&x, "x", 4, (int64_t[]){N, C, H, W}, 21, 1.0f);
    oph_param(&w, "w", 4, (int64_t[]){OC, C, KS, KS}, 22, 1.0f);
    oph_param(&b, "b", 1, (int64_t[]){OC}, 23, 1.0f);
    const int64_t per_y = (int64_t)OC * H * W, per_x = (int64_t)C * H * W;
    float *R = malloc((size_t)(N * per_y) * sizeof *R);
    dt_rng r;
    dt_rng_seed(&r, 5);
    for (int64_t i = 0; i < N * per_y; i++) R[i] = dt_rng_uniform(&r) - 0.5f;

    dt_graph *g = dt_graph_create();
    dt_tensor *y = dt_op_conv2d(g, &x.value, &w.value, &b.value, 1, 2);
    assert_non_null(y);
    assert_non_null(y->grad_fn);
    if (!strncmp(dt_conv_backend(), "im2col", 6)) {   /* chunking is im2col's */
        assert_true(y->grad_fn->i[2] < N);   /* really chunked */
        if (want_nb1) assert_int_equal(y->grad_fn->i[2], 1);
        else assert_true(y->grad_fn->i[2] > 1);
    }
    assert_int_equal(dt_graph_backward(g, oph_wsum(g, y, R)), DT_OK);
    float *dw_all = malloc((size_t)w.grad.numel * sizeof(float));
    float *db_all = malloc(OC * sizeof(float));
    float *dx_all = malloc((size_t)x.grad.numel * sizeof(float));
    memcpy(dw_all, w.grad.data, (size_t)w.grad.numel * sizeof(float));
    memcpy(db_all, b.grad.data, OC * sizeof(float));
    memcpy(dx_all, x.grad.data, (size_t)x.grad.numel * sizeof(float));
    float *y_all = malloc((size_t)y->numel * sizeof(float));   /* y lives in the arena, reset below */
    memcpy(y_all, y->data, (size_t)y->numel * sizeof(float));

    memset(w.grad.data, 0, (size_t)w.grad.numel * sizeof(float));
    memset(b.grad.data, 0, OC * sizeof(float));
    double dx_err = 0;
    for (int n = 0; n < N; n++) {   /* one image at a time; dw, db accumulate across the calls */
        dt_param xi;
        assert_int_equal(dt_param_init(&xi, "xi", 4, (int64_t[]){1, C, H, W}), DT_OK);
        memcpy(xi.value.data, dt_f32(&x.value) + n * per_x, (size_t)per_x * sizeof(float));
        dt_graph_reset(g);
        dt_tensor *yi = dt_op_conv2d(g, &xi.value, &w.value, &b.value, 1, 2);
        assert_non_null(yi);
        assert_true(oph_max_diff(dt_f32(yi), y_all + n * per_y, per_y) < 1e-4);
        assert_int_equal(dt_graph_backward(g, oph_wsum(g, yi, R + n * per_y)), DT_OK);
        dx_err = fmax(dx_err, oph_max_diff(dt_f32(&xi.grad), dx_all + n * per_x, per_x));
        dt_graph_reset(g);   /* the tape references xi: drop it before xi goes away */
        dt_param_free(&xi);
    }
    assert_true(dx_err < 1e-4);
    double dw_scale = 0;
    for (int64_t i = 0; i < w.grad.numel; i++) dw_scale = fmax(dw_scale, fabs(dw_all[i]));
    assert_true(dw_scale > 1.0);
    assert_true(oph_max_diff(dt_f32(&w.grad), dw_all, w.grad.numel) < 1e-4 * dw_scale);
    assert_true(oph_max_diff(dt_f32(&b.grad), db_all, OC) < 1e-3);
    dt_graph_free(g);
    free(R); free(y_all); free(dw_all); free(db_all); free(dx_all);
    dt_param_free(&x); dt_param_free(&w); dt_param_free(&b);
}

static void test_conv2d_chunked_batch_matches_per_image(void **state) {
    (void)state;
    check_chunked(12, 16, 48, 48, 4, 0);   /* 400 x 2304 per image, 11M in all: 2 chunks of 6 */
    check_chunked(2, 96, 64, 64, 2, 1);    /* 2400 x 4096 = 9.8M per image > budget: 1 per chunk */
}

/* Parameter gradients accumulate (+=) across backward passes. */
static void test_conv2d_grads_accumulate(void **state) {
    (void)state;
    dt_param x, w, b;
    oph_param(&x, "x", 4, (int64_t[]){2, 3, 7, 5}, 31, 1.0f);
    oph_param(&w, "w", 4, (int64_t[]){4, 3, 3, 3}, 32, 1.0f);
    oph_param(&b, "b", 1, (int64_t[]){4}, 33, 1.0f);
    float R[2 * 4 * 7 * 5];
    for (int i = 0; i < 2 * 4 * 7 * 5; i++) R[i] = (float)sin(0.37 * i + 0.1);
    dt_graph *g = dt_graph_create();
    float first_w = 0, first_b = 0, first_x = 0;
    for (int step = 0; step < 2; step++) {
        dt_graph_reset(g);
        dt_tensor *y = dt_op_conv2d(g, &x.value, &w.value, &b.value, 1, 1);
        assert_non_null(y);
        assert_int_equal(dt_graph_backward(g, oph_wsum(g, y, R)), DT_OK);
        if (step == 0) { first_w = dt_f32(&w.grad)[5]; first_b = dt_f32(&b.grad)[1]; first_x = dt_f32(&x.grad)[17]; }
    }
    assert_true(first_w != 0.f && first_b != 0.f && first_x != 0.f);
    assert_float_equal(dt_f32(&w.grad)[5], 2 * first_w, 1e-5 * fabs(first_w) + 1e-6);
    assert_float_equal(dt_f32(&b.grad)[1], 2 * first_b, 1e-5 * fabs(first_b) + 1e-6);
    assert_float_equal(dt_f32(&x.grad)[17], 2 * first_x, 1e-5 * fabs(first_x) + 1e-6);
    dt_graph_free(g);
    dt_param_free(&x); dt_param_free(&w); dt_param_free(&b);
}

/* With grad disabled nothing is recorded and the output does not require grad. */
static void test_conv2d_no_grad_records_nothing(void **state) {
    (void)state;
    dt_param x, w;
    oph_param(&x, "x", 4, (int64_t[]){1, 2, 4, 4}, 41, 1.0f);
    oph_param(&w, "w", 4, (int64_t[]){3, 2, 3, 3}, 42, 1.0f);
    dt_graph *g = dt_graph_create();
    dt_graph_set_grad_enabled(g, 0);
    dt_tensor *y = dt_op_conv2d(g, &x.value, &w.value, NULL, 1, 0);
    assert_non_null(y);
    assert_int_equal(y->requires_grad, 0);
    assert_null(y->grad_fn);
    assert_int_equal(dt_graph_param_uses(g, &w), 0);
    dt_graph_free(g);
    dt_param_free(&x); dt_param_free(&w);
}

/* oneDNN and im2col agree on the demo CNN's two convolutions (batch 64):
 * y, dx, dw within float rounding of sums over up to C*25*N*H*W terms. */
static void test_conv2d_onednn_matches_im2col(void **state) {
    (void)state;
    const int shapes[2][4] = {{1, 28, 32, 0}, {32, 14, 64, 1}};   /* C, H=W, OC, needs dx */
    for (int k = 0; k < 2; k++) {
        int C = shapes[k][0], H = shapes[k][1], OC = shapes[k][2], N = 64;
        dt_param x, w;
        oph_param(&x, "x", 4, (int64_t[]){N, C, H, H}, 41 + k, 1.0f);
        oph_param(&w, "w", 4, (int64_t[]){OC, C, 5, 5}, 43 + k, 1.0f);
        x.value.requires_grad = shapes[k][3];
        int64_t ny = (int64_t)N * OC * H * H;
        float *R = malloc((size_t)ny * sizeof *R), *ref[3];
        dt_rng r;
        dt_rng_seed(&r, 7);
        for (int64_t i = 0; i < ny; i++) R[i] = dt_rng_uniform(&r) - 0.5f;
        int64_t n[3] = {ny, x.grad.numel, w.grad.numel};
        for (int pass = 0; pass < 2; pass++) {
            assert_int_equal(dt_conv_set_backend(pass ? "onednn" : "im2col"), DT_OK);
            memset(x.grad.data, 0, (size_t)x.grad.numel * sizeof(float));
            memset(w.grad.data, 0, (size_t)w.grad.numel * sizeof(float));
            dt_graph *g = dt_graph_create();
            dt_tensor *y = dt_op_conv2d(g, &x.value, &w.value, NULL, 1, 2);
            assert_non_null(y);
            assert_int_equal(dt_graph_backward(g, oph_wsum(g, y, R)), DT_OK);
            const float *got[3] = {dt_f32(y), dt_f32(&x.grad), dt_f32(&w.grad)};
            for (int t = 0; t < 3; t++) {
                if (t == 1 && !shapes[k][3]) continue;
                if (!pass) {
                    ref[t] = malloc((size_t)n[t] * sizeof(float));
                    memcpy(ref[t], got[t], (size_t)n[t] * sizeof(float));
                    continue;
                }
                double scale = 0;
                for (int64_t i = 0; i < n[t]; i++) scale = fmax(scale, fabs(ref[t][i]));
                assert_true(scale > 0);
                double d = oph_max_diff(got[t], ref[t], n[t]);
                if (d > 1e-5 * scale) fail_msg("conv %d tensor %d: max diff %g (scale %g)", k, t, d, scale);
                free(ref[t]);
            }
            dt_graph_free(g);
        }
        free(R);
        dt_param_free(&x); dt_param_free(&w);
    }
}

/* y, dx, dw of conv(x, w) (5x5, pad 2) under precision prec, for the loss
 * sum(y * R), into out[0..2] (allocated) */
static void conv_grads(dt_precision prec, dt_param *x, dt_param *w, const float *R, float *out[3]) {
    assert_int_equal(dt_gemm_set_precision(prec), DT_OK);
    memset(x->grad.data, 0, (size_t)x->grad.numel * sizeof(float));
    memset(w->grad.data, 0, (size_t)w->grad.numel * sizeof(float));
    dt_graph *g = dt_graph_create();
    dt_tensor *y = dt_op_conv2d(g, &x->value, &w->value, NULL, 1, 2);
    assert_non_null(y);
    assert_int_equal(dt_graph_backward(g, oph_wsum(g, y, R)), DT_OK);
    const dt_tensor *t[3] = {y, &x->grad, &w->grad};
    for (int i = 0; i < 3; i++) {
        out[i] = malloc((size_t)t[i]->numel * sizeof(float));
        memcpy(out[i], dt_f32(t[i]), (size_t)t[i]->numel * sizeof(float));
    }
    dt_graph_free(g);
    assert_int_equal(dt_gemm_set_precision(DT_PREC_FP32), DT_OK);
}

/* 16-bit precision: a convolution's products take 16-bit inputs with fp32
 * accumulation on either backend, as dt_sgemm's: y, dx and dw are the fp32
 * op's on x, w and the upstream gradient rounded beforehand, to within the
 * order of fp32 additions (1e-5 of the largest value; oneDNN's kernels do
 * not promise one order from run to run), and at least 10 times further
 * from the fp32 op's on the inputs as they are (what rounding moves).
 * bf16: DTRAIN_BF16=force, set in main. */
static void test_conv2d_16bit_rounds_inputs(void **state) {
    (void)state;
    const struct { const char *backend; dt_precision prec; dt_dtype to; } cases[] = {
        {"onednn", DT_PREC_FP16, DT_F16}, {"im2col", DT_PREC_FP16, DT_F16},
        {"onednn", DT_PREC_BF16, DT_BF16}, {"im2col", DT_PREC_BF16, DT_BF16}};
    const int64_t N = 8, C = 3, H = 12, OC = 16;   /* 8·12·12 x 16 x 75 = 1.4M multiply-adds: past bf16's 2^18 */
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        assert_int_equal(dt_conv_set_backend(cases[c].backend), DT_OK);
        dt_param x, w, xr, wr;
        oph_param(&x, "x", 4, (int64_t[]){N, C, H, H}, 51, 1.0f);
        oph_param(&w, "w", 4, (int64_t[]){OC, C, 5, 5}, 52, 1.0f);
        oph_param(&xr, "x", 4, (int64_t[]){N, C, H, H}, 51, 1.0f);
        oph_param(&wr, "w", 4, (int64_t[]){OC, C, 5, 5}, 52, 1.0f);
        dt_round_to(xr.value.data, xr.value.data, cases[c].to, (size_t)xr.value.numel);
        dt_round_to(wr.value.data, wr.value.data, cases[c].to, (size_t)wr.value.numel);
        int64_t n[3] = {N * OC * H * H, x.grad.numel, w.grad.numel};
        float *R = malloc((size_t)n[0] * sizeof *R), *Rr = malloc((size_t)n[0] * sizeof *Rr);
        dt_rng r;
        dt_rng_seed(&r, 9);
        for (int64_t i = 0; i < n[0]; i++) R[i] = dt_rng_uniform(&r) - 0.5f;
        dt_round_to(Rr, R, cases[c].to, (size_t)n[0]);
        float *got[3], *want[3], *plain[3];
        conv_grads(cases[c].prec, &x, &w, R, got);
        conv_grads(DT_PREC_FP32, &xr, &wr, Rr, want);
        conv_grads(DT_PREC_FP32, &x, &w, R, plain);
        for (int t = 0; t < 3; t++) {
            double scale = 0;
            for (int64_t i = 0; i < n[t]; i++) scale = fmax(scale, fabs(want[t][i]));
            double tol = 1e-5 * scale, to_want = oph_max_diff(got[t], want[t], n[t]),
                   to_plain = oph_max_diff(got[t], plain[t], n[t]);
            if (!(scale > 0) || to_want > tol || to_plain < 10 * tol)
                fail_msg("%s %s: tensor %d (y, dx, dw): %g from the fp32 op's on rounded inputs (at most %g), %g from "
                         "its on the inputs as they are (at least %g)", cases[c].backend,
                         cases[c].to == DT_F16 ? "fp16" : "bf16", t, to_want, tol, to_plain, 10 * tol);
            free(got[t]); free(want[t]); free(plain[t]);
        }
        free(R); free(Rr);
        dt_param_free(&x); dt_param_free(&w); dt_param_free(&xr); dt_param_free(&wr);
    }
}

static int use_onednn(void **state) { (void)state; return dt_conv_set_backend("onednn") != DT_OK; }
static int use_im2col(void **state) { (void)state; return dt_conv_set_backend("im2col") != DT_OK; }

int main(void) {
    const struct CMUnitTest extra[] = {
        cmocka_unit_test(test_conv2d_chunked_batch_matches_per_image),
        cmocka_unit_test(test_conv2d_grads_accumulate),
        cmocka_unit_test(test_conv2d_no_grad_records_nothing),
    };
    setenv("DTRAIN_BF16", "force", 1);   /* bf16 numerics on any CPU (only where the precision says bf16) */
    const struct CMUnitTest cross[] = {cmocka_unit_test(test_conv2d_onednn_matches_im2col),
                                       cmocka_unit_test(test_conv2d_16bit_rounds_inputs)};
    int bad = oph_run_group("conv2d_onednn", table, OPH_LEN(table), extra, OPH_LEN(extra), use_onednn);
    bad += oph_run_group("conv2d_im2col", table, OPH_LEN(table), extra, OPH_LEN(extra), use_im2col);
    return bad + cmocka_run_group_tests_name("conv2d_cross", cross, NULL, NULL);
}
