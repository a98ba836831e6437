/* The trainer checks that the model takes the dataset's samples before it
 * trains: the built-in MLP and CNN take the images' size (any the model can
 * take); Fashion-MNIST IDX directories whose train and test images differ, or
 * whose images a model cannot take, are refused at trainer creation with a
 * message naming the data and both shapes, and batches never read or write
 * outside their buffers (this suite also runs under ASan). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtrain/log.h"
#include "dtrain/train.h"
#include "tmpdir.h"

#define N_TRAIN 8
#define N_TEST 4

static char g_root[256];

static int group_setup(void **state) {
    (void)state;
    return dt_test_tmpdir(g_root, sizeof g_root, "data_shape");
}

static int group_teardown(void **state) {
    (void)state;
    dt_test_rm_rf(g_root);
    return 0;
}

/* Raw (uncompressed) IDX: magic 0x0000 08 ndim, big-endian uint32 dims, bytes. */
static void write_idx(const char *path, int ndim, const uint32_t *dims, const uint8_t *data, size_t len) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    uint8_t magic[4] = {0, 0, 0x08, (uint8_t)ndim};
    assert_int_equal(fwrite(magic, 1, 4, f), 4);
    for (int i = 0; i < ndim; i++) {
        uint8_t be[4] = {(uint8_t)(dims[i] >> 24), (uint8_t)(dims[i] >> 16), (uint8_t)(dims[i] >> 8), (uint8_t)dims[i]};
        assert_int_equal(fwrite(be, 1, 4, f), 4);
    }
    if (len) assert_int_equal(fwrite(data, 1, len, f), len);
    assert_int_equal(fclose(f), 0);
}

/* Pixel j of image i of a split, and label i: known without reading back. */
static uint8_t pixel(int64_t i, int64_t j) { return (uint8_t)((i * 131 + j * 7 + 3) % 256); }
static uint8_t label(int64_t i) { return (uint8_t)(i % 10); }

static void write_split(const char *dir, const char *prefix, uint32_t n, uint32_t side) {
    char path[512];
    size_t px = (size_t)side * side;
    uint8_t *img = malloc(n * px), lab[16];
    assert_non_null(img);
    for (uint32_t i = 0; i < n; i++) {
        for (size_t j = 0; j < px; j++) img[i * px + j] = pixel(i, (int64_t)j);
        lab[i] = label(i);
    }
    uint32_t idims[3] = {n, side, side}, ldims[1] = {n};
    snprintf(path, sizeof path, "%s/%s-images-idx3-ubyte", dir, prefix);
    write_idx(path, 3, idims, img, n * px);
    snprintf(path, sizeof path, "%s/%s-labels-idx1-ubyte", dir, prefix);
    write_idx(path, 1, ldims, lab, n);
    free(img);
}

/* <root>/<name>/ with N_TRAIN train images of train_side^2 and N_TEST test images of test_side^2. */
static const char *make_fmnist(const char *name, uint32_t train_side, uint32_t test_side) {
    static char dir[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(dir[k], sizeof dir[k], "%s/%s", g_root, name);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "mkdir -p %s", dir[k]);
    assert_int_equal(system(cmd), 0);
    write_split(dir[k], "train", N_TRAIN, train_side);
    write_split(dir[k], "t10k", N_TEST, test_side);
    return dir[k];
}

static void opts_for(dt_train_opts *o, dt_model_kind kind, const char *dir) {
    dt_train_opts_default(o);
    o->model = dt_model_cfg_default(kind);
    o->model.mlp_n_hidden = 1; o->model.mlp_hidden[0] = 8;
    o->model.cnn_c1 = 2; o->model.cnn_c2 = 2; o->model.cnn_fc = 8;
    o->data = DT_DATA_FASHION_MNIST;
    o->data_path = dir;
    o->batch = 4; o->steps = 2; o->quiet = 1;
}

static void assert_msg_has(const char *needle) {
    if (!strstr(dt_error_message(), needle))
        fail_msg("error message lacks '%s': %s", needle, dt_error_message());
}

/* train 28x28 but test 56x56: the eval batches would not fit the buffers. */
static void test_train_and_test_sizes_differ(void **state) {
    (void)state;
    const char *dir = make_fmnist("mixed", 28, 56);
    dt_model_kind kinds[2] = {DT_MODEL_CNN, DT_MODEL_MLP};
    for (int k = 0; k < 2; k++) {
        dt_train_opts o;
        opts_for(&o, kinds[k], dir);
        dt_trainer *t = (dt_trainer *)&o;   /* must be reset to NULL */
        dt_error_clear();
        assert_int_not_equal(dt_trainer_create(&o, NULL, &t), DT_OK);
        assert_null(t);
        assert_msg_has(dir);
        assert_msg_has("t10k-images-idx3-ubyte");   /* the file that differs */
        assert_msg_has("56x56");
        assert_msg_has("28x28");
    }
}

/* One training step and the full evaluation on the trainer's data (under
 * ASan: batches stay inside their buffers). */
static void step_and_evaluate(dt_trainer *t) {
    assert_int_equal(dt_trainer_step(t, NULL), DT_OK);
    double loss = -1, acc = -1;
    assert_int_equal(dt_trainer_evaluate(t, &loss, &acc), DT_OK);
    assert_true(loss > 0 && acc >= 0 && acc <= 1);
}

/* The built-in image models take any image size they can: the MLP's input is
 * the image's pixel count, the CNN's H x W the image's (two 2x2 max-pools:
 * fc1 sees c2 x H/4 x W/4). Parameter counts are worked out by hand below. */
static void test_models_follow_the_image_size(void **state) {
    (void)state;
    struct { uint32_t side; size_t mlp, cnn; } cases[] = {
        /* MLP in-8-10: in*8+8 + 8*10+10; CNN c1=c2=2, fc 8: conv1 50 + bn1 4 + conv2 100 + bn2 4
         * + fc1 (2*(side/4)^2)*8+8 + fc2 90 */
        {56, 3136 * 8 + 8 + 90, 50 + 4 + 100 + 4 + 2 * 14 * 14 * 8 + 8 + 90},
        {20, 400 * 8 + 8 + 90, 50 + 4 + 100 + 4 + 2 * 5 * 5 * 8 + 8 + 90},
        {30, 900 * 8 + 8 + 90, 50 + 4 + 100 + 4 + 2 * 7 * 7 * 8 + 8 + 90},   /* 30 -> 15 -> 7 (floor) */
        {4, 16 * 8 + 8 + 90, 50 + 4 + 100 + 4 + 2 * 1 * 1 * 8 + 8 + 90},     /* the smallest the CNN takes */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char name[32];
        snprintf(name, sizeof name, "side%u", cases[i].side);
        const char *dir = make_fmnist(name, cases[i].side, cases[i].side);
        dt_train_opts o;
        dt_trainer *t = NULL;
        opts_for(&o, DT_MODEL_MLP, dir);
        assert_int_equal(dt_trainer_create(&o, NULL, &t), DT_OK);
        assert_int_equal(t->model_params, cases[i].mlp);
        step_and_evaluate(t);
        dt_trainer_free(t);
        opts_for(&o, DT_MODEL_CNN, dir);
        assert_int_equal(dt_trainer_create(&o, NULL, &t), DT_OK);
        assert_int_equal(t->model_params, cases[i].cnn);
        step_and_evaluate(t);
        dt_trainer_free(t);
    }
}

/* 1x1 and 3x3 images: the MLP takes them (1 and 9 inputs), the CNN cannot
 * (its pools need 4x4): refused naming the data, its shape and the limit. */
static void test_images_too_small_for_the_cnn(void **state) {
    (void)state;
    uint32_t sides[2] = {1, 3};
    for (int i = 0; i < 2; i++) {
        char name[32], shape[64];
        snprintf(name, sizeof name, "tiny%u", sides[i]);
        const char *dir = make_fmnist(name, sides[i], sides[i]);
        dt_train_opts o;
        dt_trainer *t = NULL;
        opts_for(&o, DT_MODEL_CNN, dir);
        dt_error_clear();
        assert_int_equal(dt_trainer_create(&o, NULL, &t), DT_EINVAL);
        assert_null(t);
        assert_msg_has(dir);
        snprintf(shape, sizeof shape, "float [1, %u, %u]", sides[i], sides[i]);
        assert_msg_has(shape);
        snprintf(shape, sizeof shape, "%ux%u", sides[i], sides[i]);
        assert_msg_has(shape);
        assert_msg_has("model cnn");
        assert_msg_has("4..");
        opts_for(&o, DT_MODEL_MLP, dir);
        assert_int_equal(dt_trainer_create(&o, NULL, &t), DT_OK);
        assert_int_equal(t->model_params, (size_t)(sides[i] * sides[i]) * 8 + 8 + 90);
        step_and_evaluate(t);
        dt_trainer_free(t);
    }
}

/* A model the user builds is not resized: an MLP for 784 inputs on 20x20
 * images is refused naming both shapes; GPT-2 takes no images at all. */
static dt_status build_from_cfg(void *user, uint64_t seed, dt_model **out) {
    return dt_model_create(user, seed, out);
}

static void test_images_the_model_cannot_take(void **state) {
    (void)state;
    const char *dir = make_fmnist("small", 20, 20);
    dt_train_opts o;
    dt_trainer *t = NULL;
    opts_for(&o, DT_MODEL_MLP, dir);
    dt_model_cfg c = o.model;   /* input 28*28 = 784 */
    o.build_model = build_from_cfg;
    o.build_user = &c;
    assert_int_equal(dt_trainer_create(&o, NULL, &t), DT_EINVAL);
    assert_null(t);
    assert_msg_has(dir);
    assert_msg_has("float [1, 20, 20]");
    assert_msg_has("float [784]");

    opts_for(&o, DT_MODEL_GPT2, dir);
    assert_int_equal(dt_trainer_create(&o, NULL, &t), DT_EINVAL);
    assert_msg_has("model gpt2 takes 'ids' int32 [<=128], which the data lacks");
}

/* too few outputs for the data's 10 classes */
static void test_too_few_classes(void **state) {
    (void)state;
    const char *dir = make_fmnist("classes", 28, 28);
    dt_train_opts o;
    opts_for(&o, DT_MODEL_MLP, dir);
    o.model.mlp_out = 5;
    dt_trainer *t = NULL;
    assert_int_equal(dt_trainer_create(&o, NULL, &t), DT_EINVAL);
    assert_msg_has("10 classes");
}

typedef struct capture { char text[4096]; int n_info, n_progress; } capture;
static void capture_log(void *ctx, dt_log_level level, const char *msg) {
    capture *c = ctx;
    strncat(c->text, msg, sizeof c->text - strlen(c->text) - 1);
    if (level == DT_LOG_INFO) c->n_info++;
    if (level == DT_LOG_PROGRESS) c->n_progress++;
}

/* An MLP whose input is 20*20 takes the 20x20 images: buffers are sized from
 * the data, training and the final evaluation run on the whole test split. */
static void test_mlp_sized_for_the_images_trains(void **state) {
    (void)state;
    const char *dir = make_fmnist("small_ok", 20, 20);
    dt_train_opts o;
    opts_for(&o, DT_MODEL_MLP, dir);
    o.model.mlp_in = 20 * 20;
    o.quiet = 0;
    dt_trainer *t = NULL;
    assert_int_equal(dt_trainer_create(&o, NULL, &t), DT_OK);
    const dt_sample_shape *s = &t->data.sample;
    assert_int_equal(s->n_inputs, 1);
    assert_string_equal(s->in[0].name, "image");
    assert_int_equal(s->in[0].dtype, DT_F32);
    assert_int_equal(s->in[0].ndim, 3);
    assert_int_equal(s->in[0].dims[0], 1);
    assert_int_equal(s->in[0].dims[1], 20);
    assert_int_equal(s->in[0].dims[2], 20);
    assert_int_equal(s->targets, 1);
    assert_int_equal(t->data.size[DT_SPLIT_TRAIN], N_TRAIN);
    assert_int_equal(t->data.size[DT_SPLIT_EVAL], N_TEST);

    static capture cap;
    memset(&cap, 0, sizeof cap);
    dt_log_set_handler(capture_log, &cap);
    dt_status st = dt_trainer_run(t);
    dt_log_set_handler(NULL, NULL);
    assert_int_equal(st, DT_OK);
    /* 400*8 + 8 + 8*10 + 10 parameters; 2 steps of batch 4 */
    assert_non_null(strstr(cap.text, "dtrain: mlp, 3298 parameters, single x1, 2 steps of 4 samples\n"));
    assert_non_null(strstr(cap.text, "samples/s"));
    double loss, acc;
    assert_int_equal(dt_trainer_evaluate(t, &loss, &acc), DT_OK);
    char want[128];
    snprintf(want, sizeof want, "test accuracy: %.4f  test loss: %.4f\n", acc, loss);
    assert_non_null(strstr(cap.text, want));
    assert_int_equal(cap.n_info, 3);      /* start line, GEMM backend line, result line */
    assert_int_equal(cap.n_progress, 2);  /* one line per step (not a terminal) */
    dt_trainer_free(t);
}

/* A user's model through build_model: blocks it marks for recompute stay
 * marked unless the run asks for a mode; a model left unbuilt is refused. */
static dt_status build_marked(void *user, uint64_t seed, dt_model **out) {
    const dt_model_cfg *c = user;
    DT_TRY(dt_model_create(c, seed, out));
    (*out)->blocks[0].recompute = 1;
    return DT_OK;
}
static dt_status build_unbuilt(void *user, uint64_t seed, dt_model **out) {
    (void)user;
    return dt_model_new("half", seed, out);
}

static void test_build_model(void **state) {
    (void)state;
    const char *dir = make_fmnist("build_model", 28, 28);
    dt_train_opts o;
    opts_for(&o, DT_MODEL_MLP, dir);
    dt_model_cfg c = o.model;
    o.build_model = build_marked;
    o.build_user = &c;
    dt_trainer *t = NULL;
    assert_int_equal(dt_trainer_create(&o, NULL, &t), DT_OK);
    assert_int_equal(t->model->n_blocks, 2);
    assert_int_equal(t->model->blocks[0].recompute, 1);   /* default mode none: the user's mark kept */
    assert_int_equal(dt_trainer_step(t, NULL), DT_OK);
    dt_trainer_free(t);
    o.recompute = DT_RECOMPUTE_BLOCKS;
    c.mlp_n_hidden = 2; c.mlp_hidden[1] = 8;
    assert_int_equal(dt_trainer_create(&o, NULL, &t), DT_OK);
    assert_int_equal(t->model->blocks[1].recompute, 1);
    assert_int_equal(t->model->blocks[2].recompute, 0);   /* never the last */
    dt_trainer_free(t);
    o.build_model = build_unbuilt;
    assert_int_equal(dt_trainer_create(&o, NULL, &t), DT_EINVAL);
    assert_null(t);
    assert_msg_has("model half: build_model must end with dt_model_build");
}

int main(void) {
    unsetenv("DTRAIN_TTY");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_train_and_test_sizes_differ),
        cmocka_unit_test(test_models_follow_the_image_size),
        cmocka_unit_test(test_images_too_small_for_the_cnn),
        cmocka_unit_test(test_images_the_model_cannot_take),
        cmocka_unit_test(test_too_few_classes),
        cmocka_unit_test(test_mlp_sized_for_the_images_trains),
        cmocka_unit_test(test_build_model),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
