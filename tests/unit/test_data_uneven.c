/* The uneven split of a text directory (dt_dataset_opts.part_rank /
 * part_world): file k (name order) goes to part k % parts, clipped to the
 * training tokens (the first 90% of the stream); the eval split is the
 * held-out tail on every part; a part too short fails on every part, naming
 * it; data that cannot be split by file is refused. Expected contents are
 * written out from the file layout below, not derived from the code. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtrain/data.h"
#include "tmpdir.h"

static char g_dir[256];

/* a: 100 x 'a', b: 30 x 'b', c: 50 x 'c', d: 20 x 'd' -> 200 tokens; the eval
 * tail is the last 20 (all of d), training = a b c (180 tokens). */
static int group_setup(void **state) {
    (void)state;
    if (dt_test_tmpdir(g_dir, sizeof g_dir, "uneven")) return -1;
    const char names[4] = {'a', 'b', 'c', 'd'};
    const int sizes[4] = {100, 30, 50, 20};
    for (int i = 0; i < 4; i++) {
        char path[512];
        snprintf(path, sizeof path, "%s/%c.txt", g_dir, names[i]);
        FILE *f = fopen(path, "wb");
        if (!f) return -1;
        for (int k = 0; k < sizes[i]; k++) fputc(names[i], f);
        fclose(f);
    }
    return 0;
}

static int group_teardown(void **state) {
    (void)state;
    dt_test_rm_rf(g_dir);
    return 0;
}

static void open_part(int rank, int world, int64_t seq, dt_dataset *d) {
    dt_dataset_opts o = {.path = g_dir, .seq = seq, .part_rank = rank, .part_world = world};
    assert_int_equal(dt_dataset_open("text", &o, d), DT_OK);
}

/* sample i of split sp: x must be all `cx`, y all `cy` except the last target `last` */
static void expect_sample(const dt_dataset *d, dt_split sp, int64_t i, char cx, char last) {
    int32_t x[16], y[16];
    void *xs[1] = {x};
    dt_dataset_batch(d, sp, &i, 1, xs, y);
    for (int t = 0; t < 10; t++) {
        assert_int_equal(x[t], cx);
        assert_int_equal(y[t], t == 9 ? last : cx);
    }
}

static void test_parts_of_two(void **state) {
    (void)state;
    dt_dataset d;
    open_part(0, 2, 10, &d);   /* a + c: 150 tokens -> (150 - 1) / 10 windows */
    assert_int_equal(d.size[DT_SPLIT_TRAIN], 14);
    assert_int_equal(d.size[DT_SPLIT_EVAL], 1);   /* d's 20 tokens */
    expect_sample(&d, DT_SPLIT_TRAIN, 0, 'a', 'a');
    expect_sample(&d, DT_SPLIT_TRAIN, 9, 'a', 'c');   /* tokens 90..100: a's last, then c */
    expect_sample(&d, DT_SPLIT_TRAIN, 13, 'c', 'c');
    expect_sample(&d, DT_SPLIT_EVAL, 0, 'd', 'd');
    dt_dataset_close(&d);
    open_part(1, 2, 10, &d);   /* b + d clipped to nothing: 30 tokens */
    assert_int_equal(d.size[DT_SPLIT_TRAIN], 2);
    assert_int_equal(d.size[DT_SPLIT_EVAL], 1);
    expect_sample(&d, DT_SPLIT_TRAIN, 1, 'b', 'b');
    expect_sample(&d, DT_SPLIT_EVAL, 0, 'd', 'd');
    dt_dataset_close(&d);
    open_part(0, 1, 10, &d);   /* one part: the whole training stream, as without a split */
    assert_int_equal(d.size[DT_SPLIT_TRAIN], 17);
    dt_dataset_close(&d);
}

static void test_parts_of_three(void **state) {
    (void)state;
    dt_dataset d;
    open_part(2, 3, 10, &d);   /* c only */
    assert_int_equal(d.size[DT_SPLIT_TRAIN], 4);
    expect_sample(&d, DT_SPLIT_TRAIN, 3, 'c', 'c');
    dt_dataset_close(&d);
}

static void expect_refused(int rank, int world, int64_t seq, const char *path, const char *data, const char *needle) {
    dt_dataset d;
    dt_dataset_opts o = {.path = path, .seq = seq, .part_rank = rank, .part_world = world};
    dt_error_clear();
    assert_int_not_equal(dt_dataset_open(data, &o, &d), DT_OK);
    if (!strstr(dt_error_message(), needle)) fail_msg("error \"%s\" lacks \"%s\"", dt_error_message(), needle);
}

static void test_refused(void **state) {
    (void)state;
    expect_refused(0, 5, 10, g_dir, "text", "at least 5 files");
    /* seq 40: part 1 (30 tokens) is too short; part 0 says so too */
    expect_refused(0, 2, 40, g_dir, "text", "rank 1's files");
    expect_refused(1, 2, 40, g_dir, "text", "rank 1's files");
    char file[512];
    snprintf(file, sizeof file, "%s/a.txt", g_dir);
    expect_refused(0, 2, 10, file, "text", "not a directory");
    expect_refused(0, 2, 10, file, "shard", "directory of files");
    expect_refused(0, 2, 10, g_dir, "fashion-mnist", "directory of files");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parts_of_two),
        cmocka_unit_test(test_parts_of_three),
        cmocka_unit_test(test_refused),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
