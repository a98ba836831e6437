/* SGD kernel: several steps against a double-precision reference (plain,
 * momentum, nesterov, weight decay, grad_scale), step-1 buffer init, and
 * bitwise independence of range splits and thread count. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>

#include "dtrain/optim.h"

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static float urand(void) {   /* [-1, 1) */
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((g_rng >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}
static void fill(float *x, size_t n) { for (size_t i = 0; i < n; i++) x[i] = urand(); }

/* Straightforward PyTorch SGD in double. */
static void ref_sgd(const dt_optim_cfg *c, double lr, int decay, double *p, const float *g,
                    double *buf, size_t n, int64_t step, double gs) {
    double wd = decay ? c->weight_decay : 0.0, mu = c->momentum;
    for (size_t i = 0; i < n; i++) {
        double gi = (double)g[i] * gs + wd * p[i];
        if (mu > 0) {
            buf[i] = step == 1 ? gi : mu * buf[i] + gi;
            gi = c->nesterov ? gi + mu * buf[i] : buf[i];
        }
        p[i] -= lr * gi;
    }
}

/* Runs `steps` steps of kernel and reference; returns max relative error. */
static double run_vs_ref(float momentum, int nesterov, float wd, int decay, float gs) {
    enum { N = 517, STEPS = 6 };
    dt_optim_cfg c = dt_optim_cfg_default(DT_OPTIM_SGD);
    c.momentum = momentum;
    c.nesterov = nesterov;
    c.weight_decay = wd;
    assert_int_equal(dt_optim_cfg_validate(&c), DT_OK);
    float p[N], g[N], buf[N];
    double rp[N], rbuf[N];
    fill(p, N);
    for (size_t i = 0; i < N; i++) { rp[i] = p[i]; buf[i] = 12345.0f; rbuf[i] = 0; }  /* buf junk: step 1 must overwrite */
    double worst = 0;
    for (int64_t t = 1; t <= STEPS; t++) {
        float lr = 0.05f * (float)t;   /* a schedule: LR changes each step */
        fill(g, N);
        dt_sgd_step_range(&c, lr, decay, p, g, buf, N, t, gs);
        ref_sgd(&c, lr, decay, rp, g, rbuf, N, t, gs);
        for (size_t i = 0; i < N; i++) {
            double e = fabs(p[i] - rp[i]) / (fabs(rp[i]) + 1.0);
            if (e > worst) worst = e;
            if (momentum > 0) {
                e = fabs(buf[i] - rbuf[i]) / (fabs(rbuf[i]) + 1.0);
                if (e > worst) worst = e;
            }
        }
    }
    return worst;
}

static void test_sgd_plain(void **st) {
    (void)st;
    assert_true(run_vs_ref(0.0f, 0, 0.0f, 0, 1.0f) < 1e-6);
}

static void test_sgd_weight_decay(void **st) {
    (void)st;
    assert_true(run_vs_ref(0.0f, 0, 0.3f, 1, 1.0f) < 1e-6);
    assert_true(run_vs_ref(0.9f, 0, 0.3f, 1, 1.0f) < 1e-6);
    /* decay flag off: wd must be ignored (the reference is told decay=0 too) */
    assert_true(run_vs_ref(0.9f, 0, 0.3f, 0, 1.0f) < 1e-6);
}

static void test_sgd_momentum(void **st) {
    (void)st;
    assert_true(run_vs_ref(0.9f, 0, 0.0f, 0, 1.0f) < 1e-6);
    assert_true(run_vs_ref(0.5f, 0, 0.1f, 1, 0.25f) < 1e-6);
}

static void test_sgd_nesterov(void **st) {
    (void)st;
    assert_true(run_vs_ref(0.9f, 1, 0.0f, 0, 1.0f) < 1e-6);
    assert_true(run_vs_ref(0.8f, 1, 0.2f, 1, 0.5f) < 1e-6);
}

static void test_sgd_grad_scale(void **st) {
    (void)st;
    assert_true(run_vs_ref(0.0f, 0, 0.0f, 0, 0.125f) < 1e-6);
    assert_true(run_vs_ref(0.9f, 1, 0.1f, 1, 3.0f) < 1e-6);
}

/* Known numbers: step 1 buf = g' exactly, nesterov d = g' + mu*g'. */
static void test_sgd_first_step_exact(void **st) {
    (void)st;
    dt_optim_cfg c = dt_optim_cfg_default(DT_OPTIM_SGD);
    c.momentum = 0.5f;
    c.nesterov = 1;
    float p[2] = {1.0f, -2.0f}, g[2] = {0.5f, 1.0f}, buf[2] = {99.0f, -99.0f};
    dt_sgd_step_range(&c, 0.5f, 0, p, g, buf, 2, 1, 2.0f);   /* g' = {1, 2} */
    assert_true(buf[0] == 1.0f && buf[1] == 2.0f);
    assert_true(p[0] == 1.0f - 0.5f * 1.5f && p[1] == -2.0f - 0.5f * 3.0f);
    /* step 2: buf = 0.5*buf + g' = {1.5, 3}; d = g' + 0.5*buf = {1.75, 3.5} */
    dt_sgd_step_range(&c, 0.5f, 0, p, g, buf, 2, 2, 2.0f);
    assert_true(buf[0] == 1.5f && buf[1] == 3.0f);
    assert_true(p[0] == 0.25f - 0.875f && p[1] == -3.5f - 1.75f);
}

/* Stepping [0,n) at once equals stepping [0,k) then [k,n), bitwise. */
static void split_equal(size_t n, size_t k, float momentum, int nesterov) {
    dt_optim_cfg c = dt_optim_cfg_default(DT_OPTIM_SGD);
    c.momentum = momentum;
    c.nesterov = nesterov;
    c.weight_decay = 0.1f;
    float *p1 = malloc(n * 4), *p2 = malloc(n * 4), *b1 = calloc(n, 4), *b2 = calloc(n, 4),
          *g = malloc(n * 4);
    assert_non_null(p1); assert_non_null(p2); assert_non_null(b1); assert_non_null(b2);
    assert_non_null(g);
    fill(p1, n);
    memcpy(p2, p1, n * 4);
    float *orig = malloc(n * 4);
    memcpy(orig, p1, n * 4);
    for (int64_t t = 1; t <= 3; t++) {
        fill(g, n);
        dt_sgd_step_range(&c, 0.1f, 1, p1, g, b1, n, t, 0.7f);
        dt_sgd_step_range(&c, 0.1f, 1, p2, g, b2, k, t, 0.7f);
        dt_sgd_step_range(&c, 0.1f, 1, p2 + k, g + k, b2 + k, n - k, t, 0.7f);
    }
    assert_memory_equal(p1, p2, n * 4);
    assert_memory_equal(b1, b2, n * 4);
    assert_memory_not_equal(p1, orig, n * 4);   /* something actually happened */
    free(p1); free(p2); free(b1); free(b2); free(g); free(orig);
}

static void test_sgd_split_bitwise(void **st) {
    (void)st;
    split_equal(37, 5, 0.9f, 1);
    split_equal(1001, 13, 0.9f, 0);
    split_equal(1001, 500, 0.0f, 0);
    split_equal(200003, 77777, 0.9f, 1);   /* both parts large enough for OpenMP */
    split_equal(200003, 12345, 0.9f, 0);
}

static void test_sgd_threads_bitwise(void **st) {
    (void)st;
    size_t n = 300007;
    dt_optim_cfg c = dt_optim_cfg_default(DT_OPTIM_SGD);
    c.momentum = 0.9f;
    c.nesterov = 1;
    c.weight_decay = 0.05f;
    float *p1 = malloc(n * 4), *p2 = malloc(n * 4), *b1 = calloc(n, 4), *b2 = calloc(n, 4),
          *g = malloc(n * 4);
    fill(p1, n);
    memcpy(p2, p1, n * 4);
    int saved = omp_get_max_threads();
    for (int64_t t = 1; t <= 3; t++) {
        fill(g, n);
        omp_set_num_threads(1);
        dt_sgd_step_range(&c, 0.1f, 1, p1, g, b1, n, t, 1.0f);
        omp_set_num_threads(3);
        dt_sgd_step_range(&c, 0.1f, 1, p2, g, b2, n, t, 1.0f);
    }
    omp_set_num_threads(saved);
    assert_memory_equal(p1, p2, n * 4);
    assert_memory_equal(b1, b2, n * 4);
    free(p1); free(p2); free(b1); free(b2); free(g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sgd_plain),
        cmocka_unit_test(test_sgd_weight_decay),
        cmocka_unit_test(test_sgd_momentum),
        cmocka_unit_test(test_sgd_nesterov),
        cmocka_unit_test(test_sgd_grad_scale),
        cmocka_unit_test(test_sgd_first_step_exact),
        cmocka_unit_test(test_sgd_split_bitwise),
        cmocka_unit_test(test_sgd_threads_bitwise),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
