/* Linear, linear_gelu and matmul on the op harness (tests/common/op_harness.h):
 * both weight layouts, with and without bias, 2-D and 3-D x, shapes large
 * enough for OpenBLAS and the OpenMP bias paths, a frozen input, accumulation
 * when a weight is used twice / across micro-steps, bad shapes. The bitwise
 * comparison of linear_gelu with the unfused chain is test_ops_fused.c. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include "op_harness.h"

/* ---- linear, linear_gelu: y = x w^T (+ b) [then gelu] ---- */
typedef struct lin_ctx { dt_wlayout layout; int bias, gelu, nograph; } lin_ctx;

static dt_tensor *f_linear(dt_graph *g, dt_param **in, void *ctx) {
    const lin_ctx *c = ctx;
    dt_graph *gg = c->nograph ? NULL : g;
    dt_tensor *b = c->bias ? OPH_T(in, 2) : NULL;
    return c->gelu ? dt_op_linear_gelu(gg, OPH_T(in, 0), OPH_T(in, 1), b, c->layout)
                   : dt_op_linear(gg, OPH_T(in, 0), OPH_T(in, 1), b, c->layout);
}

static double gelu(double x) {
    return 0.5 * x * (1.0 + tanh(sqrt(2.0 / 3.14159265358979323846) * (x + 0.044715 * x * x * x)));
}

/* y[n, o] = sum_i x[n, i] w(o, i) + b[o] in double */
static void r_linear(dt_param **in, void *ctx, double *y) {
    const lin_ctx *c = ctx;
    const dt_tensor *xt = &in[0]->value, *wt = &in[1]->value;
    int64_t K = xt->shape[xt->ndim - 1], N = xt->numel / K;
    int64_t O = c->layout == DT_W_OUT_IN ? wt->shape[0] : wt->shape[1];
    const float *x = OPH_V(in, 0), *w = OPH_V(in, 1), *b = c->bias ? OPH_V(in, 2) : NULL;
    for (int64_t n = 0; n < N; n++)
        for (int64_t o = 0; o < O; o++) {
            double s = b ? b[o] : 0.0;
            for (int64_t i = 0; i < K; i++) s += (double)x[n * K + i] * (c->layout == DT_W_OUT_IN ? w[o * K + i] : w[i * O + o]);
            y[n * O + o] = c->gelu ? gelu(s) : s;
        }
}

/* the frozen x gets no gradient */
static void cg_x_untouched(const oph_entry *e, dt_param **in, const dt_tensor *y) {
    (void)e; (void)y;
    for (int64_t i = 0; i < in[0]->grad.numel; i++) assert_float_equal(dt_f32(&in[0]->grad)[i], 0.0f, 0.0);
}

static lin_ctx oi = {DT_W_OUT_IN, 0, 0, 0}, oib = {DT_W_OUT_IN, 1, 0, 0}, io = {DT_W_IN_OUT, 0, 0, 0},
               iob = {DT_W_IN_OUT, 1, 0, 0}, bad_layout = {(dt_wlayout)7, 0, 0, 0}, nograph = {DT_W_OUT_IN, 0, 0, 1};
static lin_ctx g_oib = {DT_W_OUT_IN, 1, 1, 0}, g_iob = {DT_W_IN_OUT, 1, 1, 0}, g_oi = {DT_W_OUT_IN, 0, 1, 0},
               g_io = {DT_W_IN_OUT, 0, 1, 0}, g_bad_layout = {(dt_wlayout)7, 0, 1, 0}, g_nograph = {DT_W_IN_OUT, 0, 1, 1};

/* ---- matmul: [B,] M x K times [B,] K x N ---- */
static dt_tensor *f_matmul(dt_graph *g, dt_param **in, void *ctx) {
    (void)ctx;
    return dt_op_matmul(g, OPH_T(in, 0), OPH_T(in, 1));
}
static void r_matmul(dt_param **in, void *ctx, double *c) {
    (void)ctx;
    const dt_tensor *at = &in[0]->value, *bt = &in[1]->value;
    int nd = at->ndim;
    int64_t Bt = nd == 3 ? at->shape[0] : 1, M = at->shape[nd - 2], K = at->shape[nd - 1], N = bt->shape[nd - 1];
    const float *a = OPH_V(in, 0), *b = OPH_V(in, 1);
    for (int64_t t = 0; t < Bt; t++)
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) {
                double s = 0;
                for (int64_t k = 0; k < K; k++) s += (double)a[(t * M + i) * K + k] * b[(t * K + k) * N + j];
                c[(t * M + i) * N + j] = s;
            }
}

/* forward: x seed 1, w seed 2, b seed 3 (N = 6, in = 5, out = 7); gradients:
 * x seed 11, w seed 12, b seed 13 (0.5), gradcheck seed 5 */
static const oph_entry table[] = {
    {.name = "linear out_in x [6, 5]", .op = "linear", .fn = f_linear, .ctx = &oi, .n_in = 2,
     .in = {{"x", 2, {6, 5}, 1}, {"w", 2, {7, 5}, 2}}, .ref = r_linear, .atol = 1e-5, .out = OPH_SHAPE(2, 6, 7)},
    {.name = "linear out_in x [2, 3, 5]", .op = "linear", .fn = f_linear, .ctx = &oi, .n_in = 2,
     .in = {{"x", 3, {2, 3, 5}, 1}, {"w", 2, {7, 5}, 2}}, .ref = r_linear, .atol = 1e-5, .out = OPH_SHAPE(3, 2, 3, 7)},
    {.name = "linear out_in bias x [6, 5]", .op = "linear", .fn = f_linear, .ctx = &oib, .n_in = 3,
     .in = {{"x", 2, {6, 5}, 1}, {"w", 2, {7, 5}, 2}, {"b", 1, {7}, 3}}, .ref = r_linear, .atol = 1e-5, .out = OPH_SHAPE(2, 6, 7)},
    {.name = "linear out_in bias x [2, 3, 5]", .op = "linear", .fn = f_linear, .ctx = &oib, .n_in = 3,
     .in = {{"x", 3, {2, 3, 5}, 1}, {"w", 2, {7, 5}, 2}, {"b", 1, {7}, 3}}, .ref = r_linear, .atol = 1e-5, .out = OPH_SHAPE(3, 2, 3, 7)},
    {.name = "linear in_out x [6, 5]", .op = "linear", .fn = f_linear, .ctx = &io, .n_in = 2,
     .in = {{"x", 2, {6, 5}, 1}, {"w", 2, {5, 7}, 2}}, .ref = r_linear, .atol = 1e-5, .out = OPH_SHAPE(2, 6, 7)},
    {.name = "linear in_out x [2, 3, 5]", .op = "linear", .fn = f_linear, .ctx = &io, .n_in = 2,
     .in = {{"x", 3, {2, 3, 5}, 1}, {"w", 2, {5, 7}, 2}}, .ref = r_linear, .atol = 1e-5, .out = OPH_SHAPE(3, 2, 3, 7)},
    {.name = "linear in_out bias x [6, 5]", .op = "linear", .fn = f_linear, .ctx = &iob, .n_in = 3,
     .in = {{"x", 2, {6, 5}, 1}, {"w", 2, {5, 7}, 2}, {"b", 1, {7}, 3}}, .ref = r_linear, .atol = 1e-5, .out = OPH_SHAPE(2, 6, 7)},
    {.name = "linear in_out bias x [2, 3, 5]", .op = "linear", .fn = f_linear, .ctx = &iob, .n_in = 3,
     .in = {{"x", 3, {2, 3, 5}, 1}, {"w", 2, {5, 7}, 2}, {"b", 1, {7}, 3}}, .ref = r_linear, .atol = 1e-5, .out = OPH_SHAPE(3, 2, 3, 7)},
    {.name = "linear grad out_in bias 3x5->7", .op = "linear", .fn = f_linear, .ctx = &oib, .n_in = 3,
     .in = {{"x", 2, {3, 5}, 11}, {"w", 2, {7, 5}, 12, 0.5f}, {"b", 1, {7}, 13, 0.5f}}, .grad = 1, .gc = {.seed = 5}},
    {.name = "linear grad out_in 3x5->7", .op = "linear", .fn = f_linear, .ctx = &oi, .n_in = 2,
     .in = {{"x", 2, {3, 5}, 11}, {"w", 2, {7, 5}, 12, 0.5f}}, .grad = 1, .gc = {.seed = 5}},
    {.name = "linear grad out_in bias 1x1->1", .op = "linear", .fn = f_linear, .ctx = &oib, .n_in = 3,
     .in = {{"x", 2, {1, 1}, 11}, {"w", 2, {1, 1}, 12, 0.5f}, {"b", 1, {1}, 13, 0.5f}}, .grad = 1, .gc = {.seed = 5}},
    {.name = "linear grad in_out bias 3x5->7", .op = "linear", .fn = f_linear, .ctx = &iob, .n_in = 3,
     .in = {{"x", 2, {3, 5}, 11}, {"w", 2, {5, 7}, 12, 0.5f}, {"b", 1, {7}, 13, 0.5f}}, .grad = 1, .gc = {.seed = 5}},
    {.name = "linear grad in_out 4x9->2", .op = "linear", .fn = f_linear, .ctx = &io, .n_in = 2,
     .in = {{"x", 2, {4, 9}, 11}, {"w", 2, {9, 2}, 12, 0.5f}}, .grad = 1, .gc = {.seed = 5}},
    {.name = "linear grad in_out bias 130x70->300 (OpenBLAS, OpenMP)", .op = "linear", .fn = f_linear, .ctx = &iob,
     .n_in = 3, .in = {{"x", 2, {130, 70}, 21}, {"w", 2, {70, 300}, 22, 0.2f}, {"b", 1, {300}, 23, 0.5f}},
     .ref = r_linear, .atol = 1e-4, .out = OPH_SHAPE(2, 130, 300), .grad = 1, .gc = {.seed = 6, .max_checks = 40}},
    {.name = "linear frozen x", .op = "linear", .fn = f_linear, .ctx = &oi, .n_in = 2,
     .in = {{"x", 2, {3, 5}, 41, .frozen = 1}, {"w", 2, {4, 5}, 42}}, .grad = 1, .gc = {.seed = 8},
     .check_grad = cg_x_untouched},
    {.name = "linear twice out_in bias", .op = "linear", .fn = f_linear, .ctx = &oib, .n_in = 3,
     .in = {{"x", 2, {3, 5}, 51}, {"w_out_in", 2, {7, 5}, 52}, {"b", 1, {7}, 54}}, .twice = 1},
    {.name = "linear twice in_out bias", .op = "linear", .fn = f_linear, .ctx = &iob, .n_in = 3,
     .in = {{"x", 2, {3, 5}, 51}, {"w_in_out", 2, {5, 7}, 53}, {"b", 1, {7}, 54}}, .twice = 1},
    {.name = "linear bad: w [7, 6] for x [3, 5]", .op = "linear", .fn = f_linear, .ctx = &oi, .n_in = 2,
     .in = {{"x", 2, {3, 5}, 1}, {"w", 2, {7, 6}, 1}}, .error = "[3, 5]"},
    {.name = "linear bad: w [7, 5] as in_out", .op = "linear", .fn = f_linear, .ctx = &io, .n_in = 2,
     .in = {{"x", 2, {3, 5}, 1}, {"wb", 2, {7, 5}, 1}}, .error = ""},
    {.name = "linear bad: b [8]", .op = "linear", .fn = f_linear, .ctx = &oib, .n_in = 3,
     .in = {{"x", 2, {3, 5}, 1}, {"wb", 2, {7, 5}, 1}, {"b", 1, {8}, 1}}, .error = ""},
    {.name = "linear bad: w 3-D", .op = "linear", .fn = f_linear, .ctx = &oi, .n_in = 2,
     .in = {{"x", 2, {3, 5}, 1}, {"w3", 3, {2, 7, 5}, 1}}, .error = ""},
    {.name = "linear bad: x NULL", .op = "linear", .fn = f_linear, .ctx = &oi, .n_in = 2,
     .in = {OPH_NULL, {"wb", 2, {7, 5}, 1}}, .error = ""},
    {.name = "linear bad: layout 7", .op = "linear", .fn = f_linear, .ctx = &bad_layout, .n_in = 2,
     .in = {{"x", 2, {3, 5}, 1}, {"wb", 2, {7, 5}, 1}}, .error = ""},
    {.name = "linear bad: graph NULL", .op = "linear", .fn = f_linear, .ctx = &nograph, .n_in = 2,
     .in = {{"x", 2, {3, 5}, 1}, {"wb", 2, {7, 5}, 1}}, .error = ""},
    {.name = "linear ok: [3, 5] x [7, 5]", .op = "linear", .fn = f_linear, .ctx = &oi, .n_in = 2,
     .in = {{"x", 2, {3, 5}, 1}, {"wb", 2, {7, 5}, 1}}, .ref = r_linear, .atol = 1e-5, .out = OPH_SHAPE(2, 3, 7)},
    /* linear_gelu against gelu(linear) in double; bitwise vs the chain: test_ops_fused.c */
    {.name = "linear_gelu out_in bias 3x5->7", .op = "linear_gelu", .fn = f_linear, .ctx = &g_oib, .n_in = 3,
     .in = {{"x", 2, {3, 5}, 11, 1.5f}, {"w", 2, {7, 5}, 12, 0.5f}, {"b", 1, {7}, 13}}, .ref = r_linear,
     .atol = 1e-5, .rtol = 1e-5, .out = OPH_SHAPE(2, 3, 7), .grad = 1, .gc = {.seed = 5}},
    {.name = "linear_gelu in_out 2x3x17->33", .op = "linear_gelu", .fn = f_linear, .ctx = &g_io, .n_in = 2,
     .in = {{"x", 3, {2, 3, 17}, 14, 1.5f}, {"w", 2, {17, 33}, 15, 0.5f}}, .ref = r_linear,
     .atol = 1e-5, .rtol = 1e-5, .out = OPH_SHAPE(3, 2, 3, 33), .grad = 1, .gc = {.seed = 6, .max_checks = 60}},
    {.name = "linear_gelu in_out bias 67x19->515 (OpenMP)", .op = "linear_gelu", .fn = f_linear, .ctx = &g_iob,
     .n_in = 3, .in = {{"x", 2, {67, 19}, 16, 1.5f}, {"w", 2, {19, 515}, 17, 0.5f}, {"b", 1, {515}, 18}},
     .ref = r_linear, .atol = 1e-5, .rtol = 1e-5, .out = OPH_SHAPE(2, 67, 515), .grad = 1,
     .gc = {.seed = 7, .max_checks = 40}},
    {.name = "linear_gelu twice out_in", .op = "linear_gelu", .fn = f_linear, .ctx = &g_oi, .n_in = 2,
     .in = {{"x", 2, {3, 5}, 19}, {"w", 2, {7, 5}, 20}}, .twice = 1},
    {.name = "linear_gelu bad: b [4]", .op = "linear_gelu", .fn = f_linear, .ctx = &g_iob, .n_in = 3,
     .in = {{"x", 2, {3, 7}, 1}, {"w", 2, {7, 5}, 2}, {"b", 1, {4}, 3}}, .error = "b has shape [4]"},
    {.name = "linear_gelu bad: x [3, 7] for w [7, 5] out_in", .op = "linear_gelu", .fn = f_linear, .ctx = &g_oi,
     .n_in = 2, .in = {{"x", 2, {3, 7}, 1}, {"w", 2, {7, 5}, 2}}, .error = "x has shape [3, 7]"},
    {.name = "linear_gelu bad: w 3-D", .op = "linear_gelu", .fn = f_linear, .ctx = &g_io, .n_in = 2,
     .in = {{"x", 2, {3, 7}, 1}, {"w3", 3, {7, 5, 1}, 4}}, .error = "w must be 2-D"},
    {.name = "linear_gelu bad: x NULL", .op = "linear_gelu", .fn = f_linear, .ctx = &g_io, .n_in = 2,
     .in = {OPH_NULL, {"w", 2, {7, 5}, 2}}, .error = "x is NULL"},
    {.name = "linear_gelu bad: layout 7", .op = "linear_gelu", .fn = f_linear, .ctx = &g_bad_layout, .n_in = 2,
     .in = {{"x", 2, {3, 7}, 1}, {"w", 2, {7, 5}, 2}}, .error = "layout"},
    {.name = "linear_gelu bad: graph NULL", .op = "linear_gelu", .fn = f_linear, .ctx = &g_nograph, .n_in = 2,
     .in = {{"x", 2, {3, 7}, 1}, {"w", 2, {7, 5}, 2}}, .error = "graph"},
    /* matmul: a seed 1 + M, b seed 2 + N */
    {.name = "matmul 3x5 * 5x4", .op = "matmul", .fn = f_matmul, .n_in = 2,
     .in = {{"a", 2, {3, 5}, 4}, {"b", 2, {5, 4}, 6}}, .ref = r_matmul, .atol = 1e-4, .out = OPH_SHAPE(2, 3, 4),
     .grad = 1, .gc = {.seed = 3}},
    {.name = "matmul 1x1 * 1x1", .op = "matmul", .fn = f_matmul, .n_in = 2,
     .in = {{"a", 2, {1, 1}, 2}, {"b", 2, {1, 1}, 3}}, .ref = r_matmul, .atol = 1e-4, .out = OPH_SHAPE(2, 1, 1),
     .grad = 1, .gc = {.seed = 3}},
    {.name = "matmul 2 x 3x4 * 4x5", .op = "matmul", .fn = f_matmul, .n_in = 2,
     .in = {{"a", 3, {2, 3, 4}, 4}, {"b", 3, {2, 4, 5}, 7}}, .ref = r_matmul, .atol = 1e-4,
     .out = OPH_SHAPE(3, 2, 3, 5), .grad = 1, .gc = {.seed = 3}},
    {.name = "matmul 5 x 8x3 * 3x6 (batch-parallel)", .op = "matmul", .fn = f_matmul, .n_in = 2,
     .in = {{"a", 3, {5, 8, 3}, 9}, {"b", 3, {5, 3, 6}, 8}}, .ref = r_matmul, .atol = 1e-4,
     .out = OPH_SHAPE(3, 5, 8, 6), .grad = 1, .gc = {.seed = 3, .max_checks = 40}},
    {.name = "matmul 2 x 70x90 * 90x80 (threaded SGEMM per slice)", .op = "matmul", .fn = f_matmul, .n_in = 2,
     .in = {{"a", 3, {2, 70, 90}, 71}, {"b", 3, {2, 90, 80}, 82}}, .ref = r_matmul, .atol = 1e-4,
     .out = OPH_SHAPE(3, 2, 70, 80), .grad = 1, .gc = {.seed = 3, .max_checks = 40}},
    {.name = "matmul twice 3 x 2x4 * 4x5", .op = "matmul", .fn = f_matmul, .n_in = 2,
     .in = {{"a", 3, {3, 2, 4}, 61}, {"b", 3, {3, 4, 5}, 62}}, .twice = 1},
    {.name = "matmul bad: K 3 vs 4", .op = "matmul", .fn = f_matmul, .n_in = 2,
     .in = {{"a", 2, {2, 3}, 1}, {"b", 2, {4, 3}, 1}}, .error = ""},
    {.name = "matmul bad: 2-D x 3-D", .op = "matmul", .fn = f_matmul, .n_in = 2,
     .in = {{"a", 2, {2, 3}, 1}, {"c", 3, {2, 3, 4}, 1}}, .error = ""},
    {.name = "matmul bad: batch 2 vs 3", .op = "matmul", .fn = f_matmul, .n_in = 2,
     .in = {{"c", 3, {2, 3, 4}, 1}, {"d", 3, {3, 4, 5}, 1}}, .error = ""},
    {.name = "matmul bad: b NULL", .op = "matmul", .fn = f_matmul, .n_in = 2,
     .in = {{"a", 2, {2, 3}, 1}, OPH_NULL}, .error = ""},
};

/* y = linear(x, W) + linear(z, W): dW must be the sum of both uses. */
static dt_tensor *f_shared(dt_graph *g, dt_param **in, void *ctx) {
    (void)ctx;
    dt_tensor *a = dt_op_linear(g, OPH_T(in, 0), OPH_T(in, 2), NULL, DT_W_OUT_IN);
    dt_tensor *b = dt_op_linear(g, OPH_T(in, 1), OPH_T(in, 2), NULL, DT_W_OUT_IN);
    return a && b ? dt_op_add(g, a, b) : NULL;
}
static dt_tensor *f_use_x(dt_graph *g, dt_param **in, void *ctx) {
    (void)ctx;
    return dt_op_linear(g, OPH_T(in, 0), OPH_T(in, 2), NULL, DT_W_OUT_IN);
}
static dt_tensor *f_use_z(dt_graph *g, dt_param **in, void *ctx) {
    (void)ctx;
    return dt_op_linear(g, OPH_T(in, 1), OPH_T(in, 2), NULL, DT_W_OUT_IN);
}

static void test_linear_shared_weight_accumulates(void **state) {
    (void)state;
    int64_t xs[2] = {3, 5}, ws[2] = {4, 5};
    dt_param x, z, w;
    oph_param(&x, "x", 2, xs, 31, 1.0f);
    oph_param(&z, "z", 2, xs, 32, 1.0f);
    oph_param(&w, "w", 2, ws, 33, 1.0f);
    dt_param *in_p[3] = {&x, &z, &w};
    dt_gc_opts o = {.seed = 7};
    assert_int_equal(dt_gradcheck(f_shared, NULL, in_p, 3, &o), 0);

    /* explicit: grad(shared) == grad(use x) + grad(use z) */
    float gx[20], gsum[20];
    memset(w.grad.data, 0, sizeof gx);
    oph_backward_sum(f_use_x, NULL, in_p);
    memcpy(gx, w.grad.data, sizeof gx);
    oph_backward_sum(f_use_z, NULL, in_p);   /* accumulates on top: gx + gz */
    memcpy(gsum, w.grad.data, sizeof gsum);
    memset(w.grad.data, 0, sizeof gx);
    oph_backward_sum(f_shared, NULL, in_p);
    double maxg = 0;
    for (int i = 0; i < 20; i++) {
        assert_float_equal(dt_f32(&w.grad)[i], gsum[i], 1e-4);
        maxg = fmax(maxg, fabs(gsum[i] - gx[i]));
    }
    assert_true(maxg > 1e-3);   /* the second use really contributed */
    /* a second micro-step without zeroing doubles the gradient */
    oph_backward_sum(f_shared, NULL, in_p);
    for (int i = 0; i < 20; i++) assert_float_equal(dt_f32(&w.grad)[i], 2 * gsum[i], 1e-4);
    dt_param_free(&x); dt_param_free(&z); dt_param_free(&w);
}

int main(void) {
    const struct CMUnitTest extra[] = {cmocka_unit_test(test_linear_shared_weight_accumulates)};
    return OPH_RUN("ops_linear", table, extra);
}
