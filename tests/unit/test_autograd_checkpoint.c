/* Activation recompute (dt_graph_checkpoint) on a net of residual blocks
 *   y = x + dropout(gelu(layernorm(x) · W_bᵀ + bias_b))     (module "b<k>")
 * with a head logits = y · W_0ᵀ tied to block 0's weight, cross-entropy loss.
 *
 * Checkpointing any set of blocks changes nothing observable: loss, every
 * parameter gradient, the input gradient, the rng state after the step and
 * the grad-ready order are bitwise those of the plain run (the replay runs
 * the same ops on the same values, dropout keys drawn from the same rng
 * state (dt_graph_checkpoint's generator contract), and its
 * backward accumulates in the plain order). The activation high-water drops. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dtrain/ops.h"
#include "gradcheck.h"

enum { NB_MAX = 8, NP_MAX = 4 * NB_MAX };

typedef struct bnet {
    int nb;
    int64_t n, c;                      /* x[n, c], every block keeps the width */
    dt_param p[NP_MAX];                /* block b: lnw, lnb, W, bias at 4b .. 4b+3 */
    dt_param *mod_params[NB_MAX][4];
    dt_module mod[NB_MAX];
    dt_rng rng;                        /* dropout */
    float p_drop;
    float *x;                          /* input data [n * c] */
    int32_t *y;                        /* targets [n] */
} bnet;

static void bnet_init(bnet *n, int nb, int64_t rows, int64_t c) {
    memset(n, 0, sizeof *n);
    n->nb = nb; n->n = rows; n->c = c;
    n->p_drop = 0.25f;
    static const char *suf[4] = {"lnw", "lnb", "W", "bias"};
    for (int b = 0; b < nb; b++) {
        snprintf(n->mod[b].name, sizeof n->mod[b].name, "b%d", b);
        for (int k = 0; k < 4; k++) {
            dt_param *p = &n->p[4 * b + k];
            char name[32];
            snprintf(name, sizeof name, "b%d.%s", b, suf[k]);
            int64_t shape[2] = {c, c};
            assert_int_equal(dt_param_init(p, name, k == 2 ? 2 : 1, shape), DT_OK);
            dt_gc_fill(p, 100 + (uint64_t)(4 * b + k), k == 2 ? 0.3f : 0.5f);
            n->mod_params[b][k] = p;
        }
        n->mod[b].params = n->mod_params[b];
        n->mod[b].n_params = 4;
        n->mod[b].index = b;
    }
    n->x = malloc((size_t)(rows * c) * sizeof *n->x);
    n->y = malloc((size_t)rows * sizeof *n->y);
    for (int64_t i = 0; i < rows * c; i++) n->x[i] = (float)sin(0.37 * (double)i + 0.5);
    for (int64_t i = 0; i < rows; i++) n->y[i] = (int32_t)((i * 7 + 3) % c);
}

static void bnet_free(bnet *n) {
    for (int i = 0; i < 4 * n->nb; i++) dt_param_free(&n->p[i]);
    free(n->x);
    free(n->y);
}

static int bnet_np(const bnet *n) { return 4 * n->nb; }

static void bnet_zero_grad(bnet *n) {
    for (int i = 0; i < bnet_np(n); i++) memset(n->p[i].grad.data, 0, (size_t)n->p[i].grad.numel * sizeof(float));
}

/* ---- one block as a checkpoint function ---- */
typedef struct blk_ctx {
    bnet *net;
    int b;
    dt_tensor *in;       /* the input when the checkpoint is given x = NULL */
    int calls, fail_on;  /* fail_on > 0: the fail_on-th call fails */
    int nest;            /* call dt_graph_checkpoint from inside */
    int recomputing[4];  /* dt_graph_recomputing() at each call */
} blk_ctx;

static dt_tensor *block(dt_graph *g, dt_tensor *x, void *vctx) {
    blk_ctx *c = vctx;
    bnet *n = c->net;
    dt_param **p = n->mod_params[c->b];
    if (!x) x = c->in;
    if (c->calls < 4) c->recomputing[c->calls] = dt_graph_recomputing(g);
    if (++c->calls == c->fail_on) { DT_ERR(DT_EINVAL, "block %d: boom", c->b); return NULL; }
    if (c->nest) return dt_graph_checkpoint(g, block, x, &(blk_ctx){.net = n, .b = c->b}, &n->rng);
    if (dt_module_enter(g, &n->mod[c->b]) != DT_OK) return NULL;
    dt_tensor *h = dt_op_layernorm(g, x, &p[0]->value, &p[1]->value, 1e-5f);
    h = dt_op_linear(g, h, &p[2]->value, &p[3]->value, DT_W_OUT_IN);
    h = dt_op_gelu(g, h);
    /* a generator-driven random op: the rows' dropout keys come from one
     * draw of n->rng, so the replay matches only if it restores the state */
    uint64_t *keys = dt_graph_scratch(g, (size_t)n->n * sizeof *keys), draw = dt_rng_u32(&n->rng);
    if (!keys) return NULL;
    for (int64_t r = 0; r < n->n; r++) keys[r] = dt_dropout_row_key(draw, 0, (uint64_t)r);
    h = dt_op_dropout(g, h, n->p_drop, keys, (uint64_t)c->b);
    dt_tensor *y = dt_op_add(g, x, h);
    if (dt_module_leave(g, &n->mod[c->b]) != DT_OK) return NULL;
    return y;
}

/* ---- a run: forward (blocks in ck_mask checkpointed), backward, results ---- */
typedef struct run_out {
    float loss;
    float grads[NP_MAX * 64 * 64];
    float *xgrad;
    dt_rng rng_after;
    const char *ready[NP_MAX]; int n_ready;
    float grad0_at_ready[NP_MAX];
    char hooks[64][128]; int n_hooks;
    size_t arena_bytes;
} run_out;

static run_out *cur;   /* where the hooks write */

static dt_status on_ready(dt_param *p, void *user) {
    (void)user;
    assert_true(cur->n_ready < NP_MAX);
    cur->grad0_at_ready[cur->n_ready] = dt_f32(&p->grad)[0];
    cur->ready[cur->n_ready++] = p->name;
    return DT_OK;
}

static dt_status on_module(dt_module *m, dt_module_hook_kind k, void *user) {
    (void)user;
    static const char *kn[DT_HOOK_KINDS] = {"pre_fwd", "post_fwd", "pre_bwd", "post_bwd", "pre_rec", "post_rec"};
    if (cur->n_hooks < 64) snprintf(cur->hooks[cur->n_hooks++], 128, "%s:%s", m->name, kn[k]);
    return DT_OK;
}

enum { VIA_X = 0, VIA_CTX = 1 };

static dt_tensor *forward_loss(dt_graph *g, bnet *n, dt_tensor *x, unsigned ck_mask, int via, blk_ctx *ctxs) {
    dt_tensor *h = x;
    for (int b = 0; b < n->nb; b++) {
        ctxs[b] = (blk_ctx){.net = n, .b = b};
        if (!(ck_mask >> b & 1)) h = block(g, h, &ctxs[b]);
        else if (via == VIA_X) h = dt_graph_checkpoint(g, block, h, &ctxs[b], &n->rng);
        else { ctxs[b].in = h; h = dt_graph_checkpoint(g, block, NULL, &ctxs[b], &n->rng); }
        assert_non_null(h);
    }
    dt_tensor *logits = dt_op_linear(g, h, &n->p[2].value, NULL, DT_W_OUT_IN);   /* tied to b0.W */
    dt_tensor *loss = dt_op_cross_entropy(g, logits, n->y);
    assert_non_null(loss);
    return loss;
}

static void run(bnet *n, unsigned ck_mask, int via, run_out *o) {
    memset(o, 0, sizeof *o);
    cur = o;
    bnet_zero_grad(n);
    for (int i = 0; i < bnet_np(n); i++) n->p[i].on_grad_ready = on_ready;
    for (int b = 0; b < n->nb; b++) n->mod[b].hook = on_module;
    dt_rng_seed(&n->rng, 7);
    dt_graph *g = dt_graph_create();
    dt_tensor *x = dt_graph_input(g, 2, (int64_t[]){n->n, n->c}, n->x, 1);
    blk_ctx ctxs[NB_MAX];
    dt_tensor *loss = forward_loss(g, n, x, ck_mask, via, ctxs);
    o->loss = dt_f32(loss)[0];
    assert_int_equal(dt_graph_backward(g, loss), DT_OK);
    int pos = 0;
    for (int i = 0; i < bnet_np(n); i++) {
        memcpy(o->grads + pos, n->p[i].grad.data, (size_t)n->p[i].grad.numel * sizeof(float));
        pos += (int)n->p[i].grad.numel;
    }
    o->xgrad = malloc((size_t)(n->n * n->c) * sizeof(float));
    memcpy(o->xgrad, dt_graph_grad(g, x), (size_t)(n->n * n->c) * sizeof(float));
    o->rng_after = n->rng;
    o->arena_bytes = dt_graph_arena_bytes(g);
    dt_graph_free(g);
    cur = NULL;
}

static void expect_same(const bnet *n, const run_out *a, const run_out *b) {
    size_t ng = 0;
    for (int i = 0; i < bnet_np(n); i++) ng += (size_t)n->p[i].grad.numel;
    assert_memory_equal(&a->loss, &b->loss, sizeof a->loss);
    assert_memory_equal(a->grads, b->grads, ng * sizeof(float));
    assert_memory_equal(a->xgrad, b->xgrad, (size_t)(n->n * n->c) * sizeof(float));
    assert_memory_equal(&a->rng_after, &b->rng_after, sizeof a->rng_after);
    assert_int_equal(a->n_ready, b->n_ready);
    for (int i = 0; i < a->n_ready; i++) assert_string_equal(a->ready[i], b->ready[i]);
}

/* Every parameter once; its gradient final when its hook ran. */
static void expect_ready_once_final(bnet *n, const run_out *o) {
    assert_int_equal(o->n_ready, bnet_np(n));
    for (int i = 0; i < bnet_np(n); i++) {
        int seen = 0;
        for (int k = 0; k < o->n_ready; k++)
            if (!strcmp(o->ready[k], n->p[i].name)) {
                seen++;
                assert_true(o->grad0_at_ready[k] == dt_f32(&n->p[i].grad)[0]);
            }
        assert_int_equal(seen, 1);
    }
}

static void test_checkpoint_bitwise_as_plain(void **state) {
    (void)state;
    bnet n;
    bnet_init(&n, 3, 6, 8);
    run_out *plain = malloc(sizeof *plain), *ck = malloc(sizeof *ck);
    run(&n, 0, VIA_X, plain);
    expect_ready_once_final(&n, plain);
    const unsigned masks[3] = {7u, 2u, 5u};   /* every block, the middle one, the outer two */
    for (int via = VIA_X; via <= VIA_CTX; via++)
        for (int m = 0; m < 3; m++) {
            run(&n, masks[m], via, ck);
            expect_ready_once_final(&n, ck);   /* b0.W (tied to the head) after both uses */
            expect_same(&n, ck, plain);
            free(ck->xgrad);
        }
    free(plain->xgrad);
    free(plain);
    free(ck);
    bnet_free(&n);
}

/* Module hooks: the first pass fires pre/post forward; backward replays a
 * checkpointed block (pre/post recompute) and then back-propagates it. */
static void test_recompute_hooks(void **state) {
    (void)state;
    bnet n;
    bnet_init(&n, 2, 4, 8);
    run_out *o = malloc(sizeof *o);
    run(&n, 3u, VIA_X, o);
    const char *want[] = {"b0:pre_fwd", "b0:post_fwd", "b1:pre_fwd", "b1:post_fwd",
                          "b1:pre_rec", "b1:post_rec", "b1:pre_bwd", "b1:post_bwd",
                          "b0:pre_rec", "b0:post_rec", "b0:pre_bwd", "b0:post_bwd"};
    assert_int_equal(o->n_hooks, 12);
    for (int i = 0; i < 12; i++) assert_string_equal(o->hooks[i], want[i]);
    free(o->xgrad);
    run(&n, 1u, VIA_X, o);   /* only b0 checkpointed */
    const char *want1[] = {"b0:pre_fwd", "b0:post_fwd", "b1:pre_fwd", "b1:post_fwd",
                           "b1:pre_bwd", "b1:post_bwd", "b0:pre_rec", "b0:post_rec", "b0:pre_bwd", "b0:post_bwd"};
    assert_int_equal(o->n_hooks, 10);
    for (int i = 0; i < 10; i++) assert_string_equal(o->hooks[i], want1[i]);
    free(o->xgrad);
    free(o);
    bnet_free(&n);
}

/* The point of it: a deep net's activation high-water (main + scratch) drops. */
static void test_checkpoint_lowers_high_water(void **state) {
    (void)state;
    bnet n;
    bnet_init(&n, 8, 64, 64);
    run_out *plain = malloc(sizeof *plain), *ck = malloc(sizeof *ck);
    run(&n, 0, VIA_X, plain);
    run(&n, 0xffu, VIA_X, ck);
    expect_same(&n, ck, plain);
    if (getenv("DTT_VERBOSE")) printf("arena high-water: plain %zu, checkpointed %zu\n", plain->arena_bytes, ck->arena_bytes);
    assert_true(ck->arena_bytes < plain->arena_bytes / 2);
    free(plain->xgrad); free(ck->xgrad);
    free(plain);
    free(ck);
    bnet_free(&n);
}

static void expect_msg(dt_status s, dt_status code, const char *needle) {
    assert_int_equal(s, code);
    if (!strstr(dt_error_message(), needle)) fail_msg("message '%s' lacks '%s'", dt_error_message(), needle);
    dt_error_clear();
}

/* fn failing on replay fails backward with fn's message; the rng is left as
 * the forward left it. Nested checkpoints are refused. */
static void test_checkpoint_errors(void **state) {
    (void)state;
    bnet n;
    bnet_init(&n, 1, 4, 8);
    dt_graph *g = dt_graph_create();
    dt_rng_seed(&n.rng, 3);
    dt_tensor *x = dt_graph_input(g, 2, (int64_t[]){n.n, n.c}, n.x, 1);
    blk_ctx c = {.net = &n, .b = 0, .fail_on = 2};
    dt_tensor *y = dt_graph_checkpoint(g, block, x, &c, &n.rng);
    assert_non_null(y);
    dt_rng after_fwd = n.rng;
    dt_tensor *loss = dt_op_cross_entropy(g, y, n.y);
    expect_msg(dt_graph_backward(g, loss), DT_EINVAL, "block 0: boom");
    assert_memory_equal(&n.rng, &after_fwd, sizeof after_fwd);

    dt_graph_reset(g);
    x = dt_graph_input(g, 2, (int64_t[]){n.n, n.c}, n.x, 1);
    c = (blk_ctx){.net = &n, .b = 0, .fail_on = 1};   /* the first pass fails: fn's error, no output */
    assert_null(dt_graph_checkpoint(g, block, x, &c, &n.rng));
    expect_msg(dt_error_code(), DT_EINVAL, "boom");
    c = (blk_ctx){.net = &n, .b = 0, .nest = 1};
    assert_null(dt_graph_checkpoint(g, block, x, &c, &n.rng));
    expect_msg(dt_error_code(), DT_ESTATE, "nested");
    assert_null(dt_graph_checkpoint(g, NULL, x, &c, &n.rng));
    expect_msg(dt_error_code(), DT_EINVAL, "fn");
    /* the graph still works after the refusals */
    c = (blk_ctx){.net = &n, .b = 0};
    loss = dt_op_cross_entropy(g, dt_graph_checkpoint(g, block, x, &c, &n.rng), n.y);
    assert_int_equal(dt_graph_backward(g, loss), DT_OK);
    dt_graph_free(g);
    bnet_free(&n);
}

/* With grad disabled the checkpoint just runs fn: its own output, nothing
 * recorded, fn called once. */
static void test_no_grad_just_runs(void **state) {
    (void)state;
    bnet n;
    bnet_init(&n, 1, 4, 8);
    dt_graph *g = dt_graph_create();
    dt_graph_set_grad_enabled(g, 0);
    dt_tensor *x = dt_graph_input(g, 2, (int64_t[]){n.n, n.c}, n.x, 0);
    blk_ctx c = {.net = &n, .b = 0};
    dt_tensor *y = dt_graph_checkpoint(g, block, x, &c, &n.rng);
    assert_non_null(y);
    assert_int_equal(c.calls, 1);
    assert_int_equal(c.recomputing[0], 0);
    assert_false(y->requires_grad);
    assert_null(y->grad_fn);
    assert_int_equal(dt_graph_param_uses(g, &n.p[2]), 0);
    dt_graph_free(g);
    bnet_free(&n);
}

/* A checkpointed block whose output no gradient reaches is not replayed, but
 * its parameters' uses are released: grad-ready still fires for them. */
static void test_unreached_checkpoint_releases_uses(void **state) {
    (void)state;
    bnet n;
    bnet_init(&n, 2, 4, 8);
    run_out *o = malloc(sizeof *o);
    memset(o, 0, sizeof *o);
    cur = o;
    for (int i = 0; i < bnet_np(&n); i++) n.p[i].on_grad_ready = on_ready;
    dt_graph *g = dt_graph_create();
    dt_rng_seed(&n.rng, 5);
    dt_tensor *x = dt_graph_input(g, 2, (int64_t[]){n.n, n.c}, n.x, 1);
    blk_ctx c[2] = {{.net = &n, .b = 0}, {.net = &n, .b = 1}};
    dt_tensor *y0 = block(g, x, &c[0]);
    assert_non_null(dt_graph_checkpoint(g, block, x, &c[1], &n.rng));   /* a side branch, unused */
    dt_rng after_fwd = n.rng;
    assert_int_equal(dt_graph_backward(g, dt_op_cross_entropy(g, y0, n.y)), DT_OK);
    assert_int_equal(c[1].calls, 1);                        /* not replayed */
    assert_memory_equal(&n.rng, &after_fwd, sizeof after_fwd);
    /* b1's four first, as an unreached plain block releases them (nodes last
     * to first: linear W, bias; layernorm lnw, lnb), then b0's */
    const char *want[8] = {"b1.W", "b1.bias", "b1.lnw", "b1.lnb", "b0.W", "b0.bias", "b0.lnw", "b0.lnb"};
    assert_int_equal(o->n_ready, 8);
    for (int i = 0; i < 8; i++) assert_string_equal(o->ready[i], want[i]);
    cur = NULL;
    dt_graph_free(g);
    free(o);
    bnet_free(&n);
}

/* Two checkpoints reading the same tensor through ctx (x = NULL): the first
 * replay (block 1) creates that tensor's gradient, the second (block 0)
 * reuses the scratch before adding to it, so the gradient must live in the
 * main arena. loss = CE(block0(x) + block1(x)); bitwise as the plain run. */
static void branch_run(bnet *n, int ck, float *xgrad, float *grads, size_t ng) {
    bnet_zero_grad(n);
    dt_rng_seed(&n->rng, 11);
    dt_graph *g = dt_graph_create();
    dt_tensor *x = dt_graph_input(g, 2, (int64_t[]){n->n, n->c}, n->x, 1);
    blk_ctx c[2] = {{.net = n, .b = 0, .in = x}, {.net = n, .b = 1, .in = x}};
    dt_tensor *y[2];
    for (int b = 0; b < 2; b++) y[b] = ck ? dt_graph_checkpoint(g, block, NULL, &c[b], &n->rng) : block(g, x, &c[b]);
    dt_tensor *loss = dt_op_cross_entropy(g, dt_op_add(g, y[0], y[1]), n->y);
    assert_int_equal(dt_graph_backward(g, loss), DT_OK);
    memcpy(xgrad, dt_graph_grad(g, x), (size_t)(n->n * n->c) * sizeof(float));
    size_t pos = 0;
    for (int i = 0; i < bnet_np(n); i++) {
        memcpy(grads + pos, n->p[i].grad.data, (size_t)n->p[i].grad.numel * sizeof(float));
        pos += (size_t)n->p[i].grad.numel;
    }
    assert_true(pos == ng);
    dt_graph_free(g);
}

static void test_ctx_input_gradient_outlives_replay(void **state) {
    (void)state;
    bnet n;
    bnet_init(&n, 2, 6, 8);
    size_t nx = (size_t)(n.n * n.c), ng = 2 * (2 * 8 + 8 * 8 + 8);
    float *xg[2] = {malloc(nx * sizeof(float)), malloc(nx * sizeof(float))};
    float *pg[2] = {malloc(ng * sizeof(float)), malloc(ng * sizeof(float))};
    for (int ck = 0; ck < 2; ck++) branch_run(&n, ck, xg[ck], pg[ck], ng);
    assert_memory_equal(xg[1], xg[0], nx * sizeof(float));
    assert_memory_equal(pg[1], pg[0], ng * sizeof(float));
    for (int k = 0; k < 2; k++) { free(xg[k]); free(pg[k]); }
    bnet_free(&n);
}

/* dt_graph_recomputing: 0 in the first pass and outside, 1 in the replay. */
static void test_recomputing_flag(void **state) {
    (void)state;
    bnet n;
    bnet_init(&n, 1, 4, 8);
    dt_graph *g = dt_graph_create();
    dt_rng_seed(&n.rng, 9);
    dt_tensor *x = dt_graph_input(g, 2, (int64_t[]){n.n, n.c}, n.x, 1);
    blk_ctx c = {.net = &n, .b = 0};
    assert_int_equal(dt_graph_recomputing(g), 0);
    dt_tensor *loss = dt_op_cross_entropy(g, dt_graph_checkpoint(g, block, x, &c, &n.rng), n.y);
    assert_int_equal(dt_graph_backward(g, loss), DT_OK);
    assert_int_equal(c.calls, 2);
    assert_int_equal(c.recomputing[0], 0);
    assert_int_equal(c.recomputing[1], 1);
    assert_int_equal(dt_graph_recomputing(g), 0);
    dt_graph_free(g);
    bnet_free(&n);
}

/* x a frozen parameter's value (requires_grad on the tensor, not on the
 * parameter: no gradient storage is asked for): the replay still runs and
 * the block's parameters get their gradients and grad-ready calls. */
static void test_frozen_param_input_still_replays(void **state) {
    (void)state;
    bnet n;
    bnet_init(&n, 1, 4, 8);
    dt_param X;
    assert_int_equal(dt_param_init(&X, "X", 2, (int64_t[]){4, 8}), DT_OK);
    dt_gc_fill(&X, 3, 1.f);
    X.requires_grad = 0;   /* X.value.requires_grad stays 1 */
    float *want = malloc(4 * sizeof(float));
    for (int ck = 0; ck < 2; ck++) {
        run_out *o = calloc(1, sizeof *o);
        cur = o;
        bnet_zero_grad(&n);
        for (int i = 0; i < 4; i++) n.p[i].on_grad_ready = on_ready;
        dt_rng_seed(&n.rng, 4);
        dt_graph *g = dt_graph_create();
        blk_ctx c = {.net = &n, .b = 0};
        dt_tensor *y = ck ? dt_graph_checkpoint(g, block, &X.value, &c, &n.rng) : block(g, &X.value, &c);
        assert_int_equal(dt_graph_backward(g, dt_op_cross_entropy(g, y, n.y)), DT_OK);
        assert_int_equal(c.calls, ck ? 2 : 1);
        assert_int_equal(o->n_ready, 4);
        for (int k = 0; k < 4; k++) {
            if (!ck) want[k] = dt_f32(&n.p[k].grad)[1];
            else assert_true(dt_f32(&n.p[k].grad)[1] == want[k]);
        }
        dt_graph_free(g);
        cur = NULL;
        free(o);
    }
    free(want);
    dt_param_free(&X);
    bnet_free(&n);
}

/* A checkpoint around parameter-free ops on a fresh graph (no parameter use
 * listed yet, as under --freeze): x's gradient is the plain run's. */
static dt_tensor *relu_fn(dt_graph *g, dt_tensor *x, void *ctx) { (void)ctx; return dt_op_relu(g, x); }

static void test_parameter_free_checkpoint(void **state) {
    (void)state;
    float xd[8] = {1, -2, 3, -4, 5, -6, 7, -8}, up[8] = {1, 2, 3, 4, 5, 6, 7, 8}, want[8];
    for (int ck = 0; ck < 2; ck++) {
        dt_graph *g = dt_graph_create();
        dt_tensor *x = dt_graph_input(g, 2, (int64_t[]){2, 4}, xd, 1);
        dt_tensor *y = ck ? dt_graph_checkpoint(g, relu_fn, x, NULL, NULL) : relu_fn(g, x, NULL);
        assert_non_null(y);
        assert_int_equal(dt_graph_backward_from(g, y, up), DT_OK);
        const float *gx = dt_graph_grad(g, x);
        assert_non_null(gx);
        if (!ck) memcpy(want, gx, sizeof want);
        else assert_memory_equal(gx, want, sizeof want);
        dt_graph_free(g);
    }
}

/* fn uses W but returns a tensor computed with grad disabled: the output
 * needs no gradient, yet W's use is counted; backward must release it, so
 * W's grad-ready fires once, as in the plain run. */
static int w_ready;
static dt_status count_ready(dt_param *p, void *user) { (void)p; (void)user; w_ready++; return DT_OK; }

static dt_tensor *used_w_const_out(dt_graph *g, dt_tensor *x, void *ctx) {
    dt_param *W = ctx;
    if (!dt_op_linear(g, x, &W->value, NULL, DT_W_OUT_IN)) return NULL;
    int prev = dt_graph_set_grad_enabled(g, 0);
    dt_tensor *y = dt_op_relu(g, x);
    dt_graph_set_grad_enabled(g, prev);
    return y;
}

static void test_no_grad_output_releases_uses(void **state) {
    (void)state;
    dt_param W;
    assert_int_equal(dt_param_init(&W, "W", 2, (int64_t[]){4, 4}), DT_OK);
    dt_gc_fill(&W, 5, 0.5f);
    W.on_grad_ready = count_ready;
    float xd[8] = {1, -2, 3, -4, 5, -6, 7, -8}, up[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    for (int ck = 0; ck < 2; ck++) {
        dt_graph *g = dt_graph_create();
        w_ready = 0;
        dt_tensor *x = dt_graph_input(g, 2, (int64_t[]){2, 4}, xd, 1);
        dt_tensor *y = ck ? dt_graph_checkpoint(g, used_w_const_out, x, &W, NULL) : used_w_const_out(g, x, &W);
        assert_non_null(y);
        assert_false(y->requires_grad);
        assert_int_equal(dt_graph_param_uses(g, &W), 1);
        assert_int_equal(dt_graph_backward_from(g, dt_op_add(g, dt_op_relu(g, x), y), up), DT_OK);
        assert_int_equal(w_ready, 1);
        dt_graph_free(g);
    }
    dt_param_free(&W);
}

/* A region (inside a module, so pack16 records its markers) that returns a
 * parameter's value unchanged: z = relu(P) + relu(x). The checkpoint and the
 * pack16 region count P's use, so P's gradient, its use count, has_grad and
 * grad-ready are the plain run's; a frozen P (its value still requires grad)
 * takes no gradient and backward succeeds. */
typedef struct param_out_ctx { dt_module *m; dt_param *P; } param_out_ctx;

static dt_tensor *param_out(dt_graph *g, dt_tensor *x, void *vctx) {
    (void)x;
    param_out_ctx *c = vctx;
    if (dt_module_enter(g, c->m) != DT_OK || dt_module_leave(g, c->m) != DT_OK) return NULL;
    return &c->P->value;
}

static void test_param_value_output(void **state) {
    (void)state;
    dt_param P;
    assert_int_equal(dt_param_init(&P, "P", 2, (int64_t[]){2, 4}), DT_OK);
    dt_gc_fill(&P, 9, 1.f);
    P.on_grad_ready = count_ready;
    dt_module m = {.name = "m"};
    param_out_ctx c = {&m, &P};
    float xd[8] = {1, -2, 3, -4, 5, -6, 7, -8}, up[8] = {1, 2, 3, 4, 5, 6, 7, 8}, want[8];
    for (int frozen = 0; frozen < 2; frozen++) {
        P.requires_grad = !frozen;
        for (int mode = 0; mode < 3; mode++) {   /* plain, checkpoint, pack16 */
            memset(P.grad.data, 0, sizeof want);
            P.has_grad = 0;
            w_ready = 0;
            dt_graph *g = dt_graph_create();
            dt_tensor *x = dt_graph_input(g, 2, (int64_t[]){2, 4}, xd, 1);
            dt_tensor *y = mode == 0 ? param_out(g, NULL, &c)
                         : mode == 1 ? dt_graph_checkpoint(g, param_out, NULL, &c, NULL)
                                     : dt_graph_pack16(g, param_out, NULL, &c, DT_BF16);
            assert_non_null(y);
            assert_int_equal(dt_graph_backward_from(g, dt_op_add(g, dt_op_relu(g, y), dt_op_relu(g, x)), up), DT_OK);
            assert_int_equal(dt_graph_param_uses(g, &P), !frozen);
            assert_int_equal(P.has_grad, !frozen);
            assert_int_equal(w_ready, !frozen);
            if (mode == 0) memcpy(want, P.grad.data, sizeof want);
            else assert_memory_equal(P.grad.data, want, sizeof want);
            dt_graph_free(g);
        }
    }
    dt_param_free(&P);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_checkpoint_bitwise_as_plain),
        cmocka_unit_test(test_recompute_hooks),
        cmocka_unit_test(test_checkpoint_lowers_high_water),
        cmocka_unit_test(test_checkpoint_errors),
        cmocka_unit_test(test_no_grad_just_runs),
        cmocka_unit_test(test_unreached_checkpoint_releases_uses),
        cmocka_unit_test(test_ctx_input_gradient_outlives_replay),
        cmocka_unit_test(test_recomputing_flag),
        cmocka_unit_test(test_frozen_param_input_still_replays),
        cmocka_unit_test(test_parameter_free_checkpoint),
        cmocka_unit_test(test_no_grad_output_releases_uses),
        cmocka_unit_test(test_param_value_output),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
