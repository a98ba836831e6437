/* The dataset interface: the registry opens datasets by name (and names the
 * known ones for an unknown name); token datasets report sizes and shapes
 * from their definition (windows of T+1 tokens, last 10% held out) and fill
 * batches with the right tokens; their loading errors name the file. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "dtrain/data.h"
#include "dtrain/train.h"
#include "tmpdir.h"

static char g_dir[256];

static int group_setup(void **state) {
    (void)state;
    return dt_test_tmpdir(g_dir, sizeof g_dir, "dataset");
}

static int group_teardown(void **state) {
    (void)state;
    dt_test_rm_rf(g_dir);
    return 0;
}

/* Byte i of a generated text file. */
static uint8_t byte_at(int64_t i) { return (uint8_t)(' ' + (i * 7) % 90); }

static const char *write_text(const char *name, int64_t n) {
    static char path[2][512];
    static int k;
    k ^= 1;
    snprintf(path[k], sizeof path[k], "%s/%s", g_dir, name);
    FILE *f = fopen(path[k], "wb");
    assert_non_null(f);
    for (int64_t i = 0; i < n; i++) fputc(byte_at(i), f);
    assert_int_equal(fclose(f), 0);
    return path[k];
}

static void assert_msg_has(const char *needle) {
    if (!strstr(dt_error_message(), needle))
        fail_msg("error message lacks '%s': %s", needle, dt_error_message());
}

static void test_registry_names(void **state) {
    (void)state;
    assert_true(dt_dataset_exists("fashion-mnist"));
    assert_true(dt_dataset_exists("text"));
    assert_true(dt_dataset_exists("shard"));
    assert_false(dt_dataset_exists("imagenet"));
    assert_false(dt_dataset_exists(NULL));
    char buf[128];
    assert_string_equal(dt_dataset_names(buf, sizeof buf), "fashion-mnist, text, shard");
    assert_int_equal(dt_dataset_check_name("text"), DT_OK);
    assert_int_equal(dt_dataset_check_name("imagenet"), DT_EINVAL);
    assert_msg_has("unknown dataset 'imagenet' (fashion-mnist, text, shard)");
    dt_dataset d;
    dt_dataset_opts o = {.seq = 8};
    assert_int_equal(dt_dataset_open("imagenet", &o, &d), DT_EINVAL);
    assert_msg_has("'imagenet'");
    assert_msg_has("fashion-mnist, text, shard");
    assert_null(d.self);
    dt_dataset_close(&d);   /* closing an empty dataset is harmless */
}

/* 1000 bytes, T = 16: the last 100 bytes are held out, so train has
 * (900 - 1) / 16 = 56 windows and eval (100 - 1) / 16 = 6. */
static void test_text_sizes_shape_and_batch(void **state) {
    (void)state;
    dt_dataset d;
    dt_dataset_opts o = {.path = write_text("corpus.txt", 1000), .seq = 16};
    assert_int_equal(dt_dataset_open(DT_DATA_TEXT, &o, &d), DT_OK);
    assert_string_equal(d.name, "text");
    assert_string_equal(d.source, o.path);
    assert_int_equal(d.size[DT_SPLIT_TRAIN], 56);
    assert_int_equal(d.size[DT_SPLIT_EVAL], 6);
    assert_int_equal(d.sample.n_inputs, 1);
    assert_string_equal(d.sample.in[0].name, "ids");
    assert_int_equal(d.sample.in[0].dtype, DT_I32);
    assert_int_equal(d.sample.in[0].ndim, 1);
    assert_int_equal(d.sample.in[0].dims[0], 16);
    assert_int_equal(d.sample.targets, 16);
    assert_int_equal(d.sample.classes, 256);
    assert_int_equal(dt_input_bytes(&d.sample.in[0]), 16 * sizeof(int32_t));
    assert_string_equal(d.unit, "tokens");
    assert_string_equal(d.eval_name, "validation");

    int32_t x[2 * 16], y[2 * 16];
    void *xs[1] = {x};
    int64_t idx[2] = {3, 0};
    dt_batch b = dt_dataset_batch(&d, DT_SPLIT_TRAIN, idx, 2, xs, y);
    assert_int_equal(b.B, 2);
    assert_int_equal(b.T, 16);
    assert_int_equal(b.n_inputs, 1);   /* "ids" int32 [2, 16], a view of x */
    assert_string_equal(b.names[0], "ids");
    assert_int_equal(b.in[0].dtype, DT_I32);
    assert_int_equal(b.in[0].ndim, 2);
    assert_int_equal(b.in[0].shape[0], 2);
    assert_int_equal(b.in[0].shape[1], 16);
    assert_ptr_equal(b.in[0].data, x);
    assert_ptr_equal(dt_batch_input(&b, "ids", DT_I32, "test"), &b.in[0]);
    assert_null(dt_batch_input(&b, "image", DT_F32, "test"));
    assert_non_null(strstr(dt_error_message(), "no input 'image' (it has 'ids')"));
    assert_null(dt_batch_input(&b, "ids", DT_F32, "test"));
    assert_non_null(strstr(dt_error_message(), "'ids' is int32, expected float"));
    assert_ptr_equal(b.y, y);
    for (int s = 0; s < 2; s++)
        for (int i = 0; i < 16; i++) {
            assert_int_equal(x[s * 16 + i], byte_at(idx[s] * 16 + i));
            assert_int_equal(y[s * 16 + i], byte_at(idx[s] * 16 + i + 1));
        }
    /* eval window 1 starts 16 tokens into the held-out tail at byte 900 */
    idx[0] = 1;
    dt_dataset_batch(&d, DT_SPLIT_EVAL, idx, 1, xs, y);
    for (int i = 0; i < 16; i++) {
        assert_int_equal(x[i], byte_at(900 + 16 + i));
        assert_int_equal(y[i], byte_at(900 + 16 + i + 1));
    }
    dt_dataset_close(&d);
    assert_null(d.self);
}

/* With a validation file nothing is held out: train = (400-1)/8 windows. */
static void test_text_val_path(void **state) {
    (void)state;
    dt_dataset d;
    dt_dataset_opts o = {.path = write_text("train.txt", 400), .val_path = write_text("val.txt", 81), .seq = 8};
    assert_int_equal(dt_dataset_open("text", &o, &d), DT_OK);
    assert_int_equal(d.size[DT_SPLIT_TRAIN], 49);
    assert_int_equal(d.size[DT_SPLIT_EVAL], 10);
    dt_dataset_close(&d);
}

static void test_token_errors_name_the_file(void **state) {
    (void)state;
    dt_dataset d;
    dt_dataset_opts o = {.path = write_text("tiny.txt", 10), .seq = 16};
    assert_int_equal(dt_dataset_open("text", &o, &d), DT_EINVAL);
    assert_msg_has("tiny.txt");
    assert_msg_has("too short");
    o.seq = 0;
    assert_int_equal(dt_dataset_open("text", &o, &d), DT_EINVAL);
    assert_msg_has("train.seq");
    dt_dataset_opts none = {.seq = 16};
    assert_int_equal(dt_dataset_open("shard", &none, &d), DT_EINVAL);
    assert_msg_has("train.data_path");
    dt_dataset_opts missing = {.path = "/nonexistent/x.bin", .seq = 16};
    assert_int_not_equal(dt_dataset_open("shard", &missing, &d), DT_OK);
    assert_msg_has("/nonexistent/x.bin");
}

/* A shard's vocabulary is its largest id + 1, over train and eval data. */
static void test_shard_vocab_covers_val(void **state) {
    (void)state;
    uint16_t tr[100], va[20];
    for (int i = 0; i < 100; i++) tr[i] = (uint16_t)(i % 50);
    for (int i = 0; i < 20; i++) va[i] = (uint16_t)(i == 7 ? 999 : i);
    char ptr[512], pva[512];
    snprintf(ptr, sizeof ptr, "%s/train.bin", g_dir);
    snprintf(pva, sizeof pva, "%s/val.bin", g_dir);
    assert_int_equal(dt_token_shard_write(ptr, tr, 100), DT_OK);
    assert_int_equal(dt_token_shard_write(pva, va, 20), DT_OK);
    dt_dataset d;
    dt_dataset_opts o = {.path = ptr, .val_path = pva, .seq = 4};
    assert_int_equal(dt_dataset_open("shard", &o, &d), DT_OK);
    assert_int_equal(d.sample.classes, 1000);
    assert_int_equal(d.size[DT_SPLIT_TRAIN], 99 / 4);
    assert_int_equal(d.size[DT_SPLIT_EVAL], 19 / 4);
    assert_non_null(strstr(d.classes_source, pva));   /* the file whose ids set the vocabulary */
    assert_string_equal(d.source, ptr);                /* (the training samples' messages name theirs) */
    dt_dataset_close(&d);
    /* a model with 256 ids is refused at creation, naming that file and its largest id */
    dt_train_opts to;
    dt_train_opts_default(&to);
    to.model = dt_model_cfg_default(DT_MODEL_GPT2);
    to.model.n_layer = 1; to.model.n_embd = 16; to.model.n_head = 2; to.model.max_t = 8;
    to.data = "shard"; to.data_path = ptr; to.val_path = pva; to.seq = 4; to.batch = 2; to.steps = 1;
    dt_trainer *t = NULL;
    assert_int_equal(dt_trainer_create(&to, NULL, &t), DT_EINVAL);
    assert_null(t);
    assert_msg_has(pva);
    assert_msg_has("ids up to 999");
}

/* llm.c's layout: train and val shards in one directory. With train.val_path
 * naming the val shard, the directory's training data is the other shards
 * only (the val shard was trained on too); the directory itself as
 * val_path is refused; a validation split too short names val_path. */
static void test_shard_val_inside_dir_held_out(void **state) {
    (void)state;
    char dir[512], ptr[600], pva[600];
    snprintf(dir, sizeof dir, "%s/llmc", g_dir);
    assert_int_equal(mkdir(dir, 0755), 0);
    uint16_t tr[100], va[40];
    for (int i = 0; i < 100; i++) tr[i] = (uint16_t)(i % 50);
    for (int i = 0; i < 40; i++) va[i] = (uint16_t)(i % 30);
    snprintf(ptr, sizeof ptr, "%s/tiny_train.bin", dir);
    snprintf(pva, sizeof pva, "%s/tiny_val.bin", dir);
    assert_int_equal(dt_token_shard_write(ptr, tr, 100), DT_OK);
    assert_int_equal(dt_token_shard_write(pva, va, 40), DT_OK);
    dt_dataset d;
    dt_dataset_opts o = {.path = dir, .val_path = pva, .seq = 4};
    assert_int_equal(dt_dataset_open("shard", &o, &d), DT_OK);
    assert_int_equal(d.size[DT_SPLIT_TRAIN], 99 / 4);   /* 139 / 4 with the val shard in */
    assert_int_equal(d.size[DT_SPLIT_EVAL], 39 / 4);
    dt_dataset_close(&d);
    /* split by file between two parts: each gets one training shard, none the val shard */
    char ptr2[600];
    snprintf(ptr2, sizeof ptr2, "%s/tiny_train2.bin", dir);
    assert_int_equal(dt_token_shard_write(ptr2, tr, 100), DT_OK);
    o.part_world = 2;
    for (o.part_rank = 0; o.part_rank < 2; o.part_rank++) {
        assert_int_equal(dt_dataset_open("shard", &o, &d), DT_OK);
        assert_int_equal(d.size[DT_SPLIT_TRAIN], 99 / 4);
        assert_int_equal(d.size[DT_SPLIT_EVAL], 39 / 4);
        dt_dataset_close(&d);
    }
    dt_dataset_opts same = {.path = dir, .val_path = dir, .seq = 4};
    assert_int_equal(dt_dataset_open("shard", &same, &d), DT_EINVAL);
    assert_msg_has("is the training data");
    dt_dataset_opts holds = {.path = ptr, .val_path = dir, .seq = 4};   /* the validation directory holds it */
    assert_int_equal(dt_dataset_open("shard", &holds, &d), DT_EINVAL);
    assert_msg_has("holds the training file");
    same.eval_only = 1;   /* evaluating only: scoring the training data is the caller's choice */
    assert_int_equal(dt_dataset_open("shard", &same, &d), DT_OK);
    dt_dataset_close(&d);
    /* a validation split shorter than a window names the validation file */
    uint16_t few[3] = {1, 2, 3};
    char pshort[600];
    snprintf(pshort, sizeof pshort, "%s/short.bin", g_dir);
    assert_int_equal(dt_token_shard_write(pshort, few, 3), DT_OK);
    dt_train_opts to;
    dt_train_opts_default(&to);
    to.model = dt_model_cfg_default(DT_MODEL_GPT2);
    to.model.n_layer = 1; to.model.n_embd = 16; to.model.n_head = 2; to.model.max_t = 8;
    to.data = "shard"; to.data_path = ptr; to.val_path = pshort; to.seq = 4; to.batch = 2; to.steps = 1;
    dt_trainer *t = NULL;
    assert_int_equal(dt_trainer_create(&to, NULL, &t), DT_EINVAL);
    assert_msg_has("train.val_path");
    assert_msg_has("short.bin");
}

static void test_shape_strings(void **state) {
    (void)state;
    char buf[128];
    dt_sample_shape img = {.n_inputs = 1, .in = {{"image", DT_F32, 3, {1, 28, 28}, 0, 0}}, .targets = 1, .classes = 10};
    dt_sample_shape tok = {.n_inputs = 1, .in = {{"ids", DT_I32, 1, {64}, 0, 0}}, .targets = 64, .classes = 256};
    dt_sample_shape two = {.n_inputs = 2, .in = {{"ids", DT_I32, 1, {8}, 0, 0}, {"mask", DT_F32, 1, {8}, 0, 0}},
                           .targets = 8, .classes = 50};
    assert_string_equal(dt_sample_shape_str(&img, buf, sizeof buf), "float [1, 28, 28] (10 classes)");
    assert_string_equal(dt_sample_shape_str(&tok, buf, sizeof buf), "int32 [64] (vocab 256)");
    assert_string_equal(dt_sample_shape_str(&two, buf, sizeof buf), "'ids' int32 [8], 'mask' float [8] (vocab 50)");
    assert_int_equal(dt_input_numel(&img.in[0]), 784);
    assert_int_equal(dt_input_bytes(&img.in[0]), 784 * sizeof(float));
    char tiny[8];   /* truncates, stays terminated */
    dt_sample_shape_str(&img, tiny, sizeof tiny);
    assert_int_equal(strlen(tiny), 7);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_registry_names),
        cmocka_unit_test(test_text_sizes_shape_and_batch),
        cmocka_unit_test(test_text_val_path),
        cmocka_unit_test(test_token_errors_name_the_file),
        cmocka_unit_test(test_shard_vocab_covers_val),
        cmocka_unit_test(test_shard_val_inside_dir_held_out),
        cmocka_unit_test(test_shape_strings),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
