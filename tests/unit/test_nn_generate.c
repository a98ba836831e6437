/* Generation (dtrain/generate.h): the KV cache gives the logits and, greedy,
 * exactly the tokens of a forward over the whole prefix (also past the
 * context, where the window is refilled); sampling is deterministic for a
 * seed and differs for another; top-k keeps to the k largest; errors name
 * the culprit. */
#include <stdlib.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <math.h>
#include <string.h>
#include "dtrain/generate.h"
#include "dtrain/ops.h"

static dt_model *tiny_gpt2(int max_t, uint64_t seed) {
    dt_model_cfg c = dt_model_cfg_default(DT_MODEL_GPT2);
    c.n_layer = 2; c.n_embd = 32; c.n_head = 4; c.vocab = 64; c.max_t = max_t;
    dt_model *m = NULL;
    assert_int_equal(dt_model_create(&c, seed, &m), DT_OK);
    /* larger embeddings than the 0.02 init: logits far enough apart that a
     * greedy choice does not hinge on the last bit */
    dt_param *wte = dt_model_find_param(m, "wte.weight");
    for (int64_t i = 0; i < wte->value.numel; i++) dt_f32(&wte->value)[i] *= 50.0f;
    return m;
}

static const int32_t prompt[] = {3, 14, 15, 9, 2};
#define NP 5

/* Step by step: the cache's logits equal a whole-prefix forward's to rounding. */
static void test_cache_logits_match_full_forward(void **state) {
    (void)state;
    dt_model *m = tiny_gpt2(32, 7);
    dt_kv_cache *kv = NULL;
    assert_int_equal(dt_kv_cache_create(m, &kv), DT_OK);
    assert_int_equal(dt_kv_cache_capacity(kv), 32);
    int32_t ids[32];
    float a[64], b[64];
    memcpy(ids, prompt, sizeof prompt);
    assert_int_equal(dt_kv_cache_forward(kv, ids, NP, a), DT_OK);   /* the prompt in one forward */
    int n = NP;
    for (;;) {
        assert_int_equal(dt_model_next_logits(m, ids, n, b), DT_OK);
        float worst = 0;
        for (int v = 0; v < 64; v++) {
            float d = fabsf(a[v] - b[v]) / (1.0f + fabsf(b[v]));
            worst = d > worst ? d : worst;
        }
        if (worst > 1e-4f) fail_msg("position %d: cached logits differ from the full forward by %g", n - 1, (double)worst);
        if (n == 32) break;
        ids[n] = (int32_t)((n * 7 + 3) % 64);
        assert_int_equal(dt_kv_cache_forward(kv, &ids[n], 1, a), DT_OK);
        n++;
    }
    assert_int_equal(dt_kv_cache_len(kv), 32);
    /* full: one more is refused, and the cache is unchanged */
    assert_int_equal(dt_kv_cache_forward(kv, ids, 1, a), DT_EINVAL);
    assert_non_null(strstr(dt_error_message(), "arch.max_t"));
    assert_int_equal(dt_kv_cache_len(kv), 32);
    dt_kv_cache_clear(kv);
    assert_int_equal(dt_kv_cache_len(kv), 0);
    dt_kv_cache_free(kv);
    dt_model_free(m);
}

static void generate(dt_model *m, float temperature, int top_k, uint64_t seed, int no_cache, int n, int32_t *out) {
    dt_gen_opts o = {.temperature = temperature, .top_k = top_k, .seed = seed, .no_cache = no_cache};
    if (dt_generate(m, prompt, NP, n, &o, out, NULL, NULL) != DT_OK) fail_msg("dt_generate: %s", dt_error_message());
}

static void assert_same(const int32_t *a, const int32_t *b, int n, const char *what) {
    for (int i = 0; i < n; i++)
        if (a[i] != b[i]) fail_msg("%s: token %d is %d with the KV cache, %d recomputing the prefix", what, i, a[i], b[i]);
}

/* Greedy: the cached generation produces exactly the recomputing one's
 * tokens, inside the context and far past it (the window refills). */
static void test_greedy_cache_equals_recompute(void **state) {
    (void)state;
    dt_model *m = tiny_gpt2(16, 11);
    int32_t a[60], b[60];
    generate(m, 0, 0, 1, 0, 10, a);
    generate(m, 0, 0, 1, 1, 10, b);
    assert_same(a, b, 10, "inside the context");
    generate(m, 0, 0, 1, 0, 60, a);   /* 5 + 60 > 16: refilled several times */
    generate(m, 0, 0, 1, 1, 60, b);
    assert_same(a, b, 60, "past the context");
    /* top_k 1 is greedy whatever the temperature */
    generate(m, 1.5f, 1, 99, 0, 60, b);
    assert_same(a, b, 60, "top-k 1");
    dt_model_free(m);
}

/* Sampling: the same seed gives the same tokens (cached or not); another
 * seed other tokens. */
static void test_sampling_deterministic_for_a_seed(void **state) {
    (void)state;
    dt_model *m = tiny_gpt2(64, 3);
    dt_param *wte = dt_model_find_param(m, "wte.weight");   /* flatter logits: sampling has choices */
    for (int64_t i = 0; i < wte->value.numel; i++) dt_f32(&wte->value)[i] /= 50.0f;
    int32_t a[40], b[40], c[40];
    generate(m, 1.0f, 0, 5, 0, 40, a);
    generate(m, 1.0f, 0, 5, 0, 40, b);
    assert_memory_equal(a, b, sizeof a);
    generate(m, 1.0f, 0, 5, 1, 40, c);
    assert_same(a, c, 40, "sampled, seed 5");
    generate(m, 1.0f, 0, 6, 0, 40, c);
    assert_memory_not_equal(a, c, sizeof a);
    dt_model_free(m);
}

static void test_pick(void **state) {
    (void)state;
    float l[6] = {0.5f, 2.0f, -1.0f, 2.0f, 1.9f, -3.0f};
    dt_rng r;
    dt_rng_seed(&r, 1);
    assert_int_equal(dt_gen_pick(l, 6, 0, 0, NULL, NULL), 1);     /* greedy: lowest id among equals */
    int seen[6] = {0};
    for (int i = 0; i < 2000; i++) {
        int32_t t = dt_gen_pick(l, 6, 1.0f, 3, &r, NULL);
        assert_true(t >= 0 && t < 6);
        seen[t]++;
    }
    /* top-3: ids 1, 3 (2.0) and 4 (1.9) only */
    assert_int_equal(seen[0] + seen[2] + seen[5], 0);
    assert_true(seen[1] > 400 && seen[3] > 400 && seen[4] > 400);
    /* top-2 with a tie at the 2nd value: 1 and 3 */
    memset(seen, 0, sizeof seen);
    for (int i = 0; i < 500; i++) seen[dt_gen_pick(l, 6, 2.0f, 2, &r, NULL)]++;
    assert_int_equal(seen[1] + seen[3], 500);
    assert_int_equal(dt_gen_pick(l, 6, -1.0f, 0, &r, NULL), -1);
    assert_int_equal(dt_error_code(), DT_EINVAL);
    float nan[2] = {0, NAN};
    assert_int_equal(dt_gen_pick(nan, 2, 0, 0, NULL, NULL), -1);
    assert_non_null(strstr(dt_error_message(), "NaN"));
    /* an infinite temperature is refused, as dt_generate refuses it */
    assert_int_equal(dt_gen_pick(l, 6, INFINITY, 0, &r, NULL), -1);
    assert_int_equal(dt_error_code(), DT_EINVAL);
    /* top_k 1 is greedy: no generator needed */
    assert_int_equal(dt_gen_pick(l, 6, 1.0f, 1, NULL, NULL), 1);
    /* infinite logits (inf - inf is NaN in the softmax): +inf ids share the
     * draw and outweigh the rest; all -inf: every kept id may come */
    float inf[3] = {0, INFINITY, INFINITY}, ninf[3] = {-INFINITY, -INFINITY, -INFINITY};
    memset(seen, 0, sizeof seen);
    for (int i = 0; i < 400; i++) seen[dt_gen_pick(inf, 3, 1.0f, 0, &r, NULL)]++;
    assert_int_equal(seen[0], 0);
    assert_true(seen[1] > 100 && seen[2] > 100);
    memset(seen, 0, sizeof seen);
    for (int i = 0; i < 600; i++) seen[dt_gen_pick(ninf, 3, 1.0f, 0, &r, NULL)]++;
    assert_true(seen[0] > 100 && seen[1] > 100 && seen[2] > 100);
    memset(seen, 0, sizeof seen);
    for (int i = 0; i < 400; i++) seen[dt_gen_pick(ninf, 3, 1.0f, 2, &r, NULL)]++;   /* top-2 of equals: ids 0, 1 */
    assert_true(seen[0] > 100 && seen[1] > 100 && seen[2] == 0);
}

/* A model of one's own: a bigram table whose largest logit after id i is
 * i + 1 (mod 50), taking "ids" declared [-8] (at most 8 tokens): greedy
 * generation without a cache counts on, also past the 8-token context. */
#define BV 50
static dt_tensor *bigram_embed(dt_model *m, dt_graph *g, dt_tensor *x, const dt_batch *b, void *u) {
    (void)x; (void)u;
    const dt_tensor *ids = dt_batch_input(b, "ids", DT_I32, "bigram");
    if (!ids || dt_module_enter(g, m->modules[0]) != DT_OK) return NULL;
    int64_t shape[3] = {b->B, b->T, BV};
    dt_tensor *y = dt_op_embedding(g, &m->modules[0]->params[0]->value, ids->data, b->B * b->T, 3, shape);
    return dt_module_leave(g, m->modules[0]) == DT_OK ? y : NULL;
}

static void test_model_of_ones_own(void **state) {
    (void)state;
    dt_model *m = NULL;
    assert_int_equal(dt_model_new("bigram", 1, &m), DT_OK);
    assert_int_equal(dt_model_add_input(m, &(dt_input_spec){.name = "ids", .dtype = DT_I32, .ndim = 1, .dims = {-8},
                                                            .int_limit = BV}), DT_OK);
    dt_module *tab = dt_model_add_module(m, "tab");
    assert_non_null(tab);
    assert_non_null(dt_model_add_param(m, tab, "weight", 2, (int64_t[]){BV, BV}, DT_INIT_ZERO));
    assert_int_equal(dt_model_add_block(m, "embed", bigram_embed, NULL, 0, NULL, 2, (int64_t[]){DT_DIM_SEQ, BV}),
                     DT_OK);
    assert_int_equal(dt_model_set_loss(m, DT_LOSS_CROSS_ENTROPY, BV), DT_OK);
    assert_int_equal(dt_model_build(m), DT_OK);
    float *w = dt_f32(&dt_model_find_param(m, "tab.weight")->value);
    for (int i = 0; i < BV; i++) w[i * BV + (i + 1) % BV] = 10.0f;
    int32_t p[2] = {1, 2}, out[20];
    dt_gen_opts o = {.no_cache = 1};
    assert_int_equal(dt_generate(m, p, 2, 20, &o, out, NULL, NULL), DT_OK);
    for (int i = 0; i < 20; i++) assert_int_equal(out[i], 3 + i);
    dt_model_free(m);
}

static void test_errors_name_the_culprit(void **state) {
    (void)state;
    dt_model *m = tiny_gpt2(16, 1);
    int32_t out[4], bad[2] = {1, 64};
    dt_gen_opts o = {0};
    assert_int_equal(dt_generate(m, bad, 2, 4, &o, out, NULL, NULL), DT_EINVAL);
    assert_non_null(strstr(dt_error_message(), "id 64"));
    o.temperature = -0.5f;
    assert_int_equal(dt_generate(m, prompt, NP, 4, &o, out, NULL, NULL), DT_EINVAL);
    assert_non_null(strstr(dt_error_message(), "temperature"));
    o.temperature = 0;
    assert_int_equal(dt_generate(m, prompt, 0, 4, &o, out, NULL, NULL), DT_EINVAL);
    assert_non_null(strstr(dt_error_message(), "empty"));
    dt_model_free(m);

    dt_model_cfg c = dt_model_cfg_default(DT_MODEL_MLP);
    assert_int_equal(dt_model_create(&c, 1, &m), DT_OK);
    dt_kv_cache *kv = (dt_kv_cache *)1;
    assert_int_equal(dt_kv_cache_create(m, &kv), DT_EINVAL);
    assert_null(kv);
    assert_non_null(strstr(dt_error_message(), "'mlp' is not a GPT-2"));
    dt_model_free(m);
}

/* The token callback sees every token in order and can stop early. */
static int stop_at_3(int32_t tok, int i, void *user) {
    int32_t *seen = user;
    seen[i] = tok;
    return i == 2;
}

static void test_callback_stops(void **state) {
    (void)state;
    dt_model *m = tiny_gpt2(16, 2);
    int32_t out[10] = {0}, seen[10] = {0};
    dt_gen_opts o = {0};
    assert_int_equal(dt_generate(m, prompt, NP, 10, &o, out, stop_at_3, seen), DT_OK);
    assert_memory_equal(out, seen, 3 * sizeof *out);
    assert_int_equal(seen[3], 0);
    /* streamed only: out may be NULL when a callback takes the tokens */
    int32_t streamed[10] = {0};
    assert_int_equal(dt_generate(m, prompt, NP, 10, &o, NULL, stop_at_3, streamed), DT_OK);
    assert_memory_equal(streamed, seen, 3 * sizeof *out);
    assert_int_equal(dt_generate(m, prompt, NP, 10, &o, NULL, NULL, NULL), DT_EINVAL);   /* nowhere for them */
    dt_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cache_logits_match_full_forward),
        cmocka_unit_test(test_greedy_cache_equals_recompute),
        cmocka_unit_test(test_sampling_deterministic_for_a_seed),
        cmocka_unit_test(test_pick),
        cmocka_unit_test(test_errors_name_the_culprit),
        cmocka_unit_test(test_callback_stops),
        cmocka_unit_test(test_model_of_ones_own),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
