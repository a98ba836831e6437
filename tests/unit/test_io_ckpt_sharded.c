/* Sharded checkpoint sets (dt_ckpt): a set written by hand as "world 3" in
 * one process reads back across piece boundaries; a newer set replaces the
 * old one only once its index lands; every kind of corruption (missing or
 * truncated file, file of another set, gap, overlap, wrong shape, wrong
 * dtype, bad index) is a clear error. Consolidated files read the same way.
 * A reader that a save overtakes (its set's files removed after it read the
 * index) reads the new set. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include "tmpdir.h"
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "dtrain/io.h"
#include "io/ckpt_internal.h"

static char root[64];
static float A[20], B[10], C[3];   /* a: [4, 5], b: [10], c: [3] */

static int setup(void **state) {
    (void)state;
    for (int i = 0; i < 20; i++) A[i] = 1.5f * (float)i;
    for (int i = 0; i < 10; i++) B[i] = -0.25f * (float)i;
    for (int i = 0; i < 3; i++) C[i] = 100.0f + (float)i;
    return dt_test_tmpdir(root, sizeof root, "ckpt_sharded");
}

static int teardown(void **state) {
    (void)state;
    dt_test_rm_rf(root);
    return 0;
}

enum variant { GOOD, GAP, OVERLAP, BIG_SHAPE, PAST_END };

/* Shard files of one set: a in three pieces, b on ranks 0 and 2 (rank 1 has
 * an empty piece), c whole on rank 1. */
static void write_shards(const char *dir, const char *set, enum variant v) {
    size_t a1 = v == GAP ? 8 : v == OVERLAP ? 6 : 7;
    size_t b2n = v == PAST_END ? 8 : 7;
    dt_ckpt_piece r0[] = {{"a", 0, 7, A}, {"b", 0, 3, B}};
    dt_ckpt_piece r1[] = {{"a", a1, 14 - a1, A + a1}, {"b", 3, 0, B + 3}, {"c", 0, 3, C}};
    dt_ckpt_piece r2[] = {{"a", 14, 6, A + 14}, {"b", 3, b2n, B + 3}};
    float pad[8] = {0};
    if (v == PAST_END) { memcpy(pad, B + 3, 7 * sizeof(float)); r2[1].data = pad; }
    assert_int_equal(dt_ckpt_prepare_dir(dir), DT_OK);
    assert_int_equal(dt_ckpt_write_shard(dir, set, 0, 3, r0, 2), DT_OK);
    assert_int_equal(dt_ckpt_write_shard(dir, set, 1, 3, r1, 3), DT_OK);
    assert_int_equal(dt_ckpt_write_shard(dir, set, 2, 3, r2, 2), DT_OK);
}

static void write_index(const char *dir, const char *set, enum variant v) {
    dt_ckpt_shape shapes[] = {{"a", 2, {v == BIG_SHAPE ? 5 : 4, 5}}, {"b", 1, {10}}, {"c", 1, {3}}};
    dt_st_meta meta[] = {{"format", "dtrain-checkpoint-1"}, {"step", "7"}};
    assert_int_equal(dt_ckpt_write_index(dir, set, 3, 2, shapes, 3, meta, 2), DT_OK);
}

static void write_set(const char *dir, const char *set, enum variant v) {
    write_shards(dir, set, v);
    write_index(dir, set, v);
}

static void subdir(char *buf, size_t n, const char *name) {
    snprintf(buf, n, "%s/%s", root, name);
}

static void shard_path(char *buf, size_t n, const char *dir, const char *set, int rank) {
    snprintf(buf, n, "%s/shard-%s-r%d.safetensors", dir, set, rank);
}

static int count_files(const char *dir) {
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)))
        if (de->d_name[0] != '.') n++;
    closedir(d);
    return n;
}

/* Opening must fail with a message containing every needle. */
static void expect_open_error(const char *path, const char *n1, const char *n2) {
    dt_ckpt *c = NULL;
    assert_int_not_equal(dt_ckpt_open(path, &c), DT_OK);
    assert_null(c);
    const char *msg = dt_error_message();
    if (getenv("DT_TEST_VERBOSE")) print_message("  error: %s\n", msg);
    if (!strstr(msg, n1) || (n2 && !strstr(msg, n2))) fail_msg("message lacks '%s' / '%s': %s", n1, n2 ? n2 : "", msg);
}

static void test_round_trip_ranges(void **state) {
    (void)state;
    char dir[128], set[DT_CKPT_SET_MAX];
    subdir(dir, sizeof dir, "good");
    dt_ckpt_set_id(7, dt_ckpt_nonce(), set);
    write_set(dir, set, GOOD);
    dt_ckpt *c;
    assert_int_equal(dt_ckpt_open(dir, &c), DT_OK);
    assert_true(dt_ckpt_is_sharded(c));
    assert_string_equal(dt_ckpt_get_meta(c, "step"), "7");
    assert_null(dt_ckpt_get_meta(c, "nope"));
    int nd;
    int64_t sh[DT_MAX_DIMS];
    assert_true(dt_ckpt_find(c, "a", &nd, sh));
    assert_int_equal(nd, 2);
    assert_int_equal(sh[0], 4);
    assert_int_equal(sh[1], 5);
    assert_false(dt_ckpt_find(c, "a@0", NULL, NULL));
    float got[20];
    /* [5, 16) spans all three pieces of a */
    assert_int_equal(dt_ckpt_read(c, "a", 5, 11, got), DT_OK);
    assert_memory_equal(got, A + 5, 11 * sizeof(float));
    for (size_t s = 0; s < 20; s++)   /* every single element */
        for (size_t n = 0; s + n <= 20; n += 7) {
            memset(got, 0, sizeof got);
            assert_int_equal(dt_ckpt_read(c, "a", s, n, got), DT_OK);
            assert_memory_equal(got, A + s, n * sizeof(float));
        }
    assert_int_equal(dt_ckpt_read(c, "b", 0, 10, got), DT_OK);
    assert_memory_equal(got, B, sizeof B);
    assert_int_equal(dt_ckpt_read(c, "c", 1, 2, got), DT_OK);
    assert_memory_equal(got, C + 1, 2 * sizeof(float));
    assert_int_not_equal(dt_ckpt_read(c, "a", 15, 6, got), DT_OK);
    assert_non_null(strstr(dt_error_message(), "out of range"));
    assert_int_equal(dt_ckpt_expect(c, "a", 2, (int64_t[]){4, 5}), DT_OK);
    assert_int_not_equal(dt_ckpt_expect(c, "a", 2, (int64_t[]){5, 4}), DT_OK);
    assert_non_null(strstr(dt_error_message(), "'a' has shape [4, 5]"));
    assert_non_null(strstr(dt_error_message(), "index.json"));
    assert_non_null(strstr(dt_error_message(), "[5, 4]"));
    assert_int_not_equal(dt_ckpt_expect(c, "zz", 1, (int64_t[]){3}), DT_OK);
    assert_non_null(strstr(dt_error_message(), "missing tensor 'zz'"));
    dt_ckpt_close(c);
}

/* A new save is invisible until its index lands; then the old set's files go. */
static void test_new_set_replaces_old(void **state) {
    (void)state;
    char dir[128], s1[DT_CKPT_SET_MAX], s2[DT_CKPT_SET_MAX], p[256];
    subdir(dir, sizeof dir, "replace");
    dt_ckpt_set_id(3, 0x11111111u, s1);
    dt_ckpt_set_id(3, 0x22222222u, s2);   /* same step, another save */
    assert_string_equal(s1, "3-11111111");
    write_set(dir, s1, GOOD);
    assert_int_equal(count_files(dir), 4);
    write_shards(dir, s2, GAP);            /* "crash" before the index */
    dt_ckpt *c;
    assert_int_equal(dt_ckpt_open(dir, &c), DT_OK);   /* old set still whole */
    dt_ckpt_close(c);
    snprintf(p, sizeof p, "%s/shard-%s-r0.safetensors.tmp.1.0", dir, s1);   /* a dead temp file */
    FILE *f = fopen(p, "w");
    fclose(f);
    /* files of the user's that merely start like a shard stay */
    const char *users[] = {"shard-000.bin", "shard-notes.txt", "shard-3-1111111-r0.safetensors",
                           "shard-3-11111111-r0.safetensors.bak", "shard-3-11111111-r0.safetensors.tmp.x"};
    for (int i = 0; i < 5; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, users[i]);
        assert_non_null(f = fopen(p, "w"));
        fclose(f);
    }
    write_set(dir, s2, GOOD);
    assert_int_equal(count_files(dir), 4 + 5);
    for (int i = 0; i < 5; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, users[i]);
        if (access(p, F_OK) != 0) fail_msg("a save removed the user's file %s", users[i]);
        unlink(p);
    }
    shard_path(p, sizeof p, dir, s1, 0);
    assert_int_not_equal(access(p, F_OK), 0);
    assert_int_equal(dt_ckpt_open(dir, &c), DT_OK);
    float got[10];
    assert_int_equal(dt_ckpt_read(c, "b", 0, 10, got), DT_OK);
    assert_memory_equal(got, B, sizeof B);
    dt_ckpt_close(c);
}

static void test_missing_and_truncated_file(void **state) {
    (void)state;
    char dir[128], set[DT_CKPT_SET_MAX], p[256];
    dt_ckpt_set_id(1, 0xabcdef01u, set);
    subdir(dir, sizeof dir, "missing");
    write_set(dir, set, GOOD);
    shard_path(p, sizeof p, dir, set, 1);
    assert_int_equal(unlink(p), 0);
    expect_open_error(dir, "shard-1-abcdef01-r1.safetensors", "missing");

    subdir(dir, sizeof dir, "truncated");
    write_set(dir, set, GOOD);
    shard_path(p, sizeof p, dir, set, 2);
    struct stat sb;
    assert_int_equal(stat(p, &sb), 0);
    assert_int_equal(truncate(p, sb.st_size - 10), 0);
    expect_open_error(dir, "shard-1-abcdef01-r2.safetensors", "truncated");

    subdir(dir, sizeof dir, "noindex");
    write_shards(dir, set, GOOD);
    expect_open_error(dir, "index.json", "noindex");
}

static void test_file_of_another_set(void **state) {
    (void)state;
    char dir[128], s1[DT_CKPT_SET_MAX], s2[DT_CKPT_SET_MAX], from[256], to[256];
    subdir(dir, sizeof dir, "mixed");
    dt_ckpt_set_id(5, 0x0000aaaau, s1);
    dt_ckpt_set_id(5, 0x0000bbbbu, s2);
    write_set(dir, s1, GOOD);
    write_shards(dir, s2, GOOD);
    shard_path(from, sizeof from, dir, s2, 1);
    shard_path(to, sizeof to, dir, s1, 1);
    assert_int_equal(rename(from, to), 0);   /* same size, other set */
    expect_open_error(dir, "belongs to set '5-0000bbbb'", "'5-0000aaaa'");
}

static void test_gap_overlap_shape(void **state) {
    (void)state;
    char dir[128], set[DT_CKPT_SET_MAX];
    dt_ckpt_set_id(2, 0x12345678u, set);
    subdir(dir, sizeof dir, "gap");
    write_set(dir, set, GAP);
    expect_open_error(dir, "tensor 'a' elements [7, 8) missing", "3 files");
    subdir(dir, sizeof dir, "overlap");
    write_set(dir, set, OVERLAP);
    expect_open_error(dir, "tensor 'a' elements [6, 7) stored twice", "r0.safetensors and");
    subdir(dir, sizeof dir, "bigshape");   /* index says [5, 5]: the last 5 are missing */
    write_set(dir, set, BIG_SHAPE);
    expect_open_error(dir, "tensor 'a' elements [20, 25) missing", NULL);
    subdir(dir, sizeof dir, "pastend");
    write_set(dir, set, PAST_END);
    expect_open_error(dir, "piece 'b@3'", "runs past");
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void test_bad_index_and_dtype(void **state) {
    (void)state;
    char dir[128], set[DT_CKPT_SET_MAX], p[256];
    dt_ckpt_set_id(4, 0x0badf00du, set);
    subdir(dir, sizeof dir, "badindex");
    write_set(dir, set, GOOD);
    snprintf(p, sizeof p, "%s/index.json", dir);
    write_text(p, "{\"format\": \"something-else\"}");
    expect_open_error(dir, "index format 'something-else'", NULL);
    write_text(p, "{\"format\": \"dtrain-zero-sharded-1\", \"world\": 2, \"set\": \"x\", \"files\": []}");
    expect_open_error(dir, "0 files for world size 2", NULL);
    write_text(p, "not json");
    expect_open_error(dir, "not a JSON object", NULL);

    /* a BF16 piece in rank 2's file */
    subdir(dir, sizeof dir, "bf16");
    write_shards(dir, set, GOOD);
    uint16_t half[6] = {0};
    dt_st_entry e[] = {{"a@14", DT_BF16, 1, {6}, half}, {"b@3", DT_F32, 1, {7}, B + 3}};
    dt_st_meta m[] = {{"set", set}, {"rank", "2"}, {"world", "3"}};
    shard_path(p, sizeof p, dir, set, 2);
    assert_int_equal(dt_safetensors_write(p, e, 2, m, 3), DT_OK);
    write_index(dir, set, GOOD);
    expect_open_error(dir, "piece 'a@14' is BF16", "expected 1-D F32");

    /* a file that names itself another rank */
    subdir(dir, sizeof dir, "rank");
    write_shards(dir, set, GOOD);
    m[1].value = "0";
    dt_st_entry e2[] = {{"a@14", DT_F32, 1, {6}, A + 14}, {"b@3", DT_F32, 1, {7}, B + 3}};
    shard_path(p, sizeof p, dir, set, 2);
    assert_int_equal(dt_safetensors_write(p, e2, 2, m, 3), DT_OK);
    write_index(dir, set, GOOD);
    expect_open_error(dir, "holds rank '0'", "rank 2");
}

static void test_consolidated_file(void **state) {
    (void)state;
    char p[128];
    snprintf(p, sizeof p, "%s/one.safetensors", root);
    uint16_t half[2] = {0x3f80, 0x4000};
    dt_st_entry e[] = {{"a", DT_F32, 2, {4, 5}, A}, {"c", DT_F32, 1, {3}, C}, {"h", DT_BF16, 1, {2}, half}};
    dt_st_meta m[] = {{"format", "dtrain-checkpoint-1"}};
    assert_int_equal(dt_safetensors_write(p, e, 3, m, 1), DT_OK);
    dt_ckpt *c;
    assert_int_equal(dt_ckpt_open(p, &c), DT_OK);
    assert_false(dt_ckpt_is_sharded(c));
    assert_string_equal(dt_ckpt_get_meta(c, "format"), "dtrain-checkpoint-1");
    float got[20];
    assert_int_equal(dt_ckpt_read(c, "a", 3, 12, got), DT_OK);
    assert_memory_equal(got, A + 3, 12 * sizeof(float));
    assert_int_equal(dt_ckpt_expect(c, "h", 1, (int64_t[]){2}), DT_OK);
    assert_int_not_equal(dt_ckpt_read(c, "h", 0, 2, got), DT_OK);
    assert_non_null(strstr(dt_error_message(), "'h' is BF16, expected F32"));
    dt_ckpt_close(c);
    /* truncated: the message names the file */
    struct stat sb;
    assert_int_equal(stat(p, &sb), 0);
    assert_int_equal(truncate(p, sb.st_size - 4), 0);
    expect_open_error(p, "one.safetensors", "truncated");
    snprintf(p, sizeof p, "%s/none.safetensors", root);
    expect_open_error(p, "none.safetensors", "cannot open");
}

/* A set id not of dt_ckpt_set_id's form is refused: the names a later save
 * removes (and an abandoned one keeps) follow from that form. */
static void test_set_id_form(void **state) {
    (void)state;
    char dir[128];
    subdir(dir, sizeof dir, "ids");
    assert_int_equal(dt_ckpt_prepare_dir(dir), DT_OK);
    dt_ckpt_piece r0[] = {{"a", 0, 7, A}};
    dt_ckpt_shape shapes[] = {{"a", 1, {7}}};
    const char *bad[] = {"mine", "3-1234567", "3-123456789", "-3-12345678", "3-1234567g", "3_12345678", ""};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        assert_int_equal(dt_ckpt_write_shard(dir, bad[i], 0, 1, r0, 1), DT_EINVAL);
        assert_non_null(strstr(dt_error_message(), "dt_ckpt_set_id"));
        assert_int_equal(dt_ckpt_write_index(dir, bad[i], 1, 1, shapes, 1, NULL, 0), DT_EINVAL);
    }
    assert_int_equal(count_files(dir), 0);
    char set[DT_CKPT_SET_MAX];
    dt_ckpt_set_id(123456789012LL, 0xabcdef01u, set);
    assert_int_equal(dt_ckpt_write_shard(dir, set, 0, 1, r0, 1), DT_OK);
}

static void test_prepare_dir_rejects_file(void **state) {
    (void)state;
    char p[128];
    snprintf(p, sizeof p, "%s/plainfile", root);
    write_text(p, "x");
    assert_int_not_equal(dt_ckpt_prepare_dir(p), DT_OK);
    assert_non_null(strstr(dt_error_message(), "not a directory"));
}

/* A save lands between the reader's index and its files (the hook runs
 * there): the old set's files are gone, the reader takes the new set. */
static const char *race_dir;
static int race_saves;   /* saves the hook still makes, one per call */
static unsigned race_salt;

static void save_between(const char *dir) {
    assert_string_equal(dir, race_dir);
    if (race_saves <= 0) return;
    race_saves--;
    char set[DT_CKPT_SET_MAX];
    dt_ckpt_set_id(9, 0x30000000u + race_salt++, set);
    C[0] += 1.0f;   /* each save's c differs */
    write_set(dir, set, GOOD);
}

static void test_reader_overtaken_by_save(void **state) {
    (void)state;
    char dir[128], set[DT_CKPT_SET_MAX];
    subdir(dir, sizeof dir, "race");
    dt_ckpt_set_id(8, 0x2fffffffu, set);
    write_set(dir, set, GOOD);
    float c0 = C[0], got[3];
    race_dir = dir;
    dt__ckpt_after_index_read = save_between;
    for (int saves = 1; saves <= 3; saves++) {   /* one save, or several in a row */
        race_saves = saves;
        dt_ckpt *c = NULL;
        dt_status s = dt_ckpt_open(dir, &c);
        if (s != DT_OK) fail_msg("overtaken by %d save(s): %s", saves, dt_error_message());
        assert_int_equal(race_saves, 0);
        assert_int_equal(dt_ckpt_read(c, "c", 0, 3, got), DT_OK);
        assert_true(got[0] == C[0]);   /* the newest set */
        dt_ckpt_close(c);
    }
    /* a file missing with the index unchanged stays an error, not a retry */
    race_saves = 0;
    char p[256];
    dt_ckpt_set_id(9, 0x30000000u + race_salt - 1, set);
    shard_path(p, sizeof p, dir, set, 1);
    assert_int_equal(unlink(p), 0);
    expect_open_error(dir, "missing", NULL);
    dt__ckpt_after_index_read = NULL;
    C[0] = c0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip_ranges),
        cmocka_unit_test(test_new_set_replaces_old),
        cmocka_unit_test(test_missing_and_truncated_file),
        cmocka_unit_test(test_file_of_another_set),
        cmocka_unit_test(test_gap_overlap_shape),
        cmocka_unit_test(test_bad_index_and_dtype),
        cmocka_unit_test(test_consolidated_file),
        cmocka_unit_test(test_set_id_form),
        cmocka_unit_test(test_prepare_dir_rejects_file),
        cmocka_unit_test(test_reader_overtaken_by_save),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
