/* Sequence parallelism's ops (ops.h dt_op_tp_gather_seq / _scatter_seq,
 * dt_op_dropout_at) on T = 2 and T = 4 ranks that are threads of this
 * process (tests/common/tp_threads.h), against one process on the whole
 * tensors:
 *   gather_seq of the shards x[:, r S .. r S + S) is bitwise the whole x.
 *   A Megatron MLP block x -> LayerNorm -> [gather] -> c_fc (columns r of
 *     T) -> GELU -> c_proj (rows r of T) -> [scatter] -> + b, with B = 3
 *     samples (so the [rows, T, n] reorder is exercised), T positions 8,
 *     C = 6: each rank's output is its positions of the whole block's output,
 *     its input gradient its positions of the whole one's, its c_fc / c_proj
 *     weight gradients its parts of the whole ones, and the LayerNorm gain /
 *     bias and the c_proj bias gradients summed over the ranks are the whole
 *     ones (all within 1e-5 relative + 1e-6; the split sums round
 *     differently).
 *   dropout_at on a shard with offset r S C: bitwise the whole-row
 *     dropout's output and gradient on those positions.
 *   Errors: a group without all-gather, a sequence T does not divide, a
 *   negative offset.
 * Without the ops this file does not link. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "dtrain/autograd.h"
#include "dtrain/ops.h"
#include "tp_threads.h"

enum { B = 3, L = 8, C = 6, F = 8 /* hidden, divisible by 2 and 4 */ };

static float xval(int64_t i) { return sinf(0.37f * (float)i) * 1.5f + 0.1f * (float)(i % 5); }
static float wval(int64_t i) { return cosf(0.11f * (float)i + 0.3f) * 0.4f; }
static float dyval(int64_t i) { return sinf(0.23f * (float)i + 1.0f); }

/* The whole block's parameters, as values: ln (gain, bias), W1 [C, F], W2 [F, C], b2 [C]. */
typedef struct weights { float g[C], b[C], w1[C * F], w2[F * C], b2[C]; } weights;
static void make_weights(weights *w) {
    for (int i = 0; i < C; i++) { w->g[i] = 1.0f + 0.1f * (float)i; w->b[i] = 0.05f * (float)i - 0.1f; w->b2[i] = 0.02f * (float)i; }
    for (int i = 0; i < C * F; i++) { w->w1[i] = wval(i); w->w2[i] = wval(1000 + i); }
}

typedef struct result {
    float y[B * L * C], dx[B * L * C], dg[C], db[C], dw1[C * F], dw2[F * C], db2[C];
    float gathered[B * L * C];
    int ok;
} result;

typedef struct params { dt_param x, g, b, w1, w2, b2; } params;

static int init_params(params *p, int64_t rows_len, int64_t f) {
    int64_t xs[3] = {B, rows_len, C}, cs[1] = {C}, s1[2] = {C, f}, s2[2] = {f, C};
    return dt_param_init(&p->x, "x", 3, xs) || dt_param_init(&p->g, "g", 1, cs) || dt_param_init(&p->b, "b", 1, cs) ||
           dt_param_init(&p->w1, "w1", 2, s1) || dt_param_init(&p->w2, "w2", 2, s2) || dt_param_init(&p->b2, "b2", 1, cs);
}
static void free_params(params *p) {
    dt_param_free(&p->x); dt_param_free(&p->g); dt_param_free(&p->b);
    dt_param_free(&p->w1); dt_param_free(&p->w2); dt_param_free(&p->b2);
}

/* Rank r of T (c NULL: one process, T = 1): its positions, columns of W1, rows of W2. */
static void block(const dt_tp_comm *c, int T, result *out) {
    int r = c ? c->rank : 0;
    int64_t S = L / T, f = F / T;
    weights w;
    make_weights(&w);
    params p;
    dt_graph *g = dt_graph_create();
    if (!g || init_params(&p, S, f)) return;
    for (int64_t bb = 0; bb < B; bb++)
        for (int64_t t = 0; t < S; t++)
            for (int64_t k = 0; k < C; k++) dt_f32(&p.x.value)[(bb * S + t) * C + k] = xval((bb * L + r * S + t) * C + k);
    memcpy(p.g.value.data, w.g, sizeof w.g);
    memcpy(p.b.value.data, w.b, sizeof w.b);
    memcpy(p.b2.value.data, w.b2, sizeof w.b2);
    for (int64_t i = 0; i < C; i++)
        for (int64_t j = 0; j < f; j++) dt_f32(&p.w1.value)[i * f + j] = w.w1[i * F + r * f + j];
    for (int64_t i = 0; i < f; i++)
        for (int64_t j = 0; j < C; j++) dt_f32(&p.w2.value)[i * C + j] = w.w2[(r * f + i) * C + j];
    dt_tensor *h = NULL, *y = NULL;
    if (c) {   /* the shards gathered as they are: the whole x */
        dt_tensor *all = dt_op_tp_gather_seq(g, &p.x.value, c);
        if (!all) goto done;
        memcpy(out->gathered, all->data, sizeof out->gathered);
    }
    h = dt_op_layernorm(g, &p.x.value, &p.g.value, &p.b.value, 1e-5f);
    if (h && c) h = dt_op_tp_gather_seq(g, h, c);
    if (h) h = dt_op_linear(g, h, &p.w1.value, NULL, DT_W_IN_OUT);
    if (h) h = dt_op_gelu(g, h);
    if (h) h = dt_op_linear(g, h, &p.w2.value, NULL, DT_W_IN_OUT);
    if (h && c) h = dt_op_tp_scatter_seq(g, h, c);
    if (h) y = dt_op_bias_add(g, h, &p.b2.value);
    if (!y) goto done;
    float *dy = malloc((size_t)y->numel * sizeof *dy);
    if (!dy) goto done;
    for (int64_t bb = 0; bb < B; bb++)
        for (int64_t t = 0; t < S; t++)
            for (int64_t k = 0; k < C; k++) dy[(bb * S + t) * C + k] = dyval((bb * L + r * S + t) * C + k);
    if (dt_graph_backward_from(g, y, dy) == DT_OK) {
        memcpy(out->y, y->data, (size_t)y->numel * sizeof(float));
        memcpy(out->dx, p.x.grad.data, (size_t)y->numel * sizeof(float));
        memcpy(out->dg, p.g.grad.data, sizeof out->dg);
        memcpy(out->db, p.b.grad.data, sizeof out->db);
        memcpy(out->db2, p.b2.grad.data, sizeof out->db2);
        memcpy(out->dw1, p.w1.grad.data, (size_t)(C * f) * sizeof(float));
        memcpy(out->dw2, p.w2.grad.data, (size_t)(f * C) * sizeof(float));
        out->ok = 1;
    }
    free(dy);
done:
    free_params(&p);
    dt_graph_free(g);
}

static int g_T;
static void block_rank(const dt_tp_comm *c, void *arg) { block(c, g_T, arg); }

static void near(const char *what, int rank, float got, float want) {
    if (fabsf(got - want) > 1e-5f * fabsf(want) + 1e-6f) fail_msg("rank %d: %s %.9g, whole %.9g", rank, what, got, want);
}

static void block_equals_whole(int T) {
    result *whole = calloc(1, sizeof *whole), *part = calloc((size_t)T, sizeof *part);
    assert_non_null(whole);
    assert_non_null(part);
    block(NULL, 1, whole);
    assert_true(whole->ok);
    g_T = T;
    assert_int_equal(tp_threads_run(T, block_rank, part, sizeof *part), 0);
    int64_t S = L / T, f = F / T;
    float dg[C] = {0}, db[C] = {0}, db2[C] = {0};
    for (int r = 0; r < T; r++) {
        const result *p = &part[r];
        if (!p->ok) fail_msg("T=%d rank %d: the ops failed", T, r);
        for (int64_t i = 0; i < B * L * C; i++)   /* gathered shards: the whole x, bitwise */
            if (p->gathered[i] != xval(i)) fail_msg("T=%d rank %d: gathered element %lld differs", T, r, (long long)i);
        for (int64_t bb = 0; bb < B; bb++)
            for (int64_t t = 0; t < S; t++)
                for (int64_t k = 0; k < C; k++) {
                    int64_t li = (bb * S + t) * C + k, wi = (bb * L + r * S + t) * C + k;
                    near("y", r, p->y[li], whole->y[wi]);
                    near("dx", r, p->dx[li], whole->dx[wi]);
                }
        for (int64_t i = 0; i < C; i++)
            for (int64_t j = 0; j < f; j++) near("dW1", r, p->dw1[i * f + j], whole->dw1[i * F + r * f + j]);
        for (int64_t i = 0; i < f; i++)
            for (int64_t j = 0; j < C; j++) near("dW2", r, p->dw2[i * C + j], whole->dw2[(r * f + i) * C + j]);
        for (int k = 0; k < C; k++) { dg[k] += p->dg[k]; db[k] += p->db[k]; db2[k] += p->db2[k]; }
    }
    for (int k = 0; k < C; k++) {   /* replicated parameters: the ranks' partial gradients sum to the whole's */
        near("sum of LayerNorm gain grads", -1, dg[k], whole->dg[k]);
        near("sum of LayerNorm bias grads", -1, db[k], whole->db[k]);
        near("sum of c_proj bias grads", -1, db2[k], whole->db2[k]);
        if (T > 1 && fabsf(part[0].db2[k] - whole->db2[k]) <= 1e-6f * fabsf(whole->db2[k]) && whole->db2[k] != 0)
            fail_msg("rank 0's c_proj bias gradient %d is already the whole one's: not a partial sum", k);
    }
    free(part);
    free(whole);
}
static void block_tp2(void **state) { (void)state; block_equals_whole(2); }
static void block_tp4(void **state) { (void)state; block_equals_whole(4); }

/* dropout_at on positions [r S, r S + S): the whole rows' masks there. */
static void dropout_shard_is_whole_slice(void **state) {
    (void)state;
    enum { T = 4, S = L / T };
    uint64_t keys[B];
    for (int i = 0; i < B; i++) keys[i] = dt_dropout_row_key(11, 2, (uint64_t)i);
    dt_param whole, part;
    int64_t ws[3] = {B, L, C}, ps[3] = {B, S, C};
    assert_int_equal(dt_param_init(&whole, "w", 3, ws), DT_OK);
    assert_int_equal(dt_param_init(&part, "p", 3, ps), DT_OK);
    for (int64_t i = 0; i < B * L * C; i++) dt_f32(&whole.value)[i] = xval(i);
    dt_graph *g = dt_graph_create();
    assert_non_null(g);
    dt_graph_set_training(g, 1);
    dt_tensor *yw = dt_op_dropout(g, &whole.value, 0.3f, keys, dt_dropout_site(1, 0));
    assert_non_null(yw);
    float dyw[B * L * C];
    for (int64_t i = 0; i < B * L * C; i++) dyw[i] = dyval(i);
    assert_int_equal(dt_graph_backward_from(g, yw, dyw), DT_OK);
    for (int r = 0; r < T; r++) {
        dt_graph *gp = dt_graph_create();
        assert_non_null(gp);
        dt_graph_set_training(gp, 1);
        float dyp[B * S * C];
        memset(part.grad.data, 0, sizeof dyp);
        for (int64_t bb = 0; bb < B; bb++)
            for (int64_t i = 0; i < S * C; i++) {
                dt_f32(&part.value)[bb * S * C + i] = dt_f32(&whole.value)[bb * L * C + r * S * C + i];
                dyp[bb * S * C + i] = dyw[bb * L * C + r * S * C + i];
            }
        dt_tensor *yp = dt_op_dropout_at(gp, &part.value, 0.3f, keys, dt_dropout_site(1, 0), (int64_t)r * S * C);
        assert_non_null(yp);
        assert_int_equal(dt_graph_backward_from(gp, yp, dyp), DT_OK);
        for (int64_t bb = 0; bb < B; bb++)
            for (int64_t i = 0; i < S * C; i++) {
                int64_t li = bb * S * C + i, wi = bb * L * C + r * S * C + i;
                if (dt_f32(yp)[li] != dt_f32(yw)[wi] || dt_f32(&part.grad)[li] != dt_f32(&whole.grad)[wi])
                    fail_msg("rank %d: element %lld of the shard differs from the whole row's", r, (long long)li);
            }
        dt_graph_free(gp);
    }
    dt_graph_free(g);
    dt_param_free(&whole);
    dt_param_free(&part);
}

static dt_status no_sum(void *ctx, float *buf, int64_t n) { (void)ctx; (void)buf; (void)n; return DT_OK; }
static dt_status never(void *ctx, const float *in, float *out, int64_t n, int64_t rows) {
    (void)ctx; (void)in; (void)out; (void)n; (void)rows;
    return DT_ERR(DT_ESTATE, "called");
}

static void errors(void **state) {
    (void)state;
    dt_param x;
    int64_t shape[3] = {2, 3, 4};
    assert_int_equal(dt_param_init(&x, "x", 3, shape), DT_OK);
    dt_graph *g = dt_graph_create();
    assert_non_null(g);
    dt_tp_comm c = {.rank = 0, .size = 2, .allreduce_sum = no_sum};   /* no all-gather / reduce-scatter */
    assert_null(dt_op_tp_gather_seq(g, &x.value, &c));
    assert_int_equal(dt_error_code(), DT_EINVAL);
    assert_non_null(strstr(dt_error_message(), "tp_gather_seq"));
    c.allgather = c.reduce_scatter = never;
    assert_null(dt_op_tp_scatter_seq(g, &x.value, &c));   /* 3 positions over 2 ranks */
    assert_non_null(strstr(dt_error_message(), "not divisible"));
    dt_graph_set_training(g, 1);
    uint64_t keys[2] = {1, 2};
    assert_null(dt_op_dropout_at(g, &x.value, 0.5f, keys, 0, -1));
    assert_int_equal(dt_error_code(), DT_EINVAL);
    dt_graph_free(g);
    dt_param_free(&x);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(block_tp2), cmocka_unit_test(block_tp4),
                                       cmocka_unit_test(dropout_shard_is_whole_slice), cmocka_unit_test(errors)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
