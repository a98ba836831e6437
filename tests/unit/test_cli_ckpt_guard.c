/* Checkpoints know what they are, through the CLI (tiny GPT-2 on a text file):
 *  - resuming with another architecture (--layers, --heads) fails naming the
 *    flag and both values; --steps below the checkpoint's step fails naming both;
 *  - a flipped byte in a tensor's data is reported naming the file and the
 *    tensor, for a single file (--resume and --init) and for a ZeRO sharded set
 *    (--nproc 2 and 4);
 *  - --init / --resume reject overlapping data_offsets, trailing bytes and a
 *    header length one short (data misaligned by a byte) with a reader error
 *    naming the file;
 *  - a save removes the temp file a killed save left (its pid is dead).
 * DT_TEST_CLI=/path/to/dtrain runs the same checks against another build. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cjson/cJSON.h>
#include "cli_env.h"
#include "tmpdir.h"

static char dir[64], corpus[128];
static char out[1 << 16];

static const char *cli(void) {
    const char *c = getenv("DT_TEST_CLI");
    return c && *c ? c : DT_CLI_PATH;
}

static int setup(void **state) {
    (void)state;
    dt_test_cli_mpi_env();
    if (dt_test_tmpdir(dir, sizeof dir, "cli_ckpt_guard") != 0) return -1;
    snprintf(corpus, sizeof corpus, "%s/corpus.txt", dir);
    FILE *f = fopen(corpus, "w");
    if (!f) return -1;
    for (int i = 0; i < 300; i++) fprintf(f, "a stitch in time saves %d, said the %d-th tailor.\n", i % 17, i % 5);
    fclose(f);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    dt_test_rm_rf(dir);
    return 0;
}

/* `dtrain train <tiny gpt2> <extra>`; exit status, output in out. */
static int run(const char *extra) {
    static char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "%s train --model gpt2 --embd 32 --max-t 16 --seq 16 --batch 4 --data text --data-path %s "
             "--lr 3e-3 --seed 5 --eval-batches 1 --quiet --threads 1 %s 2>&1",
             cli(), corpus, extra);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t k = fread(out, 1, sizeof out - 1, p);
    out[k] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void train(const char *extra) {
    int rc = run(extra);
    if (rc != 0) fail_msg("dtrain train ... %s: exit %d, output:\n%s", extra, rc, out);
}

/* The run fails and its output has every one of the n needles. */
static void expect_fail(const char *extra, int n, ...) {
    int rc = run(extra);
    if (rc == 0) fail_msg("dtrain train ... %s: exit 0 (expected an error), output:\n%s", extra, out);
    va_list ap;
    va_start(ap, n);
    for (int i = 0; i < n; i++) {
        const char *needle = va_arg(ap, const char *);
        if (!strstr(out, needle)) fail_msg("dtrain train ... %s: output lacks '%s':\n%s", extra, needle, out);
    }
    va_end(ap);
}

/* ---- file surgery (headers parsed here with cJSON, not by dtrain) ---- */
static unsigned char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc(*n + 1);
    assert_non_null(b);
    assert_int_equal(fread(b, 1, *n, f), *n);
    fclose(f);
    return b;
}

static void spit(const char *path, const void *b, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(b, 1, n, f), n);
    fclose(f);
}

static uint64_t hdr_len(const unsigned char *b) {
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | b[i];
    return n;
}

static cJSON *parse_header(const unsigned char *b) {
    uint64_t n = hdr_len(b);
    char *t = malloc(n + 1);
    memcpy(t, b + 8, n);
    t[n] = 0;
    cJSON *j = cJSON_Parse(t);
    free(t);
    assert_non_null(j);
    return j;
}

static void offsets(const cJSON *h, const char *name, uint64_t *b, uint64_t *e) {
    const cJSON *o = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(h, name), "data_offsets");
    assert_non_null(o);
    *b = (uint64_t)cJSON_GetArrayItem(o, 0)->valuedouble;
    *e = (uint64_t)cJSON_GetArrayItem(o, 1)->valuedouble;
}

/* Writes header h (+ pad spaces, length field + delta) and data to path. */
static void write_st(const char *path, const cJSON *h, int pad, int delta, const unsigned char *data, size_t nd) {
    char *j = cJSON_PrintUnformatted(h);
    size_t nj = strlen(j), n = nj + (size_t)pad;
    unsigned char *b = malloc(8 + n + nd);
    uint64_t len = (uint64_t)((int64_t)n + delta);
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(len >> (8 * i));
    memcpy(b + 8, j, nj);
    memset(b + 8 + nj, ' ', (size_t)pad);
    memcpy(b + 8 + n, data, nd);
    spit(path, b, 8 + n + nd);
    free(b);
    free(j);
}

/* Flips one byte in the middle of tensor `name`'s data. */
static void flip_in(const char *path, const char *name) {
    size_t n;
    unsigned char *b = slurp(path, &n);
    cJSON *h = parse_header(b);
    uint64_t s, e;
    offsets(h, name, &s, &e);
    assert_true(e > s);
    b[8 + hdr_len(b) + s + (e - s) / 2] ^= 0x10;
    spit(path, b, n);
    cJSON_Delete(h);
    free(b);
}

/* ---- architecture and --steps ---- */
static void test_resume_other_architecture(void **state) {
    (void)state;
    char ck[128], extra[512];
    snprintf(ck, sizeof ck, "%s/l3h4.safetensors", dir);
    snprintf(extra, sizeof extra, "--layers 3 --heads 4 --steps 2 --save %s", ck);
    train(extra);
    snprintf(extra, sizeof extra, "--layers 2 --heads 4 --steps 3 --resume %s", ck);
    expect_fail(extra, 3, ck, "--layers 3", "--layers 2 contradicts");   /* the CLI reads the file's arch.* */
    snprintf(extra, sizeof extra, "--layers 3 --heads 8 --steps 3 --resume %s", ck);
    expect_fail(extra, 3, ck, "--heads 4", "--heads 8 contradicts");
    snprintf(extra, sizeof extra, "--layers 3 --heads 4 --steps 1 --resume %s", ck);
    expect_fail(extra, 3, ck, "--steps 1", "step 2");
    /* the same architecture resumes; --steps equal to the checkpoint's trains nothing */
    snprintf(extra, sizeof extra, "--layers 3 --heads 4 --steps 3 --resume %s", ck);
    train(extra);
    snprintf(extra, sizeof extra, "--layers 3 --heads 4 --steps 2 --resume %s", ck);
    train(extra);
}

/* ---- checksums ---- */
static void test_flipped_bit_single_file(void **state) {
    (void)state;
    char ck[128], extra[512];
    snprintf(ck, sizeof ck, "%s/flip.safetensors", dir);
    snprintf(extra, sizeof extra, "--layers 2 --heads 2 --steps 1 --save %s", ck);
    train(extra);
    flip_in(ck, "h.1.mlp.c_fc.weight");
    snprintf(extra, sizeof extra, "--layers 2 --heads 2 --steps 2 --resume %s", ck);
    expect_fail(extra, 3, ck, "'h.1.mlp.c_fc.weight'", "checksum");
    snprintf(extra, sizeof extra, "--layers 2 --heads 2 --steps 1 --init %s", ck);
    expect_fail(extra, 3, ck, "'h.1.mlp.c_fc.weight'", "checksum");
}

/* A sharded ZeRO-2 set of np ranks; a byte of the first non-empty piece in
 * rank 1's file flipped; resuming at np fails naming the file and the piece. */
static void flipped_sharded(int np) {
    char ck[128], extra[512];
    snprintf(ck, sizeof ck, "%s/zero_np%d", dir, np);
    snprintf(extra, sizeof extra, "--layers 2 --heads 2 --steps 1 --nproc %d --zero 2 --save %s", np, ck);
    train(extra);
    DIR *d = opendir(ck);
    assert_non_null(d);
    char shard[512] = "";
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (strstr(e->d_name, "-r1.safetensors")) snprintf(shard, sizeof shard, "%s/%s", ck, e->d_name);
    closedir(d);
    assert_true(shard[0]);
    size_t n;
    unsigned char *b = slurp(shard, &n);
    cJSON *h = parse_header(b);
    char name[192] = "", piece[200];
    for (const cJSON *v = h->child; v && !name[0]; v = v->next) {
        if (!strcmp(v->string, "__metadata__")) continue;
        uint64_t s, t;
        offsets(h, v->string, &s, &t);
        if (t > s) snprintf(name, sizeof name, "%s", v->string);
    }
    assert_true(name[0]);
    flip_in(shard, name);
    snprintf(piece, sizeof piece, "'%s'", name);
    cJSON_Delete(h);
    free(b);
    snprintf(extra, sizeof extra, "--layers 2 --heads 2 --steps 2 --nproc %d --zero 2 --resume %s", np, ck);
    expect_fail(extra, 3, strrchr(shard, '/') + 1, piece, "checksum");
}

static void test_flipped_bit_sharded_np2(void **state) { (void)state; flipped_sharded(2); }
static void test_flipped_bit_sharded_np4(void **state) { (void)state; flipped_sharded(4); }

/* ---- the --init / --resume reader validates like the safetensors reader ---- */
static void expect_reader_error(const char *bad, const char *word) {
    char extra[512];
    snprintf(extra, sizeof extra, "--layers 2 --heads 2 --steps 2 --resume %s", bad);
    expect_fail(extra, 2, bad, word);
    if (strstr(out, "--lr")) fail_msg("--resume %s: error blames --lr:\n%s", bad, out);
    snprintf(extra, sizeof extra, "--layers 2 --heads 2 --steps 1 --init %s", bad);
    expect_fail(extra, 2, bad, word);
    if (strstr(out, "--lr")) fail_msg("--init %s: error blames --lr:\n%s", bad, out);
}

static void test_reader_rejects_bad_layouts(void **state) {
    (void)state;
    char ck[128], bad[128], extra[512];
    snprintf(ck, sizeof ck, "%s/good.safetensors", dir);
    snprintf(extra, sizeof extra, "--layers 2 --heads 2 --steps 1 --save %s", ck);
    train(extra);
    size_t n;
    unsigned char *b = slurp(ck, &n);
    uint64_t hn = hdr_len(b);
    const unsigned char *data = b + 8 + hn;
    size_t nd = n - 8 - hn;

    /* overlap: ln_1.weight's bytes removed, it aliases ln_1.bias (same shape) */
    cJSON *h = parse_header(b);
    uint64_t wb, we, bb, be;
    offsets(h, "h.0.ln_1.weight", &wb, &we);
    offsets(h, "h.0.ln_1.bias", &bb, &be);
    assert_int_equal(we - wb, be - bb);
    uint64_t cut = we - wb;
    for (cJSON *v = h->child; v; v = v->next) {
        if (!strcmp(v->string, "__metadata__")) continue;
        cJSON *o = cJSON_GetObjectItemCaseSensitive(v, "data_offsets");
        for (int i = 0; i < 2; i++) {
            cJSON *x = cJSON_GetArrayItem(o, i);
            if ((uint64_t)x->valuedouble >= we) cJSON_SetNumberValue(x, x->valuedouble - (double)cut);
        }
    }
    offsets(h, "h.0.ln_1.bias", &bb, &be);
    cJSON *wo = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(h, "h.0.ln_1.weight"), "data_offsets");
    cJSON_SetNumberValue(cJSON_GetArrayItem(wo, 0), (double)bb);
    cJSON_SetNumberValue(cJSON_GetArrayItem(wo, 1), (double)be);
    unsigned char *d2 = malloc(nd);
    memcpy(d2, data, wb);
    memcpy(d2 + wb, data + we, nd - we);
    snprintf(bad, sizeof bad, "%s/overlap.safetensors", dir);
    write_st(bad, h, 0, 0, d2, nd - cut);
    free(d2);
    cJSON_Delete(h);
    expect_reader_error(bad, "overlap");

    /* trailing bytes after the last tensor */
    unsigned char *b2 = calloc(1, n + 16);
    memcpy(b2, b, n);
    snprintf(bad, sizeof bad, "%s/trailing.safetensors", dir);
    spit(bad, b2, n + 16);
    free(b2);
    expect_reader_error(bad, "trailing");

    /* header length one short: still valid JSON (padding), data shifted a byte */
    h = parse_header(b);
    snprintf(bad, sizeof bad, "%s/hdr_minus_1.safetensors", dir);
    write_st(bad, h, 8, -1, data, nd);
    cJSON_Delete(h);
    expect_reader_error(bad, "trailing");
    free(b);
}

/* ---- temp files of killed saves ---- */
static void test_save_removes_dead_writers_temp(void **state) {
    (void)state;
    pid_t dead = fork();
    if (dead == 0) _exit(0);
    assert_true(dead > 0);
    assert_int_equal(waitpid(dead, NULL, 0), dead);
    pid_t live = fork();
    if (live == 0) { pause(); _exit(0); }
    assert_true(live > 0);
    char ck[128], stale[192], kept[192], other[192], extra[512];
    snprintf(ck, sizeof ck, "%s/tmp_ck.safetensors", dir);
    snprintf(stale, sizeof stale, "%s.tmp.%ld.0", ck, (long)dead);
    snprintf(kept, sizeof kept, "%s.tmp.%ld.0", ck, (long)live);
    snprintf(other, sizeof other, "%s/other.safetensors.tmp.%ld.0", dir, (long)dead);   /* another target's */
    spit(stale, "partial", 7);
    spit(kept, "partial", 7);
    spit(other, "partial", 7);
    snprintf(extra, sizeof extra, "--layers 1 --heads 2 --steps 1 --save %s", ck);
    train(extra);
    int stale_left = access(stale, F_OK) == 0, kept_left = access(kept, F_OK) == 0, other_left = access(other, F_OK) == 0;
    kill(live, SIGKILL);
    waitpid(live, NULL, 0);
    if (stale_left) fail_msg("%s (writer %ld is dead) survived the next save", stale, (long)dead);
    if (!kept_left) fail_msg("%s (writer %ld is alive) was removed", kept, (long)live);
    if (!other_left) fail_msg("%s (another target's) was removed", other);
    assert_int_equal(access(ck, F_OK), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_resume_other_architecture),
        cmocka_unit_test(test_flipped_bit_single_file),
        cmocka_unit_test(test_flipped_bit_sharded_np2),
        cmocka_unit_test(test_flipped_bit_sharded_np4),
        cmocka_unit_test(test_reader_rejects_bad_layouts),
        cmocka_unit_test(test_save_removes_dead_writers_temp),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
