/* The split backward (dt_graph_defer_weights / dt_graph_backward_weights).
 *
 * Three micro-batches on three graphs share the parameters. Deferring weight
 * gradients to W and running the W passes in the order of the B passes gives
 * gradients bitwise equal to plain backward of the graphs in turn, for any
 * interleaving; after every step the test checks that B moved exactly the
 * gradients it should (not the deferred ones) and W exactly the deferred
 * ones, so a deferral that did nothing would fail. Nets: a GPT-2-like stack
 * with a tied embedding (reshape view, in-place cross-entropy), a CNN with
 * (Sync)BatchNorm, and one with a checkpointed block, whose parameters are
 * computed in B. Also: grad-ready timing, error states, queue counts, and
 * the in-place guard that keeps an input W will read. */
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

enum { NM = 3 };   /* micro-batches = graphs */

/* ---- predicates ---- */
static int defer_all(const dt_param *p, void *user) { (void)p; (void)user; return 1; }
typedef struct pset { dt_param *p[8]; int n; } pset;
static int defer_in_set(const dt_param *p, void *user) {
    const pset *s = user;
    for (int i = 0; i < s->n; i++) if (s->p[i] == p) return 1;
    return 0;
}

/* ---- a model: parameters and the loss of micro-batch k ---- */
typedef dt_tensor *(*loss_fn)(dt_graph *g, void *net, int k);
typedef struct model { dt_param *p; int np; loss_fn loss; void *net; } model;

static void init_params(dt_param *p, int np, const char *const *names, const int64_t (*shapes)[4], const int *nd) {
    for (int i = 0; i < np; i++) {
        assert_int_equal(dt_param_init(&p[i], names[i], nd[i], shapes[i]), DT_OK);
        dt_gc_fill(&p[i], 40 + (uint64_t)i, 0.5f);
    }
}
static void zero_grads(const model *m) {
    for (int i = 0; i < m->np; i++) memset(m->p[i].grad.data, 0, (size_t)m->p[i].grad.numel * sizeof(float));
}
static size_t grads_len(const model *m) {
    size_t n = 0;
    for (int i = 0; i < m->np; i++) n += (size_t)m->p[i].grad.numel;
    return n;
}
static float *grads_copy(const model *m) {
    float *out = malloc(grads_len(m) * sizeof *out), *o = out;
    for (int i = 0; i < m->np; i++) {
        memcpy(o, m->p[i].grad.data, (size_t)m->p[i].grad.numel * sizeof(float));
        o += m->p[i].grad.numel;
    }
    return out;
}
static int grad_changed(const dt_param *p, const float *before) {
    return memcmp(p->grad.data, before, (size_t)p->grad.numel * sizeof(float)) != 0;
}

/* Forward micro-batches 0..NM-1 on graphs g0..g2 (pred/user: deferral, NULL
 * = plain), then run sched ("B0 B1 W0 ...": backward or weight pass of graph
 * k). After each step every parameter's gradient must have changed iff it
 * belongs to the step: B moves those with in_w[i] = 0, W those with 1.
 * Returns the gradients (malloc'd, zeroed before the run). */
static float *run_schedule(const model *m, const char *sched, dt_defer_fn pred, void *user, const int *in_w) {
    zero_grads(m);
    dt_graph *g[NM];
    dt_tensor *loss[NM];
    for (int k = 0; k < NM; k++) {
        g[k] = dt_graph_create();
        dt_graph_defer_weights(g[k], pred, user);
        loss[k] = m->loss(g[k], m->net, k);
        assert_non_null(loss[k]);
    }
    for (const char *c = sched; *c; c++) {
        if (*c != 'B' && *c != 'W') continue;
        int k = c[1] - '0', w = *c == 'W';
        assert_true(k >= 0 && k < NM);
        float *before = grads_copy(m), *b = before;
        assert_int_equal(w ? dt_graph_backward_weights(g[k]) : dt_graph_backward(g[k], loss[k]), DT_OK);
        for (int i = 0; i < m->np; i++) {
            int expect = w ? in_w[i] : !in_w[i];
            if (grad_changed(&m->p[i], b) != expect)
                fail_msg("%s: step %.2s %s %s's gradient", sched, c, expect ? "did not change" : "changed",
                         m->p[i].name);
            b += m->p[i].grad.numel;
        }
        free(before);
    }
    for (int k = 0; k < NM; k++) {
        assert_int_equal(dt_graph_deferred_nodes(g[k]), 0);
        dt_graph_free(g[k]);
    }
    return grads_copy(m);
}

static void expect_bitwise(const model *m, const float *a, const float *b, const char *what) {
    const float *pa = a, *pb = b;
    for (int i = 0; i < m->np; i++) {
        size_t n = (size_t)m->p[i].grad.numel;
        if (memcmp(pa, pb, n * sizeof(float)) != 0) fail_msg("%s: %s's gradient differs", what, m->p[i].name);
        pa += n;
        pb += n;
    }
}

/* ---- GPT-2-like: embedding(wte) + embedding(wpe) -> layernorm -> linear ->
 * gelu -> linear -> reshape -> linear(wte, tied) -> cross-entropy ---- */
enum { V = 23, C = 8, T = 6, BS = 3, NTOK = BS * T };
enum { WTE, WPE, LNW, LNB, W1, B1, W2, B2, GP };
static const char *const gpt_names[GP] = {"wte", "wpe", "ln.w", "ln.b", "fc.w", "fc.b", "proj.w", "proj.b"};
typedef struct gpt {
    dt_param p[GP];
    int consume;                   /* dt_op_cross_entropy_consume */
    int32_t ids[NM][NTOK], tgt[NM][NTOK], pos[NTOK];
    dt_tensor *logits[NM];
} gpt;

static void gpt_init(gpt *m, int consume) {
    memset(m, 0, sizeof *m);
    static const int64_t shapes[GP][4] = {{V, C}, {T, C}, {C}, {C}, {4 * C, C}, {4 * C}, {C, 4 * C}, {C}};
    static const int nd[GP] = {2, 2, 1, 1, 2, 1, 2, 1};
    init_params(m->p, GP, gpt_names, shapes, nd);
    m->consume = consume;
    for (int k = 0; k < NM; k++)
        for (int i = 0; i < NTOK; i++) {
            m->ids[k][i] = (int32_t)((i * 7 + k * 5) % 11);   /* ids repeat; 11 .. V-1 never looked up */
            m->tgt[k][i] = i == 4 ? -1 : (int32_t)((i * 5 + k) % V);
        }
    for (int i = 0; i < NTOK; i++) m->pos[i] = i % T;
}
static void gpt_free(gpt *m) { for (int i = 0; i < GP; i++) dt_param_free(&m->p[i]); }

static dt_tensor *gpt_loss(dt_graph *g, void *net, int k) {
    gpt *m = net;
    int64_t s3[3] = {BS, T, C}, s2[2] = {NTOK, C};
    dt_tensor *h = dt_op_embedding(g, &m->p[WTE].value, m->ids[k], NTOK, 3, s3);
    h = dt_op_add(g, h, dt_op_embedding(g, &m->p[WPE].value, m->pos, NTOK, 3, s3));
    h = dt_op_layernorm(g, h, &m->p[LNW].value, &m->p[LNB].value, 1e-5f);
    h = dt_op_gelu(g, dt_op_linear(g, h, &m->p[W1].value, &m->p[B1].value, DT_W_OUT_IN));
    h = dt_op_linear(g, h, &m->p[W2].value, &m->p[B2].value, DT_W_OUT_IN);
    h = dt_op_reshape(g, h, 2, s2);
    h = m->logits[k] = dt_op_linear(g, h, &m->p[WTE].value, NULL, DT_W_OUT_IN);
    assert_non_null(h);
    return m->consume ? dt_op_cross_entropy_consume(g, h, m->tgt[k]) : dt_op_cross_entropy(g, h, m->tgt[k]);
}
static model gpt_model(gpt *m) { return (model){m->p, GP, gpt_loss, m}; }

static void test_gpt_schedules_bitwise(void **state) {
    (void)state;
    static const int none[GP] = {0}, all[GP] = {1, 1, 1, 1, 1, 1, 1, 1}, wte_only[GP] = {[WTE] = 1};
    const struct { const char *sched; int only_wte; const int *in_w; } cases[] = {
        {"B0 B1 B2 W0 W1 W2", 0, all},
        {"B0 W0 B1 B2 W1 W2", 0, all},
        {"B0 B1 W0 B2 W1 W2", 0, all},
        {"B0 B1 B2 W0 W1 W2", 1, wte_only},
        {"B0 W0 B1 W1 B2 W2", 1, wte_only},
    };
    for (int consume = 0; consume < 2; consume++) {
        gpt m;
        gpt_init(&m, consume);
        model md = gpt_model(&m);
        float *plain = run_schedule(&md, "B0 B1 B2", NULL, NULL, none);
        pset wte = {{&m.p[WTE]}, 1};
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            float *got = cases[c].only_wte ? run_schedule(&md, cases[c].sched, defer_in_set, &wte, cases[c].in_w)
                                           : run_schedule(&md, cases[c].sched, defer_all, NULL, cases[c].in_w);
            char what[96];
            snprintf(what, sizeof what, "%s%s%s", consume ? "consume " : "", cases[c].only_wte ? "wte " : "all ",
                     cases[c].sched);
            expect_bitwise(&md, plain, got, what);
            free(got);
        }
        free(plain);
        gpt_free(&m);
    }
}

/* The in-place cross-entropy still writes d(logits) over the logits with the
 * head's weight gradient deferred (the guard does not fire: W reads the
 * logits' gradient, which is that storage, and the head's input). */
static void test_gpt_in_place_kept(void **state) {
    (void)state;
    gpt m;
    gpt_init(&m, 1);
    dt_graph *g = dt_graph_create();
    dt_graph_defer_weights(g, defer_all, NULL);
    dt_tensor *loss = gpt_loss(g, &m, 0);
    dt_tensor *lg = m.logits[0];
    float *before = malloc((size_t)lg->numel * sizeof *before);
    memcpy(before, lg->data, (size_t)lg->numel * sizeof *before);
    assert_int_equal(dt_graph_backward(g, loss), DT_OK);
    assert_ptr_equal(lg->grad->data, lg->data);   /* in place */
    assert_true(memcmp(before, lg->data, (size_t)lg->numel * sizeof *before) != 0);
    assert_int_equal(dt_graph_backward_weights(g), DT_OK);
    free(before);
    dt_graph_free(g);
    gpt_free(&m);
}

/* ---- CNN: conv2d -> batchnorm -> relu -> maxpool -> flatten -> linear ---- */
enum { CN = 4, CC = 2, CH = 6, OC = 3, NCLS = 5 };
enum { CW, CB, BNG, BNB, FW, FB, CNP };
static const char *const cnn_names[CNP] = {"conv.w", "conv.b", "bn.g", "bn.b", "fc.w", "fc.b"};
typedef struct cnn {
    dt_param p[CNP];
    float x[NM][CN * CC * CH * CH];
    int32_t y[NM][CN];
    int use_sync, sync_calls;
} cnn;

static dt_status count_sync(float *data, int64_t n, double *count, void *user) {
    (void)data; (void)n; (void)count;   /* one rank: the sum over ranks is the local sum */
    ((cnn *)user)->sync_calls++;
    return DT_OK;
}

static void cnn_init(cnn *m, int use_sync) {
    memset(m, 0, sizeof *m);
    static const int64_t shapes[CNP][4] = {{OC, CC, 3, 3}, {OC}, {OC}, {OC}, {NCLS, OC * 3 * 3}, {NCLS}};
    static const int nd[CNP] = {4, 1, 1, 1, 2, 1};
    init_params(m->p, CNP, cnn_names, shapes, nd);
    m->use_sync = use_sync;
    for (int k = 0; k < NM; k++) {
        for (int i = 0; i < CN * CC * CH * CH; i++) m->x[k][i] = (float)sin(0.31 * i + 1.7 * k);
        for (int i = 0; i < CN; i++) m->y[k][i] = (int32_t)((3 * i + k) % NCLS);
    }
}
static void cnn_free(cnn *m) { for (int i = 0; i < CNP; i++) dt_param_free(&m->p[i]); }

static dt_tensor *cnn_loss(dt_graph *g, void *net, int k) {
    cnn *m = net;
    dt_bn_sync sync = {count_sync, m};
    dt_tensor *h = dt_graph_input(g, 4, (int64_t[]){CN, CC, CH, CH}, m->x[k], 0);
    h = dt_op_conv2d(g, h, &m->p[CW].value, &m->p[CB].value, 1, 1);
    h = dt_op_batchnorm(g, h, &m->p[BNG].value, &m->p[BNB].value, NULL, NULL, 0.1f, 1e-5f, m->use_sync ? &sync : NULL);
    h = dt_op_flatten(g, dt_op_maxpool2d(g, dt_op_relu(g, h), 2, 2));
    h = dt_op_linear(g, h, &m->p[FW].value, &m->p[FB].value, DT_W_OUT_IN);
    assert_non_null(h);
    return dt_op_cross_entropy(g, h, m->y[k]);
}

static void test_cnn_defer_all_bitwise(void **state) {
    (void)state;
    static const int none[CNP] = {0}, all[CNP] = {1, 1, 1, 1, 1, 1};
    for (int use_sync = 0; use_sync < 2; use_sync++) {
        cnn m;
        cnn_init(&m, use_sync);
        model md = {m.p, CNP, cnn_loss, &m};
        float *plain = run_schedule(&md, "B0 B1 B2", NULL, NULL, none);
        int plain_calls = m.sync_calls;
        m.sync_calls = 0;
        float *got = run_schedule(&md, "B0 B1 B2 W0 W1 W2", defer_all, NULL, all);
        expect_bitwise(&md, plain, got, use_sync ? "cnn, SyncBN" : "cnn");
        /* SyncBN: two exchanges per forward (sum x, then sum (x - mean)^2) and one per
         * backward (for dx), deferred or not */
        assert_int_equal(plain_calls, use_sync ? 3 * NM : 0);
        assert_int_equal(m.sync_calls, plain_calls);
        free(plain);
        free(got);
        /* ... and the W pass communicates nothing */
        dt_graph *g = dt_graph_create();
        dt_graph_defer_weights(g, defer_all, NULL);
        assert_int_equal(dt_graph_backward(g, cnn_loss(g, &m, 0)), DT_OK);
        int after_b = m.sync_calls;
        assert_int_equal(dt_graph_backward_weights(g), DT_OK);
        assert_int_equal(m.sync_calls, after_b);
        dt_graph_free(g);
        cnn_free(&m);
    }
}

/* ---- grad-ready on a final graph ---- */
typedef struct probe {
    int in_w, n;
    const char *name[16];
    int fired_in_w[16];
    float *grad_at_fire[16];
} probe;
static dt_status on_ready(dt_param *p, void *user) {
    probe *pr = user;
    assert_true(pr->n < 16);
    pr->name[pr->n] = p->name;
    pr->fired_in_w[pr->n] = pr->in_w;
    pr->grad_at_fire[pr->n] = malloc((size_t)p->grad.numel * sizeof(float));
    memcpy(pr->grad_at_fire[pr->n], p->grad.data, (size_t)p->grad.numel * sizeof(float));
    pr->n++;
    return DT_OK;
}

static void test_grad_ready_timing(void **state) {
    (void)state;
    gpt m;
    gpt_init(&m, 0);
    probe pr = {0};
    for (int i = 0; i < GP; i++) { m.p[i].on_grad_ready = on_ready; m.p[i].on_grad_ready_user = &pr; }
    pset defer = {{&m.p[WTE], &m.p[W2]}, 2};
    dt_graph *g = dt_graph_create();
    dt_graph_defer_weights(g, defer_in_set, &defer);
    assert_int_equal(dt_graph_backward(g, gpt_loss(g, &m, 0)), DT_OK);
    pr.in_w = 1;
    assert_int_equal(dt_graph_backward_weights(g), DT_OK);
    /* B walks the tape backwards: the head (wte deferred), proj (w deferred,
     * b released), fc, layernorm, wpe's embedding, wte's embedding (deferred).
     * W replays the deferred nodes in that order: the head's wte use (one of
     * two), proj.w, then wte's last use. */
    static const char *const order[GP] = {"proj.b", "fc.w", "fc.b", "ln.w", "ln.b", "wpe", "proj.w", "wte"};
    static const int in_w[GP] = {0, 0, 0, 0, 0, 0, 1, 1};
    assert_int_equal(pr.n, GP);   /* each parameter exactly once */
    for (int i = 0; i < GP; i++) {
        assert_string_equal(pr.name[i], order[i]);
        assert_int_equal(pr.fired_in_w[i], in_w[i]);
        const dt_param *p = NULL;
        for (int j = 0; j < GP; j++) if (!strcmp(m.p[j].name, order[i])) p = &m.p[j];
        /* the hook saw the parameter's complete gradient */
        assert_memory_equal(pr.grad_at_fire[i], p->grad.data, (size_t)p->grad.numel * sizeof(float));
        free(pr.grad_at_fire[i]);
    }
    /* a non-final graph fires nothing, in B or W */
    pr.n = 0;
    dt_graph_reset(g);
    dt_graph_set_final(g, 0);
    assert_int_equal(dt_graph_backward(g, gpt_loss(g, &m, 1)), DT_OK);
    assert_int_equal(dt_graph_backward_weights(g), DT_OK);
    assert_int_equal(pr.n, 0);
    dt_graph_free(g);
    gpt_free(&m);
}

/* ---- a checkpointed block between deferred layers:
 * linear(A) -> checkpoint[layernorm -> linear(Wb) -> gelu] -> linear(Z) -> CE ---- */
enum { KR = 5, KI = 6, KC = 7, KO = 4 };
enum { KA, KAB, KLW, KLB, KW, KWB, KZ, KZB, KNP };
static const char *const knet_names[KNP] = {"A", "A.b", "blk.ln.w", "blk.ln.b", "blk.w", "blk.b", "Z", "Z.b"};
typedef struct knet {
    dt_param p[KNP];
    float x[NM][KR * KI];
    int32_t y[NM][KR];
    int calls, fail_on;   /* fail_on > 0: the block's fail_on-th call fails */
} knet;

static void knet_init(knet *m) {
    memset(m, 0, sizeof *m);
    static const int64_t shapes[KNP][4] = {{KC, KI}, {KC}, {KC}, {KC}, {KC, KC}, {KC}, {KO, KC}, {KO}};
    static const int nd[KNP] = {2, 1, 1, 1, 2, 1, 2, 1};
    init_params(m->p, KNP, knet_names, shapes, nd);
    for (int k = 0; k < NM; k++) {
        for (int i = 0; i < KR * KI; i++) m->x[k][i] = (float)cos(0.43 * i + 0.9 * k);
        for (int i = 0; i < KR; i++) m->y[k][i] = (int32_t)((i + 2 * k) % KO);
    }
}
static void knet_free(knet *m) { for (int i = 0; i < KNP; i++) dt_param_free(&m->p[i]); }

static dt_tensor *knet_block(dt_graph *g, dt_tensor *x, void *ctx) {
    knet *m = ctx;
    if (++m->calls == m->fail_on) {
        DT_ERR(DT_EINVAL, "block: planned failure");
        return NULL;
    }
    dt_tensor *h = dt_op_layernorm(g, x, &m->p[KLW].value, &m->p[KLB].value, 1e-5f);
    return dt_op_gelu(g, dt_op_linear(g, h, &m->p[KW].value, &m->p[KWB].value, DT_W_OUT_IN));
}

static dt_tensor *knet_loss(dt_graph *g, void *net, int k) {
    knet *m = net;
    dt_tensor *h = dt_graph_input(g, 2, (int64_t[]){KR, KI}, m->x[k], 0);
    h = dt_op_linear(g, h, &m->p[KA].value, &m->p[KAB].value, DT_W_OUT_IN);
    h = dt_graph_checkpoint(g, knet_block, h, m, NULL);
    h = dt_op_linear(g, h, &m->p[KZ].value, &m->p[KZB].value, DT_W_OUT_IN);
    assert_non_null(h);
    return dt_op_cross_entropy(g, h, m->y[k]);
}

static void test_checkpoint_weights_in_b(void **state) {
    (void)state;
    knet m;
    knet_init(&m);
    model md = {m.p, KNP, knet_loss, &m};
    static const int none[KNP] = {0}, outside[KNP] = {[KA] = 1, [KAB] = 1, [KZ] = 1, [KZB] = 1};
    float *plain = run_schedule(&md, "B0 B1 B2", NULL, NULL, none);
    m.calls = 0;
    /* pred says defer everything; the block's parameters still move in B */
    float *got = run_schedule(&md, "B0 B1 B2 W0 W1 W2", defer_all, NULL, outside);
    assert_int_equal(m.calls, 2 * NM);   /* first pass + replay per graph */
    expect_bitwise(&md, plain, got, "checkpoint");
    free(got);
    got = run_schedule(&md, "B0 W0 B1 B2 W1 W2", defer_all, NULL, outside);
    expect_bitwise(&md, plain, got, "checkpoint, interleaved");
    free(got);
    free(plain);
    knet_free(&m);
}

/* ---- error states ---- */
static void expect_estate(dt_status s, const char *words) {
    assert_int_equal(s, DT_ESTATE);
    if (!strstr(dt_error_message(), words)) fail_msg("message '%s' lacks '%s'", dt_error_message(), words);
}

static void test_errors(void **state) {
    (void)state;
    knet m;
    knet_init(&m);
    dt_graph *g = dt_graph_create();
    expect_estate(dt_graph_backward_weights(g), "has not run");          /* fresh graph */
    dt_tensor *loss = knet_loss(g, &m, 0);
    expect_estate(dt_graph_backward_weights(g), "has not run");          /* forward only */
    assert_int_equal(dt_graph_backward(g, loss), DT_OK);                 /* nothing deferred */
    assert_int_equal(dt_graph_deferred_nodes(g), 0);
    assert_int_equal(dt_graph_backward_weights(g), DT_OK);               /* a no-op */
    expect_estate(dt_graph_backward_weights(g), "twice");
    dt_graph_reset(g);
    dt_graph_defer_weights(g, defer_all, NULL);
    assert_int_equal(dt_graph_backward(g, knet_loss(g, &m, 1)), DT_OK);
    assert_int_equal(dt_graph_backward_weights(g), DT_OK);
    expect_estate(dt_graph_backward_weights(g), "twice");
    /* a failed backward leaves nothing to do */
    dt_graph_reset(g);
    m.calls = 0;
    m.fail_on = 2;   /* the replay */
    assert_int_not_equal(dt_graph_backward(g, knet_loss(g, &m, 2)), DT_OK);
    assert_int_equal(dt_graph_deferred_nodes(g), 0);
    expect_estate(dt_graph_backward_weights(g), "failed");
    assert_int_equal(dt_graph_backward_weights(NULL), DT_EINVAL);
    dt_graph_free(g);
    knet_free(&m);
}

/* ---- queue counts; reset drops pending work ---- */
static int gpt_deferred(gpt *m, dt_defer_fn pred, void *user) {
    dt_graph *g = dt_graph_create();
    dt_graph_defer_weights(g, pred, user);
    assert_int_equal(dt_graph_deferred_nodes(g), 0);
    assert_int_equal(dt_graph_backward(g, gpt_loss(g, m, 0)), DT_OK);
    int n = dt_graph_deferred_nodes(g);
    assert_int_equal(dt_graph_backward_weights(g), DT_OK);
    assert_int_equal(dt_graph_deferred_nodes(g), 0);
    dt_graph_free(g);
    return n;
}

static void test_deferred_nodes(void **state) {
    (void)state;
    gpt m;
    gpt_init(&m, 0);
    pset wte = {{&m.p[WTE]}, 1}, none = {{NULL}, 0};
    /* nodes with a parameter input: 2 embeddings, layernorm, 3 linears */
    assert_int_equal(gpt_deferred(&m, defer_all, NULL), 6);
    assert_int_equal(gpt_deferred(&m, defer_in_set, &wte), 2);   /* wte's embedding and the head */
    assert_int_equal(gpt_deferred(&m, defer_in_set, &none), 0);
    assert_int_equal(gpt_deferred(&m, NULL, NULL), 0);
    m.p[WTE].requires_grad = 0;   /* frozen: never deferred */
    assert_int_equal(gpt_deferred(&m, defer_all, NULL), 4);
    m.p[WTE].requires_grad = 1;

    /* the checkpoint node is not deferred, nor anything in its replay */
    knet k;
    knet_init(&k);
    dt_graph *g = dt_graph_create();
    dt_graph_defer_weights(g, defer_all, NULL);
    assert_int_equal(dt_graph_backward(g, knet_loss(g, &k, 0)), DT_OK);
    assert_int_equal(dt_graph_deferred_nodes(g), 2);
    /* reset drops the W work: A and Z never get their gradients */
    dt_graph_reset(g);
    assert_int_equal(dt_graph_deferred_nodes(g), 0);
    expect_estate(dt_graph_backward_weights(g), "has not run");
    for (int i = 0; i < (int)(k.p[KA].grad.numel); i++) assert_true(dt_f32(&k.p[KA].grad)[i] == 0.0f);
    /* the predicate is kept across the reset */
    assert_int_equal(dt_graph_backward(g, knet_loss(g, &k, 1)), DT_OK);
    assert_int_equal(dt_graph_deferred_nodes(g), 2);
    dt_graph_free(g);
    knet_free(&k);
    gpt_free(&m);
}

/* ---- the in-place guard ----
 * h = linear(x, A); loss1 = CE_consume(reshape(h)) recorded before
 * z = linear(h, Z); loss = loss1 + CE(z). B reaches linear(Z) first (its dW
 * deferred: W reads h), then the in-place cross-entropy would write d(logits)
 * over reshape(h)'s storage = h's. Plain backward does exactly that (Z's dW
 * has read h by then); with Z deferred the cross-entropy must accumulate
 * instead, and the gradients stay bitwise plain's. */
enum { GR = 4, GI = 5, GH = 6, GZ = 3 };
enum { GA, GZW, GNP };
typedef struct gnet {
    dt_param p[GNP];
    float x[NM][GR * GI];
    int32_t t1[NM][2 * GR], t2[NM][GR];
    dt_tensor *h[NM];
} gnet;

static dt_tensor *gnet_loss(dt_graph *g, void *net, int k) {
    gnet *m = net;
    dt_tensor *x = dt_graph_input(g, 2, (int64_t[]){GR, GI}, m->x[k], 0);
    dt_tensor *h = m->h[k] = dt_op_linear(g, x, &m->p[GA].value, NULL, DT_W_OUT_IN);
    dt_tensor *l1 = dt_op_cross_entropy_consume(g, dt_op_reshape(g, h, 2, (int64_t[]){2 * GR, GH / 2}), m->t1[k]);
    dt_tensor *l2 = dt_op_cross_entropy(g, dt_op_linear(g, h, &m->p[GZW].value, NULL, DT_W_OUT_IN), m->t2[k]);
    assert_non_null(l1);
    assert_non_null(l2);
    return dt_op_add(g, l1, l2);
}

static void test_in_place_guard(void **state) {
    (void)state;
    gnet m;
    memset(&m, 0, sizeof m);
    static const char *const names[GNP] = {"A", "Z"};
    static const int64_t shapes[GNP][4] = {{GH, GI}, {GZ, GH}};
    static const int nd[GNP] = {2, 2};
    init_params(m.p, GNP, names, shapes, nd);
    for (int k = 0; k < NM; k++) {
        for (int i = 0; i < GR * GI; i++) m.x[k][i] = (float)sin(0.7 * i - 0.3 * k);
        for (int i = 0; i < 2 * GR; i++) m.t1[k][i] = (int32_t)((i + k) % (GH / 2));
        for (int i = 0; i < GR; i++) m.t2[k][i] = (int32_t)((2 * i + k) % GZ);
    }
    model md = {m.p, GNP, gnet_loss, &m};
    static const int none[GNP] = {0}, z_only[GNP] = {[GZW] = 1};
    float *plain = run_schedule(&md, "B0 B1 B2", NULL, NULL, none);
    pset z = {{&m.p[GZW]}, 1};
    float *got = run_schedule(&md, "B0 B1 B2 W0 W1 W2", defer_in_set, &z, z_only);
    expect_bitwise(&md, plain, got, "in-place guard");
    free(plain);
    free(got);

    /* the hazard is real: plain backward overwrites h; deferred B keeps it */
    for (int defer = 0; defer < 2; defer++) {
        dt_graph *g = dt_graph_create();
        if (defer) dt_graph_defer_weights(g, defer_in_set, &z);
        dt_tensor *loss = gnet_loss(g, &m, 0);
        float h[GR * GH];
        memcpy(h, m.h[0]->data, sizeof h);
        assert_int_equal(dt_graph_backward(g, loss), DT_OK);
        assert_int_equal(memcmp(h, m.h[0]->data, sizeof h) != 0, !defer);
        assert_int_equal(dt_graph_backward_weights(g), DT_OK);
        dt_graph_free(g);
    }
    for (int i = 0; i < GNP; i++) dt_param_free(&m.p[i]);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpt_schedules_bitwise),
        cmocka_unit_test(test_gpt_in_place_kept),
        cmocka_unit_test(test_cnn_defer_all_bitwise),
        cmocka_unit_test(test_grad_ready_timing),
        cmocka_unit_test(test_checkpoint_weights_in_b),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_deferred_nodes),
        cmocka_unit_test(test_in_place_guard),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
