/* Activation recompute on the built-in models: --recompute blocks trains
 * bitwise like none (GPT-2 with dropout: same masks on the replay; CNN:
 * BatchNorm running statistics updated once), with lower activation memory. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>
#include "dtrain/nn.h"
#include "dtrain/ops.h"
#include "dtrain/optim.h"

typedef struct run {
    float loss[4];
    float *params, *buffers;
    size_t n_params, n_buffers;
    size_t arena;
} run;

/* 4 AdamW steps from seed 5 on a fixed batch; records losses, final
 * parameters and buffers and the arena high-water. Dropout keys: (model
 * seed, step, row), as the trainer forms them. */
static void train(const dt_model_cfg *c, const dt_batch *b, dt_recompute mode, run *out) {
    dt_model *m;
    assert_int_equal(dt_model_create(c, 5, &m), DT_OK);
    dt_model_set_recompute(m, mode);
    dt_optim_cfg oc = dt_optim_cfg_default(DT_OPTIM_ADAMW);
    dt_optimizer opt;
    dt_optim_segment seg = {0, m->param_flat.numel, 1, NULL, NULL, 0};
    assert_int_equal(dt_optimizer_init(&opt, &oc, &seg, 1, 0, m->param_flat.numel), DT_OK);
    dt_graph *g = dt_graph_create();
    uint64_t keys[64];
    assert_true(b->B <= 64);
    for (int s = 0; s < 4; s++) {
        dt_batch bs = *b;
        for (int64_t r = 0; r < b->B; r++) keys[r] = dt_dropout_row_key(m->dropout_seed, (uint64_t)s, (uint64_t)r);
        bs.row_keys = keys;
        dt_graph_reset(g);
        dt_tensor *loss = dt_model_forward(m, g, &bs, NULL);
        assert_non_null(loss);
        out->loss[s] = dt_f32(loss)[0];
        assert_int_equal(dt_graph_backward(g, loss), DT_OK);
        assert_int_equal(dt_optimizer_step_range(&opt, oc.lr, m->param_flat.data, m->grad_flat.data, 0,
                                                 m->param_flat.numel, 1.f), DT_OK);
        dt_optimizer_finish_step(&opt);
        dt_model_zero_grad(m);
    }
    out->n_params = m->param_flat.numel;
    out->params = malloc(out->n_params * sizeof(float));
    memcpy(out->params, m->param_flat.data, out->n_params * sizeof(float));
    out->n_buffers = 0;
    for (int i = 0; i < m->n_buffers; i++) out->n_buffers += (size_t)m->buffers[i]->value.numel;
    out->buffers = malloc((out->n_buffers ? out->n_buffers : 1) * sizeof(float));
    for (int i = 0, at = 0; i < m->n_buffers; at += (int)m->buffers[i]->value.numel, i++)
        memcpy(out->buffers + at, m->buffers[i]->value.data, (size_t)m->buffers[i]->value.numel * sizeof(float));
    out->arena = dt_graph_arena_bytes(g);
    dt_graph_free(g);
    dt_optimizer_free(&opt);
    dt_model_free(m);
}

static void assert_same_run(const run *a, const run *b) {
    assert_memory_equal(a->loss, b->loss, sizeof a->loss);
    assert_int_equal(a->n_params, b->n_params);
    assert_memory_equal(a->params, b->params, a->n_params * sizeof(float));
    assert_int_equal(a->n_buffers, b->n_buffers);
    if (a->n_buffers) assert_memory_equal(a->buffers, b->buffers, a->n_buffers * sizeof(float));
}

static void free_run(run *r) { free(r->params); free(r->buffers); }

static void test_gpt2_with_dropout(void **state) {
    (void)state;
    dt_model_cfg c = dt_model_cfg_default(DT_MODEL_GPT2);
    c.n_layer = 4; c.n_embd = 32; c.n_head = 4; c.vocab = 64; c.max_t = 32; c.dropout = 0.1f;
    enum { B = 4, T = 32 };
    static int32_t ids[B * T], y[B * T];
    for (int i = 0; i < B * T; i++) { ids[i] = (i * 7 + 3) % 64; y[i] = (i * 5 + 1) % 64; }
    dt_batch b = {.B = B, .T = T, .y = y};
    assert_int_equal(dt_batch_add_input(&b, "ids", DT_I32, 2, (int64_t[]){B, T}, ids), DT_OK);
    run none, blocks;
    train(&c, &b, DT_RECOMPUTE_NONE, &none);
    train(&c, &b, DT_RECOMPUTE_BLOCKS, &blocks);
    assert_same_run(&none, &blocks);
    /* 6 blocks of which 4 are transformer layers: keeping only block inputs
     * (and one block's replay at a time) must cut activation memory well
     * below half */
    if (!(blocks.arena * 2 < none.arena))
        fail_msg("activation memory with recompute %zu bytes, without %zu", blocks.arena, none.arena);
    free_run(&none);
    free_run(&blocks);
}

static void test_cnn_batchnorm_updates_once(void **state) {
    (void)state;
    dt_model_cfg c = dt_model_cfg_default(DT_MODEL_CNN);
    c.cnn_c1 = 3; c.cnn_c2 = 4; c.cnn_fc = 8;
    enum { B = 6 };
    static float img[B * 784];
    static int32_t y[B];
    for (int i = 0; i < B * 784; i++) img[i] = (float)((i * 37) % 101) / 50.f - 1.f;
    for (int i = 0; i < B; i++) y[i] = i % 10;
    dt_batch b = {.B = B, .T = 1, .y = y};
    assert_int_equal(dt_batch_add_input(&b, "image", DT_F32, 4, (int64_t[]){B, 1, 28, 28}, img), DT_OK);
    run none, blocks;
    train(&c, &b, DT_RECOMPUTE_NONE, &none);
    train(&c, &b, DT_RECOMPUTE_BLOCKS, &blocks);
    assert_true(none.n_buffers == 2 * (3 + 4));
    assert_same_run(&none, &blocks);   /* running mean/var included */
    free_run(&none);
    free_run(&blocks);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpt2_with_dropout),
        cmocka_unit_test(test_cnn_batchnorm_updates_once),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
