/* Per-tensor checksums through dt_ckpt (the reader of every checkpoint load):
 * a flipped byte anywhere in a tensor's (or a sharded piece's) data is an
 * error naming the file and the tensor, also when only a few elements of it
 * are read; intact files read back exactly, in whole and in part. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>
#include "dtrain/io.h"
#include "tmpdir.h"

static char root[64];
static float A[1000], B[40];

static int setup(void **state) {
    (void)state;
    for (int i = 0; i < 1000; i++) A[i] = 0.5f * (float)i - 7.0f;
    for (int i = 0; i < 40; i++) B[i] = (float)(i * i);
    return dt_test_tmpdir(root, sizeof root, "io_ckpt_crc");
}

static int teardown(void **state) {
    (void)state;
    dt_test_rm_rf(root);
    return 0;
}

/* XOR one byte at offset `at` from the END of the file (data is last). */
static void flip_from_end(const char *path, long at) {
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    assert_int_equal(fseek(f, -at, SEEK_END), 0);
    int c = fgetc(f);
    assert_int_not_equal(c, EOF);
    assert_int_equal(fseek(f, -at, SEEK_END), 0);
    fputc(c ^ 0x04, f);
    fclose(f);
}

static void expect_msg(const char *a, const char *b) {
    if (!strstr(dt_error_message(), a) || !strstr(dt_error_message(), b))
        fail_msg("message lacks '%s' / '%s': %s", a, b, dt_error_message());
}

static void test_single_file(void **state) {
    (void)state;
    char p[128];
    snprintf(p, sizeof p, "%s/one.safetensors", root);
    dt_st_entry e[] = {{"b", DT_F32, 1, {40}, B}, {"a", DT_F32, 2, {10, 100}, A}};   /* a's bytes end the file */
    assert_int_equal(dt_safetensors_write(p, e, 2, NULL, 0), DT_OK);
    dt_ckpt *c;
    float got[1000];
    assert_int_equal(dt_ckpt_open(p, &c), DT_OK);
    assert_int_equal(dt_ckpt_read(c, "a", 10, 5, got), DT_OK);
    assert_memory_equal(got, A + 10, 5 * sizeof(float));
    assert_int_equal(dt_ckpt_read(c, "a", 0, 1000, got), DT_OK);
    assert_memory_equal(got, A, sizeof A);
    dt_ckpt_close(c);

    flip_from_end(p, 4 * 50 + 2);   /* inside element 949 of a */
    assert_int_equal(dt_ckpt_open(p, &c), DT_OK);   /* headers only: the data is checked when read */
    assert_int_equal(dt_ckpt_read(c, "b", 0, 40, got), DT_OK);   /* b is intact */
    assert_int_equal(dt_ckpt_read(c, "a", 0, 4, got), DT_EFORMAT);   /* a few elements: the whole tensor is checked */
    expect_msg("one.safetensors", "'a'");
    assert_int_equal(dt_ckpt_read(c, "a", 0, 1000, got), DT_EFORMAT);
    expect_msg("checksum", "'a'");
    dt_ckpt_close(c);
    dt_safetensors st;
    assert_int_equal(dt_safetensors_load(p, &st), DT_EFORMAT);   /* the whole-file reader too */
    expect_msg("one.safetensors", "'a'");
}

static void test_sharded_piece(void **state) {
    (void)state;
    char dir[128];
    snprintf(dir, sizeof dir, "%s/set", root);
    char set[DT_CKPT_SET_MAX];
    dt_ckpt_set_id(3, 0xabcd1234u, set);
    dt_ckpt_piece r0[] = {{"a", 0, 600, A}, {"b", 0, 40, B}};
    dt_ckpt_piece r1[] = {{"a", 600, 400, A + 600}};
    assert_int_equal(dt_ckpt_prepare_dir(dir), DT_OK);
    assert_int_equal(dt_ckpt_write_shard(dir, set, 0, 2, r0, 2), DT_OK);
    assert_int_equal(dt_ckpt_write_shard(dir, set, 1, 2, r1, 1), DT_OK);
    dt_ckpt_shape shapes[] = {{"a", 1, {1000}}, {"b", 1, {40}}};
    assert_int_equal(dt_ckpt_write_index(dir, set, 2, 2, shapes, 2, NULL, 0), DT_OK);
    char f1[256];
    snprintf(f1, sizeof f1, "%s/shard-%s-r1.safetensors", dir, set);
    flip_from_end(f1, 4 * 10 + 1);   /* element 989 of a, in rank 1's piece "a@600" */
    dt_ckpt *c;
    float got[1000];
    assert_int_equal(dt_ckpt_open(dir, &c), DT_OK);
    assert_int_equal(dt_ckpt_read(c, "a", 100, 500, got), DT_OK);   /* rank 0's piece only */
    assert_memory_equal(got, A + 100, 500 * sizeof(float));
    assert_int_equal(dt_ckpt_read(c, "a", 590, 20, got), DT_EFORMAT);   /* touches a@600 */
    char name[64];
    snprintf(name, sizeof name, "shard-%s-r1.safetensors", set);
    expect_msg(name, "'a@600'");
    dt_ckpt_close(c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_single_file),
        cmocka_unit_test(test_sharded_piece),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
