/* dt_op_batchnorm: forward vs a double reference, running statistics, eval
 * mode, backward via finite differences (training and eval), SyncBatchNorm
 * with fake sync functions, bad args. */
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

#define EPS 1e-5f

static void make(dt_param *p, const char *name, int ndim, const int64_t *shape, uint64_t seed, float scale) {
    assert_int_equal(dt_param_init(p, name, ndim, shape), DT_OK);
    dt_gc_fill(p, seed, scale);
}

/* gamma around 1, beta around 0, both non-trivial */
static void make_affine(dt_param *ga, dt_param *be, int64_t C, uint64_t seed) {
    make(ga, "gamma", 1, (int64_t[]){C}, seed, 0.5f);
    for (int64_t c = 0; c < C; c++) dt_f32(&ga->value)[c] += 1.0f;
    make(be, "beta", 1, (int64_t[]){C}, seed + 1, 0.5f);
}


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

/* ---- forward ---- */
static void test_batchnorm_training_forward_matches_reference(void **state) {
    (void)state;
    const int64_t shapes[3][4] = {{8, 3, 1, 1}, {4, 3, 5, 1}, {2, 3, 3, 4}};
    for (int t = 0; t < 3; t++) {
        int ndim = t + 2;
        int64_t N = shapes[t][0], C = shapes[t][1], S = shapes[t][2] * shapes[t][3];
        dt_param x, ga, be;
        make(&x, "x", ndim, shapes[t], 10 + t, 2.0f);
        for (int64_t i = 0; i < x.value.numel; i++) dt_f32(&x.value)[i] += 3.0f;   /* non-zero mean */
        make_affine(&ga, &be, C, 20 + t);
        dt_graph *g = dt_graph_create();
        dt_tensor *y = dt_op_batchnorm(g, &x.value, &ga.value, &be.value, NULL, NULL, 0.1f, EPS, NULL);
        assert_non_null(y);
        assert_int_equal(y->ndim, ndim);
        double *ref = malloc((size_t)x.value.numel * sizeof *ref);
        ref_bn(dt_f32(&x.value), N, C, S, dt_f32(&ga.value), dt_f32(&be.value), EPS, ref, NULL, NULL);
        for (int64_t i = 0; i < y->numel; i++)
            if (fabs(dt_f32(y)[i] - ref[i]) > 1e-5) fail_msg("ndim %d: y[%lld] = %g, want %g", ndim, (long long)i, dt_f32(y)[i], ref[i]);
        free(ref);
        dt_graph_free(g);
        dt_param_free(&x); dt_param_free(&ga); dt_param_free(&be);
    }
}

/* Running statistics after two training forwards, vs. hand-applied momentum:
 * r = (1-m) r + m * stat, with the unbiased variance. */
static void test_batchnorm_running_stats_two_forwards(void **state) {
    (void)state;
    const int64_t N = 4, C = 3, H = 2, W = 3, S = H * W;
    const float m = 0.1f;
    dt_param x1, x2;
    make(&x1, "x1", 4, (int64_t[]){N, C, H, W}, 31, 1.0f);
    make(&x2, "x2", 4, (int64_t[]){N, C, H, W}, 32, 3.0f);
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

/* Eval: y = gamma*(x - running_mean)/sqrt(running_var + eps) + beta, running
 * stats untouched, each sample independent of the rest of the batch. */
static void test_batchnorm_eval_uses_running_stats(void **state) {
    (void)state;
    const int64_t N = 3, C = 2, S = 4;
    dt_param x, ga, be;
    make(&x, "x", 3, (int64_t[]){N, C, S}, 41, 1.0f);
    make_affine(&ga, &be, C, 42);
    dt_tensor rm, rv;
    assert_int_equal(dt_tensor_alloc(&rm, DT_F32, 1, (int64_t[]){C}), DT_OK);
    assert_int_equal(dt_tensor_alloc(&rv, DT_F32, 1, (int64_t[]){C}), DT_OK);
    const float rmv[2] = {0.7f, -1.3f}, rvv[2] = {2.5f, 0.3f};
    memcpy(rm.data, rmv, sizeof rmv);
    memcpy(rv.data, rvv, sizeof rvv);
    dt_graph *g = dt_graph_create();
    dt_graph_set_training(g, 0);
    for (int grad = 1; grad >= 0; grad--) {
        dt_graph_reset(g);
        dt_graph_set_grad_enabled(g, grad);
        dt_tensor *y = dt_op_batchnorm(g, &x.value, &ga.value, &be.value, &rm, &rv, 0.1f, EPS, NULL);
        assert_non_null(y);
        for (int64_t n = 0; n < N; n++)
            for (int64_t c = 0; c < C; c++)
                for (int64_t s = 0; s < S; s++) {
                    int64_t i = (n * C + c) * S + s;
                    double want = dt_f32(&ga.value)[c] * (dt_f32(&x.value)[i] - rmv[c]) / sqrt(rvv[c] + (double)EPS)
                                  + dt_f32(&be.value)[c];
                    assert_float_equal(dt_f32(y)[i], want, 1e-5);
                }
        assert_memory_equal(rm.data, rmv, sizeof rmv);
        assert_memory_equal(rv.data, rvv, sizeof rvv);
    }
    /* a batch of one works in eval (training would reject it) */
    dt_tensor one;
    dt_tensor_view(&one, x.value.data, DT_F32, 3, (int64_t[]){1, C, 1});
    dt_tensor *y1 = dt_op_batchnorm(g, &one, NULL, NULL, &rm, &rv, 0.1f, EPS, NULL);
    assert_non_null(y1);
    assert_float_equal(dt_f32(y1)[0], (dt_f32(&x.value)[0] - rmv[0]) / sqrt(rvv[0] + (double)EPS), 1e-5);
    dt_graph_set_training(g, 1);
    assert_null(dt_op_batchnorm(g, &one, NULL, NULL, &rm, &rv, 0.1f, EPS, NULL));
    assert_non_null(strstr(dt_error_message(), "more than one value"));
    dt_error_clear();
    dt_graph_free(g);
    dt_tensor_free(&rm); dt_tensor_free(&rv);
    dt_param_free(&x); dt_param_free(&ga); dt_param_free(&be);
}

/* Without running buffers eval falls back to batch statistics (as PyTorch's
 * track_running_stats=False). */
static void test_batchnorm_without_buffers_uses_batch_stats(void **state) {
    (void)state;
    dt_param x;
    make(&x, "x", 2, (int64_t[]){6, 2}, 51, 1.0f);
    dt_graph *g = dt_graph_create();
    dt_graph_set_training(g, 0);
    dt_tensor *y = dt_op_batchnorm(g, &x.value, NULL, NULL, NULL, NULL, 0.1f, EPS, NULL);
    assert_non_null(y);
    double ref[12];
    ref_bn(dt_f32(&x.value), 6, 2, 1, NULL, NULL, EPS, ref, NULL, NULL);
    for (int i = 0; i < 12; i++) assert_float_equal(dt_f32(y)[i], ref[i], 1e-5);
    dt_graph_free(g);
    dt_param_free(&x);
}

/* ---- backward via finite differences ---- */
typedef struct bn_ctx { int training; dt_tensor *rm, *rv; } bn_ctx;

static dt_tensor *bn_fn(dt_graph *g, dt_param **in, void *ctx) {
    const bn_ctx *bc = ctx;
    dt_graph_set_training(g, bc->training);
    return dt_op_batchnorm(g, &in[0]->value, &in[1]->value, &in[2]->value, bc->rm, bc->rv, 0.1f, EPS, NULL);
}

/* Tolerance: in training mode y is a smooth but non-linear function of x
 * (through mean and variance), so the eps = 1e-2 central difference has an
 * O(eps^2 * |f'''|) truncation error; with x ~ N(0, 1.5^2) and 8..24 values
 * per channel the worst element measured is ~4e-4 relative (it passes rtol
 * 5e-4 / atol 5e-5, fails 1e-4 / 1e-5). Forward rounding (float y, L summed
 * in double) adds only ~1e-5 absolute after dividing by 2*eps. rtol 2e-3 /
 * atol 2e-4 leaves a 5x margin while a wrong backward (e.g. dropping the
 * mean or the xhat term of dx, or treating batch statistics as constants) is
 * off by O(1) and fails. Eval mode is affine in every
 * input, so there the differences are exact up to rounding. */
static void run_bn_gradcheck(int ndim, const int64_t *shape, int training, uint64_t seed) {
    dt_param x, ga, be;
    make(&x, "x", ndim, shape, seed, 1.5f);
    make_affine(&ga, &be, shape[1], seed + 1);
    dt_tensor rm, rv;
    assert_int_equal(dt_tensor_alloc(&rm, DT_F32, 1, &shape[1]), DT_OK);
    assert_int_equal(dt_tensor_alloc(&rv, DT_F32, 1, &shape[1]), DT_OK);
    for (int64_t c = 0; c < shape[1]; c++) { dt_f32(&rm)[c] = 0.2f * (float)c - 0.1f; dt_f32(&rv)[c] = 0.5f + (float)c; }
    bn_ctx bc = {training, &rm, &rv};
    dt_param *in[3] = {&x, &ga, &be};
    dt_gc_opts o = {.seed = seed, .rtol = 2e-3, .atol = 2e-4};
    if (dt_gradcheck(bn_fn, &bc, in, 3, &o)) fail_msg("batchnorm gradcheck failed (ndim %d training %d)", ndim, training);
    /* the gradients are not trivially zero (sum_x dL/dx is 0 per channel in training, but not elementwise) */
    double gx = 0;
    for (int64_t i = 0; i < x.grad.numel; i++) gx += fabs(dt_f32(&x.grad)[i]);
    assert_true(gx > 1e-2);
    dt_tensor_free(&rm); dt_tensor_free(&rv);
    dt_param_free(&x); dt_param_free(&ga); dt_param_free(&be);
}

static void test_batchnorm_gradcheck_training(void **state) {
    (void)state;
    run_bn_gradcheck(2, (int64_t[]){8, 3}, 1, 61);
    run_bn_gradcheck(3, (int64_t[]){4, 3, 5}, 1, 62);
    run_bn_gradcheck(4, (int64_t[]){2, 3, 3, 4}, 1, 63);
}

static void test_batchnorm_gradcheck_eval(void **state) {
    (void)state;
    run_bn_gradcheck(2, (int64_t[]){5, 3}, 0, 71);
    run_bn_gradcheck(4, (int64_t[]){2, 3, 3, 2}, 0, 72);
}

/* gamma, beta and x gradients accumulate (+=) over two backward passes. */
static void test_batchnorm_grads_accumulate(void **state) {
    (void)state;
    dt_param x, ga, be;
    make(&x, "x", 4, (int64_t[]){2, 3, 2, 2}, 75, 1.0f);
    make_affine(&ga, &be, 3, 76);
    float R[24];
    for (int i = 0; i < 24; i++) R[i] = (float)sin(0.9 * i + 0.3);
    dt_graph *g = dt_graph_create();
    float first[3] = {0};
    for (int step = 0; step < 2; step++) {
        dt_graph_reset(g);
        dt_tensor *y = dt_op_batchnorm(g, &x.value, &ga.value, &be.value, NULL, NULL, 0.1f, EPS, NULL);
        assert_non_null(y);
        assert_int_equal(dt_graph_backward(g, wsum(g, y, R)), DT_OK);
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
    assert_int_equal(dt_graph_backward(g, wsum(g, y, R)), DT_OK);
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
    make(&src, "x", 1, (int64_t[]){per}, 81, 1.3f);
    make_affine(&gsrc, &bsrc, C, 82);
    make(&rsrc, "R", 1, (int64_t[]){per}, 84, 1.0f);
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

    /* exactly two exchanges of 2C floats; the forward one starts from the local count */
    assert_int_equal(fs.calls, 2);
    assert_int_equal(fs.n_seen[0], 2 * C);
    assert_int_equal(fs.n_seen[1], 2 * C);
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
    make(&src, "x", 1, (int64_t[]){per}, 91, 2.0f);
    for (int64_t i = 0; i < per; i++) dt_f32(&src.value)[i] += 4.0f;
    make_affine(&gsrc, &bsrc, C, 92);
    make(&rsrc, "R", 1, (int64_t[]){per}, 94, 1.0f);
    fake_sync fs = {.factor = 1};
    dt_bn_sync sync = {fake_sync_fn, &fs};
    bn_run a, b;
    bn_forward_backward(dt_f32(&src.value), N, C, H, W, dt_f32(&gsrc.value), dt_f32(&bsrc.value),
                        dt_f32(&rsrc.value), &sync, &a);
    bn_forward_backward(dt_f32(&src.value), N, C, H, W, dt_f32(&gsrc.value), dt_f32(&bsrc.value),
                        dt_f32(&rsrc.value), NULL, &b);
    assert_int_equal(fs.calls, 2);
    assert_memory_equal(a.y, b.y, (size_t)per * sizeof(float));
    assert_memory_equal(a.dx, b.dx, (size_t)per * sizeof(float));
    assert_memory_equal(a.dga, b.dga, (size_t)C * sizeof(float));
    assert_memory_equal(a.dbe, b.dbe, (size_t)C * sizeof(float));
    assert_memory_equal(a.rm, b.rm, (size_t)C * sizeof(float));
    assert_memory_equal(a.rv, b.rv, (size_t)C * sizeof(float));
    bn_run_free(&a); bn_run_free(&b);
    dt_param_free(&src); dt_param_free(&gsrc); dt_param_free(&bsrc); dt_param_free(&rsrc);
}

/* A failing sync fn makes the forward return NULL with both messages; eval
 * mode (running stats) never calls it. */
static void test_syncbn_failure_and_eval(void **state) {
    (void)state;
    dt_param x;
    make(&x, "x", 4, (int64_t[]){2, 2, 2, 2}, 95, 1.0f);
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

static void expect_error(dt_tensor *y, const char *needle) {
    assert_null(y);
    assert_int_equal(dt_error_code(), DT_EINVAL);
    if (!strstr(dt_error_message(), "batchnorm") || !strstr(dt_error_message(), needle))
        fail_msg("unexpected message: %s", dt_error_message());
    dt_error_clear();
}

static void test_batchnorm_bad_args(void **state) {
    (void)state;
    dt_param x, x1, ga4;
    make(&x, "x", 4, (int64_t[]){2, 3, 2, 2}, 1, 1.0f);
    make(&x1, "x1", 1, (int64_t[]){6}, 2, 1.0f);
    make(&ga4, "g4", 1, (int64_t[]){4}, 3, 1.0f);
    dt_tensor rm;
    assert_int_equal(dt_tensor_alloc(&rm, DT_F32, 1, (int64_t[]){3}), DT_OK);
    dt_graph *g = dt_graph_create();
    expect_error(dt_op_batchnorm(g, &x1.value, NULL, NULL, NULL, NULL, 0.1f, EPS, NULL), "[6]");
    expect_error(dt_op_batchnorm(g, &x.value, &ga4.value, NULL, NULL, NULL, 0.1f, EPS, NULL), "gamma");
    expect_error(dt_op_batchnorm(g, &x.value, NULL, &ga4.value, NULL, NULL, 0.1f, EPS, NULL), "beta");
    expect_error(dt_op_batchnorm(g, &x.value, NULL, NULL, &rm, NULL, 0.1f, EPS, NULL), "both");
    expect_error(dt_op_batchnorm(g, &x.value, NULL, NULL, &rm, &ga4.value, 0.1f, EPS, NULL), "running_var");
    expect_error(dt_op_batchnorm(g, &x.value, NULL, NULL, NULL, NULL, 1.5f, EPS, NULL), "momentum");
    expect_error(dt_op_batchnorm(g, &x.value, NULL, NULL, NULL, NULL, 0.1f, -1.0f, NULL), "eps");
    expect_error(dt_op_batchnorm(g, NULL, NULL, NULL, NULL, NULL, 0.1f, EPS, NULL), "required");
    dt_graph_free(g);
    dt_tensor_free(&rm);
    dt_param_free(&x); dt_param_free(&x1); dt_param_free(&ga4);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batchnorm_training_forward_matches_reference),
        cmocka_unit_test(test_batchnorm_running_stats_two_forwards),
        cmocka_unit_test(test_batchnorm_eval_uses_running_stats),
        cmocka_unit_test(test_batchnorm_without_buffers_uses_batch_stats),
        cmocka_unit_test(test_batchnorm_gradcheck_training),
        cmocka_unit_test(test_batchnorm_gradcheck_eval),
        cmocka_unit_test(test_batchnorm_grads_accumulate),
        cmocka_unit_test(test_syncbn_two_ranks_match_concatenated_batch),
        cmocka_unit_test(test_syncbn_identity_equals_plain),
        cmocka_unit_test(test_syncbn_failure_and_eval),
        cmocka_unit_test(test_batchnorm_bad_args),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
