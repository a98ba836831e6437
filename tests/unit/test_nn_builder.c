/* The public model builder: registration and initialisation, builder errors
 * (sticky, reported by dt_model_build), blocks checked against their
 * declarations, any range of blocks run alone equals the whole forward, and
 * whether a model takes a dataset's samples. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dtrain/nn.h"

static void assert_msg_has(const char *needle) {
    if (!strstr(dt_error_message(), needle)) fail_msg("error message lacks '%s': %s", needle, dt_error_message());
}

/* ---- a 3-block net: in [4] -> fc0 [6] -> relu, fc1 [6] -> relu, fc2 [3] ---- */
typedef struct net { dt_module *fc[3]; int64_t out_override; } net;

static dt_tensor *first(dt_model *m, dt_graph *g, dt_tensor *x, const dt_batch *b, void *user) {
    (void)m; (void)x;
    const dt_tensor *in = dt_batch_input(b, "x", DT_F32, "test");
    if (!in) return NULL;
    dt_tensor *v = dt_graph_tensor(g, 2, (int64_t[]){b->B, 4});
    if (!v) return NULL;
    v->data = in->data;
    dt_tensor *h = dt_nn_linear(g, ((net *)user)->fc[0], v);
    return h ? dt_op_relu(g, h) : NULL;
}
static dt_tensor *middle(dt_model *m, dt_graph *g, dt_tensor *x, const dt_batch *b, void *user) {
    (void)m; (void)b;
    dt_tensor *h = dt_nn_linear(g, ((net *)user)->fc[1], x);
    return h ? dt_op_relu(g, h) : NULL;
}
static dt_tensor *last(dt_model *m, dt_graph *g, dt_tensor *x, const dt_batch *b, void *user) {
    (void)m; (void)b;
    net *n = user;
    dt_tensor *y = dt_nn_linear(g, n->fc[2], x);
    if (y && n->out_override) {   /* a block that returns other than it declared */
        y = dt_op_reshape(g, y, 3, (int64_t[]){b->B, 1, 3});
    }
    return y;
}

static dt_model *build_net(net *n, uint64_t seed) {
    dt_model *m;
    assert_int_equal(dt_model_new("tiny", seed, &m), DT_OK);
    assert_int_equal(dt_model_add_input(m, &(dt_input_spec){.name = "x", .dtype = DT_F32, .ndim = 1, .dims = {4}}), DT_OK);
    int64_t w[4] = {4, 6, 6, 3};
    for (int i = 0; i < 3; i++) {
        char name[16];
        snprintf(name, sizeof name, "fc%d", i);
        n->fc[i] = dt_nn_add_linear(m, name, w[i], w[i + 1]);
        assert_non_null(n->fc[i]);
    }
    assert_int_equal(dt_model_add_block(m, "first", first, n, 0, NULL, 1, &w[1]), DT_OK);
    assert_int_equal(dt_model_add_block(m, "middle", middle, n, 1, &w[1], 1, &w[2]), DT_OK);
    assert_int_equal(dt_model_add_block(m, "last", last, n, 1, &w[2], 1, &w[3]), DT_OK);
    assert_int_equal(dt_model_set_loss(m, DT_LOSS_CROSS_ENTROPY, 3), DT_OK);
    assert_int_equal(dt_model_build(m), DT_OK);
    return m;
}

static float X[5 * 4] = {0.1f, -0.2f, 0.3f, 0.9f, 1.0f, 0.5f, -0.7f, 0.2f, -0.3f, 0.8f,
                         0.4f, -0.1f, 0.6f, -0.9f, 0.05f, 0.3f, -0.5f, 0.25f, 0.7f, -0.4f};
static int32_t Y[5] = {0, 2, 1, 2, 0};

static dt_batch batch(void) {
    dt_batch b = {.B = 5, .T = 1, .y = Y};
    assert_int_equal(dt_batch_add_input(&b, "x", DT_F32, 2, (int64_t[]){4, 5}, X), DT_EINVAL);   /* B first */
    assert_msg_has("batch input 'x' must be F32 or I32 [B = 5, ...]");
    assert_int_equal(dt_batch_add_input(&b, "x", DT_F32, 2, (int64_t[]){5, 4}, X), DT_OK);
    return b;
}

static void test_registration_and_init(void **state) {
    (void)state;
    net n = {0}, n2 = {0}, n3 = {0};
    dt_model *m = build_net(&n, 7), *same = build_net(&n2, 7), *other = build_net(&n3, 8);
    assert_int_equal(m->n_params, 6);
    const char *names[6] = {"fc0.weight", "fc0.bias", "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"};
    for (int i = 0; i < 6; i++) {
        assert_string_equal(m->params[i]->name, names[i]);
        assert_int_equal(m->params[i]->weight_decay, i % 2 == 0);   /* matrices only */
    }
    assert_int_equal(m->params[0]->value.shape[0], 6);   /* torch layout: weight [out, in] */
    assert_int_equal(m->params[0]->value.shape[1], 4);
    assert_int_equal(dt_model_num_params(m), 6 * 4 + 6 + 6 * 6 + 6 + 3 * 6 + 3);
    /* uniform(+-1/sqrt(in)), seeded: same seed same weights, another seed others */
    const float *w = dt_f32(&m->params[0]->value);
    float maxabs = 0;
    for (int i = 0; i < 24; i++) maxabs = fmaxf(maxabs, fabsf(w[i]));
    assert_true(maxabs <= 0.5f && maxabs > 0.25f);
    assert_memory_equal(m->param_flat.data, same->param_flat.data, m->param_flat.numel * sizeof(float));
    assert_memory_not_equal(m->param_flat.data, other->param_flat.data, m->param_flat.numel * sizeof(float));
    /* the layernorm helper: weight 1, bias 0, no rng draw */
    dt_model *ln;
    assert_int_equal(dt_model_new("ln", 1, &ln), DT_OK);
    dt_module *mod = dt_nn_add_layernorm(ln, "norm", 3);
    assert_non_null(mod);
    assert_string_equal(mod->params[1]->name, "norm.bias");
    for (int i = 0; i < 3; i++) {
        assert_true(dt_f32(&mod->params[0]->value)[i] == 1.0f);
        assert_true(dt_f32(&mod->params[1]->value)[i] == 0.0f);
    }
    dt_model_free(ln);
    dt_model_free(m); dt_model_free(same); dt_model_free(other);
}

static dt_tensor *noop(dt_model *m, dt_graph *g, dt_tensor *x, const dt_batch *b, void *user) {
    (void)m; (void)g; (void)b; (void)user;
    return x;
}

/* One failure is remembered: later adds do nothing, build reports the first. */
static void test_builder_errors_are_sticky(void **state) {
    (void)state;
    dt_model *m;
    assert_int_equal(dt_model_new("", 1, &m), DT_EINVAL);
    assert_int_equal(dt_model_new("x", 1, NULL), DT_EINVAL);   /* NULL arguments: an error, not a crash */
    assert_msg_has("out is NULL");
    assert_int_equal(dt_model_create(NULL, 1, &m), DT_EINVAL);
    assert_msg_has("cfg is NULL");
    assert_int_equal(dt_model_new("e", 1, &m), DT_OK);
    assert_non_null(dt_model_add_module(m, "a"));
    assert_null(dt_model_add_module(m, "a"));
    assert_msg_has("module 'a' added twice");
    assert_null(dt_model_add_module(m, "b"));   /* sticky */
    dt_error_clear();
    assert_int_equal(dt_model_build(m), DT_EINVAL);
    assert_msg_has("module 'a' added twice");   /* the first error's own message, kept by the model */
    dt_model_free(m);

    /* a shape that cannot be allocated names the parameter: a negative
     * dimension, and an element count past DT_TENSOR_MAX_NUMEL (2^31 x 2^31
     * wrapped to a crash or an empty parameter) */
    int64_t shapes[3][2] = {{4, -1}, {(int64_t)1 << 31, (int64_t)1 << 31}, {(int64_t)1 << 40, (int64_t)1 << 40}};
    const char *needles[3] = {"parameter 'fc.weight': negative dimension -1", "parameter 'fc.weight': tensor shape",
                              "parameter 'fc.weight': tensor shape"};
    for (int k = 0; k < 3; k++) {
        assert_int_equal(dt_model_new("e", 1, &m), DT_OK);
        dt_module *fc = dt_model_add_module(m, "fc");
        assert_null(dt_model_add_param(m, fc, "weight", 2, shapes[k], DT_INIT_ZERO));
        assert_msg_has(needles[k]);
        assert_null(dt_model_add_param(m, fc, "bias", 1, (int64_t[]){4}, DT_INIT_ZERO));   /* sticky */
        assert_int_equal(dt_model_build(m), DT_EINVAL);
        assert_msg_has(needles[k]);
        dt_model_free(m);
    }

    int64_t d3[1] = {3}, bad[1] = {0};
    const dt_input_spec in = {.name = "x", .dtype = DT_F32, .ndim = 1, .dims = {3}};
    struct { const char *needle; int case_; } cases[] = {
        {"parameter 'p.w' added twice", 0}, {"block b output dim 0 is 0", 1}, {"declares no input", 2},
        {"has no blocks", 3},               {"has no loss head", 4},        {"must read the batch", 5},
        {"takes other dims than block", 6}, {"must return [.., 5]", 7},     {"input 'x' is declared twice", 8},
        {"cannot add module 'late' after dt_model_build", 9},
        {"returns a sequence-parallel share of the positions", 10},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        assert_int_equal(dt_model_new("e", 1, &m), DT_OK);
        int c = cases[k].case_;
        if (c != 2) dt_model_add_input(m, &in);
        if (c == 0) {
            dt_module *p = dt_model_add_module(m, "p");
            dt_model_add_param(m, p, "w", 1, d3, DT_INIT_ZERO);
            assert_null(dt_model_add_param(m, p, "w", 1, d3, DT_INIT_ZERO));
            assert_msg_has(cases[k].needle);
        }
        if (c == 1) {
            assert_int_equal(dt_model_add_block(m, "b", noop, NULL, 0, NULL, 1, bad), DT_EINVAL);
            assert_msg_has(cases[k].needle);
        }
        if (c == 5) dt_model_add_block(m, "b", noop, NULL, 1, d3, 1, d3);
        else if (c != 3 && c != 1) dt_model_add_block(m, "b", noop, NULL, 0, NULL, 1, d3);
        if (c == 6) dt_model_add_block(m, "c", noop, NULL, 1, (int64_t[]){4}, 1, d3);
        if (c == 10) dt_model_add_block(m, "c", noop, NULL, 1, d3, 2, (int64_t[]){DT_DIM_SEQ_PART, 3});
        if (c == 8) {
            assert_int_equal(dt_model_add_input(m, &in), DT_EINVAL);
            assert_msg_has(cases[k].needle);
        }
        if (c != 4) dt_model_set_loss(m, DT_LOSS_CROSS_ENTROPY, c == 7 ? 5 : 3);
        dt_status s = dt_model_build(m);
        if (c == 9) {
            assert_int_equal(s, DT_OK);
            assert_null(dt_model_add_module(m, "late"));
        } else {
            assert_int_not_equal(s, DT_OK);
        }
        assert_msg_has(cases[k].needle);   /* (c = 0, 1, 8: the add's error, reported again at build) */
        dt_model_free(m);
    }
}

/* Misuse of the builder is an error naming the culprit, never a crash: a
 * NULL model, a NULL shape, a parameter with an empty dimension (it broke
 * the optimizer's layout later, naming nothing), no leaf name, another
 * model's module, a buffer added twice or under a parameter's name (both
 * failed only at the first checkpoint save). */
static void test_builder_misuse(void **state) {
    (void)state;
    int64_t d3[1] = {3}, empty[2] = {0, 4};
    dt_error_clear();
    assert_null(dt_model_add_module(NULL, "a"));
    assert_msg_has("cannot add module 'a': the model is NULL");
    assert_null(dt_model_add_param(NULL, NULL, "w", 1, d3, DT_INIT_ZERO));
    assert_msg_has("the model is NULL");
    assert_null(dt_model_add_buffer(NULL, "b", 1, d3, 0.f));
    assert_int_equal(dt_model_build(NULL), DT_EINVAL);
    assert_int_equal(dt_model_add_block(NULL, "b", noop, NULL, 0, NULL, 1, d3), DT_EINVAL);
    assert_null(dt_model_find_param(NULL, "w"));
    /* (each of these dereferenced the NULL model) */
    dt_input_spec in = {.name = "x", .dtype = DT_F32, .ndim = 1, .dims = {3}};
    assert_int_equal(dt_model_add_input(NULL, &in), DT_EINVAL);
    assert_msg_has("the model is NULL");
    assert_int_equal(dt_model_set_loss(NULL, DT_LOSS_CROSS_ENTROPY, 3), DT_EINVAL);
    assert_int_equal(dt_model_set_loss_split(NULL, 4, 2), DT_EINVAL);
    dt_param_split sp = {.dim = 0, .groups = 1, .parts = 2, .index = 0};
    assert_null(dt_model_add_param_split(NULL, NULL, "w", 1, d3, DT_INIT_ZERO, sp));
    assert_msg_has("the model is NULL");
    struct { const char *needle; int case_; } cases[] = {
        {"parameter 'p.w' has 1 dimensions but no shape (NULL)", 0},
        {"parameter 'p.w' has dimension 0 of size 0", 1},
        {"parameter 'p.' has no leaf name", 2},
        {"parameter 'q.w': module q is not this model's", 3},
        {"buffer 'stats' added twice", 4},
        {"buffer 'p.w' has a parameter's name", 5},
        {"buffer 'stats' has 2 dimensions but no shape (NULL)", 6},
        {"block b input has 1 dims but no sizes (NULL)", 7},
        {"parameter 'stats' has a buffer's name", 8},
        {"parameter 'p.w' has 1 dimensions but no shape (NULL)", 9},
    };
    dt_model *other;
    assert_int_equal(dt_model_new("other", 1, &other), DT_OK);
    dt_module *q = dt_model_add_module(other, "q");
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        dt_model *m;
        assert_int_equal(dt_model_new("e", 1, &m), DT_OK);
        dt_module *p = dt_model_add_module(m, "p");
        int c = cases[k].case_;
        if (c == 0) assert_null(dt_model_add_param(m, p, "w", 1, NULL, DT_INIT_ZERO));
        if (c == 1) assert_null(dt_model_add_param(m, p, "w", 2, empty, DT_INIT_ZERO));
        if (c == 2) assert_null(dt_model_add_param(m, p, NULL, 1, d3, DT_INIT_ZERO));
        if (c == 3) assert_null(dt_model_add_param(m, q, "w", 1, d3, DT_INIT_ZERO));
        if (c == 4) {
            assert_non_null(dt_model_add_buffer(m, "stats", 1, d3, 0.f));
            assert_null(dt_model_add_buffer(m, "stats", 1, d3, 0.f));
        }
        if (c == 5) {
            assert_non_null(dt_model_add_param(m, p, "w", 1, d3, DT_INIT_ZERO));
            assert_null(dt_model_add_buffer(m, "p.w", 1, d3, 0.f));
        }
        if (c == 6) assert_null(dt_model_add_buffer(m, "stats", 2, NULL, 0.f));
        if (c == 7) assert_int_equal(dt_model_add_block(m, "b", noop, NULL, 1, NULL, 1, d3), DT_EINVAL);
        if (c == 8) {   /* (it built, trained, and failed at the first save: "duplicate tensor name") */
            assert_non_null(dt_model_add_buffer(m, "stats", 1, d3, 0.f));
            assert_null(dt_model_add_param(m, NULL, "stats", 1, d3, DT_INIT_ZERO));
        }
        if (c == 9) assert_null(dt_model_add_param_split(m, p, "w", 1, NULL, DT_INIT_ZERO, sp));
        assert_msg_has(cases[k].needle);
        assert_int_not_equal(dt_model_build(m), DT_OK);   /* and the build reports it again */
        assert_msg_has(cases[k].needle);
        dt_model_free(m);
    }
    dt_model_free(other);
}

/* Blocks [0, k) then [k, n) and the loss head equal the whole forward,
 * loss and gradients bitwise; a block returning other than it declared is
 * an error naming it. */
static void test_ranges_equal_whole_forward(void **state) {
    (void)state;
    net n = {0};
    dt_model *m = build_net(&n, 3);
    dt_batch b = batch();
    dt_graph *g = dt_graph_create();
    dt_tensor *logits = NULL, *loss = dt_model_forward(m, g, &b, &logits);
    assert_non_null(loss);
    assert_int_equal(logits->shape[0], 5);
    assert_int_equal(logits->shape[1], 3);
    float whole = dt_f32(loss)[0];
    assert_int_equal(dt_graph_backward(g, loss), DT_OK);
    size_t np = m->grad_flat.numel;
    float *gw = malloc(np * sizeof *gw);
    memcpy(gw, m->grad_flat.data, np * sizeof *gw);
    for (int k = 1; k < 3; k++) {
        dt_model_zero_grad(m);
        dt_graph_reset(g);
        dt_tensor *x = dt_model_run_blocks(m, g, &b, 0, k, NULL);
        assert_non_null(x);
        int64_t shape[4];
        assert_int_equal(dt_model_block_shape(m, k, 1, &b, shape), 2);
        assert_int_equal(x->shape[0], shape[0]);
        assert_int_equal(x->shape[1], shape[1]);
        x = dt_model_run_blocks(m, g, &b, k, 3, x);
        assert_non_null(x);
        loss = dt_model_loss(m, g, &b, x, NULL);
        assert_true(dt_f32(loss)[0] == whole);
        assert_int_equal(dt_graph_backward(g, loss), DT_OK);
        assert_memory_equal(m->grad_flat.data, gw, np * sizeof *gw);
    }
    dt_graph_reset(g);
    assert_null(dt_model_run_blocks(m, g, &b, 1, 3, NULL));
    assert_msg_has("block middle needs its input activation x");
    assert_null(dt_model_run_blocks(m, g, &b, 2, 4, NULL));
    assert_msg_has("blocks [2, 4) outside 0..3");
    n.out_override = 1;
    assert_null(dt_model_forward(m, g, &b, NULL));
    assert_msg_has("block last returned [5, 1, 3], declared [5, 3]");
    free(gw);
    dt_graph_free(g);
    dt_model_free(m);
}

static void test_block_shapes_resolve_seq(void **state) {
    (void)state;
    dt_model_cfg c = dt_model_cfg_default(DT_MODEL_GPT2);
    c.n_layer = 2; c.n_embd = 8; c.n_head = 2; c.vocab = 16; c.max_t = 8;
    dt_model *m;
    assert_int_equal(dt_model_create(&c, 1, &m), DT_OK);
    assert_int_equal(m->n_blocks, 4);   /* embed, h.0, h.1, head */
    assert_string_equal(m->blocks[0].name, "embed");
    assert_string_equal(m->blocks[2].name, "h.1");
    assert_string_equal(m->blocks[3].name, "head");
    dt_batch b = {.B = 3, .T = 5};
    int64_t s[4];
    assert_int_equal(dt_model_block_shape(m, 0, 1, &b, s), 0);   /* reads the batch */
    assert_int_equal(dt_model_block_shape(m, 1, 1, &b, s), 3);
    assert_true(s[0] == 3 && s[1] == 5 && s[2] == 8);
    assert_int_equal(dt_model_block_shape(m, 3, 0, &b, s), 3);
    assert_true(s[0] == 3 && s[1] == 5 && s[2] == 16);
    dt_model_free(m);
}

static dt_status check(const dt_model *m, dt_input_spec in, int64_t targets, int64_t classes) {
    dt_sample_shape s = {.n_inputs = 1, .in = {in}, .targets = targets, .classes = classes};
    return dt_model_check_sample(m, &s);
}

static void test_check_sample(void **state) {
    (void)state;
    dt_model_cfg c = dt_model_cfg_default(DT_MODEL_GPT2);
    c.max_t = 16; c.vocab = 100;
    dt_model *gpt, *mlp;
    assert_int_equal(dt_model_create(&c, 1, &gpt), DT_OK);
    c = dt_model_cfg_default(DT_MODEL_MLP);
    assert_int_equal(dt_model_create(&c, 1, &mlp), DT_OK);
    dt_input_spec ids = {.name = "ids", .dtype = DT_I32, .ndim = 1, .dims = {16}};
    assert_int_equal(check(gpt, ids, 16, 100), DT_OK);
    ids.dims[0] = 17;   /* longer than max_t */
    assert_int_equal(check(gpt, ids, 17, 100), DT_EINVAL);
    assert_msg_has("takes 'ids' int32 [<=16]");
    ids.dims[0] = 8;
    assert_int_equal(check(gpt, ids, 8, 101), DT_EINVAL);   /* ids beyond the vocabulary */
    assert_msg_has("values below 100");
    dt_input_spec img = {.name = "image", .dtype = DT_F32, .ndim = 3, .dims = {1, 28, 28}};
    assert_int_equal(check(gpt, img, 1, 10), DT_EINVAL);
    assert_msg_has("which the data lacks");
    assert_int_equal(check(mlp, img, 1, 10), DT_OK);
    img.dims[0] = 4; img.dims[1] = 14; img.dims[2] = 14;   /* flat: any shape of 784 elements */
    assert_int_equal(check(mlp, img, 1, 10), DT_OK);
    img.dims[2] = 13;
    assert_int_equal(check(mlp, img, 1, 10), DT_EINVAL);
    assert_msg_has("any shape of that many elements");
    img.dims[2] = 14;
    assert_int_equal(check(mlp, img, 1, 11), DT_EINVAL);
    assert_msg_has("fewer than the data's 11 classes");
    assert_int_equal(check(mlp, img, 2, 10), DT_EINVAL);   /* the MLP predicts one target per sample */
    assert_msg_has("predicts 1 targets per sample, the data has 2");
    img.dtype = DT_I32;
    assert_int_equal(check(mlp, img, 1, 10), DT_EINVAL);
    dt_model_free(gpt);
    dt_model_free(mlp);
}

/* A batch whose images are smaller than the CNN's (14 x 14 for 28 x 28) is
 * an error naming both sizes, as the MLP's; the convolution read past the
 * batch before. And the loss cannot change once the model is built. */
static void test_cnn_image_size_and_late_loss(void **state) {
    (void)state;
    dt_model_cfg c = dt_model_cfg_default(DT_MODEL_CNN);
    dt_model *m;
    assert_int_equal(dt_model_create(&c, 1, &m), DT_OK);
    float px[2 * 14 * 14] = {0};
    int32_t y[2] = {1, 2};
    dt_batch b = {.B = 2, .T = 1, .y = y};
    int64_t shape[4] = {2, 1, 14, 14};
    assert_int_equal(dt_batch_add_input(&b, "image", DT_F32, 4, shape, px), DT_OK);
    dt_graph *g = dt_graph_create();
    assert_non_null(g);
    dt_error_clear();
    assert_null(dt_model_forward(m, g, &b, NULL));
    assert_msg_has("cnn: image input has 196 elements per sample, expected 28 x 28");
    dt_graph_free(g);
    assert_int_equal(dt_model_set_loss(m, DT_LOSS_CROSS_ENTROPY, 5), DT_ESTATE);
    assert_msg_has("cannot set the loss after dt_model_build");
    dt_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_registration_and_init),
        cmocka_unit_test(test_builder_errors_are_sticky),
        cmocka_unit_test(test_builder_misuse),
        cmocka_unit_test(test_ranges_equal_whole_forward),
        cmocka_unit_test(test_block_shapes_resolve_seq),
        cmocka_unit_test(test_check_sample),
        cmocka_unit_test(test_cnn_image_size_and_late_loss),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
