/* Token shards and text files are read where they lie (mapped read-only),
 * not copied: a rank's own (anonymous) memory stays flat while a directory
 * of shards or of text is opened and batches are drawn from it. The windows still read the
 * concatenated stream: across shard boundaries (one window across three
 * shards), in the held-out tail, in each rank's files and in a file's
 * ranges. Expected tokens come from the formula the shards were written
 * with, never from the reader. */
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

#include "dtrain/data.h"
#include "tmpdir.h"

static char g_dir[256];

static int group_setup(void **state) {
    (void)state;
    return dt_test_tmpdir(g_dir, sizeof g_dir, "mapped");
}

static int group_teardown(void **state) {
    (void)state;
    dt_test_rm_rf(g_dir);
    return 0;
}

/* token at position i of the whole stream */
static uint16_t tok_at(int64_t i) { return (uint16_t)((i * 7919 + 13) % 50021); }

/* dir/name holding tokens [first, first + n) of the stream */
static void write_shard(const char *dir, const char *name, int64_t first, int64_t n) {
    uint16_t *v = malloc((size_t)n * sizeof *v);
    assert_non_null(v);
    for (int64_t i = 0; i < n; i++) v[i] = tok_at(first + i);
    char path[600];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    assert_int_equal(dt_token_shard_write(path, v, n), DT_OK);
    free(v);
}

static void make_dir(char *out, size_t n, const char *name) {
    snprintf(out, n, "%s/%s", g_dir, name);
    assert_int_equal(mkdir(out, 0755), 0);
}

/* Window w of split sp must be positions pos(0..T) of the stream. */
static void assert_window(const dt_dataset *d, dt_split sp, int64_t w, int T, int64_t (*pos)(int64_t)) {
    int32_t x[64], y[64];
    assert_true(T <= 64);
    void *xs[1] = {x};
    dt_dataset_batch(d, sp, &w, 1, xs, y);
    for (int t = 0; t < T; t++) {
        if (x[t] != tok_at(pos(w * T + t)) || y[t] != tok_at(pos(w * T + t + 1)))
            fail_msg("split %d window %lld token %d: x %d y %d, expected %d %d", (int)sp, (long long)w, t, x[t], y[t],
                     tok_at(pos(w * T + t)), tok_at(pos(w * T + t + 1)));
    }
}

/* shards of 1000, 20, 2500 and 400 tokens: 3920 in all, the last 392 held
 * out, so training is [0, 3528) */
static int64_t pos_train(int64_t j) { return j; }
static int64_t pos_eval(int64_t j) { return 3528 + j; }
/* 2 parts by file: part 0 = files 0 and 2 = [0, 1000) ++ [1020, 3520);
 * part 1 = files 1 and 3 = [1000, 1020) ++ [3520, 3528) */
static int64_t pos_part0(int64_t j) { return j < 1000 ? j : 1020 + (j - 1000); }
static int64_t pos_part1(int64_t j) { return j < 20 ? 1000 + j : 3520 + (j - 20); }

static void test_windows_across_shards(void **state) {
    (void)state;
    char dir[512];
    make_dir(dir, sizeof dir, "four");
    write_shard(dir, "s0.bin", 0, 1000);
    write_shard(dir, "s1.bin", 1000, 20);
    write_shard(dir, "s2.bin", 1020, 2500);
    write_shard(dir, "s3.bin", 3520, 400);
    dt_dataset d;
    dt_dataset_opts o = {.path = dir, .seq = 64};
    assert_int_equal(dt_dataset_open("shard", &o, &d), DT_OK);
    assert_int_equal(d.size[DT_SPLIT_TRAIN], 3527 / 64);
    assert_int_equal(d.size[DT_SPLIT_EVAL], 391 / 64);
    for (int64_t w = 0; w < d.size[DT_SPLIT_TRAIN]; w++)   /* window 15 = [960, 1024]: shards 0, 1 and 2 */
        assert_window(&d, DT_SPLIT_TRAIN, w, 64, pos_train);
    for (int64_t w = 0; w < d.size[DT_SPLIT_EVAL]; w++) assert_window(&d, DT_SPLIT_EVAL, w, 64, pos_eval);
    dt_dataset_close(&d);
    o.seq = 9;   /* window 110 = [990, 999]: its last token is shard 0's last */
    assert_int_equal(dt_dataset_open("shard", &o, &d), DT_OK);
    assert_int_equal(d.size[DT_SPLIT_TRAIN], 3527 / 9);
    for (int64_t w = 0; w < d.size[DT_SPLIT_TRAIN]; w++) assert_window(&d, DT_SPLIT_TRAIN, w, 9, pos_train);
    dt_dataset_close(&d);

    o.seq = 8;
    o.part_world = 2;
    o.part_rank = 0;
    assert_int_equal(dt_dataset_open("shard", &o, &d), DT_OK);
    assert_int_equal(d.size[DT_SPLIT_TRAIN], 3499 / 8);
    for (int64_t w = 0; w < d.size[DT_SPLIT_TRAIN]; w++) assert_window(&d, DT_SPLIT_TRAIN, w, 8, pos_part0);
    dt_dataset_close(&d);
    o.part_rank = 1;
    assert_int_equal(dt_dataset_open("shard", &o, &d), DT_OK);
    assert_int_equal(d.size[DT_SPLIT_TRAIN], 27 / 8);   /* window 2 = [16, 24]: both of its files */
    for (int64_t w = 0; w < d.size[DT_SPLIT_TRAIN]; w++) assert_window(&d, DT_SPLIT_TRAIN, w, 8, pos_part1);
    for (int64_t w = 0; w < d.size[DT_SPLIT_EVAL]; w++) assert_window(&d, DT_SPLIT_EVAL, w, 8, pos_eval);
    dt_dataset_close(&d);
}

/* shards of 1000, 1000 and 50 tokens: 2050, the last 205 held out, training
 * [0, 1845); 2 parts by file: part 0 = files 0 and 2, file 2 wholly held out
 * (an empty piece); the eval split is [1845, 2050) on every part */
static int64_t pos_held(int64_t j) { return 1845 + j; }

static void test_file_wholly_held_out(void **state) {
    (void)state;
    char dir[512];
    make_dir(dir, sizeof dir, "held");
    write_shard(dir, "h0.bin", 0, 1000);
    write_shard(dir, "h1.bin", 1000, 1000);
    write_shard(dir, "h2.bin", 2000, 50);
    dt_dataset d;
    dt_dataset_opts o = {.path = dir, .seq = 16, .part_rank = 0, .part_world = 2};
    assert_int_equal(dt_dataset_open("shard", &o, &d), DT_OK);
    assert_int_equal(d.size[DT_SPLIT_TRAIN], 999 / 16);
    for (int64_t w = 0; w < d.size[DT_SPLIT_TRAIN]; w++) assert_window(&d, DT_SPLIT_TRAIN, w, 16, pos_train);
    assert_int_equal(d.size[DT_SPLIT_EVAL], 204 / 16);
    for (int64_t w = 0; w < d.size[DT_SPLIT_EVAL]; w++) assert_window(&d, DT_SPLIT_EVAL, w, 16, pos_held);
    dt_dataset_close(&d);
}

/* A text directory's empty file is a piece of no tokens: a = "0123456789",
 * b = "", c = "ABCDEFGHIJ", d = "klmnopqrst" (30 bytes, the last 3 held out);
 * with T = 4 window 2 = "89ABC" crosses b; in 2 parts by file, part 1's
 * files are b and d, so its first window starts past the empty piece. */
static void text_file(const char *dir, const char *name, const char *bytes) {
    char path[600];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs(bytes, f);
    assert_int_equal(fclose(f), 0);
}

static void assert_text_window(const dt_dataset *d, int64_t w, const char *want) {   /* want: T + 1 bytes */
    int32_t x[4], y[4];
    void *xs[1] = {x};
    dt_dataset_batch(d, DT_SPLIT_TRAIN, &w, 1, xs, y);
    for (int t = 0; t < 4; t++)
        if (x[t] != want[t] || y[t] != want[t + 1])
            fail_msg("window %lld token %d: x '%c' y '%c', expected '%c' '%c'", (long long)w, t, x[t], y[t], want[t],
                     want[t + 1]);
}

static void test_empty_text_file(void **state) {
    (void)state;
    char dir[512];
    make_dir(dir, sizeof dir, "text");
    text_file(dir, "a", "0123456789");
    text_file(dir, "b", "");
    text_file(dir, "c", "ABCDEFGHIJ");
    text_file(dir, "d", "klmnopqrst");
    dt_dataset d;
    dt_dataset_opts o = {.path = dir, .seq = 4};
    assert_int_equal(dt_dataset_open("text", &o, &d), DT_OK);
    assert_int_equal(d.size[DT_SPLIT_TRAIN], 26 / 4);
    const char *all = "0123456789ABCDEFGHIJklmnopq";
    for (int64_t w = 0; w < d.size[DT_SPLIT_TRAIN]; w++) assert_text_window(&d, w, all + 4 * w);
    dt_dataset_close(&d);
    o.part_world = 2;
    o.part_rank = 1;   /* b (empty) and d's training part "klmnopq" */
    assert_int_equal(dt_dataset_open("text", &o, &d), DT_OK);
    assert_int_equal(d.size[DT_SPLIT_TRAIN], 6 / 4);
    assert_text_window(&d, 0, "klmno");
    dt_dataset_close(&d);
}

/* one file of 3000 tokens: training [0, 2700); 2 parts by range: [0, 900), [900, 2700) */
static int64_t pos_range1(int64_t j) { return 900 + j; }

static void test_ranges_of_one_shard(void **state) {
    (void)state;
    char dir[512], path[600];
    make_dir(dir, sizeof dir, "one");
    write_shard(dir, "all.bin", 0, 3000);
    snprintf(path, sizeof path, "%s/all.bin", dir);
    dt_dataset d;
    dt_dataset_opts o = {.path = path, .seq = 16, .part_rank = 1, .part_world = 2};
    assert_int_equal(dt_dataset_open("shard", &o, &d), DT_OK);
    assert_int_equal(d.size[DT_SPLIT_TRAIN], 1799 / 16);
    for (int64_t w = 0; w < d.size[DT_SPLIT_TRAIN]; w++) assert_window(&d, DT_SPLIT_TRAIN, w, 16, pos_range1);
    dt_dataset_close(&d);
}

/* kB of this process's resident memory from /proc/self/status: "RssAnon"
 * (its own: heap, not file pages) or "VmRSS" (all of it); -1 unknown */
static long status_kb(const char *field) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    long kb = -1;
    size_t n = strlen(field);
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, field, n) && line[n] == ':' && sscanf(line + n + 1, "%ld", &kb) == 1) break;
    fclose(f);
    return kb;
}

/* 4 shards x 8M tokens = 64 MB: copying them (what the reader did) adds
 * 64 MB to the rank's own memory, and reading them through the mapping at
 * open would add 64 MB of resident file pages; the rank keeps views, and
 * drawing windows maps in only the pages they touch */
static void test_shards_stay_out_of_rank_memory(void **state) {
    (void)state;
    if (status_kb("RssAnon") < 0 || status_kb("VmRSS") < 0) skip();   /* no /proc/self/status: cannot tell */
    char dir[512];
    make_dir(dir, sizeof dir, "big");
    const int64_t per = 8 << 20;
    char name[32];
    for (int k = 0; k < 4; k++) {
        snprintf(name, sizeof name, "big_%d.bin", k);
        write_shard(dir, name, k * per, per);
    }
    long anon0 = status_kb("RssAnon"), rss0 = status_kb("VmRSS");
    dt_dataset d;
    dt_dataset_opts o = {.path = dir, .seq = 64};
    assert_int_equal(dt_dataset_open("shard", &o, &d), DT_OK);
    long anon_open = status_kb("RssAnon") - anon0, rss_open = status_kb("VmRSS") - rss0;
    assert_int_equal(d.size[DT_SPLIT_TRAIN], (4 * per - 4 * per / 10 - 1) / 64);
    for (int64_t w = 0; w < d.size[DT_SPLIT_TRAIN]; w += 997)   /* reading still works everywhere */
        assert_window(&d, DT_SPLIT_TRAIN, w, 64, pos_train);
    long anon_read = status_kb("RssAnon") - anon0;
    dt_dataset_close(&d);
    if (anon_open > 8 * 1024 || anon_read > 8 * 1024)
        fail_msg("64 MB of shards grew the rank's own memory by %ld kB at open, %ld kB after reading", anon_open,
                 anon_read);
    if (rss_open > 8 * 1024) fail_msg("opening 64 MB of shards grew the resident set by %ld kB", rss_open);
}

/* byte i of the text written below */
static uint8_t byte_at(int64_t i) { return (uint8_t)((i * 131 + 7) % 251); }

static void assert_text_bytes(const dt_dataset *d, int64_t w, int T) {   /* T <= 100 */
    int32_t x[100], y[100];
    void *xs[1] = {x};
    dt_dataset_batch(d, DT_SPLIT_TRAIN, &w, 1, xs, y);
    for (int t = 0; t < T; t++)
        if (x[t] != byte_at(w * T + t) || y[t] != byte_at(w * T + t + 1))
            fail_msg("window %lld token %d: x %d y %d, expected %d %d", (long long)w, t, x[t], y[t], byte_at(w * T + t),
                     byte_at(w * T + t + 1));
}

/* 4 text files x 16 MB: widening them to uint16 (what the reader did)
 * added 128 MB to the rank's own memory; mapped, they add nothing, and the
 * windows still read the bytes across file boundaries */
static void test_text_stays_out_of_rank_memory(void **state) {
    (void)state;
    if (status_kb("RssAnon") < 0) skip();
    char dir[512], path[600];
    make_dir(dir, sizeof dir, "bigtext");
    const int64_t per = 16 << 20;
    uint8_t *buf = malloc((size_t)per);
    assert_non_null(buf);
    for (int k = 0; k < 4; k++) {
        for (int64_t i = 0; i < per; i++) buf[i] = byte_at(k * per + i);
        snprintf(path, sizeof path, "%s/part_%d.txt", dir, k);
        FILE *f = fopen(path, "wb");
        assert_non_null(f);
        assert_int_equal(fwrite(buf, 1, (size_t)per, f), (size_t)per);
        assert_int_equal(fclose(f), 0);
    }
    free(buf);
    long anon0 = status_kb("RssAnon");
    dt_dataset d;
    const int T = 100;
    dt_dataset_opts o = {.path = dir, .seq = T};
    assert_int_equal(dt_dataset_open("text", &o, &d), DT_OK);
    long anon_open = status_kb("RssAnon") - anon0;
    assert_int_equal(d.size[DT_SPLIT_TRAIN], (4 * per - 4 * per / 10 - 1) / T);
    int64_t edges[] = {per / T, 2 * per / T, 3 * per / T - 1, d.size[DT_SPLIT_TRAIN] - 1};   /* across files, the last */
    for (int64_t w = 0; w < d.size[DT_SPLIT_TRAIN]; w += 4099) assert_text_bytes(&d, w, T);
    for (int i = 0; i < 4; i++) assert_text_bytes(&d, edges[i], T);
    long anon_read = status_kb("RssAnon") - anon0;
    dt_dataset_close(&d);
    if (anon_open > 8 * 1024 || anon_read > 8 * 1024)
        fail_msg("64 MB of text grew the rank's own memory by %ld kB at open, %ld kB after reading", anon_open,
                 anon_read);
}

/* More short text files than the kernel's mappings per process (65530 by
 * default): they are read, not mapped each, into buffers of their size
 * (a page each, as before, held 66000 x 4 KiB = 258 MB of the rank's own
 * memory for 132 kB of text: the bound is 128 MB, the lists of pieces and,
 * under ASan, its redzones included: 39 MB there, a few in a release
 * build); and a pseudo-file whose size says 0 still gives its bytes. */
static void test_many_small_text_files(void **state) {
    (void)state;
    char dir[512], name[32];
    make_dir(dir, sizeof dir, "manytext");
    enum { FILES = 66000 };
    for (int k = 0; k < FILES; k++) {
        snprintf(name, sizeof name, "doc%06d.txt", k);
        text_file(dir, name, "ab");   /* file k holds "ab": the stream is "abab..." */
    }
    dt_dataset d;
    dt_dataset_opts o = {.path = dir, .seq = 4};
    long anon0 = status_kb("RssAnon");
    dt_status st = dt_dataset_open("text", &o, &d);
    if (st != DT_OK) fail_msg("%d files of 2 bytes: %s", FILES, dt_error_message());
    long grown = status_kb("RssAnon") - anon0;
    if (anon0 >= 0 && grown > 128 * 1024) {
        dt_dataset_close(&d);
        fail_msg("%d files of 2 bytes took %ld kB of the rank's memory", FILES, grown);
    }
    assert_int_equal(d.size[DT_SPLIT_TRAIN], (2 * FILES - 2 * FILES / 10 - 1) / 4);
    assert_text_window(&d, 0, "ababa");
    assert_text_window(&d, d.size[DT_SPLIT_TRAIN] - 1, "ababa");
    dt_dataset_close(&d);
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return;   /* no procfs: nothing more to check */
    fclose(f);
    dt_dataset_opts po = {.path = "/proc/self/status", .seq = 8};
    st = dt_dataset_open("text", &po, &d);
    if (st != DT_OK) fail_msg("/proc/self/status (size 0, text inside): %s", dt_error_message());
    int32_t x[8], y[8];
    void *xs[1] = {x};
    int64_t w = 0;
    dt_dataset_batch(&d, DT_SPLIT_TRAIN, &w, 1, xs, y);
    const char *want = "Name:";   /* the status file's first line */
    for (int t = 0; t < 5; t++)
        if (x[t] != want[t]) fail_msg("/proc/self/status token %d: %d, expected '%c'", t, x[t], want[t]);
    dt_dataset_close(&d);
}

/* The validation data never shares a file with the training data, whatever
 * the names: a hard link to the training file in the validation directory,
 * a symbolic link to it, or training given as a link into the validation
 * directory, are refused naming train.val_path (each trained and reported
 * a validation loss on training data before); eval_only reads no training
 * batch, so it does not care. */
static void test_validation_shares_no_file(void **state) {
    (void)state;
    char tr[512], va[512], vb[512], path[600], other[600], lnk[700];
    make_dir(tr, sizeof tr, "ov_train");
    make_dir(va, sizeof va, "ov_val_hard");
    make_dir(vb, sizeof vb, "ov_val_sym");
    char text[200];
    for (int i = 0; i < 199; i++) text[i] = (char)('a' + i % 26);
    text[199] = 0;
    text_file(tr, "train.txt", text);
    text_file(va, "other.txt", text + 50);
    text_file(vb, "other.txt", text + 50);
    snprintf(path, sizeof path, "%s/train.txt", tr);
    snprintf(lnk, sizeof lnk, "%s/copy.txt", va);
    assert_int_equal(link(path, lnk), 0);
    snprintf(lnk, sizeof lnk, "%s/copy.txt", vb);
    assert_int_equal(symlink(path, lnk), 0);
    dt_dataset d;
    const char *vals[] = {va, vb};
    for (int k = 0; k < 2; k++) {
        dt_dataset_opts o = {.path = path, .val_path = vals[k], .seq = 8};
        assert_int_equal(dt_dataset_open("text", &o, &d), DT_EINVAL);
        if (!strstr(dt_error_message(), vals[k]) || !strstr(dt_error_message(), "training data"))
            fail_msg("%s", dt_error_message());
        o.eval_only = 1;
        assert_int_equal(dt_dataset_open("text", &o, &d), DT_OK);
        dt_dataset_close(&d);
    }
    /* training through a link into a validation directory holding its target */
    snprintf(other, sizeof other, "%s/other.txt", va);
    snprintf(lnk, sizeof lnk, "%s/via_link.txt", tr);
    assert_int_equal(symlink(other, lnk), 0);
    dt_dataset_opts o = {.path = lnk, .val_path = va, .seq = 8};
    assert_int_equal(dt_dataset_open("text", &o, &d), DT_EINVAL);
    /* separate files: fine */
    dt_dataset_opts ok = {.path = path, .val_path = other, .seq = 8};
    assert_int_equal(dt_dataset_open("text", &ok, &d), DT_OK);
    dt_dataset_close(&d);
}

/* A validation shard with a larger id than any training one sets the
 * vocabulary, and messages about the vocabulary name it (classes_source);
 * messages about the training samples still name the training data
 * (source): "the 2 training samples of --val-path v.bin" was wrong. */
static void test_sources_of_messages(void **state) {
    (void)state;
    char dir[512], tp[600], vp[600];
    make_dir(dir, sizeof dir, "sources");
    int64_t first = 0;   /* a validation stretch whose largest id exceeds the training one's */
    uint16_t tmax = 0;
    for (int64_t i = 0; i < 40; i++) tmax = tok_at(i) > tmax ? tok_at(i) : tmax;
    for (int64_t f = 40;; f++) {
        uint16_t vmax = 0;
        for (int64_t i = 0; i < 40; i++) vmax = tok_at(f + i) > vmax ? tok_at(f + i) : vmax;
        if (vmax > tmax) { first = f; break; }
    }
    write_shard(dir, "t.bin", 0, 40);
    write_shard(dir, "v.bin", first, 40);
    snprintf(tp, sizeof tp, "%s/t.bin", dir);
    snprintf(vp, sizeof vp, "%s/v.bin", dir);
    dt_dataset d;
    dt_dataset_opts o = {.path = tp, .val_path = vp, .seq = 8};
    assert_int_equal(dt_dataset_open("shard", &o, &d), DT_OK);
    assert_string_equal(d.source, tp);
    assert_non_null(strstr(d.classes_source, "v.bin"));
    dt_dataset_close(&d);
}

/* The mapped reader's own checks name the file: a truncated header, a bad
 * size, and a FIFO (refused at once, not waited on). */
static void test_mapped_errors_name_the_file(void **state) {
    (void)state;
    char dir[512], path[600];
    make_dir(dir, sizeof dir, "bad");
    write_shard(dir, "a.bin", 0, 100);
    snprintf(path, sizeof path, "%s/b.bin", dir);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs("short", f);
    fclose(f);
    dt_dataset d;
    dt_dataset_opts o = {.path = dir, .seq = 8};
    assert_int_equal(dt_dataset_open("shard", &o, &d), DT_EFORMAT);
    if (!strstr(dt_error_message(), "b.bin") || !strstr(dt_error_message(), "truncated"))
        fail_msg("%s", dt_error_message());
    f = fopen(path, "r+b");   /* a whole header claiming 100 tokens, and 3 bytes of them */
    assert_non_null(f);
    int32_t hdr[256] = {20240520, 1, 100};
    assert_int_equal(fwrite(hdr, sizeof hdr, 1, f), 1);
    fputs("abc", f);
    fclose(f);
    assert_int_equal(dt_dataset_open("shard", &o, &d), DT_EFORMAT);
    if (!strstr(dt_error_message(), "b.bin") || !strstr(dt_error_message(), "size mismatch"))
        fail_msg("%s", dt_error_message());
    snprintf(path, sizeof path, "%s/fifo.bin", g_dir);
    assert_int_equal(mkfifo(path, 0600), 0);
    dt_dataset_opts fo = {.path = path, .seq = 8};
    alarm(10);   /* an open that waits for a writer fails the test (SIGALRM), not after ctest's timeout */
    assert_int_equal(dt_dataset_open("shard", &fo, &d), DT_EINVAL);
    alarm(0);
    if (!strstr(dt_error_message(), "fifo.bin") || !strstr(dt_error_message(), "not a regular file"))
        fail_msg("%s", dt_error_message());
    alarm(10);   /* as text */
    assert_int_equal(dt_dataset_open("text", &fo, &d), DT_EINVAL);
    alarm(0);
    if (!strstr(dt_error_message(), "fifo.bin") || !strstr(dt_error_message(), "not a regular file"))
        fail_msg("%s", dt_error_message());
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_windows_across_shards),
        cmocka_unit_test(test_file_wholly_held_out),
        cmocka_unit_test(test_empty_text_file),
        cmocka_unit_test(test_ranges_of_one_shard),
        cmocka_unit_test(test_shards_stay_out_of_rank_memory),
        cmocka_unit_test(test_text_stays_out_of_rank_memory),
        cmocka_unit_test(test_many_small_text_files),
        cmocka_unit_test(test_mapped_errors_name_the_file),
        cmocka_unit_test(test_validation_shares_no_file),
        cmocka_unit_test(test_sources_of_messages),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
