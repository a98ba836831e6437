/* AdamW kernel: several steps against a double-precision reference (bias
 * correction, decoupled weight decay, grad_scale, betas), a hand-computed
 * first step, and bitwise independence of range splits and thread count. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>

#include "dtrain/optim.h"

static uint64_t g_rng = 0x243f6a8885a308d3ull;
static float urand(void) {   /* [-1, 1) */
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((g_rng >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}
static void fill(float *x, size_t n) { for (size_t i = 0; i < n; i++) x[i] = urand(); }

/* Straightforward PyTorch AdamW in double. */
static void ref_adamw(const dt_optim_cfg *c, double lr, int decay, double *p, const float *g,
                      double *m, double *v, size_t n, int64_t t, double gs) {
    double b1 = c->beta1, b2 = c->beta2, wd = decay ? c->weight_decay : 0.0;
    for (size_t i = 0; i < n; i++) {
        double gi = (double)g[i] * gs;
        p[i] -= lr * wd * p[i];
        m[i] = b1 * m[i] + (1 - b1) * gi;
        v[i] = b2 * v[i] + (1 - b2) * gi * gi;
        double mh = m[i] / (1 - pow(b1, (double)t)), vh = v[i] / (1 - pow(b2, (double)t));
        p[i] -= lr * mh / (sqrt(vh) + c->eps);
    }
}

static double rel(double a, double r) { return fabs(a - r) / (fabs(r) + 1.0); }

/* Runs 8 steps of kernel and reference; returns max relative error over p, m, v. */
static double run_vs_ref(float b1, float b2, float wd, int decay, float gs, float eps) {
    enum { N = 333, STEPS = 8 };
    dt_optim_cfg c = dt_optim_cfg_default(DT_OPTIM_ADAMW);
    c.beta1 = b1; c.beta2 = b2; c.weight_decay = wd; c.eps = eps;
    assert_int_equal(dt_optim_cfg_validate(&c), DT_OK);
    float p[N], g[N], m[N] = {0}, v[N] = {0};
    double rp[N], rm[N] = {0}, rv[N] = {0};
    fill(p, N);
    for (size_t i = 0; i < N; i++) rp[i] = p[i];
    double worst = 0;
    for (int64_t t = 1; t <= STEPS; t++) {
        float lr = 0.01f / (float)t;
        fill(g, N);
        if (t == 1) g[0] = g[1] = 0.0f;   /* zero grads: v = 0, denominator = eps */
        dt_adamw_step_range(&c, lr, decay, p, g, m, v, N, t, gs);
        ref_adamw(&c, lr, decay, rp, g, rm, rv, N, t, gs);
        for (size_t i = 0; i < N; i++) {
            double e = rel(p[i], rp[i]);
            if (rel(m[i], rm[i]) > e) e = rel(m[i], rm[i]);
            if (rel(v[i], rv[i]) > e) e = rel(v[i], rv[i]);
            if (e > worst) worst = e;
        }
    }
    return worst;
}

static void test_adamw_default_betas(void **st) {
    (void)st;
    assert_true(run_vs_ref(0.9f, 0.999f, 0.0f, 0, 1.0f, 1e-8f) < 1e-6);
}

static void test_adamw_weight_decay(void **st) {
    (void)st;
    assert_true(run_vs_ref(0.9f, 0.999f, 0.1f, 1, 1.0f, 1e-8f) < 1e-6);
    assert_true(run_vs_ref(0.9f, 0.95f, 0.5f, 0, 1.0f, 1e-8f) < 1e-6);   /* flag off */
}

static void test_adamw_grad_scale(void **st) {
    (void)st;
    assert_true(run_vs_ref(0.9f, 0.999f, 0.1f, 1, 0.25f, 1e-8f) < 1e-6);
    assert_true(run_vs_ref(0.8f, 0.99f, 0.0f, 0, 4.0f, 1e-3f) < 1e-6);   /* eps matters here */
}

static void test_adamw_other_betas(void **st) {
    (void)st;
    assert_true(run_vs_ref(0.0f, 0.0f, 0.0f, 0, 1.0f, 1e-8f) < 1e-6);
    assert_true(run_vs_ref(0.5f, 0.9f, 0.01f, 1, 1.0f, 1e-6f) < 1e-6);
}

/* Step 1 with bias correction: m_hat = g, v_hat = g^2, so p' = p(1-lr*wd) - lr*g/(|g|+eps). */
static void test_adamw_first_step_known(void **st) {
    (void)st;
    dt_optim_cfg c = dt_optim_cfg_default(DT_OPTIM_ADAMW);
    c.weight_decay = 0.5f;
    float p[3] = {2.0f, -1.0f, 0.5f}, g[3] = {0.5f, -4.0f, 0.0f}, m[3] = {0}, v[3] = {0};
    dt_adamw_step_range(&c, 0.1f, 1, p, g, m, v, 3, 1, 1.0f);
    assert_true(fabs(p[0] - (2.0 * 0.95 - 0.1)) < 1e-6);
    assert_true(fabs(p[1] - (-1.0 * 0.95 + 0.1)) < 1e-6);
    assert_true(fabs(p[2] - 0.5 * 0.95) < 1e-7);   /* zero grad: decay only */
    assert_true(fabs(m[1] - (1.0 - (double)c.beta1) * -4.0) < 1e-7);
    assert_true(fabs(v[1] - (1.0 - (double)c.beta2) * 16.0) < 1e-8);
}

static void split_equal(size_t n, size_t k) {
    dt_optim_cfg c = dt_optim_cfg_default(DT_OPTIM_ADAMW);
    float *p1 = malloc(n * 4), *p2 = malloc(n * 4), *g = malloc(n * 4), *orig = malloc(n * 4);
    float *m1 = calloc(n, 4), *v1 = calloc(n, 4), *m2 = calloc(n, 4), *v2 = calloc(n, 4);
    assert_true(p1 && p2 && g && orig && m1 && v1 && m2 && v2);
    fill(p1, n);
    memcpy(p2, p1, n * 4);
    memcpy(orig, p1, n * 4);
    for (int64_t t = 1; t <= 3; t++) {
        fill(g, n);
        dt_adamw_step_range(&c, 1e-3f, 1, p1, g, m1, v1, n, t, 0.9f);
        dt_adamw_step_range(&c, 1e-3f, 1, p2, g, m2, v2, k, t, 0.9f);
        dt_adamw_step_range(&c, 1e-3f, 1, p2 + k, g + k, m2 + k, v2 + k, n - k, t, 0.9f);
    }
    assert_memory_equal(p1, p2, n * 4);
    assert_memory_equal(m1, m2, n * 4);
    assert_memory_equal(v1, v2, n * 4);
    assert_memory_not_equal(p1, orig, n * 4);
    free(p1); free(p2); free(g); free(orig); free(m1); free(v1); free(m2); free(v2);
}

/* Split points inside a vector exercise vector body vs scalar tail. */
static void test_adamw_split_bitwise(void **st) {
    (void)st;
    split_equal(37, 5);
    split_equal(37, 3);
    split_equal(1001, 13);
    split_equal(9000, 4099);
    split_equal(200003, 77777);
    split_equal(200003, 12345);
}

static void test_adamw_threads_bitwise(void **st) {
    (void)st;
    size_t n = 300007;
    dt_optim_cfg c = dt_optim_cfg_default(DT_OPTIM_ADAMW);
    float *p1 = malloc(n * 4), *p2 = malloc(n * 4), *g = malloc(n * 4);
    float *m1 = calloc(n, 4), *v1 = calloc(n, 4), *m2 = calloc(n, 4), *v2 = calloc(n, 4);
    assert_true(p1 && p2 && g && m1 && v1 && m2 && v2);
    fill(p1, n);
    memcpy(p2, p1, n * 4);
    int saved = omp_get_max_threads();
    for (int64_t t = 1; t <= 3; t++) {
        fill(g, n);
        omp_set_num_threads(1);
        dt_adamw_step_range(&c, 1e-3f, 1, p1, g, m1, v1, n, t, 1.0f);
        omp_set_num_threads(3);
        dt_adamw_step_range(&c, 1e-3f, 1, p2, g, m2, v2, n, t, 1.0f);
    }
    omp_set_num_threads(saved);
    assert_memory_equal(p1, p2, n * 4);
    assert_memory_equal(m1, m2, n * 4);
    assert_memory_equal(v1, v2, n * 4);
    free(p1); free(p2); free(g); free(m1); free(v1); free(m2); free(v2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_adamw_default_betas),
        cmocka_unit_test(test_adamw_weight_decay),
        cmocka_unit_test(test_adamw_grad_scale),
        cmocka_unit_test(test_adamw_other_betas),
        cmocka_unit_test(test_adamw_first_step_known),
        cmocka_unit_test(test_adamw_split_bitwise),
        cmocka_unit_test(test_adamw_threads_bitwise),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
