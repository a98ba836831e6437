/* Output paths are checked when the trainer is created, before any training:
 * --save, --trace and --metrics that cannot be written fail naming the flag
 * and the path; the check leaves no file behind when the run then fails; a
 * sharded --save DIR (a strategy whose save() writes a directory) is checked
 * as a directory and not created early; and a trace that cannot be written at
 * the end is reported by dt_trainer_finish instead of being lost. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <stdio.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>

#include "dtrain/train.h"
#include "tmpdir.h"

static char g_dir[256];

static int setup(void **state) {
    (void)state;
    return dt_test_tmpdir(g_dir, sizeof g_dir, "outputs");
}

static int teardown(void **state) {
    (void)state;
    dt_test_rm_rf(g_dir);
    return 0;
}

/* a tiny GPT-2 on the default text data: quick to create and step */
static void tiny_opts(dt_train_opts *o) {
    dt_train_opts_default(o);
    o->model = dt_model_cfg_default(DT_MODEL_GPT2);
    o->model.n_layer = 1; o->model.n_embd = 16; o->model.n_head = 2; o->model.max_t = 8;
    o->data = DT_DATA_TEXT;
    o->seq = 8; o->batch = 2; o->steps = 2; o->quiet = 1;
}

static void expect_create_fails(const dt_train_opts *o, const char *flag, const char *path) {
    dt_trainer *t = NULL;
    dt_error_clear();
    assert_int_not_equal(dt_trainer_create(o, NULL, &t), DT_OK);
    assert_null(t);
    if (!strstr(dt_error_message(), flag) || !strstr(dt_error_message(), path))
        fail_msg("wanted '%s' and '%s' in: %s", flag, path, dt_error_message());
}

static int entries(const char *dir) {   /* files in dir, "." and ".." not counted */
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(d);
    return n;
}

static void test_unwritable_paths_fail_at_create(void **state) {
    (void)state;
    char file[512], under_file[600];
    snprintf(file, sizeof file, "%s/plain", g_dir);
    FILE *f = fopen(file, "w");
    assert_non_null(f);
    assert_int_equal(fclose(f), 0);
    snprintf(under_file, sizeof under_file, "%s/x.st", file);   /* its parent is a file */
    const char *bad[] = {"/nonexistent_dt_dir/x.st", under_file, g_dir /* a directory, not a file */};
    for (int i = 0; i < 3; i++) {
        dt_train_opts o;
        tiny_opts(&o);
        o.save = bad[i];
        expect_create_fails(&o, "train.save", bad[i]);
        tiny_opts(&o);
        o.trace = bad[i];
        expect_create_fails(&o, "train.trace", bad[i]);
        tiny_opts(&o);
        o.metrics = bad[i];
        expect_create_fails(&o, "train.metrics", bad[i]);
    }
    /* a device or pipe would be replaced by the atomic rename: refused */
    dt_train_opts o;
    tiny_opts(&o);
    o.trace = "/dev/null";
    expect_create_fails(&o, "train.trace", "not a regular file");
    dt_test_rm_rf(file);
}

/* All three outputs writable, but the data path is wrong: the run fails at
 * creation and the output directory is as empty as before. */
static void test_no_files_left_behind(void **state) {
    (void)state;
    char save[512], trace[512], metrics[512];
    snprintf(save, sizeof save, "%s/x.st", g_dir);
    snprintf(trace, sizeof trace, "%s/t.json", g_dir);
    snprintf(metrics, sizeof metrics, "%s/m.jsonl", g_dir);
    dt_train_opts o;
    tiny_opts(&o);
    o.save = save; o.trace = trace; o.metrics = metrics;
    o.data_path = "/nonexistent_dt_data.txt";
    expect_create_fails(&o, "/nonexistent_dt_data.txt", "");
    assert_int_equal(entries(g_dir), 0);
}

/* A strategy that saves a directory: an existing file there is refused, a
 * directory not yet there is fine (its parent takes it): it is made at start
 * and holds the job's lock (one writer per directory) until the trainer is
 * freed; a directory that exists must take files. */
static void test_sharded_save_dir(void **state) {
    (void)state;
    dt_strategy sharded = {.name = "sharded", .rank = 0, .world = 1, .save_is_dir = 1};
    char file[512], dir[512], deep[600];
    snprintf(file, sizeof file, "%s/ckpt.st", g_dir);
    FILE *f = fopen(file, "w");
    assert_non_null(f);
    assert_int_equal(fclose(f), 0);
    dt_train_opts o;
    tiny_opts(&o);
    o.save = file;
    dt_trainer *t = NULL;
    assert_int_equal(dt_trainer_create(&o, &sharded, &t), DT_EINVAL);
    assert_null(t);
    assert_non_null(strstr(dt_error_message(), "train.save"));
    assert_non_null(strstr(dt_error_message(), "not a directory"));

    snprintf(dir, sizeof dir, "%s/shards", g_dir);
    o.save = dir;
    assert_int_equal(dt_trainer_create(&o, &sharded, &t), DT_OK);
    struct stat sb;
    char lock[700];
    snprintf(lock, sizeof lock, "%s/.dtrain.lock", dir);
    assert_int_equal(stat(lock, &sb), 0);   /* made and locked at start (a second job: test_ckpt_dir_lock.sh) */
    dt_trainer_free(t);
    dt_test_rm_rf(dir);

    snprintf(deep, sizeof deep, "%s/missing/shards", g_dir);
    o.save = deep;
    expect_create_fails(&o, "train.save", deep);
    dt_test_rm_rf(file);
}

/* The trace is written at the end; when that fails the caller hears of it. */
static void test_trace_write_failure_reported(void **state) {
    (void)state;
    char sub[512], trace[600];
    snprintf(sub, sizeof sub, "%s/gone", g_dir);
    assert_int_equal(mkdir(sub, 0700), 0);
    snprintf(trace, sizeof trace, "%s/t.json", sub);
    dt_train_opts o;
    tiny_opts(&o);
    o.trace = trace;
    dt_trainer *t = NULL;
    assert_int_equal(dt_trainer_create(&o, NULL, &t), DT_OK);
    assert_int_equal(dt_trainer_step(t, NULL), DT_OK);
    dt_test_rm_rf(sub);   /* the directory vanishes mid-run */
    dt_error_clear();
    assert_int_equal(dt_trainer_finish(t), DT_EIO);
    assert_non_null(strstr(dt_error_message(), trace));
    assert_int_equal(dt_trainer_finish(t), DT_OK);   /* finished once: nothing left to report */
    /* its strategy and outputs are gone: every other call is refused, naming finish */
    assert_int_equal(dt_trainer_step(t, NULL), DT_ESTATE);
    assert_non_null(strstr(dt_error_message(), "dt_trainer_finish already ran"));
    double loss = 0;
    assert_int_equal(dt_trainer_evaluate(t, &loss, NULL), DT_ESTATE);
    assert_true(isnan(loss));
    assert_int_equal(dt_trainer_save(t, trace), DT_ESTATE);
    assert_int_equal(dt_trainer_run(t), DT_ESTATE);
    dt_trainer_free(t);
    assert_int_equal(dt_trainer_step(NULL, NULL), DT_EINVAL);

    /* and when it works, the file is there after dt_trainer_finish */
    assert_int_equal(mkdir(sub, 0700), 0);
    assert_int_equal(dt_trainer_create(&o, NULL, &t), DT_OK);
    assert_int_equal(dt_trainer_step(t, NULL), DT_OK);
    assert_int_equal(dt_trainer_finish(t), DT_OK);
    struct stat sb;
    assert_int_equal(stat(trace, &sb), 0);
    assert_true(sb.st_size > 0);
    dt_trainer_free(t);
    dt_test_rm_rf(sub);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unwritable_paths_fail_at_create),
        cmocka_unit_test(test_no_files_left_behind),
        cmocka_unit_test(test_sharded_save_dir),
        cmocka_unit_test(test_trace_write_failure_reported),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
