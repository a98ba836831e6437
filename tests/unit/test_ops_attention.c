/* attention (fused causal MHSA over qkv[B, T, 3C]) on the op harness
 * (tests/common/op_harness.h): values vs a naive double implementation (odd
 * sizes and T spanning several row tiles) with and without gradients,
 * gradients (backward recomputes the probabilities) vs finite differences,
 * causality, bad shapes, and memory: no head's [T, T] kept. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include "op_harness.h"

static dt_tensor *f_att(dt_graph *g, dt_param **in, void *ctx) {
    return dt_op_attention(g, OPH_T(in, 0), *(const int *)ctx);
}

/* y[b, i, h*hs + d] = sum_{j<=i} softmax_j(q_i . k_j / sqrt(hs)) v_j[d] */
static void r_att(dt_param **in, void *ctx, double *y) {
    const int64_t *s = in[0]->value.shape;
    int64_t B = s[0], T = s[1], C = s[2] / 3, H = *(const int *)ctx, hs = C / H;
    const float *qkv = OPH_V(in, 0);
    double *p = malloc((size_t)T * sizeof *p);
    assert_non_null(p);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < T; i++) {
                const float *q = qkv + (b * T + i) * 3 * C + h * hs;
                double m = -1e300, z = 0;
                for (int64_t j = 0; j <= i; j++) {
                    const float *k = qkv + (b * T + j) * 3 * C + C + h * hs;
                    double d = 0;
                    for (int64_t e = 0; e < hs; e++) d += (double)q[e] * k[e];
                    p[j] = d / sqrt((double)hs);
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

static int heads[6] = {0, 1, 2, 3, 4, 5};

/* values: qkv seed B*1000 + T; gradients: qkv seed 7 + T, gradcheck seed 11 */
static const oph_entry table[] = {
    {.name = "attention B2 T5 C12 H3", .op = "attention", .fn = f_att, .ctx = &heads[3], .n_in = 1,
     .in = {{"qkv", 3, {2, 5, 36}, 2005}}, .ref = r_att, .atol = 2e-5, .out = OPH_SHAPE(3, 2, 5, 12)},
    {.name = "attention B1 T1 C4 H1", .op = "attention", .fn = f_att, .ctx = &heads[1], .n_in = 1,
     .in = {{"qkv", 3, {1, 1, 12}, 1001}}, .ref = r_att, .atol = 2e-5, .out = OPH_SHAPE(3, 1, 1, 4)},
    {.name = "attention B2 T70 C8 H2 (T not a multiple of 4 or 32)", .op = "attention", .fn = f_att, .ctx = &heads[2], .n_in = 1,
     .in = {{"qkv", 3, {2, 70, 24}, 2070}}, .ref = r_att, .atol = 2e-5, .out = OPH_SHAPE(3, 2, 70, 8)},
    {.name = "attention B1 T130 C24 H3 (peaky softmax)", .op = "attention", .fn = f_att, .ctx = &heads[3], .n_in = 1,
     .in = {{"qkv", 3, {1, 130, 72}, 1130, 2.0f}}, .ref = r_att, .atol = 2e-5, .out = OPH_SHAPE(3, 1, 130, 24)},
    {.name = "attention B3 T64 C16 H4 (T a multiple of the tile sizes)", .op = "attention", .fn = f_att, .ctx = &heads[4], .n_in = 1,
     .in = {{"qkv", 3, {3, 64, 48}, 3064}}, .ref = r_att, .atol = 2e-5, .out = OPH_SHAPE(3, 3, 64, 16)},
    {.name = "attention B1 T37 C80 H2 (hs = 40: two column chunks, second partial)", .op = "attention", .fn = f_att, .ctx = &heads[2], .n_in = 1,
     .in = {{"qkv", 3, {1, 37, 240}, 1037}}, .ref = r_att, .atol = 2e-5, .out = OPH_SHAPE(3, 1, 37, 80)},
    {.name = "attention B2 T33 C128 H2 (hs = 64, T just past a 32 boundary)", .op = "attention", .fn = f_att, .ctx = &heads[2], .n_in = 1,
     .in = {{"qkv", 3, {2, 33, 384}, 2033}}, .ref = r_att, .atol = 2e-5, .out = OPH_SHAPE(3, 2, 33, 128)},
    {.name = "attention grad B2 T5 C12 H3", .op = "attention", .fn = f_att, .ctx = &heads[3], .n_in = 1,
     .in = {{"qkv", 3, {2, 5, 36}, 12}}, .grad = 1, .gc = {.seed = 11}},
    {.name = "attention grad B1 T3 C2 H2 (hs = 1)", .op = "attention", .fn = f_att, .ctx = &heads[2], .n_in = 1,
     .in = {{"qkv", 3, {1, 3, 6}, 10}}, .grad = 1, .gc = {.seed = 11}},
    {.name = "attention grad B1 T70 C8 H2 (T past a 32-column boundary)", .op = "attention", .fn = f_att, .ctx = &heads[2], .n_in = 1,
     .in = {{"qkv", 3, {1, 70, 24}, 77}}, .grad = 1, .gc = {.seed = 11, .max_checks = 400}},
    {.name = "attention grad B1 T37 C80 H2 (hs = 40: two column chunks)", .op = "attention", .fn = f_att, .ctx = &heads[2], .n_in = 1,
     .in = {{"qkv", 3, {1, 37, 240}, 44}}, .grad = 1, .gc = {.seed = 11, .max_checks = 300}},
    {.name = "attention twice B2 T5 C4 H2", .op = "attention", .fn = f_att, .ctx = &heads[2], .n_in = 1,
     .in = {{"qkv", 3, {2, 5, 12}, 121}}, .twice = 1},
    {.name = "attention bad: 2-D", .op = "attention", .fn = f_att, .ctx = &heads[3], .n_in = 1,
     .in = {{"a", 2, {5, 36}, 1}}, .error = ""},
    {.name = "attention bad: 35 not 3C", .op = "attention", .fn = f_att, .ctx = &heads[3], .n_in = 1,
     .in = {{"b", 3, {2, 5, 35}, 1}}, .error = ""},
    {.name = "attention bad: 5 heads do not divide 12", .op = "attention", .fn = f_att, .ctx = &heads[5], .n_in = 1,
     .in = {{"c", 3, {2, 5, 36}, 1}}, .error = ""},
    {.name = "attention bad: 0 heads", .op = "attention", .fn = f_att, .ctx = &heads[0], .n_in = 1,
     .in = {{"c", 3, {2, 5, 36}, 1}}, .error = ""},
    {.name = "attention bad: NULL", .op = "attention", .fn = f_att, .ctx = &heads[3], .n_in = 1, .in = {OPH_NULL},
     .error = ""},
    {.name = "attention ok: [2, 5, 36] 4 heads", .op = "attention", .fn = f_att, .ctx = &heads[4], .n_in = 1,
     .in = {{"c", 3, {2, 5, 36}, 1}}, .ref = r_att, .atol = 2e-5, .out = OPH_SHAPE(3, 2, 5, 12)},
};

/* Changing token t's q/k/v must not change outputs at positions < t. */
static void test_causal(void **state) {
    (void)state;
    int64_t B = 1, T = 9, C = 6, s[3] = {B, T, 3 * C};
    dt_param x;
    oph_param(&x, "qkv", 3, s, 3, 1.0f);
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

/* No [T, T] block per head is kept for the whole batch: the graph's arena
 * (activations and op workspaces) peaks, through forward and backward,
 * below half of what B x H heads' probabilities alone would take. Two
 * threads: the per-thread workspaces are 2 x [Tp][Tp]. */
static void test_memory(void **state) {
    (void)state;
    int64_t B = 16, T = 256, C = 64, H = 8, s[3] = {B, T, 3 * C};
    int threads = omp_get_max_threads();
    omp_set_num_threads(2);
    dt_param x;
    oph_param(&x, "qkv", 3, s, 5, 1.0f);
    dt_graph *g = dt_graph_create();
    dt_tensor *y = dt_op_attention(g, &x.value, (int)H);
    assert_non_null(y);
    float *up = malloc((size_t)y->numel * sizeof *up);
    assert_non_null(up);
    for (int64_t i = 0; i < y->numel; i++) up[i] = (float)((i * 7) % 13) / 13.0f - 0.5f;
    assert_int_equal(dt_graph_backward_from(g, y, up), DT_OK);
    size_t probs = (size_t)(B * H * T * T) * sizeof(float), peak = dt_graph_arena_bytes(g);
    printf("attention B%lld T%lld H%lld: arena peak %.1f MiB, probabilities of every head %.1f MiB\n", (long long)B,
           (long long)T, (long long)H, (double)peak / 1048576.0, (double)probs / 1048576.0);
    assert_true(peak < probs / 2);
    double g2 = 0;   /* backward did run */
    for (int64_t i = 0; i < x.value.numel; i++) g2 += (double)dt_f32(&x.grad)[i] * dt_f32(&x.grad)[i];
    assert_true(g2 > 0);
    free(up);
    dt_graph_free(g);
    dt_param_free(&x);
    omp_set_num_threads(threads);
}

int main(void) {
    const struct CMUnitTest extra[] = {cmocka_unit_test(test_causal), cmocka_unit_test(test_memory)};
    return OPH_RUN("ops_attention", table, extra);
}
