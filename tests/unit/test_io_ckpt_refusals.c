/* Checkpoint readers refuse what is not a checkpoint, in one message naming
 * the culprit, and never wait on it: a FIFO (or another non-regular file)
 * given as a checkpoint file, as a set's index.json or as one of its shard
 * files; an index.json with a metadata key twice (as a single file's header
 * is); a recorded checksum that is not exactly 8 hex digits ("0x000000").
 * (Each FIFO check runs under alarm(): a reader that blocks fails the test
 * with SIGALRM instead of hanging it.) */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "dtrain/io.h"
#include "tmpdir.h"

static char root[64];
static float A[1000], B[40];

static int setup(void **state) {
    (void)state;
    for (int i = 0; i < 1000; i++) A[i] = 0.25f * (float)i;
    for (int i = 0; i < 40; i++) B[i] = (float)-i;
    return dt_test_tmpdir(root, sizeof root, "io_ckpt_refusals");
}

static int teardown(void **state) {
    (void)state;
    dt_test_rm_rf(root);
    return 0;
}

static void expect_msg(const char *a, const char *b) {
    if (!strstr(dt_error_message(), a) || !strstr(dt_error_message(), b))
        fail_msg("message lacks '%s' / '%s': %s", a, b, dt_error_message());
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, strlen(text), f), strlen(text));
    assert_int_equal(fclose(f), 0);
}

static long file_size(const char *path) {
    struct stat sb;
    assert_int_equal(stat(path, &sb), 0);
    return (long)sb.st_size;
}

/* A two-rank set in dir: "a" [1000] split 600 / 400, "b" [40] on rank 0;
 * its set id into set. */
static void write_set(const char *dir, char *set) {
    dt_ckpt_set_id(5, 0x1234abcdu, set);
    dt_ckpt_piece r0[] = {{"a", 0, 600, A}, {"b", 0, 40, B}};
    dt_ckpt_piece r1[] = {{"a", 600, 400, A + 600}};
    assert_int_equal(dt_ckpt_prepare_dir(dir), DT_OK);
    assert_int_equal(dt_ckpt_write_shard(dir, set, 0, 2, r0, 2), DT_OK);
    assert_int_equal(dt_ckpt_write_shard(dir, set, 1, 2, r1, 1), DT_OK);
    dt_ckpt_shape shapes[] = {{"a", 1, {1000}}, {"b", 1, {40}}};
    dt_st_meta meta[] = {{"step", "7"}};
    assert_int_equal(dt_ckpt_write_index(dir, set, 2, 2, shapes, 2, meta, 1), DT_OK);
}

/* dir/index.json by hand for the set write_set made: file sizes bytes0 /
 * bytes1 (-1: the file's own), metadata as given (the inside of {}) */
static void write_index(const char *dir, const char *set, long bytes0, long bytes1, const char *meta) {
    char p0[256], p1[256], ix[256], text[2048];
    snprintf(p0, sizeof p0, "%s/shard-%s-r0.safetensors", dir, set);
    snprintf(p1, sizeof p1, "%s/shard-%s-r1.safetensors", dir, set);
    if (bytes0 < 0) bytes0 = file_size(p0);
    if (bytes1 < 0) bytes1 = file_size(p1);
    snprintf(text, sizeof text,
             "{\"format\":\"dtrain-zero-sharded-1\",\"world\":2,\"stage\":2,\"set\":\"%s\","
             "\"files\":[{\"name\":\"shard-%s-r0.safetensors\",\"bytes\":%ld},"
             "{\"name\":\"shard-%s-r1.safetensors\",\"bytes\":%ld}],"
             "\"tensors\":{\"a\":[1000],\"b\":[40]},\"metadata\":{%s}}",
             set, set, bytes0, set, bytes1, meta);
    snprintf(ix, sizeof ix, "%s/index.json", dir);
    write_text(ix, text);
}

/* a FIFO as the checkpoint file: refused at once, naming it */
static void test_fifo_file(void **state) {
    (void)state;
    char p[128];
    snprintf(p, sizeof p, "%s/pipe.safetensors", root);
    assert_int_equal(mkfifo(p, 0600), 0);
    alarm(20);
    dt_ckpt *c = NULL;
    assert_int_equal(dt_ckpt_open(p, &c), DT_EIO);
    expect_msg(p, "not a regular file");
    expect_msg(p, "FIFO");
    dt_safetensors st;
    assert_int_equal(dt_safetensors_load(p, &st), DT_EIO);   /* the whole-file reader too */
    expect_msg(p, "not a regular file");
    alarm(0);
    unlink(p);
}

/* a set whose index.json is a FIFO, or a directory */
static void test_fifo_index(void **state) {
    (void)state;
    char dir[128], ix[192];
    snprintf(dir, sizeof dir, "%s/fifo_index", root);
    assert_int_equal(mkdir(dir, 0755), 0);
    snprintf(ix, sizeof ix, "%s/index.json", dir);
    assert_int_equal(mkfifo(ix, 0600), 0);
    alarm(20);
    dt_ckpt *c = NULL;
    assert_int_equal(dt_ckpt_open(dir, &c), DT_EIO);
    expect_msg(ix, "FIFO");
    alarm(0);
    unlink(ix);
    assert_int_equal(mkdir(ix, 0755), 0);
    assert_int_equal(dt_ckpt_open(dir, &c), DT_EIO);
    expect_msg(ix, "a directory, not a regular file");
    rmdir(ix);
}

/* a shard file that is a FIFO (index.json listing it with 0 bytes, as a
 * FIFO's size is): refused naming the file, not waited on */
static void test_fifo_shard(void **state) {
    (void)state;
    char dir[128], set[DT_CKPT_SET_MAX], p1[256];
    snprintf(dir, sizeof dir, "%s/fifo_shard", root);
    write_set(dir, set);
    dt_ckpt *c = NULL;
    write_index(dir, set, -1, -1, "\"step\":\"7\"");
    assert_int_equal(dt_ckpt_open(dir, &c), DT_OK);   /* the hand-made index is a good one */
    dt_ckpt_close(c);
    snprintf(p1, sizeof p1, "%s/shard-%s-r1.safetensors", dir, set);
    unlink(p1);
    assert_int_equal(mkfifo(p1, 0600), 0);
    write_index(dir, set, -1, 0, "\"step\":\"7\"");
    alarm(20);
    assert_int_equal(dt_ckpt_open(dir, &c), DT_EFORMAT);
    char name[128];
    snprintf(name, sizeof name, "shard-%s-r1.safetensors", set);
    expect_msg(name, "not a regular file");
    alarm(0);
}

/* the writer's side: discarding a failed save's shard looks at index.json
 * (a committed set keeps its shards); a FIFO there is no committed set, and
 * the discard neither waits on it nor keeps the shard */
static void test_fifo_index_at_discard(void **state) {
    (void)state;
    char dir[128], set[DT_CKPT_SET_MAX], ix[192], p0[256];
    snprintf(dir, sizeof dir, "%s/fifo_discard", root);
    assert_int_equal(dt_ckpt_prepare_dir(dir), DT_OK);
    dt_ckpt_set_id(9, 0x5678u, set);
    dt_ckpt_piece r0[] = {{"a", 0, 1000, A}};
    assert_int_equal(dt_ckpt_write_shard(dir, set, 0, 1, r0, 1), DT_OK);
    snprintf(ix, sizeof ix, "%s/index.json", dir);
    assert_int_equal(mkfifo(ix, 0600), 0);
    alarm(20);
    assert_int_equal(dt_ckpt_discard_shard(dir, set, 0), DT_OK);
    alarm(0);
    snprintf(p0, sizeof p0, "%s/shard-%s-r0.safetensors", dir, set);
    assert_int_equal(access(p0, F_OK), -1);
    unlink(ix);
}

/* index.json's metadata with one key twice: refused like a file header's */
static void test_index_duplicate_meta(void **state) {
    (void)state;
    char dir[128], set[DT_CKPT_SET_MAX];
    snprintf(dir, sizeof dir, "%s/dup_meta", root);
    write_set(dir, set);
    dt_ckpt *c = NULL;
    write_index(dir, set, -1, -1, "\"step\":\"7\",\"seed\":\"1\"");
    assert_int_equal(dt_ckpt_open(dir, &c), DT_OK);
    assert_string_equal(dt_ckpt_get_meta(c, "step"), "7");
    dt_ckpt_close(c);
    write_index(dir, set, -1, -1, "\"step\":\"7\",\"seed\":\"1\",\"step\":\"9\"");
    assert_int_equal(dt_ckpt_open(dir, &c), DT_EFORMAT);
    expect_msg(dir, "duplicate metadata key 'step'");
    expect_msg("index.json", "duplicate");
}

/* a safetensors file by hand: tensor "a", F32 [1], 4 zero bytes (zlib
 * CRC-32 0x2144df1c), its checksum recorded as crc */
static void write_one(const char *path, const char *crc) {
    char h[256];
    int n = snprintf(h, sizeof h, "{\"__metadata__\":{\"crc32.a\":\"%s\"},"
                     "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", crc);
    while (n % 8) h[n++] = ' ';
    unsigned char len[8] = {0}, zero[4] = {0};
    for (int i = 0; i < 8; i++) len[i] = (unsigned char)((uint64_t)n >> (8 * i));
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(len, 1, 8, f), 8);
    assert_int_equal(fwrite(h, 1, (size_t)n, f), (size_t)n);
    assert_int_equal(fwrite(zero, 1, 4, f), 4);
    assert_int_equal(fclose(f), 0);
}

static void test_checksum_digits(void **state) {
    (void)state;
    char p[128];
    snprintf(p, sizeof p, "%s/crc.safetensors", root);
    static const char *const good[] = {"2144df1c", "2144DF1C"};
    for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
        write_one(p, good[i]);
        dt_safetensors st;
        assert_int_equal(dt_safetensors_load(p, &st), DT_OK);
        dt_safetensors_free(&st);
        dt_ckpt *c;
        float x = 1;
        assert_int_equal(dt_ckpt_open(p, &c), DT_OK);
        assert_int_equal(dt_ckpt_read(c, "a", 0, 1, &x), DT_OK);
        assert_true(x == 0.0f);
        dt_ckpt_close(c);
    }
    static const char *const bad[] = {"0x000000", "0X2144df", " 2144df1", "+2144df1", "-2144df1", "2144df1",
                                      "2144df1c0", "2144df1g", "2144df1 ", ""};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        write_one(p, bad[i]);
        char want[64];
        snprintf(want, sizeof want, "checksum '%s' is not 8 hex digits", bad[i]);
        dt_ckpt *c = NULL;
        if (dt_ckpt_open(p, &c) != DT_EFORMAT) fail_msg("'%s' accepted by dt_ckpt_open", bad[i]);
        expect_msg(p, want);
        dt_safetensors st;
        if (dt_safetensors_load(p, &st) != DT_EFORMAT) fail_msg("'%s' accepted by dt_safetensors_load", bad[i]);
        expect_msg(p, want);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fifo_file),
        cmocka_unit_test(test_fifo_index),
        cmocka_unit_test(test_fifo_shard),
        cmocka_unit_test(test_fifo_index_at_discard),
        cmocka_unit_test(test_index_duplicate_meta),
        cmocka_unit_test(test_checksum_digits),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
