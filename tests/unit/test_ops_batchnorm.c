/* batchnorm on the op harness (tests/common/op_harness.h): training forward
 * vs a double reference (2-D, 3-D, 4-D x), eval mode on running statistics
 * or, without them, on batch statistics, backward via finite differences
 * (training and eval), bad args. Not table entries: running statistics over
 * two forwards, accumulation, SyncBatchNorm with fake sync functions. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include "op_harness.h"

#define EPS 1e-5f

/* Reference training forward in double: y, batch mean and unbiased variance per channel. */
static void ref_bn(const float *x, int64_t N, int64_t C, int64_t S, const float *ga, const float *be,
                   double eps, double *y, double *mean, double *uvar) {
    for (int64_t c = 0; c < C; c++) {
        double m = 0, v = 0, M = (double)(N * S);
        for (int64_t n = 0; n < N; n++)
            for (int64_t s = 0; s < S; s++) m += x[(n * C + c) * S + s];
        m /= M;
        for (int64_t n = 0; n < N; n++)
            for (int64_t s = 0; s < S; s++) { double d = x[(n * C + c) * S + s] - m; v += d * d; }
        if (mean) mean[c] = m;
        if (uvar) uvar[c] = v / (M - 1);
        double is = 1.0 / sqrt(v / M + eps);
        if (y)
            for (int64_t n = 0; n < N; n++)
                for (int64_t s = 0; s < S; s++) {
                    int64_t i = (n * C + c) * S + s;
                    y[i] = (ga ? ga[c] : 1.0) * (x[i] - m) * is + (be ? be[c] : 0.0);
                }
    }
}

/* in: x, gamma, beta, running_mean, running_var (absent or OPH_NULL: NULL) */
typedef struct bn_ctx {
    int training;
    float momentum, eps;
    float x_shift;               /* prep: added to x (a mean away from 0) */
    const float *rm0, *rv0;      /* prep: running stats (NULL: 0.2c - 0.1, 0.5 + c) */
} bn_ctx;

static dt_tensor *f_bn(dt_graph *g, dt_param **in, void *ctx) {
    const bn_ctx *c = ctx;
    dt_graph_set_training(g, c->training);
    return dt_op_batchnorm(g, OPH_T(in, 0), OPH_T(in, 1), OPH_T(in, 2), OPH_T(in, 3), OPH_T(in, 4), c->momentum,
                           c->eps, NULL);
}

/* gamma around 1 (beta around 0: its N(0, 0.5^2) fill), running stats set */
static void p_bn(dt_param **in, void *ctx) {
    const bn_ctx *c = ctx;
    for (int64_t i = 0; i < in[0]->value.numel; i++) dt_f32(&in[0]->value)[i] += c->x_shift;
    if (in[1]) for (int64_t i = 0; i < in[1]->value.numel; i++) dt_f32(&in[1]->value)[i] += 1.0f;
    for (int k = 3; k < 5; k++)
        if (in[k])
            for (int64_t i = 0; i < in[k]->value.numel; i++) {
                const float *v0 = k == 3 ? c->rm0 : c->rv0;
                dt_f32(&in[k]->value)[i] = v0 ? v0[i] : k == 3 ? 0.2f * (float)i - 0.1f : 0.5f + (float)i;
            }
}

/* gamma around 1, beta around 0, both non-trivial (the custom tests' inputs) */
static void make_affine(dt_param *ga, dt_param *be, int64_t C, uint64_t seed) {
    oph_param(ga, "gamma", 1, (int64_t[]){C}, seed, 0.5f);
    for (int64_t c = 0; c < C; c++) dt_f32(&ga->value)[c] += 1.0f;
    oph_param(be, "beta", 1, (int64_t[]){C}, seed + 1, 0.5f);
}

static void shape_ncs(const dt_tensor *x, int64_t *N, int64_t *C, int64_t *S) {
    *N = x->shape[0];
    *C = x->shape[1];
    *S = x->numel / (*N * *C);
}

/* training (or eval without running stats): batch statistics */
static void r_bn_batch(dt_param **in, void *ctx, double *y) {
    (void)ctx;
    int64_t N, C, S;
    shape_ncs(&in[0]->value, &N, &C, &S);
    ref_bn(OPH_V(in, 0), N, C, S, in[1] ? OPH_V(in, 1) : NULL, in[2] ? OPH_V(in, 2) : NULL, EPS, y, NULL, NULL);
}
/* eval: y = gamma * (x - running_mean) / sqrt(running_var + eps) + beta */
static void r_bn_eval(dt_param **in, void *ctx, double *y) {
    (void)ctx;
    int64_t N, C, S;
    shape_ncs(&in[0]->value, &N, &C, &S);
    const float *x = OPH_V(in, 0), *rm = OPH_V(in, 3), *rv = OPH_V(in, 4);
    for (int64_t n = 0; n < N; n++)
        for (int64_t c = 0; c < C; c++)
            for (int64_t s = 0; s < S; s++) {
                int64_t i = (n * C + c) * S + s;
                y[i] = (in[1] ? OPH_V(in, 1)[c] : 1.0) * (x[i] - rm[c]) / sqrt(rv[c] + (double)EPS)
                       + (in[2] ? OPH_V(in, 2)[c] : 0.0);
            }
}
/* eval leaves the running stats as they were */
static void cv_stats_untouched(const oph_entry *e, dt_param **in, const dt_tensor *y) {
    (void)y;
    const bn_ctx *c = e->ctx;
    assert_memory_equal(in[3]->value.data, c->rm0, 2 * sizeof(float));
    assert_memory_equal(in[4]->value.data, c->rv0, 2 * sizeof(float));
}
/* The gradients are not trivially zero (sum_x dL/dx is 0 per channel in training, but not elementwise). */
static void cg_dx_nonzero(const oph_entry *e, dt_param **in, const dt_tensor *y) {
    (void)e; (void)y;
    double gx = 0;
    for (int64_t i = 0; i < in[0]->grad.numel; i++) gx += fabs(dt_f32(&in[0]->grad)[i]);
    assert_true(gx > 1e-2);
}

static const float rm_eval[2] = {0.7f, -1.3f}, rv_eval[2] = {2.5f, 0.3f};
static bn_ctx train = {1, 0.1f, EPS, 0, NULL, NULL}, train_mean3 = {1, 0.1f, EPS, 3.0f, NULL, NULL};
static bn_ctx eval = {0, 0.1f, EPS, 0, NULL, NULL}, eval_stats = {0, 0.1f, EPS, 0, rm_eval, rv_eval};
static bn_ctx train_stats = {1, 0.1f, EPS, 0, rm_eval, rv_eval};
static bn_ctx bad_momentum = {1, 1.5f, EPS, 0, NULL, NULL}, bad_eps = {1, 0.1f, -1.0f, 0, NULL, NULL};

/* Gradcheck tolerance: in training mode y is a smooth but non-linear
 * function of x (through mean and variance), so the eps = 1e-2 central
 * difference has an O(eps^2 * |f'''|) truncation error; with x ~ N(0, 1.5^2)
 * and 8..24 values per channel the worst element measured is ~4e-4 relative
 * (it passes rtol 5e-4 / atol 5e-5, fails 1e-4 / 1e-5). Forward rounding
 * (float y, L summed in double) adds only ~1e-5 absolute after dividing by
 * 2*eps. rtol 2e-3 / atol 2e-4 leaves a 5x margin while a wrong backward
 * (e.g. dropping the mean or the xhat term of dx, or treating batch
 * statistics as constants) is off by O(1) and fails. Eval mode is affine in
 * every input, so there the differences are exact up to rounding. */
static const oph_entry table[] = {
    {.name = "batchnorm training 2D [8, 3]", .op = "batchnorm", .fn = f_bn, .ctx = &train_mean3, .n_in = 3,
     .in = {{"x", 2, {8, 3}, 10, 2.0f}, {"gamma", 1, {3}, 20, 0.5f}, {"beta", 1, {3}, 21, 0.5f}}, .prep = p_bn,
     .ref = r_bn_batch, .atol = 1e-5, .out = OPH_SHAPE(2, 8, 3)},
    {.name = "batchnorm training 3D [4, 3, 5]", .op = "batchnorm", .fn = f_bn, .ctx = &train_mean3, .n_in = 3,
     .in = {{"x", 3, {4, 3, 5}, 11, 2.0f}, {"gamma", 1, {3}, 21, 0.5f}, {"beta", 1, {3}, 22, 0.5f}}, .prep = p_bn,
     .ref = r_bn_batch, .atol = 1e-5, .out = OPH_SHAPE(3, 4, 3, 5)},
    {.name = "batchnorm training 4D [2, 3, 3, 4]", .op = "batchnorm", .fn = f_bn, .ctx = &train_mean3, .n_in = 3,
     .in = {{"x", 4, {2, 3, 3, 4}, 12, 2.0f}, {"gamma", 1, {3}, 22, 0.5f}, {"beta", 1, {3}, 23, 0.5f}}, .prep = p_bn,
     .ref = r_bn_batch, .atol = 1e-5, .out = OPH_SHAPE(4, 2, 3, 3, 4)},
    {.name = "batchnorm grad training 2D [8, 3]", .op = "batchnorm", .fn = f_bn, .ctx = &train, .n_in = 5,
     .in = {{"x", 2, {8, 3}, 61, 1.5f}, {"gamma", 1, {3}, 62, 0.5f}, {"beta", 1, {3}, 63, 0.5f},
            {"running_mean", 1, {3}, .frozen = 1}, {"running_var", 1, {3}, .frozen = 1}},
     .prep = p_bn, .grad = 1, .gc = {.seed = 61, .rtol = 2e-3, .atol = 2e-4}, .check_grad = cg_dx_nonzero},
    {.name = "batchnorm grad training 3D [4, 3, 5]", .op = "batchnorm", .fn = f_bn, .ctx = &train, .n_in = 5,
     .in = {{"x", 3, {4, 3, 5}, 62, 1.5f}, {"gamma", 1, {3}, 63, 0.5f}, {"beta", 1, {3}, 64, 0.5f},
            {"running_mean", 1, {3}, .frozen = 1}, {"running_var", 1, {3}, .frozen = 1}},
     .prep = p_bn, .grad = 1, .gc = {.seed = 62, .rtol = 2e-3, .atol = 2e-4}, .check_grad = cg_dx_nonzero},
    {.name = "batchnorm grad training 4D [2, 3, 3, 4]", .op = "batchnorm", .fn = f_bn, .ctx = &train, .n_in = 5,
     .in = {{"x", 4, {2, 3, 3, 4}, 63, 1.5f}, {"gamma", 1, {3}, 64, 0.5f}, {"beta", 1, {3}, 65, 0.5f},
            {"running_mean", 1, {3}, .frozen = 1}, {"running_var", 1, {3}, .frozen = 1}},
     .prep = p_bn, .grad = 1, .gc = {.seed = 63, .rtol = 2e-3, .atol = 2e-4}, .check_grad = cg_dx_nonzero},
    {.name = "batchnorm grad eval 2D [5, 3]", .op = "batchnorm", .fn = f_bn, .ctx = &eval, .n_in = 5,
     .in = {{"x", 2, {5, 3}, 71, 1.5f}, {"gamma", 1, {3}, 72, 0.5f}, {"beta", 1, {3}, 73, 0.5f},
            {"running_mean", 1, {3}, .frozen = 1}, {"running_var", 1, {3}, .frozen = 1}},
     .prep = p_bn, .grad = 1, .gc = {.seed = 71, .rtol = 2e-3, .atol = 2e-4}, .check_grad = cg_dx_nonzero},
    {.name = "batchnorm grad eval 4D [2, 3, 3, 2]", .op = "batchnorm", .fn = f_bn, .ctx = &eval, .n_in = 5,
     .in = {{"x", 4, {2, 3, 3, 2}, 72, 1.5f}, {"gamma", 1, {3}, 73, 0.5f}, {"beta", 1, {3}, 74, 0.5f},
            {"running_mean", 1, {3}, .frozen = 1}, {"running_var", 1, {3}, .frozen = 1}},
     .prep = p_bn, .grad = 1, .gc = {.seed = 72, .rtol = 2e-3, .atol = 2e-4}, .check_grad = cg_dx_nonzero},
    {.name = "batchnorm eval on running stats", .op = "batchnorm", .fn = f_bn, .ctx = &eval_stats, .n_in = 5,
     .in = {{"x", 3, {3, 2, 4}, 41}, {"gamma", 1, {2}, 42, 0.5f}, {"beta", 1, {2}, 43, 0.5f},
            {"running_mean", 1, {2}, .frozen = 1}, {"running_var", 1, {2}, .frozen = 1}},
     .prep = p_bn, .ref = r_bn_eval, .atol = 1e-5, .out = OPH_SHAPE(3, 3, 2, 4), .check_values = cv_stats_untouched},
    {.name = "batchnorm eval batch of one", .op = "batchnorm", .fn = f_bn, .ctx = &eval_stats, .n_in = 5,
     .in = {{"x", 3, {1, 2, 1}, 41}, OPH_NULL, OPH_NULL, {"running_mean", 1, {2}, .frozen = 1},
            {"running_var", 1, {2}, .frozen = 1}},
     .prep = p_bn, .ref = r_bn_eval, .atol = 1e-5, .out = OPH_SHAPE(3, 1, 2, 1), .check_values = cv_stats_untouched},
    {.name = "batchnorm bad: training on a batch of one", .op = "batchnorm", .fn = f_bn, .ctx = &train_stats,
     .n_in = 5, .in = {{"x", 3, {1, 2, 1}, 41}, OPH_NULL, OPH_NULL, {"running_mean", 1, {2}, .frozen = 1},
                       {"running_var", 1, {2}, .frozen = 1}}, .prep = p_bn, .error = "more than one value"},
    {.name = "batchnorm eval without running stats: batch stats", .op = "batchnorm", .fn = f_bn, .ctx = &eval,
     .n_in = 1, .in = {{"x", 2, {6, 2}, 51}}, .ref = r_bn_batch, .atol = 1e-5, .out = OPH_SHAPE(2, 6, 2)},
    {.name = "batchnorm bad: x [6]", .op = "batchnorm", .fn = f_bn, .ctx = &train, .n_in = 1,
     .in = {{"x1", 1, {6}, 2}}, .error = "[6]"},
    {.name = "batchnorm bad: gamma [4]", .op = "batchnorm", .fn = f_bn, .ctx = &train, .n_in = 2,
     .in = {{"x", 4, {2, 3, 2, 2}, 1}, {"g4", 1, {4}, 3}}, .error = "gamma"},
    {.name = "batchnorm bad: beta [4]", .op = "batchnorm", .fn = f_bn, .ctx = &train, .n_in = 3,
     .in = {{"x", 4, {2, 3, 2, 2}, 1}, OPH_NULL, {"g4", 1, {4}, 3}}, .error = "beta"},
    {.name = "batchnorm bad: running_mean without running_var", .op = "batchnorm", .fn = f_bn, .ctx = &train,
     .n_in = 4, .in = {{"x", 4, {2, 3, 2, 2}, 1}, OPH_NULL, OPH_NULL, {"rm", 1, {3}, 4}}, .error = "both"},
    {.name = "batchnorm bad: running_var [4]", .op = "batchnorm", .fn = f_bn, .ctx = &train, .n_in = 5,
     .in = {{"x", 4, {2, 3, 2, 2}, 1}, OPH_NULL, OPH_NULL, {"rm", 1, {3}, 4}, {"g4", 1, {4}, 3}},
     .error = "running_var"},
    {.name = "batchnorm bad: momentum 1.5", .op = "batchnorm", .fn = f_bn, .ctx = &bad_momentum, .n_in = 1,
     .in = {{"x", 4, {2, 3, 2, 2}, 1}}, .error = "momentum"},
    {.name = "batchnorm bad: eps -1", .op = "batchnorm", .fn = f_bn, .ctx = &bad_eps, .n_in = 1,
     .in = {{"x", 4, {2, 3, 2, 2}, 1}}, .error = "eps"},
    {.name = "batchnorm bad: x NULL", .op = "batchnorm", .fn = f_bn, .ctx = &train, .n_in = 1, .in = {OPH_NULL},
     .error = "required"},
};

/* Running statistics after two training forwards, vs. hand-applied momentum:
 * r = (1-m) r + m * stat, with the unbiased variance. */
static void test_batchnorm_running_stats_two_forwards(void **state) {
    (void)state;
    const int64_t N = 4, C = 3, H = 2, W = 3, S = H * W;
    const float m = 0.1f;
    dt_param x1, x2;
    oph_param(&x1, "x1", 4, (int64_t[]){N, C, H, W}, 31, 1.0f);
    oph_param(&x2, "x2", 4, (int64_t[]){N, C, H, W}, 32, 3.0f);
    for (int64_t i = 0; i < x2.value.numel; i++) dt_f32(&x2.value)[i] -= 1.5f;
    dt_tensor rm, rv;
    assert_int_equal(dt_tensor_alloc(&rm, DT_F32, 1, (int64_t[]){C}), DT_OK);
    assert_int_equal(dt_tensor_alloc(&rv, DT_F32, 1, (int64_t[]){C}), DT_OK);
    for (int c = 0; c < C; c++) dt_f32(&rv)[c] = 1.0f;   /* PyTorch initial state: mean 0, var 1 */

    dt_graph *g = dt_graph_create();
    assert_non_null(dt_op_batchnorm(g, &x1.value, NULL, NULL, &rm, &rv, m, EPS, NULL));
    dt_graph_reset(g);
    /* second forward with grad disabled: still training, so stats still update */
    dt_graph_set_grad_enabled(g, 0);
    assert_non_null(dt_op_batchnorm(g, &x2.value, NULL, NULL, &rm, &rv, m, EPS, NULL));

    double mu1[3], v1[3], mu2[3], v2[3];
    ref_bn(dt_f32(&x1.value), N, C, S, NULL, NULL, EPS, NULL, mu1, v1);
    ref_bn(dt_f32(&x2.value), N, C, S, NULL, NULL, EPS, NULL, mu2, v2);
    for (int c = 0; c < C; c++) {
        double em = (1 - m) * ((1 - m) * 0.0 + m * mu1[c]) + m * mu2[c];
        double ev = (1 - m) * ((1 - m) * 1.0 + m * v1[c]) + m * v2[c];
        assert_float_equal(dt_f32(&rm)[c], em, 1e-5 * (1 + fabs(em)));
        assert_float_equal(dt_f32(&rv)[c], ev, 1e-5 * (1 + fabs(ev)));
        /* the biased variance would give a visibly different value */
        const double M = (double)(N * S), b = (M - 1) / M;
        assert_true(fabs(ev - ((1 - m) * ((1 - m) + m * v1[c] * b) + m * v2[c] * b)) > 1e-3);
    }
    dt_graph_free(g);
    dt_tensor_free(&rm); dt_tensor_free(&rv);
    dt_param_free(&x1); dt_param_free(&x2);
}

/* gamma, beta and x gradients accumulate (+=) over two backward passes. */
static void test_batchnorm_grads_accumulate(void **state) {
    (void)state;
    dt_param x, ga, be;
    oph_param(&x, "x", 4, (int64_t[]){2, 3, 2, 2}, 75, 1.0f);
    make_affine(&ga, &be, 3, 76);
    float R[24];
    for (int i = 0; i < 24; i++) R[i] = (float)sin(0.9 * i + 0.3);
    dt_graph *g = dt_graph_create();
    float first[3] = {0};
    for (int step = 0; step < 2; step++) {
        dt_graph_reset(g);
        dt_tensor *y = dt_op_batchnorm(g, &x.value, &ga.value, &be.value, NULL, NULL, 0.1f, EPS, NULL);
        assert_non_null(y);
        assert_int_equal(dt_graph_backward(g, oph_wsum(g, y, R)), DT_OK);
        if (step == 0) { first[0] = dt_f32(&ga.grad)[1]; first[1] = dt_f32(&be.grad)[2]; first[2] = dt_f32(&x.grad)[5]; }
    }
    const float now[3] = {dt_f32(&ga.grad)[1], dt_f32(&be.grad)[2], dt_f32(&x.grad)[5]};
    for (int k = 0; k < 3; k++) {
        assert_true(fabsf(first[k]) > 1e-3f);
        assert_float_equal(now[k], 2 * first[k], 1e-5 * fabs(first[k]) + 1e-6);
    }
    dt_graph_free(g);
    dt_param_free(&x); dt_param_free(&ga); dt_param_free(&be);
}

/* ---- SyncBatchNorm ---- */
typedef struct fake_sync {
    int factor;          /* 2: a second rank with identical data; 1: identity (one rank) */
    int calls;
    int64_t n_seen[4];
    double count_in[4];
} fake_sync;

static dt_status fake_sync_fn(float *data, int64_t n, double *count, void *user) {
    fake_sync *fs = user;
    if (fs->calls < 4) { fs->n_seen[fs->calls] = n; fs->count_in[fs->calls] = *count; }
    fs->calls++;
    for (int64_t i = 0; i < n; i++) data[i] *= (float)fs->factor;
    *count *= fs->factor;
    return DT_OK;
}

static dt_status failing_sync_fn(float *data, int64_t n, double *count, void *user) {
    (void)data; (void)n; (void)count; (void)user;
    return DT_ERR(DT_ECOMM, "rank 1 did not answer");
}

typedef struct bn_run {
    float *y, *dx, *dga, *dbe, rm[3], rv[3];
} bn_run;

/* Forward + backward of L = sum(y * R) on x; copies results out. */
static void bn_forward_backward(const float *xv, int64_t N, int64_t C, int64_t H, int64_t W,
                                const float *ga_v, const float *be_v, const float *R,
                                const dt_bn_sync *sync, bn_run *out) {
    int64_t shape[4] = {N, C, H, W};
    dt_param x, ga, be;
    assert_int_equal(dt_param_init(&x, "x", 4, shape), DT_OK);
    assert_int_equal(dt_param_init(&ga, "gamma", 1, &C), DT_OK);
    assert_int_equal(dt_param_init(&be, "beta", 1, &C), DT_OK);
    memcpy(x.value.data, xv, (size_t)x.value.numel * sizeof(float));
    memcpy(ga.value.data, ga_v, (size_t)C * sizeof(float));
    memcpy(be.value.data, be_v, (size_t)C * sizeof(float));
    dt_tensor rm, rv;
    assert_int_equal(dt_tensor_alloc(&rm, DT_F32, 1, &C), DT_OK);
    assert_int_equal(dt_tensor_alloc(&rv, DT_F32, 1, &C), DT_OK);
    for (int64_t c = 0; c < C; c++) dt_f32(&rv)[c] = 1.0f;
    dt_graph *g = dt_graph_create();
    dt_tensor *y = dt_op_batchnorm(g, &x.value, &ga.value, &be.value, &rm, &rv, 0.1f, EPS, sync);
    assert_non_null(y);
    assert_int_equal(dt_graph_backward(g, oph_wsum(g, y, R)), DT_OK);
    size_t nx = (size_t)x.value.numel * sizeof(float);
    out->y = malloc(nx); out->dx = malloc(nx);
    out->dga = malloc((size_t)C * sizeof(float)); out->dbe = malloc((size_t)C * sizeof(float));
    memcpy(out->y, y->data, nx);
    memcpy(out->dx, x.grad.data, nx);
    memcpy(out->dga, ga.grad.data, (size_t)C * sizeof(float));
    memcpy(out->dbe, be.grad.data, (size_t)C * sizeof(float));
    memcpy(out->rm, rm.data, (size_t)C * sizeof(float));
    memcpy(out->rv, rv.data, (size_t)C * sizeof(float));
    dt_graph_free(g);
    dt_tensor_free(&rm); dt_tensor_free(&rv);
    dt_param_free(&x); dt_param_free(&ga); dt_param_free(&be);
}

static void bn_run_free(bn_run *r) { free(r->y); free(r->dx); free(r->dga); free(r->dbe); }

/* Two ranks holding identical data (simulated by a sync fn that doubles the
 * sums and the count) must behave like plain BN on the concatenated batch
 * [x; x] with upstream gradient [R; R]: same y and dx for this rank's half,
 * same running stats (global count 2M in the unbiased correction). gamma /
 * beta gradients stay local: half of the concatenated ones. */
static void test_syncbn_two_ranks_match_concatenated_batch(void **state) {
    (void)state;
    const int64_t N = 2, C = 3, H = 3, W = 2, per = N * C * H * W;
    dt_param src, gsrc, bsrc, rsrc;
    oph_param(&src, "x", 1, (int64_t[]){per}, 81, 1.3f);
    make_affine(&gsrc, &bsrc, C, 82);
    oph_param(&rsrc, "R", 1, (int64_t[]){per}, 84, 1.0f);
    float *x2 = malloc(2 * (size_t)per * sizeof(float)), *R2 = malloc(2 * (size_t)per * sizeof(float));
    memcpy(x2, src.value.data, (size_t)per * sizeof(float));
    memcpy(x2 + per, src.value.data, (size_t)per * sizeof(float));
    memcpy(R2, rsrc.value.data, (size_t)per * sizeof(float));
    memcpy(R2 + per, rsrc.value.data, (size_t)per * sizeof(float));

    fake_sync fs = {.factor = 2};
    dt_bn_sync sync = {fake_sync_fn, &fs};
    bn_run s, cat;
    bn_forward_backward(dt_f32(&src.value), N, C, H, W, dt_f32(&gsrc.value), dt_f32(&bsrc.value),
                        dt_f32(&rsrc.value), &sync, &s);
    bn_forward_backward(x2, 2 * N, C, H, W, dt_f32(&gsrc.value), dt_f32(&bsrc.value), R2, NULL, &cat);

    /* three exchanges: sum x (from the local count), sum (x - mean)^2, then backward's 2C */
    assert_int_equal(fs.calls, 3);
    assert_int_equal(fs.n_seen[0], C);
    assert_int_equal(fs.n_seen[1], C);
    assert_int_equal(fs.n_seen[2], 2 * C);
    assert_true(fs.count_in[0] == (double)(N * H * W));
    for (int64_t i = 0; i < per; i++) {
        assert_float_equal(s.y[i], cat.y[i], 1e-5);
        assert_float_equal(s.dx[i], cat.dx[i], 1e-5);
    }
    /* and the sync really changed something: plain BN on the local batch has a
     * different running variance (unbiased factor M/(M-1) vs 2M/(2M-1)) */
    bn_run loc;
    bn_forward_backward(dt_f32(&src.value), N, C, H, W, dt_f32(&gsrc.value), dt_f32(&bsrc.value),
                        dt_f32(&rsrc.value), NULL, &loc);
    for (int64_t c = 0; c < C; c++) {
        assert_float_equal(s.rm[c], cat.rm[c], 1e-6);
        assert_float_equal(s.rv[c], cat.rv[c], 1e-6);
        assert_true(fabs(loc.rv[c] - cat.rv[c]) > 1e-4);
        assert_float_equal(s.dga[c], 0.5f * cat.dga[c], 1e-5);
        assert_float_equal(s.dbe[c], 0.5f * cat.dbe[c], 1e-5);
    }
    bn_run_free(&s); bn_run_free(&cat); bn_run_free(&loc);
    free(x2); free(R2);
    dt_param_free(&src); dt_param_free(&gsrc); dt_param_free(&bsrc); dt_param_free(&rsrc);
}

/* One rank with an identity sync fn: bit-identical to the plain path. */
static void test_syncbn_identity_equals_plain(void **state) {
    (void)state;
    const int64_t N = 3, C = 3, H = 2, W = 5, per = N * C * H * W;
    dt_param src, gsrc, bsrc, rsrc;
    oph_param(&src, "x", 1, (int64_t[]){per}, 91, 2.0f);
    for (int64_t i = 0; i < per; i++) dt_f32(&src.value)[i] += 4.0f;
    make_affine(&gsrc, &bsrc, C, 92);
    oph_param(&rsrc, "R", 1, (int64_t[]){per}, 94, 1.0f);
    fake_sync fs = {.factor = 1};
    dt_bn_sync sync = {fake_sync_fn, &fs};
    bn_run a, b;
    bn_forward_backward(dt_f32(&src.value), N, C, H, W, dt_f32(&gsrc.value), dt_f32(&bsrc.value),
                        dt_f32(&rsrc.value), &sync, &a);
    bn_forward_backward(dt_f32(&src.value), N, C, H, W, dt_f32(&gsrc.value), dt_f32(&bsrc.value),
                        dt_f32(&rsrc.value), NULL, &b);
    assert_int_equal(fs.calls, 3);
    assert_memory_equal(a.y, b.y, (size_t)per * sizeof(float));
    assert_memory_equal(a.dx, b.dx, (size_t)per * sizeof(float));
    assert_memory_equal(a.dga, b.dga, (size_t)C * sizeof(float));
    assert_memory_equal(a.dbe, b.dbe, (size_t)C * sizeof(float));
    assert_memory_equal(a.rm, b.rm, (size_t)C * sizeof(float));
    assert_memory_equal(a.rv, b.rv, (size_t)C * sizeof(float));
    bn_run_free(&a); bn_run_free(&b);
    dt_param_free(&src); dt_param_free(&gsrc); dt_param_free(&bsrc); dt_param_free(&rsrc);
}

/* A mean large against the spread (5000 + a spread of about 1, as raw
 * features: years, prices): the variance is the data's, not what is left of
 * sumsq/M - mean^2 after rounding (that gave 0, and outputs 330x too large).
 * Expected values from a double two-pass over the same floats. */
static void test_large_mean_variance(void **state) {
    (void)state;
    const int64_t N = 256, C = 2;
    int64_t shape[2] = {N, C};
    dt_param x;
    assert_int_equal(dt_param_init(&x, "x", 2, shape), DT_OK);
    uint32_t r = 12345;
    for (int64_t i = 0; i < N * C; i++) {   /* uniform spread in [-1.7, 1.7): std ~ 1 */
        r = r * 1664525u + 1013904223u;
        dt_f32(&x.value)[i] = (i % C ? -5000.0f : 5000.0f) + 3.4f * ((float)(r >> 8) / 16777216.0f - 0.5f);
    }
    dt_tensor rm, rv;
    assert_int_equal(dt_tensor_alloc(&rm, DT_F32, 1, &C), DT_OK);
    assert_int_equal(dt_tensor_alloc(&rv, DT_F32, 1, &C), DT_OK);
    for (int64_t c = 0; c < C; c++) { dt_f32(&rm)[c] = 0; dt_f32(&rv)[c] = 1; }
    dt_graph *g = dt_graph_create();
    dt_tensor *y = dt_op_batchnorm(g, &x.value, NULL, NULL, &rm, &rv, 1.0f, 1e-5f, NULL);   /* momentum 1: rv = var */
    assert_non_null(y);
    for (int64_t c = 0; c < C; c++) {
        double mu = 0, var = 0, rms = 0;
        for (int64_t i = 0; i < N; i++) mu += dt_f32(&x.value)[i * C + c];
        mu /= (double)N;
        for (int64_t i = 0; i < N; i++) var += pow(dt_f32(&x.value)[i * C + c] - mu, 2);
        for (int64_t i = 0; i < N; i++) rms += pow(dt_f32(y)[i * C + c], 2);
        double unbiased = var / (double)(N - 1);
        if (fabs(dt_f32(&rv)[c] - unbiased) > 1e-3 * unbiased)
            fail_msg("channel %lld: running_var %g, the data's %g", (long long)c, dt_f32(&rv)[c], unbiased);
        rms = sqrt(rms / (double)N);   /* normalised: 1 up to eps */
        if (fabs(rms - 1.0) > 1e-3) fail_msg("channel %lld: rms of y %g, expected 1", (long long)c, rms);
    }
    dt_graph_free(g);
    dt_tensor_free(&rm); dt_tensor_free(&rv);
    dt_param_free(&x);
}

/* A failing sync fn makes the forward return NULL with both messages; eval
 * mode (running stats) never calls it. */
static void test_syncbn_failure_and_eval(void **state) {
    (void)state;
    dt_param x;
    oph_param(&x, "x", 4, (int64_t[]){2, 2, 2, 2}, 95, 1.0f);
    dt_tensor rm, rv;
    assert_int_equal(dt_tensor_alloc(&rm, DT_F32, 1, (int64_t[]){2}), DT_OK);
    assert_int_equal(dt_tensor_alloc(&rv, DT_F32, 1, (int64_t[]){2}), DT_OK);
    dt_bn_sync bad = {failing_sync_fn, NULL};
    dt_graph *g = dt_graph_create();
    assert_null(dt_op_batchnorm(g, &x.value, NULL, NULL, &rm, &rv, 0.1f, EPS, &bad));
    assert_int_equal(dt_error_code(), DT_ECOMM);
    assert_non_null(strstr(dt_error_message(), "batchnorm"));
    assert_non_null(strstr(dt_error_message(), "rank 1 did not answer"));
    dt_error_clear();
    fake_sync fs = {.factor = 2};
    dt_bn_sync sync = {fake_sync_fn, &fs};
    dt_graph_set_training(g, 0);
    assert_non_null(dt_op_batchnorm(g, &x.value, NULL, NULL, &rm, &rv, 0.1f, EPS, &sync));
    assert_int_equal(fs.calls, 0);
    dt_graph_free(g);
    dt_tensor_free(&rm); dt_tensor_free(&rv);
    dt_param_free(&x);
}

/* BatchNorm inside dt_graph_pack16 (bf16) on a channel whose mean dwarfs its
 * spread (50 +- 1): region x -> h = x + x -> batchnorm -> gelu. Backward
 * re-normalises h with the exact batch statistics, so h must stay exact (a
 * bf16 h is off by up to 2^-9 * 100 ~ 0.2, a fifth of the spread: dgamma
 * came out 15% wrong). What is still rounded is gelu's input, the
 * normalised values (|v| of a few units): relative 2^-9, so gelu's
 * derivative and through it dy, dgamma, dbeta and dx move by a few 2^-9
 * relative -- well under the 2e-2 allowed against the plain backward. */
typedef struct bn_region { dt_param *gamma, *beta; dt_tensor *rm, *rv; } bn_region;

static dt_tensor *bn_gelu(dt_graph *g, dt_tensor *x, void *vctx) {
    bn_region *c = vctx;
    dt_tensor *h = dt_op_add(g, x, x);
    h = dt_op_batchnorm(g, h, &c->gamma->value, &c->beta->value, c->rm, c->rv, 0.1f, EPS, NULL);
    return h ? dt_op_gelu(g, h) : NULL;
}

static double rel_l2(const float *a, const float *ref, int64_t n) {
    double e = 0, r = 0;
    for (int64_t i = 0; i < n; i++) { e += pow((double)a[i] - ref[i], 2); r += pow((double)ref[i], 2); }
    return sqrt(e / r);
}

static void test_pack16_large_mean_keeps_input_exact(void **state) {
    (void)state;
    enum { BN = 32, BC = 4 };
    int64_t cs[1] = {BC}, xs[2] = {BN, BC};
    dt_param gamma, beta;
    assert_int_equal(dt_param_init(&gamma, "gamma", 1, cs), DT_OK);
    assert_int_equal(dt_param_init(&beta, "beta", 1, cs), DT_OK);
    dt_tensor rm, rv;
    assert_int_equal(dt_tensor_alloc(&rm, DT_F32, 1, cs), DT_OK);
    assert_int_equal(dt_tensor_alloc(&rv, DT_F32, 1, cs), DT_OK);
    float x[BN * BC], up[BN * BC], dx[2][BN * BC], dg[2][BC], db[2][BC];
    for (int c = 0; c < BC; c++) {
        dt_f32(&gamma.value)[c] = 1.0f + 0.25f * (float)c;
        dt_f32(&beta.value)[c] = 0.1f * (float)c;
    }
    for (int i = 0; i < BN * BC; i++) {
        x[i] = 25.0f + 0.5f * (float)sin(1.7 * i);   /* h = 2x: mean 50, spread ~1 */
        up[i] = (float)cos(0.9 * i);
    }
    bn_region ctx = {&gamma, &beta, &rm, &rv};
    for (int mode = 0; mode < 2; mode++) {
        for (int c = 0; c < BC; c++) { dt_f32(&rm)[c] = 0; dt_f32(&rv)[c] = 1; }
        memset(gamma.grad.data, 0, sizeof dg[0]);
        memset(beta.grad.data, 0, sizeof db[0]);
        dt_graph *g = dt_graph_create();
        dt_tensor *xt = dt_graph_input(g, 2, xs, x, 1);
        dt_tensor *y = mode ? dt_graph_pack16(g, bn_gelu, xt, &ctx, DT_BF16) : bn_gelu(g, xt, &ctx);
        assert_non_null(y);
        assert_int_equal(dt_graph_backward_from(g, y, up), DT_OK);
        memcpy(dx[mode], dt_graph_grad(g, xt), sizeof dx[0]);
        memcpy(dg[mode], gamma.grad.data, sizeof dg[0]);
        memcpy(db[mode], beta.grad.data, sizeof db[0]);
        dt_graph_free(g);
    }
    double eg = rel_l2(dg[1], dg[0], BC), eb = rel_l2(db[1], db[0], BC), ex = rel_l2(dx[1], dx[0], BN * BC);
    if (getenv("DTT_VERBOSE")) printf("pack16 vs plain: dgamma %.3g, dbeta %.3g, dx %.3g\n", eg, eb, ex);
    dt_tensor_free(&rm); dt_tensor_free(&rv);
    dt_param_free(&gamma); dt_param_free(&beta);
    if (eg > 2e-2 || eb > 2e-2 || ex > 2e-2)
        fail_msg("pack16 vs plain relative error: dgamma %.3g, dbeta %.3g, dx %.3g (allowed 2e-2)", eg, eb, ex);
}

int main(void) {
    const struct CMUnitTest extra[] = {
        cmocka_unit_test(test_batchnorm_running_stats_two_forwards),
        cmocka_unit_test(test_batchnorm_grads_accumulate),
        cmocka_unit_test(test_syncbn_two_ranks_match_concatenated_batch),
        cmocka_unit_test(test_syncbn_identity_equals_plain),
        cmocka_unit_test(test_large_mean_variance),
        cmocka_unit_test(test_syncbn_failure_and_eval),
        cmocka_unit_test(test_pack16_large_mean_keeps_input_exact),
    };
    return OPH_RUN("ops_batchnorm", table, extra);
}
