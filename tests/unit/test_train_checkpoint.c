/* Checkpoints: round trip is bitwise; stop -> resume equals an uninterrupted
 * run bit for bit (params, optimizer state, data position, dropout seed);
 * corrupt or mismatched checkpoints are rejected with a message. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include "tmpdir.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "dtrain/train.h"

static char dir[64];
static char text_path[128];

static int setup(void **state) {
    (void)state;
    if (dt_test_tmpdir(dir, sizeof dir, "ckpt") != 0) return -1;
    snprintf(text_path, sizeof text_path, "%s/corpus.txt", dir);
    FILE *f = fopen(text_path, "w");
    for (int i = 0; i < 400; i++) fprintf(f, "the quick brown fox %d jumps over the lazy dog.\n", i * 7 % 13);
    fclose(f);
    return 0;
}

static void opts_gpt2(dt_train_opts *o) {
    dt_train_opts_default(o);
    o->model = dt_model_cfg_default(DT_MODEL_GPT2);
    o->model.n_layer = 1; o->model.n_embd = 16; o->model.n_head = 2; o->model.max_t = 16;
    o->model.dropout = 0.1f;   /* masks keyed by (dropout seed, step, sample): resumed at the right step */
    o->data = DT_DATA_TEXT;
    o->data_path = text_path;
    o->batch = 4; o->seq = 16; o->steps = 8; o->quiet = 1;
    o->warmup = 2; o->min_lr = 1e-4f;
}

static void opts_mlp(dt_train_opts *o) {
    dt_train_opts_default(o);
    o->model.mlp_n_hidden = 1; o->model.mlp_hidden[0] = 16;
    o->batch = 32; o->steps = 6; o->quiet = 1;
    o->optim = dt_optim_cfg_default(DT_OPTIM_SGD);
    o->optim.momentum = 0.9f;
}

static float *run_steps(const dt_train_opts *o, int n, const char *save, const char *resume) {
    dt_train_opts oo = *o;
    oo.resume = resume;
    dt_trainer *t;
    assert_int_equal(dt_trainer_create(&oo, NULL, &t), DT_OK);
    for (int i = 0; i < n; i++) assert_int_equal(dt_trainer_step(t, NULL), DT_OK);
    if (save) assert_int_equal(dt_checkpoint_save(t, save), DT_OK);
    size_t bytes = t->model->param_flat.numel * sizeof(float);
    float *out = malloc(bytes);
    memcpy(out, t->model->param_flat.data, bytes);
    dt_trainer_free(t);
    return out;
}

static void check_resume(dt_train_opts *o, const char *tag) {
    char ck[160];
    snprintf(ck, sizeof ck, "%s/%s.safetensors", dir, tag);
    dt_trainer *t;
    assert_int_equal(dt_trainer_create(o, NULL, &t), DT_OK);
    size_t n = t->model->param_flat.numel;
    dt_trainer_free(t);
    float *full = run_steps(o, 8, NULL, NULL);
    float *half = run_steps(o, 3, ck, NULL);
    float *resumed = run_steps(o, 5, NULL, ck);
    assert_memory_not_equal(half, full, n * sizeof(float));   /* the test is not vacuous */
    assert_memory_equal(resumed, full, n * sizeof(float));
    free(full); free(half); free(resumed);
}

static void test_resume_bitwise_gpt2_adamw_dropout(void **state) {
    (void)state;
    dt_train_opts o;
    opts_gpt2(&o);
    check_resume(&o, "gpt2");
}

static void test_resume_bitwise_mlp_sgd(void **state) {
    (void)state;
    dt_train_opts o;
    opts_mlp(&o);
    check_resume(&o, "mlp");
}

static void test_round_trip_and_corruption(void **state) {
    (void)state;
    dt_train_opts o;
    opts_gpt2(&o);
    char ck[160], bad[160];
    snprintf(ck, sizeof ck, "%s/rt.safetensors", dir);
    snprintf(bad, sizeof bad, "%s/bad.safetensors", dir);
    float *p = run_steps(&o, 2, ck, NULL);
    float *q = run_steps(&o, 0, NULL, ck);   /* load only */
    dt_trainer *t;
    assert_int_equal(dt_trainer_create(&o, NULL, &t), DT_OK);
    size_t n = t->model->param_flat.numel;
    assert_int_equal(t->step, 0);
    dt_trainer_free(t);
    assert_memory_equal(p, q, n * sizeof(float));
    /* truncated copy */
    FILE *f = fopen(ck, "rb");
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)sz);
    assert_int_equal(fread(buf, 1, (size_t)sz, f), (size_t)sz);
    fclose(f);
    f = fopen(bad, "wb");
    fwrite(buf, 1, (size_t)sz - 100, f);
    fclose(f);
    dt_train_opts ob = o;
    ob.resume = bad;
    assert_int_not_equal(dt_trainer_create(&ob, NULL, &t), DT_OK);
    assert_non_null(strstr(dt_error_message(), "bad.safetensors"));
    /* a checkpoint from a different model config: message names the setting and both values */
    dt_train_opts oc = o;
    oc.model.n_embd = 32;
    oc.resume = ck;
    assert_int_not_equal(dt_trainer_create(&oc, NULL, &t), DT_OK);
    assert_non_null(strstr(dt_error_message(), "saved with arch.embd 16"));
    assert_non_null(strstr(dt_error_message(), "this run has 32"));
    /* a checkpoint for another optimizer */
    dt_train_opts os = o;
    os.optim = dt_optim_cfg_default(DT_OPTIM_SGD);
    os.resume = ck;
    assert_int_not_equal(dt_trainer_create(&os, NULL, &t), DT_OK);
    assert_non_null(strstr(dt_error_message(), "optimizer"));
    /* another seed: its data order would make the saved position mean other
     * samples (the library took it silently; only the CLI refused) */
    dt_train_opts od = o;
    od.seed = o.seed + 1;
    od.resume = ck;
    assert_int_equal(dt_trainer_create(&od, NULL, &t), DT_EINVAL);
    assert_non_null(strstr(dt_error_message(), "rt.safetensors"));
    assert_non_null(strstr(dt_error_message(), "train.seed"));
    od.eval_only = 1;   /* evaluation keeps no data order: any seed */
    assert_int_equal(dt_trainer_create(&od, NULL, &t), DT_OK);
    dt_trainer_free(t);
    free(buf); free(p); free(q);
}

/* train.eval_only: the checkpoint's parameters evaluate exactly as the
 * trainer that saved them, with no gradient memory, and a step is refused
 * naming the option (there is nothing to step). */
static void test_eval_only(void **state) {
    (void)state;
    dt_train_opts o;
    opts_gpt2(&o);
    o.model.dropout = 0;
    char ck[160];
    snprintf(ck, sizeof ck, "%s/eval.safetensors", dir);
    dt_trainer *t;
    assert_int_equal(dt_trainer_create(&o, NULL, &t), DT_OK);
    for (int i = 0; i < 3; i++) assert_int_equal(dt_trainer_step(t, NULL), DT_OK);
    assert_int_equal(dt_checkpoint_save(t, ck), DT_OK);
    double want, acc;
    assert_int_equal(dt_trainer_evaluate(t, &want, &acc), DT_OK);
    assert_true(t->model->grad_flat.numel > 0);
    dt_trainer_free(t);
    assert_int_equal(dt_trainer_create(NULL, NULL, &t), DT_EINVAL);   /* NULL arguments: an error, not a crash */
    assert_int_equal(dt_trainer_create(&o, NULL, NULL), DT_EINVAL);
    assert_non_null(strstr(dt_error_message(), "out is NULL"));
    dt_train_opts oe = o;
    oe.eval_only = 1;
    oe.resume = ck;
    assert_int_equal(dt_trainer_create(&oe, NULL, &t), DT_OK);
    assert_int_equal(t->model->grad_flat.numel, 0);
    double got;
    assert_int_equal(dt_trainer_evaluate(t, &got, &acc), DT_OK);
    assert_true(got == want);
    assert_int_equal(dt_trainer_step(t, NULL), DT_EINVAL);
    assert_non_null(strstr(dt_error_message(), "eval_only"));
    dt_trainer_free(t);
}

static int teardown(void **state) {
    (void)state;
    dt_test_rm_rf(dir);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_resume_bitwise_gpt2_adamw_dropout),
        cmocka_unit_test(test_resume_bitwise_mlp_sgd),
        cmocka_unit_test(test_round_trip_and_corruption),
        cmocka_unit_test(test_eval_only),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
