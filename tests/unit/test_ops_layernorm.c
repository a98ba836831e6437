/* layernorm and add_layernorm on the op harness (tests/common/op_harness.h):
 * values vs a double reference (a large-mean row, 2-D and 3-D x, C from 1
 * to 515), gradients of x, (h,) w, b vs finite differences, a large case on
 * the OpenMP path, accumulation, bad shapes naming the culprit. The bitwise
 * comparison of add_layernorm with add + layernorm is test_ops_fused.c. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdlib.h>
#include "op_harness.h"

/* in: x, [h,] w, b (any may be OPH_NULL or absent) */
typedef struct ln_ctx {
    float eps;
    int fused;     /* add_layernorm(x, h, ...) instead of layernorm(x, ...) */
    int alias;     /* h is x */
    int sum_out;   /* return add_layernorm's sum s instead of y */
    int no_sum;    /* pass sum = NULL */
    int nograph;
} ln_ctx;

static dt_tensor *f_ln(dt_graph *g, dt_param **in, void *ctx) {
    const ln_ctx *c = ctx;
    dt_graph *gg = c->nograph ? NULL : g;
    if (!c->fused) return dt_op_layernorm(gg, OPH_T(in, 0), OPH_T(in, 1), OPH_T(in, 2), c->eps);
    dt_tensor *x = OPH_T(in, 0), *h = c->alias ? x : OPH_T(in, 1), *s = x;
    dt_tensor *y = dt_op_add_layernorm(gg, x, h, OPH_T(in, 2), OPH_T(in, 3), c->eps, c->no_sum ? NULL : &s);
    if (!y && !c->no_sum) assert_null(s);   /* *sum cleared on error */
    return y && c->sum_out ? s : y;
}

/* y = (x - mean) / sqrt(var + eps) * w + b per row of C, in double */
static void ln_rows(const double *x, const float *w, const float *b, double *y, int64_t N, int64_t C, double eps) {
    for (int64_t r = 0; r < N; r++) {
        double m = 0, v = 0;
        for (int64_t c = 0; c < C; c++) m += x[r * C + c];
        m /= (double)C;
        for (int64_t c = 0; c < C; c++) v += (x[r * C + c] - m) * (x[r * C + c] - m);
        v /= (double)C;
        for (int64_t c = 0; c < C; c++) y[r * C + c] = (x[r * C + c] - m) / sqrt(v + eps) * w[c] + (b ? b[c] : 0.0);
    }
}

static void r_ln(dt_param **in, void *ctx, double *y) {
    const ln_ctx *c = ctx;
    const dt_tensor *xt = &in[0]->value;
    int64_t n = xt->numel, C = xt->shape[xt->ndim - 1];
    const float *x = OPH_V(in, 0), *h = c->fused ? (c->alias ? x : OPH_V(in, 1)) : NULL;
    const float *w = c->fused ? OPH_V(in, 2) : OPH_V(in, 1);
    const float *b = c->fused ? (in[3] ? OPH_V(in, 3) : NULL) : OPH_V(in, 2);
    double *s = malloc((size_t)n * sizeof *s);
    assert_non_null(s);
    for (int64_t i = 0; i < n; i++) s[i] = h ? (double)(x[i] + h[i]) : (double)x[i];   /* the op rounds s to float */
    if (c->sum_out) memcpy(y, s, (size_t)n * sizeof *y);
    else ln_rows(s, w, b, y, n / C, C, (double)c->eps);
    free(s);
}

static void p_row0_plus_100(dt_param **in, void *ctx) {   /* a large mean in one row */
    (void)ctx;
    for (int i = 0; i < 7; i++) dt_f32(&in[0]->value)[i] += 100.0f;
}
static void p_mean_3(dt_param **in, void *ctx) {   /* a mean far from 0 */
    (void)ctx;
    for (int64_t i = 0; i < in[0]->value.numel; i++) dt_f32(&in[0]->value)[i] += 3.0f;
}

static ln_ctx ln = {1e-5f, 0, 0, 0, 0, 0}, ln_neg = {-1.0f, 0, 0, 0, 0, 0};
static ln_ctx aln = {1e-5f, 1, 0, 0, 0, 0}, aln_alias = {1e-5f, 1, 1, 0, 0, 0}, aln_sum = {1e-5f, 1, 0, 1, 0, 0};
static ln_ctx aln_neg = {-1.0f, 1, 1, 0, 0, 0}, aln_nosum = {1e-5f, 1, 1, 0, 1, 0}, aln_nograph = {1e-5f, 1, 1, 0, 0, 1};

static const oph_entry table[] = {
    {.name = "layernorm 2x3x7 (a row +100)", .op = "layernorm", .fn = f_ln, .ctx = &ln, .n_in = 3,
     .in = {{"x", 3, {2, 3, 7}, 1, 2.0f}, {"w", 1, {7}, 2}, {"b", 1, {7}, 3}}, .prep = p_row0_plus_100,
     .ref = r_ln, .atol = 1e-4, .out = OPH_SHAPE(3, 2, 3, 7)},
    {.name = "layernorm grad 3x7", .op = "layernorm", .fn = f_ln, .ctx = &ln, .n_in = 3,
     .in = {{"x", 2, {3, 7}, 4}, {"w", 1, {7}, 5}, {"b", 1, {7}, 6}}, .ref = r_ln, .atol = 1e-4,
     .out = OPH_SHAPE(2, 3, 7), .grad = 1, .gc = {.seed = 9, .eps = 3e-3}},
    {.name = "layernorm grad 4x100x96 (OpenMP)", .op = "layernorm", .fn = f_ln, .ctx = &ln, .n_in = 3,
     .in = {{"x", 3, {4, 100, 96}, 7}, {"w", 1, {96}, 8}, {"b", 1, {96}, 9}}, .ref = r_ln, .atol = 1e-4,
     .out = OPH_SHAPE(3, 4, 100, 96), .grad = 1, .gc = {.seed = 10, .eps = 3e-3, .max_checks = 48}},
    {.name = "layernorm twice 3x7", .op = "layernorm", .fn = f_ln, .ctx = &ln, .n_in = 3,
     .in = {{"x", 2, {3, 7}, 101}, {"w", 1, {7}, 102}, {"b", 1, {7}, 103}}, .twice = 1},
    {.name = "layernorm bad: w [6]", .op = "layernorm", .fn = f_ln, .ctx = &ln, .n_in = 3,
     .in = {{"x", 2, {3, 7}, 1}, {"w6", 1, {6}, 1}, {"w7", 1, {7}, 1}}, .error = ""},
    {.name = "layernorm bad: b [6]", .op = "layernorm", .fn = f_ln, .ctx = &ln, .n_in = 3,
     .in = {{"x", 2, {3, 7}, 1}, {"w7", 1, {7}, 1}, {"w6", 1, {6}, 1}}, .error = ""},
    {.name = "layernorm bad: eps -1", .op = "layernorm", .fn = f_ln, .ctx = &ln_neg, .n_in = 3,
     .in = {{"x", 2, {3, 7}, 1}, {"w7", 1, {7}, 1}, {"w7", 1, {7}, 1}}, .error = ""},
    {.name = "layernorm bad: w NULL", .op = "layernorm", .fn = f_ln, .ctx = &ln, .n_in = 3,
     .in = {{"x", 2, {3, 7}, 1}, OPH_NULL, {"w7", 1, {7}, 1}}, .error = ""},
    /* add_layernorm = layernorm(x + h), also returning the sum s */
    {.name = "add_layernorm 3x7", .op = "add_layernorm", .fn = f_ln, .ctx = &aln, .n_in = 4,
     .in = {{"x", 2, {3, 7}, 11, 2.0f}, {"h", 2, {3, 7}, 12}, {"w", 1, {7}, 13}, {"b", 1, {7}, 14}},
     .prep = p_mean_3, .ref = r_ln, .atol = 1e-4, .out = OPH_SHAPE(2, 3, 7), .grad = 1, .gc = {.seed = 15, .eps = 3e-3}},
    {.name = "add_layernorm 3x7 sum", .op = "add_layernorm", .fn = f_ln, .ctx = &aln_sum, .n_in = 4,
     .in = {{"x", 2, {3, 7}, 11, 2.0f}, {"h", 2, {3, 7}, 12}, {"w", 1, {7}, 13}, {"b", 1, {7}, 14}},
     .ref = r_ln, .exact = 1, .out = OPH_SHAPE(2, 3, 7), .grad = 1, .gc = {.seed = 16}},
    {.name = "add_layernorm 2x3x17 no bias", .op = "add_layernorm", .fn = f_ln, .ctx = &aln, .n_in = 3,
     .in = {{"x", 3, {2, 3, 17}, 17}, {"h", 3, {2, 3, 17}, 18}, {"w", 1, {17}, 19}}, .ref = r_ln, .atol = 1e-4,
     .out = OPH_SHAPE(3, 2, 3, 17), .grad = 1, .gc = {.seed = 20, .eps = 3e-3, .max_checks = 40}},
    {.name = "add_layernorm 1x1 (C = 1)", .op = "add_layernorm", .fn = f_ln, .ctx = &aln, .n_in = 4,
     .in = {{"x", 2, {1, 1}, 21}, {"h", 2, {1, 1}, 22}, {"w", 1, {1}, 23}, {"b", 1, {1}, 24}}, .ref = r_ln,
     .atol = 1e-4, .out = OPH_SHAPE(2, 1, 1)},
    {.name = "add_layernorm 67x515 (OpenMP)", .op = "add_layernorm", .fn = f_ln, .ctx = &aln, .n_in = 4,
     .in = {{"x", 2, {67, 515}, 25, 2.0f}, {"h", 2, {67, 515}, 26}, {"w", 1, {515}, 27}, {"b", 1, {515}, 28}},
     .prep = p_mean_3, .ref = r_ln, .atol = 1e-4, .out = OPH_SHAPE(2, 67, 515), .grad = 1,
     .gc = {.seed = 29, .eps = 3e-3, .max_checks = 48}},
    {.name = "add_layernorm x == h", .op = "add_layernorm", .fn = f_ln, .ctx = &aln_alias, .n_in = 4,
     .in = {{"x", 2, {5, 16}, 30}, OPH_NULL, {"w", 1, {16}, 31}, {"b", 1, {16}, 32}}, .ref = r_ln, .atol = 1e-4,
     .out = OPH_SHAPE(2, 5, 16)},
    {.name = "add_layernorm twice 3x7", .op = "add_layernorm", .fn = f_ln, .ctx = &aln, .n_in = 4,
     .in = {{"x", 2, {3, 7}, 33}, {"h", 2, {3, 7}, 34}, {"w", 1, {7}, 35}, {"b", 1, {7}, 36}}, .twice = 1},
    {.name = "add_layernorm bad: h [3, 6]", .op = "add_layernorm", .fn = f_ln, .ctx = &aln, .n_in = 3,
     .in = {{"x", 2, {3, 7}, 1}, {"h6", 2, {3, 6}, 2}, {"w7", 1, {7}, 4}}, .error = "h has shape [3, 6]"},
    {.name = "add_layernorm bad: w [6]", .op = "add_layernorm", .fn = f_ln, .ctx = &aln_alias, .n_in = 3,
     .in = {{"x", 2, {3, 7}, 1}, OPH_NULL, {"w6", 1, {6}, 3}}, .error = "w has shape [6]"},
    {.name = "add_layernorm bad: b [6]", .op = "add_layernorm", .fn = f_ln, .ctx = &aln_alias, .n_in = 4,
     .in = {{"x", 2, {3, 7}, 1}, OPH_NULL, {"w7", 1, {7}, 4}, {"w6", 1, {6}, 3}}, .error = "b has shape [6]"},
    {.name = "add_layernorm bad: eps -1", .op = "add_layernorm", .fn = f_ln, .ctx = &aln_neg, .n_in = 3,
     .in = {{"x", 2, {3, 7}, 1}, OPH_NULL, {"w7", 1, {7}, 4}}, .error = "eps"},
    {.name = "add_layernorm bad: sum NULL", .op = "add_layernorm", .fn = f_ln, .ctx = &aln_nosum, .n_in = 3,
     .in = {{"x", 2, {3, 7}, 1}, OPH_NULL, {"w7", 1, {7}, 4}}, .error = "sum is NULL"},
    {.name = "add_layernorm bad: h NULL", .op = "add_layernorm", .fn = f_ln, .ctx = &aln, .n_in = 3,
     .in = {{"x", 2, {3, 7}, 1}, OPH_NULL, {"w7", 1, {7}, 4}}, .error = "h is NULL"},
    {.name = "add_layernorm bad: w NULL", .op = "add_layernorm", .fn = f_ln, .ctx = &aln_alias, .n_in = 3,
     .in = {{"x", 2, {3, 7}, 1}, OPH_NULL, OPH_NULL}, .error = "w is NULL"},
    {.name = "add_layernorm bad: graph NULL", .op = "add_layernorm", .fn = f_ln, .ctx = &aln_nograph, .n_in = 3,
     .in = {{"x", 2, {3, 7}, 1}, OPH_NULL, {"w7", 1, {7}, 4}}, .error = "graph"},
};

int main(void) { return oph_run_group("ops_layernorm", table, OPH_LEN(table), NULL, 0, NULL); }
