/* Activations kept in 16 bits until backward (dt_graph_pack16).
 *
 * A region y = (x · A) · B with x the identity: its backward reads h = x · A
 * (= A, exactly) for B's gradient, dB[i][j] = sum_r h[r][i] * up[r][j]. With
 * the region packed, h is read back rounded, so with up = 1 the gradient is
 * sum_r round(A[r][i]), computed here in double with this file's own
 * rounding (A in [1, 2): bf16 keeps 7 fraction bits, fp16 10). Everything
 * the rounding does not reach -- y, x's and A's gradients, the grad-ready
 * order, module hooks -- stays bitwise that of the plain run. Also: a region
 * bigger than the scratch's first block (the image spans blocks) and later
 * steps, memory, an unreached region, nesting and bad input. */
#define _DEFAULT_SOURCE   /* MAP_ANONYMOUS */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "dtrain/ops.h"

enum { PLAIN = 0, BF16 = 1, F16 = 2 };

typedef struct net {
    int64_t k, m;           /* x [k, k] identity, A [k, k], B [k, m] */
    dt_param A, B;
    dt_module mod;
    dt_param *mod_params[2];
    float *x, *up;
    int depth;              /* regions chained: y_i = region(y_{i-1}) needs m == k */
    int nest;               /* 1: the region calls dt_graph_checkpoint; 2: dt_graph_pack16 */
    int deep;               /* 1: three GELUs between the products (more to keep) */
    int keep;               /* reader_region: declare its input keep-exact */
    int ret_a;              /* identity_region: return A's value instead of x */
    char log[64][160]; int n_log;   /* grad-ready and module hooks, in order */
} net;

static dt_status on_ready(dt_param *p, void *user) {
    net *n = user;
    if (n->n_log < 64) snprintf(n->log[n->n_log++], 160, "ready %s", p->name);
    return DT_OK;
}

static dt_status on_module(dt_module *m, dt_module_hook_kind k, void *user) {
    net *n = user;
    static const char *kn[DT_HOOK_KINDS] = {"pre_fwd", "post_fwd", "pre_bwd", "post_bwd", "pre_rec", "post_rec"};
    if (n->n_log < 64) snprintf(n->log[n->n_log++], 160, "%s %s", m->name, kn[k]);
    return DT_OK;
}

static void net_init(net *n, int64_t k, int64_t m) {
    memset(n, 0, sizeof *n);
    n->k = k; n->m = m; n->depth = 1;
    int64_t sa[2] = {k, k}, sb[2] = {k, m};
    assert_int_equal(dt_param_init(&n->A, "A", 2, sa), DT_OK);
    assert_int_equal(dt_param_init(&n->B, "B", 2, sb), DT_OK);
    /* A in [1, 2) with low fraction bits set: both roundings move most values */
    for (int64_t i = 0; i < k * k; i++) dt_f32(&n->A.value)[i] = 1.0f + (float)((i * 2654435761u) % 4096u) / 4096.0f + 1.0f / 16384;
    for (int64_t i = 0; i < k * m; i++) dt_f32(&n->B.value)[i] = (float)sin(0.71 * (double)i + 0.3) / (float)k;
    n->A.on_grad_ready = n->B.on_grad_ready = on_ready;
    n->A.on_grad_ready_user = n->B.on_grad_ready_user = n;
    snprintf(n->mod.name, sizeof n->mod.name, "blk");
    n->mod_params[0] = &n->A; n->mod_params[1] = &n->B;
    n->mod.params = n->mod_params;
    n->mod.n_params = 2;
    n->mod.hook = on_module;
    n->mod.hook_user = n;
    n->x = calloc((size_t)(k * k), sizeof *n->x);
    for (int64_t i = 0; i < k; i++) n->x[i * k + i] = 1.0f;
    n->up = malloc((size_t)(k * m) * sizeof *n->up);
    for (int64_t i = 0; i < k * m; i++) n->up[i] = 1.0f;
}

static void net_free(net *n) {
    dt_param_free(&n->A);
    dt_param_free(&n->B);
    free(n->x);
    free(n->up);
}

static dt_tensor *region(dt_graph *g, dt_tensor *x, void *ctx) {
    net *n = ctx;
    if (n->nest == 1) return dt_graph_checkpoint(g, region, x, &(net){0}, NULL);
    if (n->nest == 2) return dt_graph_pack16(g, region, x, n, DT_BF16);
    if (dt_module_enter(g, &n->mod) != DT_OK) return NULL;
    dt_tensor *h = dt_op_matmul(g, x, &n->A.value);
    for (int i = 0; i < 3 * n->deep; i++) h = dt_op_gelu(g, h);
    h = dt_op_matmul(g, h, &n->B.value);
    if (dt_module_leave(g, &n->mod) != DT_OK) return NULL;
    return h;
}

typedef struct result {
    float *y, *gx, *gA, *gB;
    size_t bytes;
} result;

static void result_free(result *r) { free(r->y); free(r->gx); free(r->gA); free(r->gB); }

static float *dupf(const float *p, int64_t n) {
    float *d = malloc((size_t)n * sizeof *d);
    memcpy(d, p, (size_t)n * sizeof *d);
    return d;
}

/* One step (steps times on one graph, the last kept) in `mode`. */
static result run(net *n, dt_graph *g, int mode, int steps) {
    static const dt_dtype dt[3] = {DT_F32, DT_BF16, DT_F16};
    result r = {0};
    for (int s = 0; s < steps; s++) {
        dt_graph_reset(g);
        memset(n->A.grad.data, 0, (size_t)n->A.grad.numel * sizeof(float));
        memset(n->B.grad.data, 0, (size_t)n->B.grad.numel * sizeof(float));
        n->n_log = 0;
        int64_t sx[2] = {n->k, n->k};
        dt_tensor *x = dt_graph_input(g, 2, sx, n->x, 1), *y = x;
        for (int d = 0; d < n->depth; d++) {
            y = mode == PLAIN ? region(g, y, n) : dt_graph_pack16(g, region, y, n, dt[mode]);
            assert_non_null(y);
        }
        assert_int_equal(dt_graph_backward_from(g, y, n->up), DT_OK);
        if (s + 1 < steps) continue;
        r.y = dupf(dt_f32(y), y->numel);
        r.gx = dupf(dt_graph_grad(g, x), x->numel);
        r.gA = dupf(dt_f32(&n->A.grad), n->A.grad.numel);
        r.gB = dupf(dt_f32(&n->B.grad), n->B.grad.numel);
    }
    r.bytes = dt_graph_arena_bytes(g);
    return r;
}

static double round_to(double v, double frac_bits) { return nearbyint(v * frac_bits) / frac_bits; }   /* v in [1, 2) */

static void check_rounded_gradient(int mode, int64_t k, int steps) {
    net n;
    net_init(&n, k, 8);
    dt_graph *g = dt_graph_create();
    result p = run(&n, g, PLAIN, 1);
    char plain_log[64][160];
    int plain_n = n.n_log;
    memcpy(plain_log, n.log, sizeof plain_log);
    dt_graph *g2 = dt_graph_create();
    result q = run(&n, g2, mode, steps);
    /* untouched by the rounding: bitwise */
    assert_memory_equal(p.y, q.y, (size_t)(k * n.m) * sizeof(float));
    assert_memory_equal(p.gx, q.gx, (size_t)(k * k) * sizeof(float));
    assert_memory_equal(p.gA, q.gA, (size_t)(k * k) * sizeof(float));
    assert_int_equal(plain_n, n.n_log);
    for (int i = 0; i < plain_n; i++) assert_string_equal(plain_log[i], n.log[i]);
    /* B's gradient: the rounded h, against this file's rounding */
    double bits = mode == BF16 ? 128.0 : 1024.0;
    int moved = 0;
    for (int64_t i = 0; i < k; i++) {
        double want = 0, exact = 0;
        for (int64_t r = 0; r < k; r++) {
            double a = dt_f32(&n.A.value)[r * k + i];
            want += round_to(a, bits);
            exact += a;
        }
        /* rounded: k values of 7 (bf16) or 10 (fp16) fraction bits below 2^11 sum exactly in float32, in
         * any order; exact: 14 fraction bits do not, so the BLAS's order moves it by up to k * 2^-24 */
        for (int64_t j = 0; j < n.m; j++) {
            assert_true(fabs(q.gB[i * n.m + j] - want) <= 1e-6 * want);
            assert_true(fabs(p.gB[i * n.m + j] - exact) <= (double)k * 6e-8 * exact);
        }
        moved += fabs(want - exact) > 1e-4 * exact;   /* the data tells the two apart */
    }
    assert_true(moved > k / 2);
    result_free(&p);
    result_free(&q);
    dt_graph_free(g);
    dt_graph_free(g2);
    net_free(&n);
}

static void test_bf16_rounds_what_backward_reads(void **s) { (void)s; check_rounded_gradient(BF16, 32, 1); }
static void test_fp16_rounds_what_backward_reads(void **s) { (void)s; check_rounded_gradient(F16, 32, 1); }
/* k = 1100: h (4.8 MB) does not fit the scratch's first 4 MiB block, so
 * step 1's image spans two blocks; step 3 runs in the merged one. */
static void test_image_across_scratch_blocks(void **s) { (void)s; check_rounded_gradient(BF16, 1100, 1); }
static void test_later_steps(void **s) { (void)s; check_rounded_gradient(BF16, 1100, 3); }

/* Eight chained regions of five [256, 256] activations each: the graph's
 * activation memory (its arenas' high-water: activations, their gradients,
 * the tape) falls to about half -- a packed region keeps four in 16 bits and
 * its output in fp32, and one region at a time is widened in the scratch. */
static void test_memory_halves(void **s) {
    (void)s;
    net n;
    net_init(&n, 256, 256);
    n.depth = 8;
    n.deep = 1;
    dt_graph *g = dt_graph_create(), *g2 = dt_graph_create();
    result p = run(&n, g, PLAIN, 2), q = run(&n, g2, BF16, 2);
    printf("# activation memory: plain %zu B, bf16 %zu B (%.3fx)\n", p.bytes, q.bytes, (double)q.bytes / (double)p.bytes);
    assert_true((double)q.bytes <= 0.6 * (double)p.bytes);
    for (int64_t i = 0; i < 256 * 256; i++) assert_true(fabsf(p.gA[i] - q.gA[i]) <= 2e-2f * (fabsf(p.gA[i]) + 1e-3f));
    result_free(&p);
    result_free(&q);
    dt_graph_free(g);
    dt_graph_free(g2);
    net_free(&n);
}

/* A region no gradient reaches: its parameters' uses are released, so
 * grad-ready fires for them as in the plain run. */
static void test_unreached_region_releases_uses(void **s) {
    (void)s;
    net n;
    net_init(&n, 16, 16);
    int64_t sx[2] = {16, 16}, sw[2] = {16, 16};
    dt_param W;
    assert_int_equal(dt_param_init(&W, "W", 2, sw), DT_OK);
    for (int i = 0; i < 256; i++) dt_f32(&W.value)[i] = 0.01f * (float)i;
    for (int mode = PLAIN; mode <= BF16; mode++) {
        dt_graph *g = dt_graph_create();
        n.n_log = 0;
        dt_tensor *x = dt_graph_input(g, 2, sx, n.x, 1);
        dt_tensor *dead = mode == PLAIN ? region(g, x, &n) : dt_graph_pack16(g, region, x, &n, DT_BF16);
        assert_non_null(dead);
        dt_tensor *y = dt_op_matmul(g, x, &W.value);
        assert_int_equal(dt_graph_backward_from(g, y, n.up), DT_OK);
        int ready = 0;
        for (int i = 0; i < n.n_log; i++) ready += !strncmp(n.log[i], "ready", 5);
        assert_int_equal(ready, 2);   /* A and B */
        dt_graph_free(g);
    }
    dt_param_free(&W);
    net_free(&n);
}

/* The region's output is kept exact (restored from its fp32 copy, not
 * stored in the image): softmax's backward reads its own output, and x·A's
 * weight gradient reads only x (the region's input: exact), so A's gradient
 * is bitwise the plain one. */
static dt_tensor *softmax_region(dt_graph *g, dt_tensor *x, void *ctx) {
    net *n = ctx;
    return dt_op_softmax(g, dt_op_matmul(g, x, &n->A.value));
}

static void test_output_restored_exactly(void **s) {
    (void)s;
    net n;
    net_init(&n, 64, 64);
    int64_t sx[2] = {64, 64};
    float *gA[2];
    for (int mode = PLAIN; mode <= BF16; mode++) {
        dt_graph *g = dt_graph_create();
        memset(n.A.grad.data, 0, 64 * 64 * sizeof(float));
        for (int i = 0; i < 64 * 64; i++) n.up[i] = (float)((i * 37) % 11) - 5.0f;
        dt_tensor *x = dt_graph_input(g, 2, sx, n.x, 1);
        dt_tensor *y = x;
        for (int d = 0; d < 2; d++) {   /* the second region overwrites the scratch the first's output was in */
            y = mode == PLAIN ? softmax_region(g, y, &n) : dt_graph_pack16(g, softmax_region, y, &n, DT_BF16);
            assert_non_null(y);
        }
        assert_int_equal(dt_graph_backward_from(g, y, n.up), DT_OK);
        gA[mode] = dupf(dt_f32(&n.A.grad), 64 * 64);
        dt_graph_free(g);
    }
    assert_memory_equal(gA[0], gA[1], 64 * 64 * sizeof(float));
    free(gA[0]);
    free(gA[1]);
    net_free(&n);
}

/* An op whose backward hands its saved buffer to x's gradient: dx = saved.
 * Declared with dt_graph_saved_may_round, a packed region gives it back
 * rounded; undeclared, or outside a region, exact. */
typedef struct probe { int declare; float *saved; } probe;

static void probe_backward(dt_graph *g, dt_node *n) {
    float *dx = dt_grad_of(g, n->in[0]);
    const float *sv = n->saved;
    if (dx) for (int64_t i = 0; i < n->in[0]->numel; i++) dx[i] += sv[i];
}

static dt_tensor *probe_region(dt_graph *g, dt_tensor *x, void *ctx) {
    probe *pr = ctx;
    dt_tensor *y = dt_graph_tensor(g, x->ndim, x->shape);
    float *sv = dt_graph_scratch(g, (size_t)x->numel * sizeof(float));
    if (!y || !sv) return NULL;
    memcpy(dt_f32(y), dt_f32(x), (size_t)x->numel * sizeof(float));
    memcpy(sv, pr->saved, (size_t)x->numel * sizeof(float));
    if (pr->declare) dt_graph_saved_may_round(g, sv, x->numel);
    dt_node *n = dt_graph_record(g, "probe", probe_backward, y, 1, &x);
    if (n) n->saved = sv;
    return y;
}

static void test_saved_may_round(void **s) {
    (void)s;
    int64_t shape[2] = {32, 32};
    float x[1024], up[1024], sv[1024];
    for (int i = 0; i < 1024; i++) {
        x[i] = (float)i;
        up[i] = 1.0f;
        sv[i] = 1.0f + (float)((i * 2654435761u) % 4096u) / 4096.0f + 1.0f / 16384;   /* in [1, 2): moves when rounded */
    }
    for (int packed = 0; packed < 2; packed++)
        for (int declare = 0; declare < 2; declare++) {
            dt_graph *g = dt_graph_create();
            probe pr = {declare, sv};
            dt_tensor *xt = dt_graph_input(g, 2, shape, x, 1);
            dt_tensor *y = packed ? dt_graph_pack16(g, probe_region, xt, &pr, DT_BF16) : probe_region(g, xt, &pr);
            assert_non_null(y);
            assert_int_equal(dt_graph_backward_from(g, y, up), DT_OK);
            const float *dx = dt_graph_grad(g, xt);
            int moved = 0;
            for (int i = 0; i < 1024; i++) {
                float want = packed && declare ? (float)(nearbyint((double)sv[i] * 128.0) / 128.0) : sv[i];
                assert_true(dx[i] == want);
                moved += want != sv[i];
            }
            assert_true(packed && declare ? moved > 900 : moved == 0);
            dt_graph_free(g);
        }
}

/* An op whose backward reads its input's value, which it declared to keep
 * exact: dx = x as read in backward. In a region, x = I · A (a node output,
 * otherwise rounded), so A's gradient is A exactly with the declaration and
 * A rounded without it. */
static void reader_backward(dt_graph *g, dt_node *n) {
    float *dx = dt_grad_of(g, n->in[0]);
    const float *x = dt_f32(n->in[0]);
    if (dx) for (int64_t i = 0; i < n->in[0]->numel; i++) dx[i] += x[i];
}

static dt_tensor *reader_region(dt_graph *g, dt_tensor *x, void *ctx) {
    net *n = ctx;
    dt_tensor *h = dt_op_matmul(g, x, &n->A.value);
    dt_tensor *y = h ? dt_graph_tensor(g, h->ndim, h->shape) : NULL;
    if (!y) return NULL;
    memcpy(dt_f32(y), dt_f32(h), (size_t)h->numel * sizeof(float));
    if (n->keep) dt_graph_saved_keep_exact(g, dt_f32(h), h->numel);
    dt_graph_record(g, "reader", reader_backward, y, 1, &h);
    return y;
}

static void test_saved_keep_exact(void **s) {
    (void)s;
    net n;
    net_init(&n, 32, 32);
    int64_t sx[2] = {32, 32};
    for (int keep = 0; keep < 2; keep++) {
        n.keep = keep;
        dt_graph *g = dt_graph_create();
        memset(n.A.grad.data, 0, 32 * 32 * sizeof(float));
        dt_tensor *y = dt_graph_pack16(g, reader_region, dt_graph_input(g, 2, sx, n.x, 1), &n, DT_BF16);
        assert_non_null(y);
        assert_int_equal(dt_graph_backward_from(g, y, n.up), DT_OK);
        int moved = 0;
        for (int i = 0; i < 32 * 32; i++) {
            float a = dt_f32(&n.A.value)[i], want = keep ? a : (float)(nearbyint((double)a * 128.0) / 128.0);
            assert_true(dt_f32(&n.A.grad)[i] == want);
            moved += want != a;
        }
        assert_true(keep ? moved == 0 : moved > 900);
        dt_graph_free(g);
    }
    net_free(&n);
}

/* A region that returns its input (after recording an op beside it): its
 * output is not the region's own, so backward must not write it back -- the
 * input here is the caller's read-only page (a write would fault). */
static dt_tensor *passthrough_region(dt_graph *g, dt_tensor *x, void *ctx) {
    net *n = ctx;
    return dt_op_matmul(g, x, &n->A.value) ? x : NULL;
}

static void test_output_not_owned_left_alone(void **s) {
    (void)s;
    net n;
    net_init(&n, 32, 32);
    size_t page = (size_t)sysconf(_SC_PAGESIZE), bytes = (32 * 32 * sizeof(float) + page - 1) / page * page;
    float *ro = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(ro != MAP_FAILED);
    memcpy(ro, n.x, 32 * 32 * sizeof(float));
    assert_int_equal(mprotect(ro, bytes, PROT_READ), 0);
    int64_t sx[2] = {32, 32};
    dt_graph *g = dt_graph_create();
    dt_tensor *x = dt_graph_input(g, 2, sx, ro, 1);
    dt_tensor *y = dt_graph_pack16(g, passthrough_region, x, &n, DT_BF16);
    assert_non_null(y);
    assert_int_equal(dt_graph_backward_from(g, y, n.up), DT_OK);
    const float *gx = dt_graph_grad(g, x);
    for (int i = 0; i < 32 * 32; i++) assert_true(gx[i] == 1.0f);   /* the upstream, through the region */
    dt_graph_free(g);
    munmap(ro, bytes);
    net_free(&n);
}

static int defer_all(const dt_param *p, void *user) { (void)p; (void)user; return 1; }

static void test_errors_and_plain_cases(void **s) {
    (void)s;
    net n;
    net_init(&n, 16, 16);
    int64_t sx[2] = {16, 16};
    dt_graph *g = dt_graph_create();
    dt_tensor *x = dt_graph_input(g, 2, sx, n.x, 1);
    assert_null(dt_graph_pack16(NULL, region, x, &n, DT_BF16));
    assert_int_equal(dt_error_code(), DT_EINVAL);
    assert_null(dt_graph_pack16(g, NULL, x, &n, DT_BF16));
    assert_int_equal(dt_error_code(), DT_EINVAL);
    assert_null(dt_graph_pack16(g, region, x, &n, DT_I32));
    assert_int_equal(dt_error_code(), DT_EINVAL);
    assert_non_null(strstr(dt_error_message(), "bf16 or fp16"));
    n.nest = 1;   /* a checkpoint inside a region */
    assert_null(dt_graph_pack16(g, region, x, &n, DT_BF16));
    assert_int_equal(dt_error_code(), DT_ESTATE);
    n.nest = 2;   /* a region inside a region */
    assert_null(dt_graph_pack16(g, region, x, &n, DT_BF16));
    assert_int_equal(dt_error_code(), DT_ESTATE);
    assert_non_null(strstr(dt_error_message(), "nesting"));
    n.nest = 0;
    dt_graph_free(g);

    /* DT_F32: fn simply runs (B's gradient exact); a split backward defers
     * nothing inside the region (B's gradient is the packed run's, complete
     * after B); grad disabled: the plain output */
    g = dt_graph_create();
    result p = run(&n, g, PLAIN, 1);
    result q = run(&n, g, BF16, 1);
    assert_memory_not_equal(p.gB, q.gB, 256 * sizeof(float));
    for (int split = 0; split < 2; split++) {
        dt_graph *g2 = dt_graph_create();
        if (split) dt_graph_defer_weights(g2, defer_all, NULL);
        dt_tensor *x2 = dt_graph_input(g2, 2, sx, n.x, 1);
        dt_tensor *y = dt_graph_pack16(g2, region, x2, &n, split ? DT_BF16 : DT_F32);
        assert_non_null(y);
        memset(n.B.grad.data, 0, 256 * sizeof(float));
        assert_int_equal(dt_graph_backward_from(g2, y, n.up), DT_OK);
        assert_memory_equal(split ? q.gB : p.gB, n.B.grad.data, 256 * sizeof(float));
        if (split) assert_int_equal(dt_graph_backward_weights(g2), DT_OK);
        assert_memory_equal(split ? q.gB : p.gB, n.B.grad.data, 256 * sizeof(float));
        dt_graph_free(g2);
    }
    result_free(&q);
    dt_graph *g3 = dt_graph_create();
    dt_graph_set_grad_enabled(g3, 0);
    dt_tensor *y3 = dt_graph_pack16(g3, region, dt_graph_input(g3, 2, sx, n.x, 0), &n, DT_BF16);
    assert_non_null(y3);
    assert_memory_equal(p.y, dt_f32(y3), 256 * sizeof(float));
    dt_graph_free(g3);
    result_free(&p);
    dt_graph_free(g);
    net_free(&n);
}

/* A region that records no op and returns a tensor from outside it that
 * requires grad -- its input x, or parameter A's value -- passes it through:
 * z = relu(region(t)) back-propagates into x / A exactly as the plain run. */
static dt_tensor *identity_region(dt_graph *g, dt_tensor *x, void *ctx) {
    (void)g;
    net *n = ctx;
    return n->ret_a ? &n->A.value : x;
}

static void test_unrecorded_output_passes_through(void **s) {
    (void)s;
    net n;
    net_init(&n, 16, 16);
    int64_t sx[2] = {16, 16};
    for (int of_a = 0; of_a < 2; of_a++) {
        n.ret_a = of_a;
        float *want = NULL;
        for (int mode = PLAIN; mode <= BF16; mode++) {
            dt_graph *g = dt_graph_create();
            memset(n.A.grad.data, 0, 256 * sizeof(float));
            n.n_log = 0;
            dt_tensor *x = dt_graph_input(g, 2, sx, n.x, 1);
            dt_tensor *y = mode == PLAIN ? identity_region(g, x, &n) : dt_graph_pack16(g, identity_region, x, &n, DT_BF16);
            assert_non_null(y);
            assert_true(y->requires_grad);
            dt_tensor *z = dt_op_relu(g, dt_op_add(g, y, y));
            assert_int_equal(dt_graph_backward_from(g, z, n.up), DT_OK);
            const float *gr = of_a ? dt_f32(&n.A.grad) : dt_graph_grad(g, x);
            assert_non_null(gr);
            if (mode == PLAIN) want = dupf(gr, 256);
            else assert_memory_equal(gr, want, 256 * sizeof(float));
            assert_int_equal(n.n_log, of_a);   /* A's grad-ready, once */
            dt_graph_free(g);
        }
        free(want);
    }
    net_free(&n);
}

/* A region no gradient reaches, packed or checkpointed: the log of module
 * hooks and grad-ready calls is the plain run's -- blk's pre_bwd, B's and
 * A's grad-ready, blk's post_bwd, as the plain backward walks the region's
 * unreached nodes (no recompute hooks: nothing is re-run). */
static void test_unreached_region_fires_backward_hooks(void **s) {
    (void)s;
    net n;
    net_init(&n, 16, 16);
    int64_t sx[2] = {16, 16}, sw[2] = {16, 16};
    dt_param W;
    assert_int_equal(dt_param_init(&W, "W", 2, sw), DT_OK);
    for (int i = 0; i < 256; i++) dt_f32(&W.value)[i] = 0.01f * (float)i;
    char want[64][160];
    int n_want = 0;
    for (int mode = 0; mode < 3; mode++) {   /* plain, pack16, checkpoint */
        dt_graph *g = dt_graph_create();
        n.n_log = 0;
        dt_tensor *x = dt_graph_input(g, 2, sx, n.x, 1);
        dt_tensor *dead = mode == 0 ? region(g, x, &n)
                        : mode == 1 ? dt_graph_pack16(g, region, x, &n, DT_BF16)
                                    : dt_graph_checkpoint(g, region, x, &n, NULL);
        assert_non_null(dead);
        dt_tensor *y = dt_op_matmul(g, x, &W.value);
        assert_int_equal(dt_graph_backward_from(g, y, n.up), DT_OK);
        if (mode == 0) {
            n_want = n.n_log;
            memcpy(want, n.log, sizeof want);
            assert_int_equal(n_want, 6);   /* pre_fwd post_fwd pre_bwd ready B, ready A post_bwd */
        } else {
            assert_int_equal(n.n_log, n_want);
            for (int i = 0; i < n_want; i++) assert_string_equal(n.log[i], want[i]);
        }
        dt_graph_free(g);
    }
    dt_param_free(&W);
    net_free(&n);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bf16_rounds_what_backward_reads),
        cmocka_unit_test(test_fp16_rounds_what_backward_reads),
        cmocka_unit_test(test_image_across_scratch_blocks),
        cmocka_unit_test(test_later_steps),
        cmocka_unit_test(test_memory_halves),
        cmocka_unit_test(test_unreached_region_releases_uses),
        cmocka_unit_test(test_output_restored_exactly),
        cmocka_unit_test(test_saved_may_round),
        cmocka_unit_test(test_saved_keep_exact),
        cmocka_unit_test(test_output_not_owned_left_alone),
        cmocka_unit_test(test_errors_and_plain_cases),
        cmocka_unit_test(test_unrecorded_output_passes_through),
        cmocka_unit_test(test_unreached_region_fires_backward_hooks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
