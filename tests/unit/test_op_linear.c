/* dt_op_linear: forward vs a triple loop, gradients vs finite differences for
 * both weight layouts (with and without bias, 2-D and 3-D x), accumulation
 * when a weight is used twice / across micro-steps, bad shapes. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdlib.h>
#include "op_test_util.h"

typedef struct lin_ctx { dt_wlayout layout; int bias; } lin_ctx;

static dt_tensor *f_linear(dt_graph *g, dt_param **in, void *ctx) {
    lin_ctx *c = ctx;
    return dt_op_linear(g, &in[0]->value, &in[1]->value, c->bias ? &in[2]->value : NULL, c->layout);
}

/* y[n, o] = sum_i x[n, i] w(o, i) + b[o] in double */
static void naive_linear(const float *x, const float *w, const float *b, double *y, int64_t N, int64_t in,
                         int64_t out, dt_wlayout layout) {
    for (int64_t n = 0; n < N; n++)
        for (int64_t o = 0; o < out; o++) {
            double s = b ? b[o] : 0.0;
            for (int64_t i = 0; i < in; i++)
                s += (double)x[n * in + i] * (layout == DT_W_OUT_IN ? w[o * in + i] : w[i * out + o]);
            y[n * out + o] = s;
        }
}

static void check_forward(dt_wlayout layout, int bias, int xdim) {
    int64_t N = 6, in = 5, out = 7;
    int64_t xs3[3] = {2, 3, in}, xs2[2] = {N, in};
    int64_t ws[2] = {layout == DT_W_OUT_IN ? out : in, layout == DT_W_OUT_IN ? in : out}, bs[1] = {out};
    dt_param x, w, b;
    opt_param(&x, "x", xdim, xdim == 3 ? xs3 : xs2, 1, 1.0f);
    opt_param(&w, "w", 2, ws, 2, 1.0f);
    opt_param(&b, "b", 1, bs, 3, 1.0f);
    dt_graph *g = dt_graph_create();
    dt_tensor *y = dt_op_linear(g, &x.value, &w.value, bias ? &b.value : NULL, layout);
    int64_t ys3[3] = {2, 3, out}, ys2[2] = {N, out};
    opt_assert_shape(y, xdim, xdim == 3 ? ys3 : ys2);
    double ref[6 * 7];
    naive_linear(dt_f32(&x.value), dt_f32(&w.value), bias ? dt_f32(&b.value) : NULL, ref, N, in, out, layout);
    assert_true(opt_max_diff(dt_f32(y), ref, N * out) < 1e-5);
    dt_graph_free(g);
    dt_param_free(&x); dt_param_free(&w); dt_param_free(&b);
}

static void test_forward_matches_naive(void **state) {
    (void)state;
    for (int layout = 0; layout < 2; layout++)
        for (int bias = 0; bias < 2; bias++)
            for (int xd = 2; xd <= 3; xd++) check_forward((dt_wlayout)layout, bias, xd);
}

static void check_grad(dt_wlayout layout, int bias, int64_t N, int64_t in, int64_t out) {
    int64_t xs[2] = {N, in}, bs[1] = {out};
    int64_t ws[2] = {layout == DT_W_OUT_IN ? out : in, layout == DT_W_OUT_IN ? in : out};
    dt_param x, w, b;
    opt_param(&x, "x", 2, xs, 11, 1.0f);
    opt_param(&w, "w", 2, ws, 12, 0.5f);
    opt_param(&b, "b", 1, bs, 13, 0.5f);
    dt_param *in_p[3] = {&x, &w, &b};
    lin_ctx c = {layout, bias};
    dt_gc_opts o = {.seed = 5};
    assert_int_equal(dt_gradcheck(f_linear, &c, in_p, bias ? 3 : 2, &o), 0);
    dt_param_free(&x); dt_param_free(&w); dt_param_free(&b);
}

static void test_gradcheck_out_in(void **state) {
    (void)state;
    check_grad(DT_W_OUT_IN, 1, 3, 5, 7);
    check_grad(DT_W_OUT_IN, 0, 3, 5, 7);
    check_grad(DT_W_OUT_IN, 1, 1, 1, 1);
}

static void test_gradcheck_in_out(void **state) {
    (void)state;
    check_grad(DT_W_IN_OUT, 1, 3, 5, 7);
    check_grad(DT_W_IN_OUT, 0, 4, 9, 2);
}

/* Large enough that OpenBLAS and the OpenMP bias/column-sum paths engage. */
static void test_gradcheck_large_subset(void **state) {
    (void)state;
    int64_t N = 130, in = 70, out = 300;
    int64_t xs[2] = {N, in}, ws[2] = {in, out}, bs[1] = {out};
    dt_param x, w, b;
    opt_param(&x, "x", 2, xs, 21, 1.0f);
    opt_param(&w, "w", 2, ws, 22, 0.2f);
    opt_param(&b, "b", 1, bs, 23, 0.5f);
    dt_param *in_p[3] = {&x, &w, &b};
    lin_ctx c = {DT_W_IN_OUT, 1};
    dt_gc_opts o = {.seed = 6, .max_checks = 40};
    assert_int_equal(dt_gradcheck(f_linear, &c, in_p, 3, &o), 0);
    dt_param_free(&x); dt_param_free(&w); dt_param_free(&b);
}

/* y = linear(x, W) + linear(z, W): dW must be the sum of both uses. */
static dt_tensor *f_shared(dt_graph *g, dt_param **in, void *ctx) {
    (void)ctx;
    dt_tensor *a = dt_op_linear(g, &in[0]->value, &in[2]->value, NULL, DT_W_OUT_IN);
    dt_tensor *b = dt_op_linear(g, &in[1]->value, &in[2]->value, NULL, DT_W_OUT_IN);
    return a && b ? dt_op_add(g, a, b) : NULL;
}
static dt_tensor *f_use_x(dt_graph *g, dt_param **in, void *ctx) {
    (void)ctx;
    return dt_op_linear(g, &in[0]->value, &in[2]->value, NULL, DT_W_OUT_IN);
}
static dt_tensor *f_use_z(dt_graph *g, dt_param **in, void *ctx) {
    (void)ctx;
    return dt_op_linear(g, &in[1]->value, &in[2]->value, NULL, DT_W_OUT_IN);
}

static void test_shared_weight_accumulates(void **state) {
    (void)state;
    int64_t xs[2] = {3, 5}, ws[2] = {4, 5};
    dt_param x, z, w;
    opt_param(&x, "x", 2, xs, 31, 1.0f);
    opt_param(&z, "z", 2, xs, 32, 1.0f);
    opt_param(&w, "w", 2, ws, 33, 1.0f);
    dt_param *in_p[3] = {&x, &z, &w};
    dt_gc_opts o = {.seed = 7};
    assert_int_equal(dt_gradcheck(f_shared, NULL, in_p, 3, &o), 0);

    /* explicit: grad(shared) == grad(use x) + grad(use z) */
    float gx[20], gsum[20];
    memset(w.grad.data, 0, sizeof gx);
    opt_backward_sum(f_use_x, NULL, in_p);
    memcpy(gx, w.grad.data, sizeof gx);
    opt_backward_sum(f_use_z, NULL, in_p);   /* accumulates on top: gx + gz */
    memcpy(gsum, w.grad.data, sizeof gsum);
    memset(w.grad.data, 0, sizeof gx);
    opt_backward_sum(f_shared, NULL, in_p);
    double maxg = 0;
    for (int i = 0; i < 20; i++) {
        assert_float_equal(dt_f32(&w.grad)[i], gsum[i], 1e-4);
        maxg = fmax(maxg, fabs(gsum[i] - gx[i]));
    }
    assert_true(maxg > 1e-3);   /* the second use really contributed */
    /* a second micro-step without zeroing doubles the gradient */
    opt_backward_sum(f_shared, NULL, in_p);
    for (int i = 0; i < 20; i++) assert_float_equal(dt_f32(&w.grad)[i], 2 * gsum[i], 1e-4);
    dt_param_free(&x); dt_param_free(&z); dt_param_free(&w);
}

/* Frozen x: no gradient buffer requested for it, weights still get theirs. */
static void test_frozen_input_skipped(void **state) {
    (void)state;
    int64_t xs[2] = {3, 5}, ws[2] = {4, 5};
    dt_param x, w;
    opt_param(&x, "x", 2, xs, 41, 1.0f);
    opt_param(&w, "w", 2, ws, 42, 1.0f);
    x.requires_grad = 0;
    x.value.requires_grad = 0;
    dt_param *in_p[2] = {&x, &w};
    lin_ctx c = {DT_W_OUT_IN, 0};
    dt_gc_opts o = {.seed = 8};
    assert_int_equal(dt_gradcheck(f_linear, &c, in_p, 2, &o), 0);
    for (int i = 0; i < 15; i++) assert_float_equal(dt_f32(&x.grad)[i], 0.0f, 0.0);
    dt_param_free(&x); dt_param_free(&w);
}

static void test_bad_shapes(void **state) {
    (void)state;
    int64_t xs[2] = {3, 5}, ws[2] = {7, 6}, w3[3] = {2, 7, 5}, bs[1] = {8}, ws_ok[2] = {7, 5};
    dt_param x, w, wb, w3p, b;
    opt_param(&x, "x", 2, xs, 1, 1.0f);
    opt_param(&w, "w", 2, ws, 1, 1.0f);
    opt_param(&wb, "wb", 2, ws_ok, 1, 1.0f);
    opt_param(&w3p, "w3", 3, w3, 1, 1.0f);
    opt_param(&b, "b", 1, bs, 1, 1.0f);
    dt_graph *g = dt_graph_create();
    opt_expect_error(dt_op_linear(g, &x.value, &w.value, NULL, DT_W_OUT_IN), "linear");
    assert_non_null(strstr(dt_error_message(), "[3, 5]"));
    opt_expect_error(dt_op_linear(g, &x.value, &wb.value, NULL, DT_W_IN_OUT), "linear");
    opt_expect_error(dt_op_linear(g, &x.value, &wb.value, &b.value, DT_W_OUT_IN), "linear");
    opt_expect_error(dt_op_linear(g, &x.value, &w3p.value, NULL, DT_W_OUT_IN), "linear");
    opt_expect_error(dt_op_linear(g, NULL, &wb.value, NULL, DT_W_OUT_IN), "linear");
    opt_expect_error(dt_op_linear(g, &x.value, &wb.value, NULL, (dt_wlayout)7), "linear");
    opt_expect_error(dt_op_linear(NULL, &x.value, &wb.value, NULL, DT_W_OUT_IN), "linear");
    assert_non_null(dt_op_linear(g, &x.value, &wb.value, NULL, DT_W_OUT_IN));
    dt_graph_free(g);
    dt_param_free(&x); dt_param_free(&w); dt_param_free(&wb); dt_param_free(&w3p); dt_param_free(&b);
}

static void test_inputs_used_twice(void **state) {
    (void)state;
    int64_t xs[2] = {3, 5}, wo[2] = {7, 5}, wi[2] = {5, 7}, bs[1] = {7};
    dt_param x, w1, w2, b;
    opt_param(&x, "x", 2, xs, 51, 1.0f);
    opt_param(&w1, "w_out_in", 2, wo, 52, 1.0f);
    opt_param(&w2, "w_in_out", 2, wi, 53, 1.0f);
    opt_param(&b, "b", 1, bs, 54, 1.0f);
    lin_ctx c1 = {DT_W_OUT_IN, 1}, c2 = {DT_W_IN_OUT, 1};
    dt_param *in1[3] = {&x, &w1, &b}, *in2[3] = {&x, &w2, &b};
    assert_int_equal(opt_gradcheck_twice(f_linear, &c1, in1, 3), 0);
    assert_int_equal(opt_gradcheck_twice(f_linear, &c2, in2, 3), 0);
    dt_param_free(&x); dt_param_free(&w1); dt_param_free(&w2); dt_param_free(&b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_forward_matches_naive),
        cmocka_unit_test(test_gradcheck_out_in),
        cmocka_unit_test(test_gradcheck_in_out),
        cmocka_unit_test(test_gradcheck_large_subset),
        cmocka_unit_test(test_shared_weight_accumulates),
        cmocka_unit_test(test_inputs_used_twice),
        cmocka_unit_test(test_frozen_input_skipped),
        cmocka_unit_test(test_bad_shapes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
