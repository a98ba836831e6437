/* GPT-2: HF names/shapes, finite decreasing loss, and gradients (including the
 * tied wte, used by the embedding and the lm-head) match finite differences.
 * The fused kernels (add + ln_2, c_fc + GELU) train bit for bit as the
 * unfused ops (DTRAIN_NO_FUSE=1), plain, with recompute and with the split
 * backward. */
#include <stdlib.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <math.h>
#include <string.h>
#include "dtrain/nn.h"
#include "dtrain/optim.h"
#include "gradcheck.h"

static dt_model_cfg tiny(void) {
    dt_model_cfg c = dt_model_cfg_default(DT_MODEL_GPT2);
    c.n_layer = 2; c.n_embd = 12; c.n_head = 3; c.vocab = 11; c.max_t = 8;
    return c;
}

static int32_t ids[2 * 5] = {1, 4, 2, 7, 1, 3, 3, 9, 0, 5};
static int32_t tgt[2 * 5] = {4, 2, 7, 1, 3, 3, 9, 0, 5, 6};

/* ids [B, T] as the batch's "ids" input */
static dt_batch ids_batch(int64_t B, int64_t T) {
    dt_batch b = {.B = B, .T = T, .y = tgt};
    assert_int_equal(dt_batch_add_input(&b, "ids", DT_I32, 2, (int64_t[]){B, T}, ids), DT_OK);
    return b;
}

static dt_tensor *model_loss(dt_graph *g, dt_param **in, void *ctx) {
    (void)in;
    dt_batch b = ids_batch(2, 5);
    return dt_model_forward(ctx, g, &b, NULL);
}

static void test_names_and_shapes(void **state) {
    (void)state;
    dt_model_cfg c = tiny();
    dt_model *m;
    assert_int_equal(dt_model_create(&c, 1, &m), DT_OK);
    const char *names[] = {"wte.weight", "wpe.weight", "h.0.ln_1.weight", "h.0.attn.c_attn.weight",
                           "h.1.mlp.c_proj.bias", "ln_f.bias"};
    for (int i = 0; i < 6; i++) assert_non_null(dt_model_find_param(m, names[i]));
    dt_param *ca = dt_model_find_param(m, "h.0.attn.c_attn.weight");
    assert_int_equal(ca->value.shape[0], 12);
    assert_int_equal(ca->value.shape[1], 36);   /* Conv1D layout [in, out] */
    assert_string_equal(m->params[0]->name, "wte.weight");
    assert_int_equal(m->n_params, 2 + 2 * 12 + 2);
    /* flat layout: reverse registration order, contiguous */
    assert_int_equal(m->offsets[m->n_params - 1], 0);
    assert_true(dt_f32(&m->params[0]->value) == m->param_flat.data + m->offsets[0]);
    dt_model_free(m);
}

static void test_gradients_match_finite_differences(void **state) {
    (void)state;
    dt_model_cfg c = tiny();
    dt_model *m;
    assert_int_equal(dt_model_create(&c, 2, &m), DT_OK);
    dt_param *check[4] = {dt_model_find_param(m, "wte.weight"), dt_model_find_param(m, "h.1.attn.c_attn.weight"),
                          dt_model_find_param(m, "h.0.ln_2.weight"), dt_model_find_param(m, "wpe.weight")};
    /* Scale weights up so the loss is sensitive enough for float differences. */
    for (int i = 0; i < 4; i++)
        for (int64_t k = 0; k < check[i]->value.numel; k++) dt_f32(&check[i]->value)[k] *= check[i] == check[2] ? 1.f : 10.f;
    dt_gc_opts o = {.eps = 1e-2, .rtol = 5e-2, .atol = 2e-3, .max_checks = 40};
    assert_int_equal(dt_gradcheck(model_loss, m, check, 4, &o), 0);
    /* The tied weight gets both uses: rows of tokens absent from the input still
     * get a gradient (lm-head), and a row present in the input differs from a
     * pure lm-head gradient — the finite-difference match above covers both. */
    dt_param *wte = check[0];
    double absent = 0;
    for (int k = 0; k < 12; k++) absent += fabs(dt_f32(&wte->grad)[8 * 12 + k]);   /* token 8 never input */
    assert_true(absent > 0);
    dt_model_free(m);
}

static void test_loss_finite_and_decreasing(void **state) {
    (void)state;
    dt_model_cfg c = tiny();
    dt_model *m;
    assert_int_equal(dt_model_create(&c, 3, &m), DT_OK);
    dt_optim_cfg oc = dt_optim_cfg_default(DT_OPTIM_ADAMW);
    oc.lr = 1e-2f;
    dt_optimizer opt;
    dt_optim_segment seg = {0, m->param_flat.numel, 1, NULL, NULL, 0};
    assert_int_equal(dt_optimizer_init(&opt, &oc, &seg, 1, 0, m->param_flat.numel), DT_OK);
    dt_graph *g = dt_graph_create();
    dt_batch b = ids_batch(2, 5);
    float first = 0, last = 0;
    for (int s = 0; s < 30; s++) {
        dt_graph_reset(g);
        dt_tensor *loss = dt_model_forward(m, g, &b, NULL);
        assert_non_null(loss);
        float l = dt_f32(loss)[0];
        assert_true(isfinite(l));
        if (s == 0) { first = l; assert_true(fabsf(l - logf(11.f)) < 0.5f); }
        last = l;
        assert_int_equal(dt_graph_backward(g, loss), DT_OK);
        assert_int_equal(dt_optimizer_step_range(&opt, oc.lr, m->param_flat.data, m->grad_flat.data, 0, m->param_flat.numel, 1.f), DT_OK);
        dt_optimizer_finish_step(&opt);
        dt_model_zero_grad(m);
    }
    assert_true(last < 0.5f * first);
    /* bad input: sequence longer than maxT is an error, not a crash */
    dt_batch bad = ids_batch(1, 9);
    dt_graph_reset(g);
    assert_null(dt_model_forward(m, g, &bad, NULL));
    assert_non_null(strstr(dt_error_message(), "maxT"));
    dt_graph_free(g);
    dt_optimizer_free(&opt);
    dt_model_free(m);
}

/* ---- fused kernels vs the unfused chain ---- */
static int defer_all(const dt_param *p, void *user) { (void)p; (void)user; return 1; }

/* Nodes named op on the tape reachable from t (through grad_fn and inputs). */
static int count_nodes(dt_tensor *t, const char *op) {
    enum { MAXN = 2048 };
    static const dt_node *seen[MAXN];
    static dt_node *stack[MAXN];
    int n_seen = 0, top = 0, count = 0;
    if (t->grad_fn) stack[top++] = t->grad_fn;
    while (top > 0) {
        dt_node *n = stack[--top];
        int dup = 0;
        for (int i = 0; i < n_seen && !dup; i++) dup = seen[i] == n;
        if (dup) continue;
        assert_true(n_seen < MAXN);
        seen[n_seen++] = n;
        count += !strcmp(n->op, op);
        for (int i = 0; i < n->n_in; i++)
            if (n->in[i] && n->in[i]->grad_fn && top < MAXN) stack[top++] = n->in[i]->grad_fn;
    }
    return count;
}

enum { RUN_PLAIN, RUN_RECOMPUTE, RUN_SPLIT, RUN_MODES };
static const char *const run_name[RUN_MODES] = {"plain", "recompute", "split backward"};

/* Four AdamW steps (dropout on) of a GPT-2 built with or without
 * DTRAIN_NO_FUSE=1; returns the final parameter vector (malloc'd). */
static float *train_steps(const dt_model_cfg *c, int64_t B, int64_t T, int fused, int mode, int64_t *n) {
    if (fused) unsetenv("DTRAIN_NO_FUSE");
    else setenv("DTRAIN_NO_FUSE", "1", 1);
    dt_model *m;
    assert_int_equal(dt_model_create(c, 7, &m), DT_OK);
    unsetenv("DTRAIN_NO_FUSE");   /* read when the model was built */
    if (mode == RUN_RECOMPUTE) dt_model_set_recompute(m, DT_RECOMPUTE_BLOCKS);
    dt_optim_cfg oc = dt_optim_cfg_default(DT_OPTIM_ADAMW);
    oc.lr = 1e-2f;
    dt_optimizer opt;
    dt_optim_segment seg = {.offset = 0, .numel = m->param_flat.numel, .decay = 1};
    assert_int_equal(dt_optimizer_init(&opt, &oc, &seg, 1, 0, m->param_flat.numel), DT_OK);
    int32_t *in = malloc((size_t)(B * T) * sizeof *in), *tg = malloc((size_t)(B * T) * sizeof *tg);
    for (int64_t i = 0; i < B * T; i++) {
        in[i] = (int32_t)((i * 7 + 3) % c->vocab);
        tg[i] = (int32_t)((i * 5 + 1) % c->vocab);
    }
    dt_batch b = {.B = B, .T = T, .y = tg};
    assert_int_equal(dt_batch_add_input(&b, "ids", DT_I32, 2, (int64_t[]){B, T}, in), DT_OK);
    dt_graph *g = dt_graph_create();
    if (mode == RUN_SPLIT) dt_graph_defer_weights(g, defer_all, NULL);
    uint64_t *keys = malloc((size_t)B * sizeof *keys);
    b.row_keys = keys;
    for (int s = 0; s < 4; s++) {
        for (int64_t r = 0; r < B; r++) keys[r] = dt_dropout_row_key(m->dropout_seed, (uint64_t)s, (uint64_t)r);
        dt_graph_reset(g);
        dt_graph_set_training(g, 1);
        dt_tensor *loss = dt_model_forward(m, g, &b, NULL);
        assert_non_null(loss);
        if (s == 0 && mode != RUN_RECOMPUTE) {   /* the switch works: one of each per layer, or none */
            assert_int_equal(count_nodes(loss, "add_layernorm"), fused ? c->n_layer : 0);
            assert_int_equal(count_nodes(loss, "linear_gelu"), fused ? c->n_layer : 0);
            assert_int_equal(count_nodes(loss, "gelu"), fused ? 0 : c->n_layer);
        }
        assert_int_equal(dt_graph_backward(g, loss), DT_OK);
        if (mode == RUN_SPLIT) {
            assert_true(dt_graph_deferred_nodes(g) > 0);
            assert_int_equal(dt_graph_backward_weights(g), DT_OK);
        }
        assert_int_equal(dt_optimizer_step_range(&opt, oc.lr, m->param_flat.data, m->grad_flat.data, 0,
                                                 m->param_flat.numel, 1.f), DT_OK);
        dt_optimizer_finish_step(&opt);
        dt_model_zero_grad(m);
    }
    *n = m->param_flat.numel;
    float *out = malloc((size_t)*n * sizeof *out);
    memcpy(out, m->param_flat.data, (size_t)*n * sizeof *out);
    dt_graph_free(g);
    dt_optimizer_free(&opt);
    dt_model_free(m);
    free(in);
    free(tg);
    free(keys);
    return out;
}

static void expect_fused_bitwise(const dt_model_cfg *c, int64_t B, int64_t T) {
    for (int mode = 0; mode < RUN_MODES; mode++) {
        int64_t n0, n1;
        float *ref = train_steps(c, B, T, 0, mode, &n0), *got = train_steps(c, B, T, 1, mode, &n1);
        assert_int_equal(n0, n1);
        int64_t first = -1;
        for (int64_t i = 0; i < n0 && first < 0; i++)
            if (memcmp(&ref[i], &got[i], sizeof(float))) first = i;
        if (first >= 0)
            fail_msg("C=%d %s: fused parameters differ from unfused at %lld (%.9g vs %.9g)", c->n_embd,
                     run_name[mode], (long long)first, (double)ref[first], (double)got[first]);
        free(ref);
        free(got);
    }
}

static void test_fused_kernels_bitwise(void **state) {
    (void)state;
    dt_model_cfg c = tiny();
    c.dropout = 0.1f;
    expect_fused_bitwise(&c, 2, 5);
    /* large enough for the ops' OpenMP paths: B*T*C = 34560, C = 180 not a multiple of 16 */
    c.n_embd = 180; c.n_head = 3; c.vocab = 50; c.max_t = 48;
    expect_fused_bitwise(&c, 4, 48);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names_and_shapes),
        cmocka_unit_test(test_gradients_match_finite_differences),
        cmocka_unit_test(test_loss_finite_and_decreasing),
        cmocka_unit_test(test_fused_kernels_bitwise),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
