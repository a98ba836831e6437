/* Pipeline set-up pieces that need no MPI: the balanced cut (expected cuts
 * worked out by hand from "minimise the largest stage cost"), the probe's
 * parameter and module ownership on the built-in models, and
 * dt_model_keep_params (a stage keeps its parameters' values, names and a
 * contiguous layout, and can still run its blocks). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>
#include "parallel/pipe_internal.h"

static void check_cut(const double *cost, int n, int S, const int *want) {
    int first[16];
    assert_int_equal(dt_pipe_balance(cost, n, S, first), DT_OK);
    for (int v = 0; v <= S; v++) assert_int_equal(first[v], want[v]);
}

static void test_balance(void **state) {
    (void)state;
    check_cut((double[]){1, 1, 1, 1}, 4, 2, (int[]){0, 2, 4});
    /* one heavy block alone: 5 | 1+1+1+1+1 */
    check_cut((double[]){5, 1, 1, 1, 1, 1}, 6, 2, (int[]){0, 1, 6});
    /* 1+2+3 | 4 | 5 (max 6) beats 1+2 | 3+4 | 5 (7) */
    check_cut((double[]){1, 2, 3, 4, 5}, 5, 3, (int[]){0, 3, 4, 5});
    /* as many stages as blocks: one each */
    check_cut((double[]){3, 1, 2}, 3, 3, (int[]){0, 1, 2, 3});
    check_cut((double[]){3, 1, 2}, 3, 1, (int[]){0, 3});
    int first[8];
    assert_int_equal(dt_pipe_balance((double[]){1, 1}, 2, 3, first), DT_EINVAL);
    assert_non_null(strstr(dt_error_message(), "2 blocks into 3 stages"));
}

static dt_batch gpt2_batch(int32_t *ids, int32_t *y, int B, int T) {
    for (int i = 0; i < B * T; i++) { ids[i] = (i * 7 + 3) % 64; y[i] = (i * 5 + 1) % 64; }
    dt_batch b = {.B = B, .T = T, .y = y};
    assert_int_equal(dt_batch_add_input(&b, "ids", DT_I32, 2, (int64_t[]){B, T}, ids), DT_OK);
    return b;
}

static dt_model *tiny_gpt2(void) {
    dt_model_cfg c = dt_model_cfg_default(DT_MODEL_GPT2);
    c.n_layer = 2; c.n_embd = 32; c.n_head = 2; c.vocab = 64; c.max_t = 16;
    dt_model *m;
    assert_int_equal(dt_model_create(&c, 3, &m), DT_OK);
    return m;
}

static int used(const dt_pipe_probe *pr, int k, int i) { return pr->used[(size_t)k * (size_t)pr->n_blocks + (size_t)i]; }

static void test_probe_gpt2(void **state) {
    (void)state;
    dt_model *m = tiny_gpt2();
    int32_t ids[2 * 8], y[2 * 8];
    dt_batch b = gpt2_batch(ids, y, 2, 8);
    float *before = malloc(m->param_flat.numel * sizeof(float));
    memcpy(before, m->param_flat.data, m->param_flat.numel * sizeof(float));
    dt_pipe_probe pr;
    assert_int_equal(dt_pipe_probe_run(m, &b, &pr), DT_OK);
    assert_int_equal(pr.n_blocks, 4);   /* embed, h.0, h.1, head */
    for (int i = 0; i < 4; i++) assert_true(pr.cost[i] > 0);
    int wte = dt_model_find_param(m, "wte.weight")->index, wpe = dt_model_find_param(m, "wpe.weight")->index;
    int h1 = dt_model_find_param(m, "h.1.mlp.c_fc.weight")->index, lnf = dt_model_find_param(m, "ln_f.weight")->index;
    /* the tied embedding: block 0 (lookup) and block 3 (lm-head), nothing between */
    assert_true(used(&pr, wte, 0) && !used(&pr, wte, 1) && !used(&pr, wte, 2) && used(&pr, wte, 3));
    assert_true(used(&pr, wpe, 0) && !used(&pr, wpe, 3));
    assert_true(!used(&pr, h1, 1) && used(&pr, h1, 2));
    assert_true(used(&pr, lnf, 3) && !used(&pr, lnf, 2));
    /* the probe leaves no trace: values and gradients untouched */
    assert_memory_equal(before, m->param_flat.data, m->param_flat.numel * sizeof(float));
    for (size_t i = 0; i < m->grad_flat.numel; i++) assert_true(m->grad_flat.data[i] == 0.f);
    dt_pipe_probe_free(&pr);
    free(before);
    dt_model_free(m);
}

static void test_probe_cnn_modules(void **state) {
    (void)state;
    dt_model_cfg c = dt_model_cfg_default(DT_MODEL_CNN);
    c.cnn_c1 = 4; c.cnn_c2 = 4; c.cnn_fc = 8;
    dt_model *m;
    assert_int_equal(dt_model_create(&c, 1, &m), DT_OK);
    static float img[2 * 784];
    int32_t y[2] = {1, 2};
    for (int i = 0; i < 2 * 784; i++) img[i] = (float)((i * 31) % 17) / 17.f;
    dt_batch b = {.B = 2, .T = 1, .y = y};
    assert_int_equal(dt_batch_add_input(&b, "image", DT_F32, 4, (int64_t[]){2, 1, 28, 28}, img), DT_OK);
    float *stats = malloc((size_t)m->buffers[0]->value.numel * sizeof(float));
    memcpy(stats, m->buffers[0]->value.data, (size_t)m->buffers[0]->value.numel * sizeof(float));
    dt_pipe_probe pr;
    assert_int_equal(dt_pipe_probe_run(m, &b, &pr), DT_OK);
    for (int k = 0; k < m->n_modules; k++) {
        const char *nm = m->modules[k]->name;
        int want = !strcmp(nm, "conv1") || !strcmp(nm, "bn1") ? 0 : !strcmp(nm, "conv2") || !strcmp(nm, "bn2") ? 1
                 : !strcmp(nm, "fc1") ? 2 : 3;
        assert_int_equal(pr.module_block[k], want);
    }
    /* eval mode: BatchNorm's running statistics are not updated by the probe */
    assert_memory_equal(stats, m->buffers[0]->value.data, (size_t)m->buffers[0]->value.numel * sizeof(float));
    for (int k = 0; k < m->n_modules; k++) assert_null(m->modules[k]->hook);   /* hooks restored */
    dt_pipe_probe_free(&pr);
    free(stats);
    dt_model_free(m);
}

/* The last stage of a 2-stage GPT-2: ln_f + lm-head (tied wte) and h.1. */
static void test_keep_params(void **state) {
    (void)state;
    dt_model *full = tiny_gpt2(), *m = tiny_gpt2();
    unsigned char keep[64] = {0};
    size_t want_elems = 0;
    int want_n = 0;
    for (int i = 0; i < m->n_params; i++) {
        const char *nm = m->params[i]->name;
        keep[i] = !strncmp(nm, "h.1.", 4) || !strncmp(nm, "ln_f.", 5) || !strcmp(nm, "wte.weight");
        if (keep[i]) { want_elems += (size_t)m->params[i]->value.numel; want_n++; }
    }
    assert_int_equal(dt_model_keep_params(m, keep), DT_OK);
    assert_int_equal(m->n_params, want_n);
    assert_int_equal(m->n_elems, want_elems);
    assert_int_equal(m->param_flat.numel, want_elems);
    for (int i = 0; i < m->n_params; i++) {
        dt_param *q = m->params[i], *o = dt_model_find_param(full, q->name);
        assert_non_null(o);
        assert_int_equal(q->index, i);
        assert_memory_equal(q->value.data, o->value.data, (size_t)o->value.numel * sizeof(float));
        assert_true((float *)q->value.data >= m->param_flat.data &&
                    (float *)q->value.data + q->value.numel <= m->param_flat.data + m->param_flat.numel);
        if (i > 0) assert_true(o->index > dt_model_find_param(full, m->params[i - 1]->name)->index);   /* order kept */
    }
    for (int k = 0; k < m->n_modules; k++)   /* modules list kept parameters only */
        for (int j = 0; j < m->modules[k]->n_params; j++) assert_ptr_equal(dt_model_find_param(m, m->modules[k]->params[j]->name), m->modules[k]->params[j]);
    assert_null(dt_model_find_param(m, "h.0.attn.c_attn.weight"));
    /* the stage still runs its blocks: h.1 + head on an activation equal the full model's */
    int32_t ids[2 * 8], y[2 * 8];
    dt_batch b = gpt2_batch(ids, y, 2, 8);
    dt_graph *g = dt_graph_create(), *gf = dt_graph_create();
    dt_tensor *x = dt_model_run_blocks(full, gf, &b, 0, 2, NULL);
    assert_non_null(x);
    dt_tensor *in = dt_graph_input(g, x->ndim, x->shape, dt_f32(x), 1);
    dt_tensor *ys = dt_model_run_blocks(m, g, &b, 2, 4, in), *yf = dt_model_run_blocks(full, gf, &b, 2, 4, x);
    assert_non_null(ys);
    assert_non_null(yf);
    assert_memory_equal(ys->data, yf->data, (size_t)yf->numel * sizeof(float));
    dt_graph_free(g);
    dt_graph_free(gf);
    dt_model_free(m);
    dt_model_free(full);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_balance),
        cmocka_unit_test(test_probe_gpt2),
        cmocka_unit_test(test_probe_cnn_modules),
        cmocka_unit_test(test_keep_params),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
