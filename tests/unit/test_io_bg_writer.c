/* Background writes (io.h): while a thread captures into a dt_bg_writer,
 *  - dt_safetensors_write returns with the data copied: changing the source
 *    afterwards does not change the file, which is byte for byte the file a
 *    direct write of the same entries makes;
 *  - the streaming writer likewise (appends in pieces, commit queues);
 *  - a copy large enough to run on several OpenMP threads, whose chunk
 *    boundaries fall inside tensors, gives the same bytes;
 *  - a sharded set's index waits for every rank's shard file and then
 *    commits the set (the set loads); cancelled while a shard is missing,
 *    nothing is committed and the wait reports it; abandoned, an uncommitted
 *    set's shards go and a committed set's stay;
 *  - a write that fails on the thread is reported by the next wait, naming
 *    the file, and only once;
 *  - bad arguments are refused at the call, not later. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include "tmpdir.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <omp.h>
#include "dtrain/io.h"

static char root[64];

static int setup(void **state) {
    (void)state;
    return dt_test_tmpdir(root, sizeof root, "bg_writer");
}

static int teardown(void **state) {
    (void)state;
    dt_test_rm_rf(root);
    return 0;
}

static char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)len + 1);
    *n = fread(b, 1, (size_t)len, f);
    fclose(f);
    return b;
}

static void assert_same_file(const char *a, const char *b) {
    size_t na = 0, nb = 0;
    char *x = slurp(a, &na), *y = slurp(b, &nb);
    assert_non_null(x);
    assert_non_null(y);
    assert_int_equal(na, nb);
    assert_memory_equal(x, y, na);
    free(x);
    free(y);
}

static int exists(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0;
}

static void test_copy_then_write(void **state) {
    (void)state;
    float w[12], b[3];
    for (int i = 0; i < 12; i++) w[i] = 0.5f * (float)i - 2.0f;
    for (int i = 0; i < 3; i++) b[i] = 7.0f + (float)i;
    dt_st_entry e[2] = {{"w", DT_F32, 2, {3, 4}, w}, {"b", DT_F32, 1, {3}, b}};
    dt_st_meta meta[1] = {{"step", "5"}};
    char direct[128], bg[128];
    snprintf(direct, sizeof direct, "%s/direct.safetensors", root);
    snprintf(bg, sizeof bg, "%s/bg.safetensors", root);
    assert_int_equal(dt_safetensors_write(direct, e, 2, meta, 1), DT_OK);
    dt_bg_writer *wr;
    assert_int_equal(dt_bg_writer_create(&wr), DT_OK);
    dt_bg_writer_capture(wr);
    assert_int_equal(dt_safetensors_write(bg, e, 2, meta, 1), DT_OK);
    dt_bg_writer_capture(NULL);
    for (int i = 0; i < 12; i++) w[i] = -1.0f;   /* the next step changes the parameters */
    assert_int_equal(dt_bg_writer_wait(wr, 1), DT_OK);
    assert_false(dt_bg_writer_busy(wr));
    assert_true(dt_bg_writer_peak_bytes(wr) >= sizeof w + sizeof b);
    assert_same_file(direct, bg);
    dt_bg_writer_free(wr);
}

static void test_streaming(void **state) {
    (void)state;
    float d[10];
    for (int i = 0; i < 10; i++) d[i] = (float)(i * i) - 3.0f;
    dt_st_entry e[2] = {{"x", DT_F32, 1, {6}, NULL}, {"y", DT_F32, 1, {4}, NULL}};
    dt_st_meta meta[2] = {{"format", "test"}, {"k", "v"}};
    char direct[128], bg[128];
    snprintf(direct, sizeof direct, "%s/sdirect.safetensors", root);
    snprintf(bg, sizeof bg, "%s/sbg.safetensors", root);
    for (int pass = 0; pass < 2; pass++) {
        dt_bg_writer *wr = NULL;
        if (pass) {
            assert_int_equal(dt_bg_writer_create(&wr), DT_OK);
            dt_bg_writer_capture(wr);
        }
        dt_st_writer *sw;
        assert_int_equal(dt_st_writer_open(&sw, pass ? bg : direct, e, 2, meta, 2), DT_OK);
        assert_int_equal(dt_st_writer_append(sw, d, 4 * sizeof(float)), DT_OK);   /* across the entry boundary */
        assert_int_equal(dt_st_writer_append(sw, d + 4, 6 * sizeof(float)), DT_OK);
        assert_int_equal(dt_st_writer_commit(sw), DT_OK);
        if (pass) {
            dt_bg_writer_capture(NULL);
            d[0] = 1e9f;   /* after commit: the copy is the job's */
            assert_int_equal(dt_bg_writer_wait(wr, 1), DT_OK);
            dt_bg_writer_free(wr);
        }
    }
    assert_same_file(direct, bg);
    /* an incomplete captured stream fails at commit, as a direct one does */
    dt_bg_writer *wr;
    assert_int_equal(dt_bg_writer_create(&wr), DT_OK);
    dt_bg_writer_capture(wr);
    dt_st_writer *sw;
    char part[128];
    snprintf(part, sizeof part, "%s/partial.safetensors", root);
    assert_int_equal(dt_st_writer_open(&sw, part, e, 2, meta, 2), DT_OK);
    assert_int_equal(dt_st_writer_append(sw, d, 3 * sizeof(float)), DT_OK);
    assert_int_equal(dt_st_writer_commit(sw), DT_ESTATE);
    assert_non_null(strstr(dt_error_message(), "partial.safetensors"));
    dt_bg_writer_capture(NULL);
    assert_int_equal(dt_bg_writer_wait(wr, 1), DT_OK);
    assert_false(exists(part));
    dt_bg_writer_free(wr);
}

/* above the parallel-copy threshold (4 MiB), 3 threads: each thread's byte
 * range starts and ends inside a tensor */
static void test_large_copy_on_threads(void **state) {
    (void)state;
    int keep = omp_get_max_threads();
    omp_set_num_threads(3);
    const int64_t na = 1000003, nb = 7, nc = 600001;
    float *a = malloc(sizeof(float) * (size_t)(na + nb + nc)), *b = a + na, *c = b + nb;
    assert_non_null(a);
    for (int64_t i = 0; i < na + nb + nc; i++) a[i] = (float)(i % 9973) * 0.25f - 17.0f;
    dt_st_entry e[3] = {{"a", DT_F32, 1, {na}, a}, {"b", DT_F32, 1, {nb}, b}, {"c", DT_F32, 1, {nc}, c}};
    char direct[128], bg[128], sbg[128];
    snprintf(direct, sizeof direct, "%s/ldirect.safetensors", root);
    snprintf(bg, sizeof bg, "%s/lbg.safetensors", root);
    snprintf(sbg, sizeof sbg, "%s/lsbg.safetensors", root);
    assert_int_equal(dt_safetensors_write(direct, e, 3, NULL, 0), DT_OK);
    dt_bg_writer *wr;
    assert_int_equal(dt_bg_writer_create(&wr), DT_OK);
    dt_bg_writer_capture(wr);
    assert_int_equal(dt_safetensors_write(bg, e, 3, NULL, 0), DT_OK);
    /* the streaming writer: one append of everything */
    dt_st_entry se[3] = {{"a", DT_F32, 1, {na}, NULL}, {"b", DT_F32, 1, {nb}, NULL}, {"c", DT_F32, 1, {nc}, NULL}};
    dt_st_writer *sw;
    assert_int_equal(dt_st_writer_open(&sw, sbg, se, 3, NULL, 0), DT_OK);
    assert_int_equal(dt_st_writer_append(sw, a, sizeof(float) * (size_t)(na + nb + nc)), DT_OK);
    assert_int_equal(dt_st_writer_commit(sw), DT_OK);
    dt_bg_writer_capture(NULL);
    memset(a, 0, sizeof(float) * (size_t)(na + nb + nc));   /* the copies are the jobs' */
    assert_int_equal(dt_bg_writer_wait(wr, 1), DT_OK);
    assert_same_file(direct, bg);
    assert_same_file(direct, sbg);
    dt_bg_writer_free(wr);
    free(a);
    omp_set_num_threads(keep);
}

static void test_index_waits_for_shards(void **state) {
    (void)state;
    char dir[128];
    snprintf(dir, sizeof dir, "%s/set", root);
    assert_int_equal(dt_ckpt_prepare_dir(dir), DT_OK);
    float a[6] = {1, 2, 3, 4, 5, 6};
    dt_ckpt_piece r0[] = {{"a", 0, 4, a}}, r1[] = {{"a", 4, 2, a + 4}};
    dt_ckpt_shape shapes[] = {{"a", 1, {6}}};
    dt_st_meta meta[] = {{"format", "dtrain-checkpoint-1"}, {"step", "3"}};
    dt_bg_writer *wr;
    assert_int_equal(dt_bg_writer_create(&wr), DT_OK);
    dt_bg_writer_capture(wr);
    assert_int_equal(dt_ckpt_write_shard(dir, "3-00000001", 0, 2, r0, 1), DT_OK);
    assert_int_equal(dt_ckpt_write_index(dir, "3-00000001", 2, 1, shapes, 1, meta, 2), DT_OK);
    dt_bg_writer_capture(NULL);
    assert_int_equal(dt_bg_writer_wait(wr, 0), DT_OK);   /* rank 0's shard is written; the index waits for rank 1 */
    char index[160];
    snprintf(index, sizeof index, "%s/index.json", dir);
    struct timespec ts = {0, 100 * 1000 * 1000};
    nanosleep(&ts, NULL);
    assert_false(exists(index));
    assert_true(dt_bg_writer_busy(wr));
    assert_int_equal(dt_ckpt_write_shard(dir, "3-00000001", 1, 2, r1, 1), DT_OK);   /* "rank 1" */
    assert_int_equal(dt_bg_writer_wait(wr, 1), DT_OK);
    assert_true(exists(index));
    dt_ckpt *c;
    assert_int_equal(dt_ckpt_open(dir, &c), DT_OK);
    float got[6];
    assert_int_equal(dt_ckpt_read(c, "a", 0, 6, got), DT_OK);
    assert_memory_equal(got, a, sizeof a);
    dt_ckpt_close(c);
    /* abandoned after its commit (a failure reported later, a peer's): the
     * committed set keeps its shards and loads (its rank-0 shard was removed) */
    dt_bg_writer_abandon(wr);
    assert_int_equal(dt_ckpt_open(dir, &c), DT_OK);
    assert_int_equal(dt_ckpt_read(c, "a", 0, 6, got), DT_OK);
    dt_ckpt_close(c);
    /* a set one of whose shards never comes: cancelled, the old set stays the one */
    dt_bg_writer_capture(wr);
    assert_int_equal(dt_ckpt_write_shard(dir, "4-00000002", 0, 2, r0, 1), DT_OK);
    assert_int_equal(dt_ckpt_write_index(dir, "4-00000002", 2, 1, shapes, 1, meta, 2), DT_OK);
    dt_bg_writer_capture(NULL);
    assert_int_equal(dt_bg_writer_wait(wr, 0), DT_OK);
    dt_bg_writer_cancel_index(wr);
    assert_int_not_equal(dt_bg_writer_wait(wr, 1), DT_OK);
    assert_non_null(strstr(dt_error_message(), "not committed"));
    assert_int_equal(dt_bg_writer_wait(wr, 1), DT_OK);   /* reported once */
    assert_int_equal(dt_ckpt_open(dir, &c), DT_OK);
    assert_string_equal(dt_ckpt_get_meta(c, "step"), "3");
    dt_ckpt_close(c);
    char s4[200];   /* abandoned uncommitted: its shard goes */
    snprintf(s4, sizeof s4, "%s/shard-4-00000002-r0.safetensors", dir);
    assert_true(exists(s4));
    dt_bg_writer_abandon(wr);
    assert_false(exists(s4));
    dt_bg_writer_free(wr);
}

static void test_failure_reported(void **state) {
    (void)state;
    float x[4] = {1, 2, 3, 4};
    dt_st_entry e[1] = {{"x", DT_F32, 1, {4}, x}};
    char bad[160];
    snprintf(bad, sizeof bad, "%s/no-such-dir/x.safetensors", root);
    dt_bg_writer *wr;
    assert_int_equal(dt_bg_writer_create(&wr), DT_OK);
    dt_bg_writer_capture(wr);
    assert_int_equal(dt_safetensors_write(bad, e, 1, NULL, 0), DT_OK);   /* queued */
    dt_st_entry dup[2] = {{"x", DT_F32, 1, {4}, x}, {"x", DT_F32, 1, {4}, x}};
    char ok[128];
    snprintf(ok, sizeof ok, "%s/dup.safetensors", root);
    assert_int_equal(dt_safetensors_write(ok, dup, 2, NULL, 0), DT_EINVAL);   /* refused at the call */
    dt_bg_writer_capture(NULL);
    assert_int_not_equal(dt_bg_writer_wait(wr, 1), DT_OK);
    assert_non_null(strstr(dt_error_message(), "no-such-dir"));
    assert_int_equal(dt_bg_writer_wait(wr, 1), DT_OK);
    dt_bg_writer_free(wr);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_copy_then_write),
        cmocka_unit_test(test_streaming),
        cmocka_unit_test(test_large_copy_on_threads),
        cmocka_unit_test(test_index_waits_for_shards),
        cmocka_unit_test(test_failure_reported),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
