/* Atomic file writes: replacement (keeping the replaced file's permissions),
 * failure paths keep the old file and leave no temp files behind. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include "dtrain/io.h"
#include "tmpdir.h"

static char g_dir[64];

static int setup_dir(void **state) {
    (void)state;
    return dt_test_tmpdir(g_dir, sizeof g_dir, "io_atomic");
}

static int teardown_dir(void **state) {
    (void)state;
    dt_test_rm_rf(g_dir);
    return 0;
}

static const char *path_in(const char *name) {
    static char buf[4][256];
    static int k;
    char *p = buf[k++ & 3];
    snprintf(p, 256, "%s/%s", g_dir, name);
    return p;
}

static int count_temp_files(const char *dir) {
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strstr(e->d_name, ".tmp.")) n++;
    closedir(d);
    return n;
}

static void assert_file_is(const char *p, const void *want, size_t n) {
    FILE *f = fopen(p, "rb");
    assert_non_null(f);
    unsigned char *got = malloc(n + 16);
    size_t got_n = fread(got, 1, n + 16, f);
    fclose(f);
    assert_int_equal(got_n, n);
    if (n) assert_memory_equal(got, want, n);
    free(got);
}

static void test_create_and_replace(void **state) {
    (void)state;
    const char *p = path_in("file.bin");
    assert_int_equal(dt_write_file_atomic(p, "hello", 5), DT_OK);
    assert_file_is(p, "hello", 5);
    const char *longer = "a much longer replacement text";
    assert_int_equal(dt_write_file_atomic(p, longer, strlen(longer)), DT_OK);
    assert_file_is(p, longer, strlen(longer));
    assert_int_equal(dt_write_file_atomic(p, "xy", 2), DT_OK);   /* shorter: no stale tail */
    assert_file_is(p, "xy", 2);
    assert_int_equal(dt_write_file_atomic(p, NULL, 0), DT_OK);
    assert_file_is(p, "", 0);
    assert_int_equal(count_temp_files(g_dir), 0);
    /* the replaced file's permissions stay (a private checkpoint stays private) */
    for (mode_t m = 0600; m; m = m == 0600 ? 0640 : 0) {
        assert_int_equal(chmod(p, m), 0);
        assert_int_equal(dt_write_file_atomic(p, "kept", 4), DT_OK);
        struct stat sb;
        assert_int_equal(stat(p, &sb), 0);
        assert_int_equal(sb.st_mode & 07777, m);
    }

    /* Relative path (directory "."). */
    char cwd[512];
    assert_non_null(getcwd(cwd, sizeof cwd));
    assert_int_equal(chdir(g_dir), 0);
    assert_int_equal(dt_write_file_atomic("rel.bin", "rel", 3), DT_OK);
    assert_int_equal(chdir(cwd), 0);
    assert_file_is(path_in("rel.bin"), "rel", 3);
}

static void test_target_is_directory(void **state) {
    (void)state;
    const char *p = path_in("subdir");
    assert_int_equal(mkdir(p, 0700), 0);
    /* The data is written to the temp file, then rename fails. */
    assert_int_equal(dt_write_file_atomic(p, "data", 4), DT_EIO);
    assert_non_null(strstr(dt_error_message(), p));
    struct stat sb;
    assert_int_equal(stat(p, &sb), 0);
    assert_true(S_ISDIR(sb.st_mode));
    assert_int_equal(count_temp_files(g_dir), 0);

    float w[2] = {1, 2};
    dt_st_entry e = {"w", DT_F32, 1, {2}, w};
    assert_int_equal(dt_safetensors_write(p, &e, 1, NULL, 0), DT_EIO);
    assert_int_equal(count_temp_files(g_dir), 0);
}

static void test_missing_directory(void **state) {
    (void)state;
    const char *p = path_in("no/such/dir/file.bin");
    assert_int_equal(dt_write_file_atomic(p, "x", 1), DT_EIO);
    assert_non_null(strstr(dt_error_message(), p));
    assert_int_equal(dt_write_file_atomic("", "x", 1), DT_EINVAL);
    assert_int_equal(dt_write_file_atomic(NULL, "x", 1), DT_EINVAL);
}

/* A write that fails part way (file size limit; works even as root) and, when
 * not root, an unwritable directory: the old file survives, no temp files. */
static void test_failed_write_keeps_old(void **state) {
    (void)state;
    const char *p = path_in("ckpt.bin");
    const char old[] = "previous checkpoint contents";
    assert_int_equal(dt_write_file_atomic(p, old, sizeof old), DT_OK);

    size_t big_n = 1 << 20;
    unsigned char *big = malloc(big_n);
    assert_non_null(big);
    memset(big, 0xAB, big_n);

    struct rlimit saved, lim;
    assert_int_equal(getrlimit(RLIMIT_FSIZE, &saved), 0);
    void (*prev)(int) = signal(SIGXFSZ, SIG_IGN);
    lim = saved;
    lim.rlim_cur = 4096;
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
    dt_status s1 = dt_write_file_atomic(p, big, big_n);
    float *wbig = (float *)big;
    dt_st_entry e = {"big", DT_F32, 1, {(int64_t)(big_n / 4)}, wbig};
    dt_status s2 = dt_safetensors_write(p, &e, 1, NULL, 0);
    dt_st_writer *w = NULL;
    dt_status s3 = dt_st_writer_open(&w, p, &e, 1, NULL, 0);
    dt_status s4 = DT_OK;
    if (s3 == DT_OK) {
        for (size_t off = 0; off < big_n && s4 == DT_OK; off += 8192)
            s4 = dt_st_writer_append(w, big + off, 8192);
        s4 = dt_st_writer_commit(w);
    }
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &saved), 0);
    signal(SIGXFSZ, prev);

    assert_int_equal(s1, DT_EIO);
    assert_int_equal(s2, DT_EIO);
    assert_int_equal(s3, DT_OK);
    assert_int_not_equal(s4, DT_OK);
    assert_file_is(p, old, sizeof old);
    assert_int_equal(count_temp_files(g_dir), 0);

    if (geteuid() != 0) {   /* root ignores directory permissions */
        assert_int_equal(chmod(g_dir, 0500), 0);
        assert_int_equal(dt_write_file_atomic(p, big, 16), DT_EIO);
        assert_non_null(strstr(dt_error_message(), p));
        assert_int_equal(chmod(g_dir, 0700), 0);
        assert_file_is(p, old, sizeof old);
        assert_int_equal(count_temp_files(g_dir), 0);
    }
    /* Control: without the limit the same write succeeds. */
    assert_int_equal(dt_write_file_atomic(p, big, big_n), DT_OK);
    assert_file_is(p, big, big_n);
    free(big);
}

/* Concurrent writers of one path: every result is one complete version. */
typedef struct writer_arg { const char *path; unsigned char fill; int failures; } writer_arg;

static void *writer_thread(void *p) {
    writer_arg *a = p;
    unsigned char buf[3000];
    memset(buf, a->fill, sizeof buf);
    for (int i = 0; i < 50; i++)
        if (dt_write_file_atomic(a->path, buf, sizeof buf) != DT_OK) a->failures++;
    return NULL;
}

static void test_concurrent_writers(void **state) {
    (void)state;
    const char *p = path_in("shared.bin");
    writer_arg a = {p, 'A', 0}, b = {p, 'B', 0};
    pthread_t ta, tb;
    assert_int_equal(pthread_create(&ta, NULL, writer_thread, &a), 0);
    assert_int_equal(pthread_create(&tb, NULL, writer_thread, &b), 0);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    assert_int_equal(a.failures, 0);
    assert_int_equal(b.failures, 0);
    FILE *f = fopen(p, "rb");
    assert_non_null(f);
    unsigned char got[4000];
    size_t n = fread(got, 1, sizeof got, f);
    fclose(f);
    assert_int_equal(n, 3000);
    for (size_t i = 1; i < n; i++) assert_int_equal(got[i], got[0]);
    assert_true(got[0] == 'A' || got[0] == 'B');
    assert_int_equal(count_temp_files(g_dir), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_create_and_replace, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_target_is_directory, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_missing_directory, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_failed_write_keeps_old, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_concurrent_writers, setup_dir, teardown_dir),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
