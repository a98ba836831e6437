/* dt_op_conv2d: forward vs a naive direct convolution, backward via finite
 * differences, chunked-batch backward vs per-image, accumulation, bad args —
 * every case under both backends (oneDNN, im2col); oneDNN against im2col on
 * the demo CNN's shapes. */
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

typedef struct conv_case { int stride, pad, bias; } conv_case;

/* y[n, oc, oh, ow] = b[oc] + sum_{c, kh, kw} x[n, c, oh*s-p+kh, ow*s-p+kw] * w[oc, c, kh, kw] */
static void naive_conv(const float *x, const float *w, const float *b, float *y,
                       int N, int C, int H, int W, int OC, int KH, int KW, int s, int p) {
    int OH = (H + 2 * p - KH) / s + 1, OW = (W + 2 * p - KW) / s + 1;
    for (int n = 0; n < N; n++)
        for (int oc = 0; oc < OC; oc++)
            for (int oh = 0; oh < OH; oh++)
                for (int ow = 0; ow < OW; ow++) {
                    double acc = b ? b[oc] : 0.0;
                    for (int c = 0; c < C; c++)
                        for (int kh = 0; kh < KH; kh++)
                            for (int kw = 0; kw < KW; kw++) {
                                int ih = oh * s - p + kh, iw = ow * s - p + kw;
                                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                                acc += (double)x[((n * C + c) * H + ih) * W + iw] *
                                       w[((oc * C + c) * KH + kh) * KW + kw];
                            }
                    y[((n * OC + oc) * OH + oh) * OW + ow] = (float)acc;
                }
}

/* L = sum(y * R): scalar loss for driving backward in these tests. */
static void wsum_bw(dt_graph *g, dt_node *n) {
    float *dx = dt_grad_of(g, n->in[0]);
    const float *R = n->saved;
    float d = dt_f32(n->out->grad)[0];
    if (dx) for (int64_t i = 0; i < n->in[0]->numel; i++) dx[i] += d * R[i];
}
static dt_tensor *wsum(dt_graph *g, dt_tensor *x, const float *R) {
    dt_tensor *out = dt_graph_tensor(g, 0, NULL);
    double s = 0;
    for (int64_t i = 0; i < x->numel; i++) s += (double)dt_f32(x)[i] * R[i];
    dt_f32(out)[0] = (float)s;
    dt_node *n = dt_graph_record(g, "wsum", wsum_bw, out, 1, &x);
    if (n) n->saved = (void *)R;
    return out;
}

static void make(dt_param *p, const char *name, int ndim, const int64_t *shape, uint64_t seed) {
    assert_int_equal(dt_param_init(p, name, ndim, shape), DT_OK);
    dt_gc_fill(p, seed, 1.0f);
}

static double max_abs_diff(const float *a, const float *b, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) m = fmax(m, fabs((double)a[i] - b[i]));
    return m;
}

/* ---- forward ---- */
static void check_forward(int N, int C, int H, int W, int OC, int KH, int KW, int s, int p, int bias) {
    dt_param x, w, b;
    make(&x, "x", 4, (int64_t[]){N, C, H, W}, 1);
    make(&w, "w", 4, (int64_t[]){OC, C, KH, KW}, 2);
    make(&b, "b", 1, (int64_t[]){OC}, 3);
    dt_graph *g = dt_graph_create();
    dt_tensor *y = dt_op_conv2d(g, &x.value, &w.value, bias ? &b.value : NULL, s, p);
    assert_non_null(y);
    int OH = (H + 2 * p - KH) / s + 1, OW = (W + 2 * p - KW) / s + 1;
    assert_int_equal(y->ndim, 4);
    assert_int_equal(y->shape[0], N);
    assert_int_equal(y->shape[1], OC);
    assert_int_equal(y->shape[2], OH);
    assert_int_equal(y->shape[3], OW);
    float *ref = malloc((size_t)y->numel * sizeof *ref);
    naive_conv(dt_f32(&x.value), dt_f32(&w.value), bias ? dt_f32(&b.value) : NULL, ref,
               N, C, H, W, OC, KH, KW, s, p);
    double err = max_abs_diff(dt_f32(y), ref, y->numel);
    if (err > 1e-4) fail_msg("conv2d forward differs from naive by %g (s=%d p=%d bias=%d)", err, s, p, bias);
    free(ref);
    dt_graph_free(g);
    dt_param_free(&x); dt_param_free(&w); dt_param_free(&b);
}

static void test_conv2d_forward_matches_naive(void **state) {
    (void)state;
    for (int s = 1; s <= 2; s++)
        for (int p = 0; p <= 1; p++)
            for (int bias = 0; bias <= 1; bias++)
                check_forward(2, 3, 7, 5, 4, 3, 3, s, p, bias);
    check_forward(3, 2, 6, 9, 5, 2, 4, 3, 2, 1);   /* non-square kernel, stride 3, pad 2 */
    check_forward(1, 1, 28, 28, 8, 5, 5, 1, 2, 0); /* CNN first layer shape, one image */
    check_forward(2, 1, 1, 1, 2, 3, 3, 1, 1, 1);   /* 1x1 image: every tap but the centre is padding */
}

/* ---- backward via finite differences ---- */
static dt_tensor *conv_fn(dt_graph *g, dt_param **in, void *ctx) {
    const conv_case *cc = ctx;
    return dt_op_conv2d(g, &in[0]->value, &in[1]->value, cc->bias ? &in[2]->value : NULL, cc->stride, cc->pad);
}

static void test_conv2d_gradcheck(void **state) {
    (void)state;
    for (int s = 1; s <= 2; s++)
        for (int p = 0; p <= 1; p++)
            for (int bias = 0; bias <= 1; bias++) {
                dt_param x, w, b;
                make(&x, "x", 4, (int64_t[]){2, 3, 7, 5}, 11);
                make(&w, "w", 4, (int64_t[]){4, 3, 3, 3}, 12);
                make(&b, "b", 1, (int64_t[]){4}, 13);
                dt_param *in[3] = {&x, &w, &b};
                conv_case cc = {s, p, bias};
                dt_gc_opts o = {.seed = 100 + (uint64_t)(s * 4 + p * 2 + bias)};
                /* conv is linear in each input, so central differences are exact up
                 * to float rounding: default tolerances (rtol 2e-2, atol 2e-3) are loose. */
                int rc = dt_gradcheck(conv_fn, &cc, in, bias ? 3 : 2, &o);
                if (rc) fail_msg("conv2d gradcheck failed (stride %d pad %d bias %d)", s, p, bias);
                /* no grad reached the unused bias */
                if (!bias) for (int i = 0; i < 4; i++) assert_true(dt_f32(&b.grad)[i] == 0.f);
                dt_param_free(&x); dt_param_free(&w); dt_param_free(&b);
            }
}

/* Backward for a batch processed in several im2col chunks must equal the sum
 * of single-image backwards (dw, db) and the per-image dx. The batch's im2col
 * (K = C*5*5 rows by N*H*W columns) is several times the conv's chunk budget
 * (8M floats), so it is split: into chunks of several images, or, when one
 * image alone exceeds the budget, one image per chunk (want_nb1). */
static void check_chunked(int N, int C, int H, int W, int OC, int want_nb1) {
    const int KS = 5;
    dt_param x, w, b;
    make(&x, "x", 4, (int64_t[]){N, C, H, W}, 21);
    make(&w, "w", 4, (int64_t[]){OC, C, KS, KS}, 22);
    make(&b, "b", 1, (int64_t[]){OC}, 23);
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
    assert_int_equal(dt_graph_backward(g, wsum(g, y, R)), DT_OK);
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
        assert_true(max_abs_diff(dt_f32(yi), y_all + n * per_y, per_y) < 1e-4);
        assert_int_equal(dt_graph_backward(g, wsum(g, yi, R + n * per_y)), DT_OK);
        dx_err = fmax(dx_err, max_abs_diff(dt_f32(&xi.grad), dx_all + n * per_x, per_x));
        dt_graph_reset(g);   /* the tape references xi: drop it before xi goes away */
        dt_param_free(&xi);
    }
    assert_true(dx_err < 1e-4);
    double dw_scale = 0;
    for (int64_t i = 0; i < w.grad.numel; i++) dw_scale = fmax(dw_scale, fabs(dw_all[i]));
    assert_true(dw_scale > 1.0);
    assert_true(max_abs_diff(dt_f32(&w.grad), dw_all, w.grad.numel) < 1e-4 * dw_scale);
    assert_true(max_abs_diff(dt_f32(&b.grad), db_all, OC) < 1e-3);
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
    make(&x, "x", 4, (int64_t[]){2, 3, 7, 5}, 31);
    make(&w, "w", 4, (int64_t[]){4, 3, 3, 3}, 32);
    make(&b, "b", 1, (int64_t[]){4}, 33);
    float R[2 * 4 * 7 * 5];
    for (int i = 0; i < 2 * 4 * 7 * 5; i++) R[i] = (float)sin(0.37 * i + 0.1);
    dt_graph *g = dt_graph_create();
    float first_w = 0, first_b = 0, first_x = 0;
    for (int step = 0; step < 2; step++) {
        dt_graph_reset(g);
        dt_tensor *y = dt_op_conv2d(g, &x.value, &w.value, &b.value, 1, 1);
        assert_non_null(y);
        assert_int_equal(dt_graph_backward(g, wsum(g, y, R)), DT_OK);
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
    make(&x, "x", 4, (int64_t[]){1, 2, 4, 4}, 41);
    make(&w, "w", 4, (int64_t[]){3, 2, 3, 3}, 42);
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

static void expect_error(dt_tensor *y, const char *needle) {
    assert_null(y);
    assert_int_equal(dt_error_code(), DT_EINVAL);
    if (!strstr(dt_error_message(), "conv2d") || !strstr(dt_error_message(), needle))
        fail_msg("unexpected message: %s", dt_error_message());
    dt_error_clear();
}

static void test_conv2d_bad_args(void **state) {
    (void)state;
    dt_param x, w, b, x3;
    make(&x, "x", 4, (int64_t[]){2, 3, 7, 5}, 1);
    make(&w, "w", 4, (int64_t[]){4, 3, 3, 3}, 2);
    make(&b, "b", 1, (int64_t[]){5}, 3);
    make(&x3, "x3", 3, (int64_t[]){3, 7, 5}, 4);
    dt_param w2, wbig;
    make(&w2, "w2", 4, (int64_t[]){4, 2, 3, 3}, 5);
    make(&wbig, "wbig", 4, (int64_t[]){4, 3, 9, 3}, 6);
    dt_graph *g = dt_graph_create();
    expect_error(dt_op_conv2d(g, &x.value, &w2.value, NULL, 1, 0), "[2, 3, 7, 5]");   /* C mismatch */
    expect_error(dt_op_conv2d(g, &x3.value, &w.value, NULL, 1, 0), "[3, 7, 5]");      /* 3-D x */
    expect_error(dt_op_conv2d(g, &x.value, &w.value, &b.value, 1, 0), "bias [5]");    /* wrong bias */
    expect_error(dt_op_conv2d(g, &x.value, &w.value, NULL, 0, 0), "stride 0");
    expect_error(dt_op_conv2d(g, &x.value, &w.value, NULL, 1, -1), "pad -1");
    expect_error(dt_op_conv2d(g, &x.value, &wbig.value, NULL, 1, 0), "[4, 3, 9, 3]"); /* kernel taller than 7 */
    expect_error(dt_op_conv2d(g, NULL, &w.value, NULL, 1, 0), "required");
    /* the same oversized kernel fits once padded: 7 + 2*1 >= 9 */
    assert_non_null(dt_op_conv2d(g, &x.value, &wbig.value, NULL, 1, 1));
    dt_graph_free(g);
    dt_param_free(&x); dt_param_free(&w); dt_param_free(&b); dt_param_free(&x3);
    dt_param_free(&w2); dt_param_free(&wbig);
}

/* oneDNN and im2col agree on the demo CNN's two convolutions (batch 64):
 * y, dx, dw within float rounding of sums over up to C*25*N*H*W terms. */
static void test_conv2d_onednn_matches_im2col(void **state) {
    (void)state;
    const int shapes[2][4] = {{1, 28, 32, 0}, {32, 14, 64, 1}};   /* C, H=W, OC, needs dx */
    for (int k = 0; k < 2; k++) {
        int C = shapes[k][0], H = shapes[k][1], OC = shapes[k][2], N = 64;
        dt_param x, w;
        make(&x, "x", 4, (int64_t[]){N, C, H, H}, 41 + k);
        make(&w, "w", 4, (int64_t[]){OC, C, 5, 5}, 43 + k);
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
            assert_int_equal(dt_graph_backward(g, wsum(g, y, R)), DT_OK);
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
                double d = max_abs_diff(got[t], ref[t], n[t]);
                if (d > 1e-5 * scale) fail_msg("conv %d tensor %d: max diff %g (scale %g)", k, t, d, scale);
                free(ref[t]);
            }
            dt_graph_free(g);
        }
        free(R);
        dt_param_free(&x); dt_param_free(&w);
    }
}

static int use_onednn(void **state) { (void)state; return dt_conv_set_backend("onednn") != DT_OK; }
static int use_im2col(void **state) { (void)state; return dt_conv_set_backend("im2col") != DT_OK; }

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conv2d_forward_matches_naive),
        cmocka_unit_test(test_conv2d_gradcheck),
        cmocka_unit_test(test_conv2d_chunked_batch_matches_per_image),
        cmocka_unit_test(test_conv2d_grads_accumulate),
        cmocka_unit_test(test_conv2d_no_grad_records_nothing),
        cmocka_unit_test(test_conv2d_bad_args),
    };
    const struct CMUnitTest cross[] = {cmocka_unit_test(test_conv2d_onednn_matches_im2col)};
    int bad = cmocka_run_group_tests_name("conv2d_onednn", tests, use_onednn, NULL);
    bad += cmocka_run_group_tests_name("conv2d_im2col", tests, use_im2col, NULL);
    return bad + cmocka_run_group_tests_name("conv2d_cross", cross, NULL, NULL);
}
