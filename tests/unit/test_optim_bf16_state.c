/* bfloat16 optimizer state (optim.h, dt_optim_state_dtype BF16): AdamW and
 * SGD momentum steps against a reference written here, in double, whose
 * state is rounded to bfloat16 after each step by this file's own rounding
 * (bit manipulation, round to nearest even). Gradients span tiny (1e-17:
 * v ~ 1e-37, still a normal number) to large (1e17) magnitudes.
 *
 * Two comparisons per kernel:
 *  - one step from the kernel's own state: the stored bf16 must be the
 *    reference's rounding of the double update, except where the double
 *    value lies within 1e-5 (relative) of a rounding midpoint (there fp32
 *    arithmetic may land on either side); the parameter within 1e-5
 *    (relative above 1, absolute below);
 *  - free running over 12 steps, the reference with its own rounded state:
 *    parameters within 1e-3, states within 2 bf16 ulps.
 * Plus hand-worked ties, splits/threads bitwise, the optimizer object
 * (bytes, the fp32 bracket) and the config check. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "dtrain/optim.h"

/* ---- the test's own bfloat16 ---- */
static uint16_t ref_round(float f) {   /* nearest, ties to even (no NaN in these tests) */
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t low = u & 0xffffu, hi = u >> 16;
    if (low > 0x8000u || (low == 0x8000u && (hi & 1u))) hi++;
    return (uint16_t)hi;
}
static double ref_widen(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
/* bf16 ulps between two finite values of the same sign (ordered bit patterns) */
static int ulps(uint16_t a, uint16_t b) { return abs((int)(a & 0x7fff) - (int)(b & 0x7fff)) + ((a ^ b) & 0x8000 ? 1000 : 0); }
/* x within 1e-5 (relative) of the midpoint between two neighbouring bf16 values: a tie fp32 may break either way */
static int near_midpoint(double x) {
    uint16_t lo = ref_round((float)x);
    double a = ref_widen(lo), up = ref_widen((uint16_t)(lo + 1)), dn = ref_widen((uint16_t)(lo - 1));
    double m1 = (a + up) / 2, m2 = (a + dn) / 2;
    return fabs(x - m1) <= 1e-5 * fabs(x) || fabs(x - m2) <= 1e-5 * fabs(x);
}

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static double urand(void) {   /* [0, 1) */
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(g_rng >> 11) * (1.0 / 9007199254740992.0);
}
/* gradient i of step t: sign * 10^e, e across [-17, 17] by element, plus ordinary values */
static void grads(float *g, size_t n) {
    for (size_t i = 0; i < n; i++) {
        double s = urand() < 0.5 ? -1.0 : 1.0, mag;
        if (i % 4 == 0) mag = pow(10.0, -17.0 + 34.0 * (double)(i % 37) / 36.0) * (0.5 + urand());
        else mag = urand();
        g[i] = (float)(s * mag);
    }
}

/* ---- references (PyTorch semantics, double) ---- */
static void ref_adamw(const dt_optim_cfg *c, double lr, int decay, double *p, const float *g, double *m, double *v,
                      size_t n, int64_t t, double gs) {
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
static void ref_sgd(const dt_optim_cfg *c, double lr, int decay, double *p, const float *g, double *b, size_t n,
                    int64_t t, double gs) {
    double mu = c->momentum, wd = decay ? c->weight_decay : 0.0;
    for (size_t i = 0; i < n; i++) {
        double gi = (double)g[i] * gs + wd * p[i];
        b[i] = t <= 1 ? gi : mu * b[i] + gi;
        p[i] -= lr * (c->nesterov ? gi + mu * b[i] : b[i]);
    }
}

/* error relative to the value, absolute below 1 */
static double prel(double a, double r) { return fabs(a - r) / (fabs(r) + 1.0); }

enum { N = 407, STEPS = 12 };

/* One step of the kernel from state s16 (ns arrays) vs the double reference
 * from the same state; returns the number of midpoint exceptions. */
static int one_step_check(const dt_optim_cfg *c, float lr, int decay, float *p, const float *g, uint16_t *s16[2],
                          int64_t t, float gs) {
    int ns = dt_optim_state_per_elem(c), ties = 0;
    double dp[N], ds[2][N];
    for (size_t i = 0; i < N; i++) {
        dp[i] = p[i];
        for (int k = 0; k < ns; k++) ds[k][i] = ref_widen(s16[k][i]);
    }
    if (c->kind == DT_OPTIM_ADAMW) {
        dt_adamw_step_range_bf16(c, lr, decay, p, g, s16[0], s16[1], N, t, gs);
        ref_adamw(c, lr, decay, dp, g, ds[0], ds[1], N, t, gs);
    } else {
        dt_sgd_step_range_bf16(c, lr, decay, p, g, s16[0], N, t, gs);
        ref_sgd(c, lr, decay, dp, g, ds[0], N, t, gs);
    }
    for (size_t i = 0; i < N; i++) {
        if (prel(p[i], dp[i]) > 1e-5) fail_msg("step %lld elem %zu: p %.9g, reference %.9g", (long long)t, i, p[i], dp[i]);
        for (int k = 0; k < ns; k++) {
            uint16_t want = ref_round((float)ds[k][i]);
            if (s16[k][i] == want) continue;
            if (ulps(s16[k][i], want) == 1 && near_midpoint(ds[k][i])) { ties++; continue; }
            fail_msg("step %lld elem %zu state %d: stored 0x%04x (%.9g), reference 0x%04x (double %.9g)", (long long)t, i,
                     k, s16[k][i], ref_widen(s16[k][i]), want, ds[k][i]);
        }
    }
    return ties;
}

/* STEPS steps: per-step check from shared state, then free running. */
static void run_both(const dt_optim_cfg *c, int decay, float gs) {
    assert_int_equal(dt_optim_cfg_validate(c), DT_OK);
    int ns = dt_optim_state_per_elem(c), ties = 0;
    float p[N], g[N], fp[N];
    uint16_t a16[2][N] = {{0}}, f16[2][N] = {{0}};
    uint16_t *s16[2] = {a16[0], a16[1]};
    double rp[N], rs[2][N] = {{0}};
    for (size_t i = 0; i < N; i++) fp[i] = p[i] = (float)(2.0 * urand() - 1.0), rp[i] = p[i];
    for (int64_t t = 1; t <= STEPS; t++) {
        float lr = 0.01f / (float)t;
        grads(g, N);
        ties += one_step_check(c, lr, decay, p, g, s16, t, gs);
        /* free running: kernel on its own copy, reference on its own rounded state */
        if (c->kind == DT_OPTIM_ADAMW) {
            dt_adamw_step_range_bf16(c, lr, decay, fp, g, f16[0], f16[1], N, t, gs);
            ref_adamw(c, lr, decay, rp, g, rs[0], rs[1], N, t, gs);
        } else {
            dt_sgd_step_range_bf16(c, lr, decay, fp, g, f16[0], N, t, gs);
            ref_sgd(c, lr, decay, rp, g, rs[0], N, t, gs);
        }
        for (int k = 0; k < ns; k++)
            for (size_t i = 0; i < N; i++) rs[k][i] = ref_widen(ref_round((float)rs[k][i]));   /* the stored state */
        for (size_t i = 0; i < N; i++) {
            if (prel(fp[i], rp[i]) > 1e-3) fail_msg("free step %lld elem %zu: p %.9g, reference %.9g", (long long)t, i, fp[i], rp[i]);
            for (int k = 0; k < ns; k++)
                if (ulps(f16[k][i], ref_round((float)rs[k][i])) > 2)
                    fail_msg("free step %lld elem %zu state %d: %.9g vs reference %.9g", (long long)t, i, k, ref_widen(f16[k][i]), rs[k][i]);
        }
    }
    assert_true(ties <= N * STEPS / 100);   /* midpoint exceptions are rare */
    /* tiny gradients left tiny but nonzero second moments: no underflow (element 0: g ~ 1e-17) */
    if (c->kind == DT_OPTIM_ADAMW) {
        assert_true(s16[1][0] != 0 && ref_widen(s16[1][0]) < 1e-30);
        assert_true(ref_widen(s16[1][36]) > 1e30);   /* and large ones large (element 36: g ~ 1e17) */
    }
}

static void test_adamw_bf16_vs_reference(void **st) {
    (void)st;
    dt_optim_cfg c = dt_optim_cfg_default(DT_OPTIM_ADAMW);
    c.state_dtype = DT_OPTIM_STATE_BF16;
    run_both(&c, 0, 1.0f);
    c.weight_decay = 0.1f;
    c.beta1 = 0.8f;
    c.beta2 = 0.95f;
    run_both(&c, 1, 0.5f);
}

static void test_sgd_bf16_vs_reference(void **st) {
    (void)st;
    dt_optim_cfg c = dt_optim_cfg_default(DT_OPTIM_SGD);
    c.state_dtype = DT_OPTIM_STATE_BF16;
    c.momentum = 0.9f;
    run_both(&c, 0, 1.0f);
    c.nesterov = 1;
    c.weight_decay = 0.01f;
    run_both(&c, 1, 0.25f);
}

/* Hand-worked roundings through SGD's first step (buf = g when lr = wd = 0):
 * 1 + 2^-8 is the tie between 1 and 1 + 2^-7 -> 1 (even); 1 + 3*2^-8 the tie
 * between 1 + 2^-7 and 1 + 2^-6 -> 1 + 2^-6; just above a tie rounds up;
 * 1e-38 (normal in fp32) stays nonzero. */
static void test_sgd_bf16_known_rounding(void **st) {
    (void)st;
    dt_optim_cfg c = dt_optim_cfg_default(DT_OPTIM_SGD);
    c.momentum = 0.5f;
    c.state_dtype = DT_OPTIM_STATE_BF16;
    float p[5] = {0}, g[5] = {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, 1.0f + 0x1p-8f + 0x1p-20f, -2.0f - 0x1p-7f, 1e-38f};
    uint16_t b[5];
    dt_sgd_step_range_bf16(&c, 0.0f, 0, p, g, b, 5, 1, 1.0f);
    assert_int_equal(b[0], 0x3f80);   /* 1.0 */
    assert_int_equal(b[1], 0x3f82);   /* 1.015625 */
    assert_int_equal(b[2], 0x3f81);   /* 1.0078125 */
    assert_int_equal(b[3], 0xc000);   /* -2 - 2^-7 is the tie between -2 (even) and -2 - 2^-6 */
    assert_true(b[4] != 0 && fabs(ref_widen(b[4]) - 1e-38) < 1e-38 / 128);
    /* step 2: buf = 0.5 * 1.0 + g */
    float g2[5] = {0.25f, 0, 0, 0, 0};
    dt_sgd_step_range_bf16(&c, 0.0f, 0, p, g2, b, 1, 2, 1.0f);
    assert_int_equal(b[0], 0x3f40);   /* 0.75 */
}

/* Splitting a range and the thread count change no bit (element-wise). */
static void test_bf16_split_threads_bitwise(void **st) {
    (void)st;
    const size_t n = 70001, cut = 12345;
    for (int kind = 0; kind < 2; kind++) {
        dt_optim_cfg c = dt_optim_cfg_default(kind ? DT_OPTIM_ADAMW : DT_OPTIM_SGD);
        c.momentum = 0.9f;
        c.state_dtype = DT_OPTIM_STATE_BF16;
        float *p1 = malloc(n * 4), *p2 = malloc(n * 4), *g = malloc(n * 4);
        uint16_t *a1 = calloc(n, 2), *b1 = calloc(n, 2), *a2 = calloc(n, 2), *b2 = calloc(n, 2);
        assert_true(p1 && p2 && g && a1 && b1 && a2 && b2);
        for (size_t i = 0; i < n; i++) p1[i] = p2[i] = (float)urand();
        for (int64_t t = 1; t <= 3; t++) {
            for (size_t i = 0; i < n; i++) g[i] = (float)(urand() - 0.5);
            omp_set_num_threads(2);
            if (kind) dt_adamw_step_range_bf16(&c, 1e-3f, 1, p1, g, a1, b1, n, t, 1.0f);
            else dt_sgd_step_range_bf16(&c, 1e-3f, 1, p1, g, a1, n, t, 1.0f);
            omp_set_num_threads(1);
            if (kind) {
                dt_adamw_step_range_bf16(&c, 1e-3f, 1, p2, g, a2, b2, cut, t, 1.0f);
                dt_adamw_step_range_bf16(&c, 1e-3f, 1, p2 + cut, g + cut, a2 + cut, b2 + cut, n - cut, t, 1.0f);
            } else {
                dt_sgd_step_range_bf16(&c, 1e-3f, 1, p2, g, a2, cut, t, 1.0f);
                dt_sgd_step_range_bf16(&c, 1e-3f, 1, p2 + cut, g + cut, a2 + cut, n - cut, t, 1.0f);
            }
        }
        assert_memory_equal(p1, p2, n * 4);
        assert_memory_equal(a1, a2, n * 2);
        assert_memory_equal(b1, b2, n * 2);
        free(p1); free(p2); free(g); free(a1); free(b1); free(a2); free(b2);
    }
}

/* The optimizer object: 2-byte storage, bytes halved, stepping through it
 * equals the kernel, and the fp32 bracket widens exactly and rounds stores. */
static void test_optimizer_bf16_storage(void **st) {
    (void)st;
    enum { M = 100 };
    dt_optim_cfg c = dt_optim_cfg_default(DT_OPTIM_ADAMW);
    dt_optim_segment seg = {.offset = 0, .numel = M, .decay = 1};
    dt_optimizer f, o;
    assert_int_equal(dt_optimizer_init(&f, &c, &seg, 1, 0, M), DT_OK);
    c.state_dtype = DT_OPTIM_STATE_BF16;
    assert_int_equal(dt_optimizer_init(&o, &c, &seg, 1, 0, M), DT_OK);
    assert_int_equal(dt_optim_state_bytes(&f.cfg), 8);
    assert_int_equal(dt_optim_state_bytes(&o.cfg), 4);
    assert_int_equal(dt_optimizer_state_nbytes(&f), 2 * M * 4);
    assert_int_equal(dt_optimizer_state_nbytes(&o), 2 * M * 2);
    assert_non_null(o.state16[0]);
    assert_non_null(o.state16[1]);
    assert_null(o.state[0]);
    assert_null(dt_optimizer_state_of(&o, 0, 0));   /* no fp32 view outside the bracket */
    float p[M], q[M], g[M];
    uint16_t m[M] = {0}, v[M] = {0};
    for (int i = 0; i < M; i++) p[i] = q[i] = (float)urand(), g[i] = (float)(urand() - 0.5);
    dt_optimizer_step_range(&o, 1e-2f, p, g, 0, M, 1.0f);
    dt_adamw_step_range_bf16(&c, 1e-2f, 1, q, g, m, v, M, 1, 1.0f);
    assert_memory_equal(p, q, sizeof p);
    assert_memory_equal(o.state16[0], m, sizeof m);
    assert_memory_equal(o.state16[1], v, sizeof v);
    /* the bracket: exact widening, nesting, store rounds */
    assert_int_equal(dt_optimizer_state_open(&o), DT_OK);
    assert_int_equal(dt_optimizer_state_open(&o), DT_OK);
    float *w = dt_optimizer_state_of(&o, 0, 0);
    assert_non_null(w);
    for (int i = 0; i < M; i++) assert_true(w[i] == (float)ref_widen(m[i]));
    w[3] = 1.0f + 0x1p-8f + 0x1p-20f;   /* rounds up to 0x3f81 */
    dt_optimizer_state_close(&o, 1);
    assert_int_equal(o.state16[0][3], 0x3f81);
    assert_non_null(dt_optimizer_state_of(&o, 0, 0));   /* still open once */
    dt_optimizer_state_of(&o, 0, 0)[4] = 5.0f;
    dt_optimizer_state_close(&o, 0);   /* no store: unchanged */
    assert_int_equal(o.state16[0][4], m[4]);
    assert_null(o.state[0]);
    /* fp32 storage: the bracket does nothing */
    assert_int_equal(dt_optimizer_state_open(&f), DT_OK);
    float *fs = f.state[0];
    dt_optimizer_state_close(&f, 1);
    assert_ptr_equal(f.state[0], fs);
    dt_optimizer_free(&o);
    dt_optimizer_free(&f);
    c.state_dtype = 2;
    assert_int_equal(dt_optim_cfg_validate(&c), DT_EINVAL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_adamw_bf16_vs_reference),
        cmocka_unit_test(test_sgd_bf16_vs_reference),
        cmocka_unit_test(test_sgd_bf16_known_rounding),
        cmocka_unit_test(test_bf16_split_threads_bitwise),
        cmocka_unit_test(test_optimizer_bf16_storage),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
