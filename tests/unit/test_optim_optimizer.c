/* dt_optimizer and cfg: defaults, validation of every field, segment table
 * checks, per-segment decay flag, padding left alone, owned-range checks,
 * sharded state (two halves) bitwise equal to one optimizer over everything,
 * and inactive segments skipped with their own step count. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dtrain/optim.h"

static uint64_t g_rng = 0x13198a2e03707344ull;
static float urand(void) {   /* [-1, 1) */
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((g_rng >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}
static void fill(float *x, size_t n) { for (size_t i = 0; i < n; i++) x[i] = urand(); }

/* ---- cfg ---- */

static void test_cfg_defaults(void **st) {
    (void)st;
    dt_optim_cfg a = dt_optim_cfg_default(DT_OPTIM_ADAMW);
    assert_int_equal(a.kind, DT_OPTIM_ADAMW);
    assert_true(a.lr == 1e-3f && a.beta1 == 0.9f && a.beta2 == 0.999f && a.eps == 1e-8f &&
                a.weight_decay == 0.01f);
    assert_int_equal(dt_optim_cfg_validate(&a), DT_OK);
    assert_int_equal(dt_optim_state_per_elem(&a), 2);
    dt_optim_cfg s = dt_optim_cfg_default(DT_OPTIM_SGD);
    assert_int_equal(s.kind, DT_OPTIM_SGD);
    assert_true(s.lr == 0.01f && s.momentum == 0.0f && s.weight_decay == 0.0f && !s.nesterov);
    assert_int_equal(dt_optim_cfg_validate(&s), DT_OK);
    assert_int_equal(dt_optim_state_per_elem(&s), 0);
    s.momentum = 0.9f;
    assert_int_equal(dt_optim_state_per_elem(&s), 1);
}

/* Expects DT_EINVAL with `field` named in the message. */
static void expect_bad(const dt_optim_cfg *c, const char *field) {
    dt_error_clear();
    assert_int_equal(dt_optim_cfg_validate(c), DT_EINVAL);
    assert_non_null(strstr(dt_error_message(), field));
}

static void test_cfg_validate_rejects(void **st) {
    (void)st;
    const dt_optim_cfg A = dt_optim_cfg_default(DT_OPTIM_ADAMW);
    const dt_optim_cfg S = dt_optim_cfg_default(DT_OPTIM_SGD);
    dt_optim_cfg c;
    c = A; c.lr = -1e-3f; expect_bad(&c, "lr");
    c = S; c.lr = NAN; expect_bad(&c, "lr");
    c = A; c.lr = INFINITY; expect_bad(&c, "lr");
    c = A; c.weight_decay = -0.1f; expect_bad(&c, "weight_decay");
    c = S; c.weight_decay = NAN; expect_bad(&c, "weight_decay");
    c = S; c.momentum = 1.0f; expect_bad(&c, "momentum");
    c = S; c.momentum = -0.5f; expect_bad(&c, "momentum");
    c = S; c.nesterov = 1; expect_bad(&c, "nesterov");           /* momentum 0 */
    c = A; c.beta1 = 1.0f; expect_bad(&c, "beta1");
    c = A; c.beta1 = -0.1f; expect_bad(&c, "beta1");
    c = A; c.beta2 = 1.5f; expect_bad(&c, "beta2");
    c = A; c.beta2 = NAN; expect_bad(&c, "beta2");
    c = A; c.eps = 0.0f; expect_bad(&c, "eps");
    c = A; c.eps = -1e-8f; expect_bad(&c, "eps");
    c = A; c.kind = (dt_optim_kind)7; expect_bad(&c, "kind");
    /* boundary values that are fine */
    c = S; c.momentum = 0.9f; c.nesterov = 1; c.lr = 0.0f;
    assert_int_equal(dt_optim_cfg_validate(&c), DT_OK);
    c = A; c.beta1 = 0.0f; c.beta2 = 0.0f; c.weight_decay = 0.0f;
    assert_int_equal(dt_optim_cfg_validate(&c), DT_OK);
}

/* ---- init ---- */

static void test_init_rejects(void **st) {
    (void)st;
    dt_optimizer o;
    dt_optim_cfg c = dt_optim_cfg_default(DT_OPTIM_ADAMW);
    dt_optim_segment overlap[2] = {{0, 10, 1, NULL, NULL, 0}, {8, 4, 0, NULL, NULL, 0}};
    assert_int_equal(dt_optimizer_init(&o, &c, overlap, 2, 0, 12), DT_EINVAL);
    dt_optimizer_free(&o);
    dt_optim_segment ok[2] = {{10, 5, 1, NULL, NULL, 0}, {0, 10, 0, NULL, NULL, 0}};   /* unsorted but disjoint */
    assert_int_equal(dt_optimizer_init(&o, &c, ok, 2, 8, 4), DT_EINVAL);   /* reversed */
    dt_optimizer_free(&o);
    c.eps = 0.0f;
    assert_int_equal(dt_optimizer_init(&o, &c, ok, 2, 0, 15), DT_EINVAL);
    dt_optimizer_free(&o);
    c = dt_optim_cfg_default(DT_OPTIM_ADAMW);
    assert_int_equal(dt_optimizer_init(&o, &c, ok, 2, 0, 15), DT_OK);
    assert_non_null(o.state[0]);
    assert_non_null(o.state[1]);
    assert_int_equal(o.step, 0);
    dt_optimizer_free(&o);
    c = dt_optim_cfg_default(DT_OPTIM_SGD);   /* no momentum: no state */
    assert_int_equal(dt_optimizer_init(&o, &c, ok, 2, 0, 15), DT_OK);
    assert_null(o.state[0]);
    assert_null(o.state[1]);
    dt_optimizer_free(&o);
}

/* ---- decay flag and padding ---- */

/* Layout: [0,10) decay, [10,20) no decay, [20,24) padding, [24,30) decay. */
static const dt_optim_segment k_segs[3] = {{24, 6, 1, NULL, NULL, 0}, {0, 10, 1, NULL, NULL, 0}, {10, 10, 0, NULL, NULL, 0}};
#define K_N 30

static void test_decay_flag_sgd(void **st) {
    (void)st;
    dt_optim_cfg c = dt_optim_cfg_default(DT_OPTIM_SGD);
    c.weight_decay = 0.5f;
    dt_optimizer o;
    assert_int_equal(dt_optimizer_init(&o, &c, k_segs, 3, 0, K_N), DT_OK);
    float p[K_N], g[K_N] = {0}, p0[K_N];
    for (int i = 0; i < K_N; i++) p[i] = p0[i] = 1.0f + (float)i;
    for (int i = 20; i < 24; i++) g[i] = 1.0f;   /* padding grads would move p if stepped */
    assert_int_equal(dt_optimizer_step_range(&o, 0.1f, p, g, 0, K_N, 1.0f), DT_OK);
    dt_optimizer_finish_step(&o);
    assert_int_equal(o.step, 1);
    for (int i = 0; i < K_N; i++) {
        int decays = i < 10 || i >= 24;
        float want = decays ? p0[i] - 0.1f * (0.5f * p0[i]) : p0[i];
        assert_true(p[i] == want);
        if (decays) assert_true(p[i] < p0[i]);
    }
    dt_optimizer_free(&o);
}

static void test_decay_flag_adamw(void **st) {
    (void)st;
    dt_optim_cfg c = dt_optim_cfg_default(DT_OPTIM_ADAMW);
    c.weight_decay = 0.5f;
    dt_optimizer o;
    assert_int_equal(dt_optimizer_init(&o, &c, k_segs, 3, 0, K_N), DT_OK);
    float p[K_N], g[K_N], p0[K_N];
    fill(p, K_N);
    memcpy(p0, p, sizeof p);
    fill(g, K_N);
    for (int i = 0; i < K_N; i++) g[i] += g[i] >= 0 ? 0.1f : -0.1f;   /* |g| >> eps */
    assert_int_equal(dt_optimizer_step_range(&o, 0.1f, p, g, 0, K_N, 1.0f), DT_OK);
    for (int i = 0; i < K_N; i++) {
        if (i >= 20 && i < 24) {   /* padding untouched, state untouched */
            assert_true(p[i] == p0[i]);
            assert_true(o.state[0][i] == 0.0f && o.state[1][i] == 0.0f);
            continue;
        }
        /* step 1: p' = p*(1 - lr*wd*decay) - lr*sign(g) (up to eps) */
        double keep = (i < 10 || i >= 24) ? 1.0 - 0.1 * 0.5 : 1.0;
        double want = p0[i] * keep - 0.1 * (g[i] > 0 ? 1.0 : -1.0);
        assert_true(fabs(p[i] - want) < 1e-6);
    }
    dt_optimizer_free(&o);
}

/* ---- ranges ---- */

static void test_step_range_checks(void **st) {
    (void)st;
    dt_optim_cfg c = dt_optim_cfg_default(DT_OPTIM_ADAMW);
    dt_optimizer o;
    assert_int_equal(dt_optimizer_init(&o, &c, k_segs, 3, 5, 25), DT_OK);
    float p[K_N], g[K_N], p0[K_N];
    fill(p, K_N);
    fill(g, K_N);
    memcpy(p0, p, sizeof p);
    dt_error_clear();
    assert_int_equal(dt_optimizer_step_range(&o, 0.1f, p, g, 0, 10, 1.0f), DT_EINVAL);
    assert_non_null(strstr(dt_error_message(), "owned"));
    assert_int_equal(dt_optimizer_step_range(&o, 0.1f, p, g, 10, 26, 1.0f), DT_EINVAL);
    assert_int_equal(dt_optimizer_step_range(&o, 0.1f, p, g, 12, 11, 1.0f), DT_EINVAL);
    assert_memory_equal(p, p0, sizeof p);   /* nothing stepped on error */
    assert_int_equal(dt_optimizer_step_range(&o, 0.1f, p, g, 7, 7, 1.0f), DT_OK);
    assert_memory_equal(p, p0, sizeof p);
    /* a valid range steps exactly its elements */
    assert_int_equal(dt_optimizer_step_range(&o, 0.1f, p, g, 8, 12, 1.0f), DT_OK);
    for (int i = 0; i < K_N; i++) {
        if (i >= 8 && i < 12) assert_true(p[i] != p0[i]);
        else assert_true(p[i] == p0[i]);
    }
    dt_optimizer_free(&o);
}

/* The optimizer equals direct kernel calls per segment, with step = o.step+1. */
static void test_matches_kernels(void **st) {
    (void)st;
    dt_optim_cfg c = dt_optim_cfg_default(DT_OPTIM_ADAMW);
    c.weight_decay = 0.2f;
    dt_optimizer o;
    assert_int_equal(dt_optimizer_init(&o, &c, k_segs, 3, 0, K_N), DT_OK);
    float p[K_N], q[K_N], g[K_N], m[K_N] = {0}, v[K_N] = {0};
    fill(p, K_N);
    memcpy(q, p, sizeof p);
    for (int64_t t = 1; t <= 4; t++) {
        fill(g, K_N);
        float lr = 1e-2f * (float)t;
        assert_int_equal(dt_optimizer_step_range(&o, lr, p, g, 0, K_N, 0.5f), DT_OK);
        dt_optimizer_finish_step(&o);
        dt_adamw_step_range(&c, lr, 1, q, g, m, v, 10, t, 0.5f);
        dt_adamw_step_range(&c, lr, 0, q + 10, g + 10, m + 10, v + 10, 10, t, 0.5f);
        dt_adamw_step_range(&c, lr, 1, q + 24, g + 24, m + 24, v + 24, 6, t, 0.5f);
    }
    assert_int_equal(o.step, 4);
    assert_memory_equal(p, q, sizeof p);
    assert_memory_equal(o.state[0], m, sizeof m);
    assert_memory_equal(o.state[1], v, sizeof v);
    dt_optimizer_free(&o);
}

/* ---- sharding ---- */

/* Segment table of a small "model": sizes chosen so that shard boundaries fall
 * inside segments; gaps are padding. */
static int make_segs(dt_optim_segment *s, size_t *total) {
    static const size_t sizes[] = {1000, 7, 3001, 64, 100000, 13, 20000, 5};
    size_t off = 0;
    int n = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        s[n].offset = off;
        s[n].numel = sizes[i];
        s[n].decay = (int)(i % 2 == 0);
        s[n].active = NULL;
        s[n].hp = NULL;
        s[n].grad_gap = 0;
        off += sizes[i] + (i % 3 == 1 ? 3 : 0);   /* some padding */
        n++;
    }
    *total = off + 11;   /* tail padding */
    return n;
}

static void sharded_equal(const dt_optim_cfg *c, size_t split) {
    dt_optim_segment segs[16];
    size_t n;
    int ns = make_segs(segs, &n);
    assert_true(split < n);
    dt_optimizer full, lo, hi;
    assert_int_equal(dt_optimizer_init(&full, c, segs, ns, 0, n), DT_OK);
    assert_int_equal(dt_optimizer_init(&lo, c, segs, ns, 0, split), DT_OK);
    assert_int_equal(dt_optimizer_init(&hi, c, segs, ns, split, n), DT_OK);
    float *p1 = malloc(n * 4), *p2 = malloc(n * 4), *g = malloc(n * 4), *p0 = malloc(n * 4);
    assert_true(p1 && p2 && g && p0);
    fill(p1, n);
    memcpy(p2, p1, n * 4);
    memcpy(p0, p1, n * 4);
    for (int t = 0; t < 4; t++) {
        fill(g, n);
        float lr = 0.01f + 0.001f * (float)t;
        assert_int_equal(dt_optimizer_step_range(&full, lr, p1, g, 0, n, 0.8f), DT_OK);
        /* the high shard steps in two pieces, the low one in one */
        assert_int_equal(dt_optimizer_step_range(&lo, lr, p2, g, 0, split, 0.8f), DT_OK);
        size_t mid = split + (n - split) / 3;
        assert_int_equal(dt_optimizer_step_range(&hi, lr, p2, g, mid, n, 0.8f), DT_OK);
        assert_int_equal(dt_optimizer_step_range(&hi, lr, p2, g, split, mid, 0.8f), DT_OK);
        dt_optimizer_finish_step(&full);
        dt_optimizer_finish_step(&lo);
        dt_optimizer_finish_step(&hi);
    }
    assert_memory_equal(p1, p2, n * 4);
    assert_memory_not_equal(p1, p0, n * 4);
    for (int k = 0; k < dt_optim_state_per_elem(c); k++) {
        assert_memory_equal(full.state[k], lo.state[k], split * 4);
        assert_memory_equal(full.state[k] + split, hi.state[k], (n - split) * 4);
    }
    free(p1); free(p2); free(g); free(p0);
    dt_optimizer_free(&full);
    dt_optimizer_free(&lo);
    dt_optimizer_free(&hi);
}

static void test_sharded_adamw(void **st) {
    (void)st;
    dt_optim_cfg c = dt_optim_cfg_default(DT_OPTIM_ADAMW);
    c.weight_decay = 0.1f;
    sharded_equal(&c, 52561);   /* inside the 100000 segment; both pieces > OpenMP threshold */
    sharded_equal(&c, 501);
}

static void test_sharded_sgd(void **st) {
    (void)st;
    dt_optim_cfg c = dt_optim_cfg_default(DT_OPTIM_SGD);
    c.momentum = 0.9f;
    c.nesterov = 1;
    c.weight_decay = 0.05f;
    sharded_equal(&c, 52561);
    c.momentum = 0.0f;
    c.nesterov = 0;
    sharded_equal(&c, 4099);
}

/* A segment whose active flag is 0 is not stepped: values and state stay
 * bitwise, and it keeps its own step count, so once active again it steps as
 * a fresh optimizer that saw only its active steps (PyTorch's per-parameter
 * state['step']). The always-active segment is unaffected. AdamW and SGD
 * with momentum, both with weight decay. */
static void skip_case(const dt_optim_cfg *c) {
    enum { N = 12, A = 5 };
    static const int active_in[4] = {1, 0, 0, 1};   /* segment 0's flag per step */
    float p[N], q[N], g[N];
    fill(p, N);
    memcpy(q, p, sizeof p);
    int flag = 1;
    dt_optim_segment segs[2] = {{0, A, 1, &flag, NULL, 0}, {A, N - A, 1, NULL, NULL, 0}};
    dt_optimizer o, ref0, ref1;   /* ref0: segment 0 alone, stepped only when active; ref1: segment 1 */
    assert_int_equal(dt_optimizer_init(&o, c, segs, 2, 0, N), DT_OK);
    dt_optim_segment r0 = {0, A, 1, NULL, NULL, 0}, r1 = {A, N - A, 1, NULL, NULL, 0};
    assert_int_equal(dt_optimizer_init(&ref0, c, &r0, 1, 0, A), DT_OK);
    assert_int_equal(dt_optimizer_init(&ref1, c, &r1, 1, A, N), DT_OK);
    int ns = dt_optim_state_per_elem(c);
    for (int st = 0; st < 4; st++) {
        fill(g, N);
        flag = active_in[st];
        float p0[N], s0[2][N];
        memcpy(p0, p, sizeof p);
        for (int k = 0; k < ns; k++) memcpy(s0[k], o.state[k], N * sizeof(float));
        assert_int_equal(dt_optimizer_step_range(&o, 0.05f, p, g, 0, N, 1.0f), DT_OK);
        dt_optimizer_finish_step(&o);
        if (!flag) {
            assert_memory_equal(p, p0, A * sizeof(float));
            for (int k = 0; k < ns; k++) assert_memory_equal(o.state[k], s0[k], A * sizeof(float));
        } else {
            assert_int_equal(dt_optimizer_step_range(&ref0, 0.05f, q, g, 0, A, 1.0f), DT_OK);
            dt_optimizer_finish_step(&ref0);
        }
        assert_int_equal(dt_optimizer_step_range(&ref1, 0.05f, q, g, A, N, 1.0f), DT_OK);
        dt_optimizer_finish_step(&ref1);
        assert_memory_equal(p, q, sizeof p);
    }
    assert_true(dt_optimizer_segment_steps(&o, 0) == 2 && dt_optimizer_segment_steps(&o, 1) == 4);
    for (int k = 0; k < ns; k++) {
        assert_memory_equal(o.state[k], ref0.state[k], A * sizeof(float));
        assert_memory_equal(o.state[k] + A, ref1.state[k], (N - A) * sizeof(float));
    }
    dt_optimizer_free(&o);
    dt_optimizer_free(&ref0);
    dt_optimizer_free(&ref1);
}

static void test_inactive_segment_skipped(void **st) {
    (void)st;
    dt_optim_cfg a = dt_optim_cfg_default(DT_OPTIM_ADAMW);
    a.weight_decay = 0.1f;
    skip_case(&a);
    dt_optim_cfg s = dt_optim_cfg_default(DT_OPTIM_SGD);
    s.momentum = 0.9f;
    s.weight_decay = 0.1f;
    skip_case(&s);
}

/* Compact state: holes (frozen parameters left out of the table, padding)
 * cost no state; stepping equals an optimizer with full state bit for bit,
 * and dt_optimizer_state_of finds each element's state. */
static void compact_equals_full(const dt_optim_cfg *c) {
    enum { NC = 60 };
    /* [0,10) seg, [10,25) hole, [25,40) seg, [40,45) hole, [45,58) seg, [58,60) hole */
    dt_optim_segment segs[3] = {{25, 15, 0, NULL, NULL, 0}, {0, 10, 1, NULL, NULL, 0}, {45, 13, 1, NULL, NULL, 0}};
    dt_optimizer full, comp;
    assert_int_equal(dt_optimizer_init(&full, c, segs, 3, 0, NC), DT_OK);
    assert_int_equal(dt_optimizer_init_compact(&comp, c, segs, 3, NC), DT_OK);
    assert_int_equal(comp.state_len, 38);
    assert_int_equal(full.state_len, NC);
    float p[NC], q[NC], g[NC];
    fill(p, NC);
    memcpy(q, p, sizeof p);
    for (int t = 0; t < 3; t++) {
        fill(g, NC);
        assert_int_equal(dt_optimizer_step_range(&full, 0.05f, p, g, 0, NC, 1.0f), DT_OK);
        assert_int_equal(dt_optimizer_step_range(&comp, 0.05f, q, g, 0, NC, 1.0f), DT_OK);
        dt_optimizer_finish_step(&full);
        dt_optimizer_finish_step(&comp);
    }
    assert_memory_equal(p, q, sizeof p);
    int ns = dt_optim_state_per_elem(c);
    for (int k = 0; k < ns; k++)
        for (size_t e = 0; e < NC; e++) {
            int in = e < 10 || (e >= 25 && e < 40) || (e >= 45 && e < 58);
            float *a = dt_optimizer_state_of(&full, k, e), *b = dt_optimizer_state_of(&comp, k, e);
            if (!in) { assert_null(b); assert_null(a); continue; }
            assert_non_null(a);
            assert_non_null(b);
            assert_memory_equal(a, b, sizeof *a);
            if (e + 1 < NC && dt_optimizer_state_of(&comp, k, e + 1)) assert_ptr_equal(dt_optimizer_state_of(&comp, k, e + 1), b + 1);
        }
    assert_null(dt_optimizer_state_of(&comp, 0, NC));
    dt_optimizer_free(&full);
    dt_optimizer_free(&comp);
    /* a segment past the buffer */
    assert_int_equal(dt_optimizer_init_compact(&comp, c, segs, 3, 50), DT_EINVAL);
}

static void test_compact_state(void **st) {
    (void)st;
    dt_optim_cfg a = dt_optim_cfg_default(DT_OPTIM_ADAMW);
    a.weight_decay = 0.1f;
    compact_equals_full(&a);
    dt_optim_cfg s = dt_optim_cfg_default(DT_OPTIM_SGD);
    s.momentum = 0.9f;
    s.weight_decay = 0.1f;
    compact_equals_full(&s);
}

/* Gradients with frozen parameters left out (nn.h grad_offsets): a segment
 * with grad_gap reads grad[offset - gap]; the step equals the one over a
 * full-layout gradient, and a gap larger than the offset is refused. */
static void test_grad_gap(void **st) {
    (void)st;
    dt_optim_cfg c = dt_optim_cfg_default(DT_OPTIM_ADAMW);
    c.weight_decay = 0.1f;
    /* values: [0,8) trainable, [8,20) frozen (no segment), [20,26) trainable */
    const dt_optim_segment dense[2] = {{0, 8, 1, NULL, NULL, 0}, {20, 6, 1, NULL, NULL, 0}};
    const dt_optim_segment gapped[2] = {{0, 8, 1, NULL, NULL, 0}, {20, 6, 1, NULL, NULL, 12}};
    dt_optimizer a, b;
    assert_int_equal(dt_optimizer_init_compact(&a, &c, dense, 2, 26), DT_OK);
    assert_int_equal(dt_optimizer_init_compact(&b, &c, gapped, 2, 26), DT_OK);
    float pa[26], pb[26], p0[26], g[26], gc[14];
    fill(pa, 26);
    memcpy(pb, pa, sizeof pa);
    memcpy(p0, pa, sizeof pa);
    for (int s = 0; s < 3; s++) {
        for (int i = 0; i < 26; i++) g[i] = i >= 8 && i < 20 ? 0.0f : 0.01f * (float)(i + 1) * (float)(s + 1);
        memcpy(gc, g, 8 * sizeof *g);
        memcpy(gc + 8, g + 20, 6 * sizeof *g);
        assert_int_equal(dt_optimizer_step_range(&a, 0.05f, pa, g, 0, 26, 1.0f), DT_OK);
        assert_int_equal(dt_optimizer_step_range(&b, 0.05f, pb, gc, 0, 26, 1.0f), DT_OK);
        dt_optimizer_finish_step(&a);
        dt_optimizer_finish_step(&b);
    }
    assert_memory_equal(pa, pb, sizeof pa);
    assert_true(pb[21] != p0[21]);   /* the gapped segment did move */
    dt_optimizer_free(&a);
    dt_optimizer_free(&b);
    const dt_optim_segment bad[1] = {{4, 8, 1, NULL, NULL, 5}};
    assert_int_equal(dt_optimizer_init_compact(&a, &c, bad, 1, 26), DT_EINVAL);
    assert_non_null(strstr(dt_error_message(), "gradient gap"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cfg_defaults),
        cmocka_unit_test(test_cfg_validate_rejects),
        cmocka_unit_test(test_init_rejects),
        cmocka_unit_test(test_decay_flag_sgd),
        cmocka_unit_test(test_decay_flag_adamw),
        cmocka_unit_test(test_step_range_checks),
        cmocka_unit_test(test_matches_kernels),
        cmocka_unit_test(test_sharded_adamw),
        cmocka_unit_test(test_sharded_sgd),
        cmocka_unit_test(test_compact_state),
        cmocka_unit_test(test_inactive_segment_skipped),
        cmocka_unit_test(test_grad_gap),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
