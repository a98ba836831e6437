/* dt_op_attention (fused causal MHSA over qkv[B, T, 3C]): values vs a naive
 * double implementation (odd sizes and T spanning several row tiles),
 * causality, no-grad path == grad path, gradients vs finite differences,
 * bad shapes. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdlib.h>
#include "op_test_util.h"

static dt_tensor *f_att(dt_graph *g, dt_param **in, void *ctx) {
    return dt_op_attention(g, &in[0]->value, *(int *)ctx);
}

/* y[b, i, h*hs + d] = sum_{j<=i} softmax_j(q_i . k_j / sqrt(hs)) v_j[d] */
static void att_ref(const float *qkv, double *y, int64_t B, int64_t T, int64_t C, int64_t H) {
    int64_t hs = C / H;
    double *p = malloc((size_t)T * sizeof *p);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < T; i++) {
                const float *q = qkv + (b * T + i) * 3 * C + h * hs;
                double m = -1e300, z = 0;
                for (int64_t j = 0; j <= i; j++) {
                    const float *k = qkv + (b * T + j) * 3 * C + C + h * hs;
                    double s = 0;
                    for (int64_t d = 0; d < hs; d++) s += (double)q[d] * k[d];
                    p[j] = s / sqrt((double)hs);
                    m = fmax(m, p[j]);
                }
                for (int64_t j = 0; j <= i; j++) z += (p[j] = exp(p[j] - m));
                for (int64_t d = 0; d < hs; d++) {
                    double acc = 0;
                    for (int64_t j = 0; j <= i; j++) acc += p[j] / z * qkv[(b * T + j) * 3 * C + 2 * C + h * hs + d];
                    y[(b * T + i) * C + h * hs + d] = acc;
                }
            }
    free(p);
}

static void check_values(int64_t B, int64_t T, int64_t C, int H, float scale) {
    int64_t s[3] = {B, T, 3 * C};
    dt_param x;
    opt_param(&x, "qkv", 3, s, (uint64_t)(B * 1000 + T), scale);
    double *ref = malloc((size_t)(B * T * C) * sizeof *ref);
    att_ref(dt_f32(&x.value), ref, B, T, C, H);
    for (int grad = 0; grad < 2; grad++) {   /* grad path keeps P; no-grad uses tile scratch */
        dt_graph *g = dt_graph_create();
        dt_graph_set_grad_enabled(g, grad);
        dt_tensor *y = dt_op_attention(g, &x.value, H);
        int64_t ys[3] = {B, T, C};
        opt_assert_shape(y, 3, ys);
        double err = opt_max_diff(dt_f32(y), ref, B * T * C);
        if (err > 2e-5) fail_msg("B=%lld T=%lld C=%lld H=%d grad=%d: max err %g", (long long)B, (long long)T,
                                 (long long)C, H, grad, err);
        dt_graph_free(g);
    }
    free(ref);
    dt_param_free(&x);
}

static void test_values(void **state) {
    (void)state;
    check_values(2, 5, 12, 3, 1.0f);
    check_values(1, 1, 4, 1, 1.0f);
    check_values(2, 70, 8, 2, 1.0f);     /* T not a multiple of 4 or 32 */
    check_values(1, 130, 24, 3, 2.0f);   /* peaky softmax */
    check_values(3, 64, 16, 4, 1.0f);    /* T a multiple of the tile sizes */
    check_values(1, 37, 80, 2, 1.0f);    /* hs = 40: two column chunks, second partial */
    check_values(2, 33, 128, 2, 1.0f);   /* hs = 64, T just past a 32 boundary */
}

/* Changing token t's q/k/v must not change outputs at positions < t. */
static void test_causal(void **state) {
    (void)state;
    int64_t B = 1, T = 9, C = 6, s[3] = {B, T, 3 * C};
    dt_param x;
    opt_param(&x, "qkv", 3, s, 3, 1.0f);
    dt_graph *g = dt_graph_create();
    dt_tensor *y0 = dt_op_attention(g, &x.value, 2);
    assert_non_null(y0);
    for (int64_t c = 0; c < 3 * C; c++) dt_f32(&x.value)[6 * 3 * C + c] += 5.0f;
    dt_tensor *y1 = dt_op_attention(g, &x.value, 2);
    assert_non_null(y1);
    for (int64_t i = 0; i < 6 * C; i++) assert_float_equal(dt_f32(y0)[i], dt_f32(y1)[i], 0.0);
    double diff = 0;
    for (int64_t i = 6 * C; i < T * C; i++) diff = fmax(diff, fabs(dt_f32(y0)[i] - dt_f32(y1)[i]));
    assert_true(diff > 1e-3);
    dt_graph_free(g);
    dt_param_free(&x);
}

static void check_grad(int64_t B, int64_t T, int64_t C, int H, int max_checks) {
    int64_t s[3] = {B, T, 3 * C};
    dt_param x;
    opt_param(&x, "qkv", 3, s, (uint64_t)(7 + T), 1.0f);
    dt_param *in[1] = {&x};
    dt_gc_opts o = {.seed = 11, .max_checks = max_checks};
    assert_int_equal(dt_gradcheck(f_att, &H, in, 1, &o), 0);
    dt_param_free(&x);
}

static void test_gradcheck(void **state) {
    (void)state;
    check_grad(2, 5, 12, 3, 0);
    check_grad(1, 3, 2, 2, 0);        /* hs = 1 */
    check_grad(1, 70, 8, 2, 400);     /* T past a 32-column boundary */
    check_grad(1, 37, 80, 2, 300);    /* hs = 40: two column chunks */
}

static void test_bad_shapes(void **state) {
    (void)state;
    int64_t s2[2] = {5, 36}, s3[3] = {2, 5, 35}, ok[3] = {2, 5, 36};
    dt_param a, b, c;
    opt_param(&a, "a", 2, s2, 1, 1.0f);
    opt_param(&b, "b", 3, s3, 1, 1.0f);
    opt_param(&c, "c", 3, ok, 1, 1.0f);
    dt_graph *g = dt_graph_create();
    opt_expect_error(dt_op_attention(g, &a.value, 3), "attention");   /* not 3-D */
    opt_expect_error(dt_op_attention(g, &b.value, 3), "attention");   /* 35 not 3C */
    opt_expect_error(dt_op_attention(g, &c.value, 5), "attention");   /* 5 does not divide 12 */
    opt_expect_error(dt_op_attention(g, &c.value, 0), "attention");
    opt_expect_error(dt_op_attention(g, NULL, 3), "attention");
    assert_non_null(dt_op_attention(g, &c.value, 4));
    dt_graph_free(g);
    dt_param_free(&a); dt_param_free(&b); dt_param_free(&c);
}

static void test_input_used_twice(void **state) {
    (void)state;
    int64_t s[3] = {2, 5, 12};
    dt_param x;
    opt_param(&x, "qkv", 3, s, 121, 1.0f);
    int H = 2;
    dt_param *in[1] = {&x};
    assert_int_equal(opt_gradcheck_twice(f_att, &H, in, 1), 0);
    dt_param_free(&x);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_values),
        cmocka_unit_test(test_causal),
        cmocka_unit_test(test_gradcheck),
        cmocka_unit_test(test_input_used_twice),
        cmocka_unit_test(test_bad_shapes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
