/* The uneven split (dt_dataset_opts.part_rank / part_world): from a
 * directory (text, token shards) file k (name order) goes to part k % parts,
 * clipped to the training tokens (the first 90% of the stream); the eval
 * split is the held-out tail on every part; a part too short fails on every
 * part, naming it. One file (text, shard) and Fashion-MNIST are cut into
 * contiguous ranges in proportion to rank + 1. Expected contents are
 * written out from the file layout below, not derived from the code. */
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
    /* one file, ranges: a.txt's 90 training tokens, rank 0's third (30) is less than 40 + 1 */
    char file[512];
    snprintf(file, sizeof file, "%s/a.txt", g_dir);
    expect_refused(1, 2, 40, file, "text", "rank 0's range");
}

/* One file: contiguous ranges of the training tokens in proportion to
 * rank + 1. one/ab.txt is 60 x 'a' then 140 x 'b': 180 training tokens, of
 * which rank 0 of 2 gets the first third -- exactly the a's -- and rank 1
 * the 120 b's after them. (A subdirectory: the text directory ignores it.) */
static void test_one_file_ranges(void **state) {
    (void)state;
    char dir[512], path[600];
    snprintf(dir, sizeof dir, "%s/one", g_dir);
    assert_int_equal(mkdir(dir, 0777), 0);
    snprintf(path, sizeof path, "%s/ab.txt", dir);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    for (int k = 0; k < 200; k++) fputc(k < 60 ? 'a' : 'b', f);
    fclose(f);
    dt_dataset d;
    dt_dataset_opts o = {.path = path, .seq = 10, .part_rank = 0, .part_world = 2};
    assert_int_equal(dt_dataset_open("text", &o, &d), DT_OK);
    assert_int_equal(d.size[DT_SPLIT_TRAIN], 5);   /* (60 - 1) / 10 */
    expect_sample(&d, DT_SPLIT_TRAIN, 4, 'a', 'a');
    dt_dataset_close(&d);
    o.part_rank = 1;
    assert_int_equal(dt_dataset_open("text", &o, &d), DT_OK);
    assert_int_equal(d.size[DT_SPLIT_TRAIN], 11);   /* (120 - 1) / 10 */
    expect_sample(&d, DT_SPLIT_TRAIN, 0, 'b', 'b');
    expect_sample(&d, DT_SPLIT_TRAIN, 10, 'b', 'b');
    dt_dataset_close(&d);
}

/* Token shards: a directory of *.bin is split by file like text; one shard
 * into ranges. shards/: s0 = 100 x 1, s1 = 30 x 2, s2 = 50 x 3, s3 = 20 x 4
 * (the text layout above): rank 0 holds s0 + s2, rank 1 s1. */
static void test_shards(void **state) {
    (void)state;
    char dir[512], path[600];
    snprintf(dir, sizeof dir, "%s/shards", g_dir);
    assert_int_equal(mkdir(dir, 0777), 0);
    const int sizes[4] = {100, 30, 50, 20};
    uint16_t tok[100];
    for (int i = 0; i < 4; i++) {
        for (int k = 0; k < sizes[i]; k++) tok[k] = (uint16_t)(i + 1);
        snprintf(path, sizeof path, "%s/s%d.bin", dir, i);
        assert_int_equal(dt_token_shard_write(path, tok, sizes[i]), DT_OK);
    }
    dt_dataset d;
    dt_dataset_opts o = {.path = dir, .seq = 10, .part_rank = 0, .part_world = 2};
    assert_int_equal(dt_dataset_open("shard", &o, &d), DT_OK);
    assert_int_equal(d.size[DT_SPLIT_TRAIN], 14);   /* 150 tokens */
    assert_int_equal(d.size[DT_SPLIT_EVAL], 1);     /* s3's 20 */
    expect_sample(&d, DT_SPLIT_TRAIN, 9, 1, 3);
    expect_sample(&d, DT_SPLIT_EVAL, 0, 4, 4);
    dt_dataset_close(&d);
    o.part_rank = 1;
    assert_int_equal(dt_dataset_open("shard", &o, &d), DT_OK);
    assert_int_equal(d.size[DT_SPLIT_TRAIN], 2);   /* 30 tokens */
    expect_sample(&d, DT_SPLIT_TRAIN, 1, 2, 2);
    dt_dataset_close(&d);
    o.part_world = 0;   /* no split: the directory's shards in name order, as one stream */
    assert_int_equal(dt_dataset_open("shard", &o, &d), DT_OK);
    assert_int_equal(d.size[DT_SPLIT_TRAIN], 17);
    dt_dataset_close(&d);
    /* one shard of 60 x 7 then 140 x 8: ranks 0 and 1 of 2 get the 7s and the first 120 8s */
    snprintf(path, sizeof path, "%s/one/ab.bin", g_dir);
    uint16_t all[200];
    for (int k = 0; k < 200; k++) all[k] = k < 60 ? 7 : 8;
    assert_int_equal(dt_token_shard_write(path, all, 200), DT_OK);
    o = (dt_dataset_opts){.path = path, .seq = 10, .part_rank = 0, .part_world = 2};
    assert_int_equal(dt_dataset_open("shard", &o, &d), DT_OK);
    assert_int_equal(d.size[DT_SPLIT_TRAIN], 5);
    expect_sample(&d, DT_SPLIT_TRAIN, 4, 7, 7);
    dt_dataset_close(&d);
    o.part_rank = 1;
    assert_int_equal(dt_dataset_open("shard", &o, &d), DT_OK);
    assert_int_equal(d.size[DT_SPLIT_TRAIN], 11);
    expect_sample(&d, DT_SPLIT_TRAIN, 0, 8, 8);
    dt_dataset_close(&d);
}

/* Fashion-MNIST: image i has label i % 10; 12 training images over 3 ranks
 * in proportion 1 : 2 : 3 are images 0-1, 2-5 and 6-11; the test split
 * (4 images) is whole on every rank. Raw IDX files (the loader also reads them). */
static void write_be32(FILE *f, uint32_t v) {
    fputc((int)(v >> 24), f); fputc((int)(v >> 16 & 255), f); fputc((int)(v >> 8 & 255), f); fputc((int)(v & 255), f);
}

static void write_fm(const char *dir, const char *prefix, uint32_t n) {
    char path[600];
    snprintf(path, sizeof path, "%s/%s-images-idx3-ubyte", dir, prefix);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputc(0, f); fputc(0, f); fputc(8, f); fputc(3, f);
    write_be32(f, n); write_be32(f, 2); write_be32(f, 2);
    for (uint32_t i = 0; i < n * 4; i++) fputc((int)(i / 4), f);   /* every pixel of image i is i */
    fclose(f);
    snprintf(path, sizeof path, "%s/%s-labels-idx1-ubyte", dir, prefix);
    f = fopen(path, "wb");
    assert_non_null(f);
    fputc(0, f); fputc(0, f); fputc(8, f); fputc(1, f);
    write_be32(f, n);
    for (uint32_t i = 0; i < n; i++) fputc((int)(i % 10), f);
    fclose(f);
}

static void test_fashion_mnist(void **state) {
    (void)state;
    char dir[512];
    snprintf(dir, sizeof dir, "%s/fm", g_dir);
    assert_int_equal(mkdir(dir, 0777), 0);
    write_fm(dir, "train", 12);
    write_fm(dir, "t10k", 4);
    const int64_t first[3] = {0, 2, 6}, count[3] = {2, 4, 6};
    for (int r = 0; r < 3; r++) {
        dt_dataset d;
        dt_dataset_opts o = {.path = dir, .part_rank = r, .part_world = 3};
        assert_int_equal(dt_dataset_open("fashion-mnist", &o, &d), DT_OK);
        assert_int_equal(d.size[DT_SPLIT_TRAIN], count[r]);
        assert_int_equal(d.size[DT_SPLIT_EVAL], 4);
        for (int64_t i = 0; i < count[r]; i++) {
            float x[4];
            int32_t y;
            void *xs[1] = {x};
            dt_dataset_batch(&d, DT_SPLIT_TRAIN, &i, 1, xs, &y);
            assert_int_equal(y, (first[r] + i) % 10);
            /* its pixels are image first[r] + i's (each of value first[r] + i), normalised */
            float want = ((float)(first[r] + i) / 255.0f - 0.2860f) / 0.3530f;
            for (int k = 0; k < 4; k++) assert_float_equal(x[k], want, 1e-5);
        }
        dt_dataset_close(&d);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parts_of_two),
        cmocka_unit_test(test_parts_of_three),
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_one_file_ranges),
        cmocka_unit_test(test_shards),
        cmocka_unit_test(test_fashion_mnist),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
