/* Token datasets: byte-level text (file and directory), llm.c token shards
 * (round trip, atomic write, corrupt headers), windows and batches. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dtrain/data.h"
#include "tmpdir.h"

static char g_dir[256];

/* ---- fixture helpers ---- */

static int group_setup(void **state) {
    (void)state;
    return dt_test_tmpdir(g_dir, sizeof g_dir, "text");
}

static int group_teardown(void **state) {
    (void)state;
    dt_test_rm_rf(g_dir);
    return 0;
}

static const char *fpath(const char *name) {
    static char buf[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", g_dir, name);
    return buf[k];
}

static void write_file(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    if (n) assert_int_equal(fwrite(p, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

static void assert_msg_has(const char *needle) {
    const char *m = dt_error_message();
    if (!strstr(m, needle)) fail_msg("error message \"%s\" lacks \"%s\"", m, needle);
}

static int count_entries(const char *dir) {
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(d);
    return n;
}

/* Raw shard image: header ints h0..h2, then ntok uint16 (little-endian), plus extra bytes. */
static void write_raw_shard(const char *path, int32_t magic, int32_t version, int32_t n_hdr,
                            int64_t ntok, size_t extra) {
    size_t sz = 1024 + 2 * (size_t)ntok + extra;
    uint8_t *b = calloc(1, sz);
    assert_non_null(b);
    int32_t h[3] = {magic, version, n_hdr};
    for (int i = 0; i < 3; i++)
        for (int k = 0; k < 4; k++) b[4 * i + k] = (uint8_t)((uint32_t)h[i] >> (8 * k));
    for (int64_t i = 0; i < ntok; i++) b[1024 + 2 * i] = (uint8_t)(i % 50);
    write_file(path, b, sz);
    free(b);
}

/* ---- text ---- */

static void test_text_file_bytes(void **state) {
    (void)state;
    const unsigned char content[] = {'h', 'i', '\n', 0x00, 0xff, 0x80};
    const char *p = fpath("one.txt");
    write_file(p, content, sizeof content);
    dt_token_dataset d;
    assert_int_equal(dt_text_load(p, &d), DT_OK);
    assert_int_equal(d.n_tokens, 6);
    assert_int_equal(d.vocab, 256);
    for (int i = 0; i < 6; i++) assert_int_equal(d.tokens[i], content[i]);   /* bytes unsigned */
    dt_token_dataset_free(&d);
    assert_null(d.tokens);
}

static void test_text_dir_sorted_skips_index_and_links(void **state) {
    (void)state;
    char dir[512];
    snprintf(dir, sizeof dir, "%s/fort", g_dir);
    assert_int_equal(mkdir(dir, 0755), 0);
    char p[600];
    snprintf(p, sizeof p, "%s/zeta", dir);  write_file(p, "ZZ", 2);
    snprintf(p, sizeof p, "%s/alpha", dir); write_file(p, "aaa", 3);
    snprintf(p, sizeof p, "%s/mid", dir);   write_file(p, "m", 1);
    snprintf(p, sizeof p, "%s/alpha.dat", dir); write_file(p, "IDXIDX", 6);
    snprintf(p, sizeof p, "%s/alpha.u8", dir);  assert_int_equal(symlink("alpha", p), 0);
    snprintf(p, sizeof p, "%s/beta", dir);      assert_int_equal(symlink("zeta", p), 0);
    snprintf(p, sizeof p, "%s/sub", dir);       assert_int_equal(mkdir(p, 0755), 0);
    snprintf(p, sizeof p, "%s/sub/inner", dir); write_file(p, "SUB", 3);
    snprintf(p, sizeof p, "%s/.DS_Store", dir); write_file(p, "HID", 3);   /* hidden: not data */
    snprintf(p, sizeof p, "%s/.zeta.swp", dir); write_file(p, "SWP", 3);
    snprintf(p, sizeof p, "%s/outside.txt", g_dir); write_file(p, "EXT", 3);
    char q[600];
    snprintf(q, sizeof q, "%s/gamma", dir);     assert_int_equal(symlink(p, q), 0);

    dt_token_dataset d;
    assert_int_equal(dt_text_load(dir, &d), DT_OK);
    /* alpha, gamma (a link to a file elsewhere: read), mid, zeta; no .dat,
     * no .u8, beta (a second name of zeta: once, under its own name), no subdir,
     * no hidden file */
    const char *want = "aaaEXTmZZ";
    assert_int_equal(d.n_tokens, (int64_t)strlen(want));
    for (size_t i = 0; i < strlen(want); i++) assert_int_equal(d.tokens[i], (unsigned char)want[i]);
    assert_int_equal(d.vocab, 256);
    dt_token_dataset_free(&d);

    /* a dangling link is an error naming it, not data silently missing */
    snprintf(p, sizeof p, "%s/omega", dir);     assert_int_equal(symlink("nothing-here", p), 0);
    assert_int_equal(dt_text_load(dir, &d), DT_EIO);
    assert_msg_has("omega");
    assert_int_equal(unlink(p), 0);

    /* a link another user owns is not followed (one planted in a shared
     * directory could point at a file only the victim may read); making one
     * needs root (lchown), which the suite's machines are */
    snprintf(p, sizeof p, "%s/planted", dir);   assert_int_equal(symlink("alpha", p), 0);
    if (lchown(p, 65534, 65534) == 0) {
        assert_int_equal(dt_text_load(dir, &d), DT_EINVAL);
        assert_msg_has("planted: a link owned by another user (uid 65534)");
    } else {
        print_message("(not root: the other user's link is not checked)\n");
    }
    assert_int_equal(unlink(p), 0);

    /* a symlink passed directly is followed */
    snprintf(p, sizeof p, "%s/beta", dir);
    assert_int_equal(dt_text_load(p, &d), DT_OK);
    assert_int_equal(d.n_tokens, 2);
    assert_int_equal(d.tokens[0], 'Z');
    dt_token_dataset_free(&d);
}

static void test_text_empty_is_error(void **state) {
    (void)state;
    const char *p = fpath("empty.txt");
    write_file(p, "", 0);
    dt_token_dataset d;
    assert_int_equal(dt_text_load(p, &d), DT_EFORMAT);
    assert_null(d.tokens);
    assert_msg_has(p);

    char dir[512];
    snprintf(dir, sizeof dir, "%s/onlydat", g_dir);
    assert_int_equal(mkdir(dir, 0755), 0);
    char q[600];
    snprintf(q, sizeof q, "%s/x.dat", dir);
    write_file(q, "abc", 3);
    assert_int_equal(dt_text_load(dir, &d), DT_EFORMAT);
    assert_msg_has("no text data");
}

static void test_text_missing(void **state) {
    (void)state;
    const char *p = fpath("nope");
    dt_token_dataset d;
    assert_int_equal(dt_text_load(p, &d), DT_EIO);
    assert_msg_has(p);
}

static void test_text_fortunes_dir(void **state) {
    (void)state;
    DIR *dd = opendir(DT_FORTUNES_DIR);
    if (!dd) skip();
    /* expected size: regular, non-.dat/.u8 files */
    int64_t want = 0;
    struct dirent *e;
    char p[1024];
    while ((e = readdir(dd)) != NULL) {
        size_t l = strlen(e->d_name);
        if ((l >= 4 && !strcmp(e->d_name + l - 4, ".dat")) || (l >= 3 && !strcmp(e->d_name + l - 3, ".u8")))
            continue;
        snprintf(p, sizeof p, "%s/%s", DT_FORTUNES_DIR, e->d_name);
        struct stat sb;
        if (lstat(p, &sb) == 0 && S_ISREG(sb.st_mode)) want += sb.st_size;
    }
    closedir(dd);
    if (want == 0) skip();
    dt_token_dataset d;
    assert_int_equal(dt_text_load(DT_FORTUNES_DIR, &d), DT_OK);
    assert_int_equal(d.n_tokens, want);
    assert_int_equal(d.vocab, 256);
    for (int64_t i = 0; i < d.n_tokens; i++) assert_true(d.tokens[i] < 256);
    dt_token_dataset_free(&d);
}

/* ---- token shards ---- */

static void test_shard_roundtrip(void **state) {
    (void)state;
    char dir[512];
    snprintf(dir, sizeof dir, "%s/shards", g_dir);
    assert_int_equal(mkdir(dir, 0755), 0);
    char p[600];
    snprintf(p, sizeof p, "%s/tok.bin", dir);
    enum { N = 100003 };   /* spans more than one write chunk */
    uint16_t *t = malloc(N * sizeof *t);
    assert_non_null(t);
    for (int i = 0; i < N; i++) t[i] = (uint16_t)((i * 7919u) % 50257u);
    t[123] = 50256;   /* max id: vocab = 50257 */
    assert_int_equal(dt_token_shard_write(p, t, N), DT_OK);
    assert_int_equal(count_entries(dir), 1);   /* no temp file left behind */

    /* exact on-disk layout: LE header, 2 bytes per token */
    struct stat sb;
    assert_int_equal(stat(p, &sb), 0);
    assert_int_equal(sb.st_size, 1024 + 2 * N);
    FILE *f = fopen(p, "rb");
    assert_non_null(f);
    uint8_t h[16];
    assert_int_equal(fread(h, 1, 16, f), 16);
    fclose(f);
    const uint8_t want_h[12] = {0x88, 0xd8, 0x34, 0x01, 1, 0, 0, 0,
                                (uint8_t)(N & 0xff), (uint8_t)((N >> 8) & 0xff), (uint8_t)(N >> 16), 0};
    assert_memory_equal(h, want_h, 12);   /* 20240520 = 0x0134d888 */

    dt_token_dataset d;
    assert_int_equal(dt_token_shard_load(p, &d), DT_OK);
    assert_int_equal(d.n_tokens, N);
    assert_int_equal(d.vocab, 50257);
    assert_memory_equal(d.tokens, t, N * sizeof *t);
    dt_token_dataset_free(&d);

    /* overwrite replaces content atomically */
    const uint16_t small[3] = {5, 1, 2};
    assert_int_equal(dt_token_shard_write(p, small, 3), DT_OK);
    assert_int_equal(count_entries(dir), 1);
    assert_int_equal(dt_token_shard_load(p, &d), DT_OK);
    assert_int_equal(d.n_tokens, 3);
    assert_int_equal(d.vocab, 6);
    assert_int_equal(d.tokens[0], 5);
    dt_token_dataset_free(&d);
    free(t);
}

static void test_shard_relative_path(void **state) {
    (void)state;
    char cwd[1024];
    assert_non_null(getcwd(cwd, sizeof cwd));
    assert_int_equal(chdir(g_dir), 0);
    const uint16_t t[2] = {1, 2};
    dt_status st = dt_token_shard_write("rel.bin", t, 2);   /* directory is "." */
    assert_int_equal(chdir(cwd), 0);
    assert_int_equal(st, DT_OK);
    dt_token_dataset d;
    assert_int_equal(dt_token_shard_load(fpath("rel.bin"), &d), DT_OK);
    assert_int_equal(d.n_tokens, 2);
    dt_token_dataset_free(&d);
}

static void test_shard_write_errors(void **state) {
    (void)state;
    const uint16_t t[2] = {1, 2};
    const char *p = fpath("no-such-dir/x.bin");
    assert_int_equal(dt_token_shard_write(p, t, 2), DT_EIO);
    assert_msg_has(p);
    assert_int_equal(dt_token_shard_write(fpath("z.bin"), t, 0), DT_EINVAL);
    assert_int_equal(dt_token_shard_write(fpath("z.bin"), t, -1), DT_EINVAL);
    assert_int_equal(dt_token_shard_write(fpath("z.bin"), NULL, 2), DT_EINVAL);
    assert_int_equal(access(fpath("z.bin"), F_OK), -1);
}

static void test_shard_corrupt(void **state) {
    (void)state;
    const char *p = fpath("bad.bin");
    dt_token_dataset d;

    write_raw_shard(p, 20240521, 1, 10, 10, 0);
    assert_int_equal(dt_token_shard_load(p, &d), DT_EFORMAT);
    assert_null(d.tokens);
    assert_msg_has(p);
    assert_msg_has("bad magic 20240521");

    write_raw_shard(p, 20240520, 2, 10, 10, 0);
    assert_int_equal(dt_token_shard_load(p, &d), DT_EFORMAT);
    assert_msg_has("version 2");

    /* fewer tokens than the header says */
    write_raw_shard(p, 20240520, 1, 10, 9, 0);
    assert_int_equal(dt_token_shard_load(p, &d), DT_EFORMAT);
    assert_msg_has("size mismatch");

    /* extra bytes after the tokens */
    write_raw_shard(p, 20240520, 1, 10, 10, 1);
    assert_int_equal(dt_token_shard_load(p, &d), DT_EFORMAT);
    assert_msg_has("size mismatch");

    /* hostile counts */
    write_raw_shard(p, 20240520, 1, -5, 0, 0);
    assert_int_equal(dt_token_shard_load(p, &d), DT_EFORMAT);
    assert_msg_has("token count -5");
    write_raw_shard(p, 20240520, 1, 0x7fffffff, 4, 0);
    assert_int_equal(dt_token_shard_load(p, &d), DT_EFORMAT);
    write_raw_shard(p, 20240520, 1, 0, 0, 0);
    assert_int_equal(dt_token_shard_load(p, &d), DT_EFORMAT);

    /* shorter than the header */
    write_file(p, "abc", 3);
    assert_int_equal(dt_token_shard_load(p, &d), DT_EFORMAT);
    assert_msg_has("truncated");

    /* and a well-formed one of the same helper loads */
    write_raw_shard(p, 20240520, 1, 10, 10, 0);
    assert_int_equal(dt_token_shard_load(p, &d), DT_OK);
    assert_int_equal(d.n_tokens, 10);
    assert_int_equal(d.vocab, 10);
    dt_token_dataset_free(&d);

    assert_int_equal(dt_token_shard_load(fpath("missing.bin"), &d), DT_EIO);
}

/* ---- windows / batches ---- */

static void test_token_windows_and_batch(void **state) {
    (void)state;
    uint16_t tok[21];
    for (int i = 0; i < 21; i++) tok[i] = (uint16_t)(100 + i);
    dt_token_dataset d = {.tokens = tok, .n_tokens = 21, .vocab = 256};
    assert_int_equal(dt_token_windows(&d, 4), 5);   /* (21-1)/4 */
    assert_int_equal(dt_token_windows(&d, 20), 1);
    assert_int_equal(dt_token_windows(&d, 21), 0);  /* needs T+1 tokens */
    assert_int_equal(dt_token_windows(&d, 0), 0);
    d.n_tokens = 20;
    assert_int_equal(dt_token_windows(&d, 4), 4);
    d.n_tokens = 21;

    int64_t idx[2] = {4, 1};   /* last window uses token 20 as its final target */
    int32_t x[8], y[8];
    dt_token_batch(&d, idx, 2, 4, x, y);
    const int32_t wx[8] = {116, 117, 118, 119, 104, 105, 106, 107};
    const int32_t wy[8] = {117, 118, 119, 120, 105, 106, 107, 108};
    assert_memory_equal(x, wx, sizeof wx);
    assert_memory_equal(y, wy, sizeof wy);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_text_file_bytes),
        cmocka_unit_test(test_text_dir_sorted_skips_index_and_links),
        cmocka_unit_test(test_text_empty_is_error),
        cmocka_unit_test(test_text_missing),
        cmocka_unit_test(test_text_fortunes_dir),
        cmocka_unit_test(test_shard_roundtrip),
        cmocka_unit_test(test_shard_relative_path),
        cmocka_unit_test(test_shard_write_errors),
        cmocka_unit_test(test_shard_corrupt),
        cmocka_unit_test(test_token_windows_and_batch),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
