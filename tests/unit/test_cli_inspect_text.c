/* dtrain inspect on hand-made checkpoints: what it prints is what the file
 * holds, safely and truthfully.
 *  - tensor names, metadata keys and values and error messages holding
 *    control characters (ESC sequences, newlines, BEL, CR) are printed
 *    escaped (\x1b, \x0a, ...), never raw to the terminal.
 *  - a sharded tensor whose pieces carry a checksum only in part is shown
 *    as checked in part, not as "ok".
 *  - a checkpoint without tensors has nothing to verify (not "ok"). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include "tmpdir.h"

static char root[64];
static char out[1 << 16];

static const char *cli(void) {
    const char *c = getenv("DT_TEST_CLI");
    return c && *c ? c : DT_CLI_PATH;
}

static int setup(void **state) {
    (void)state;
    return dt_test_tmpdir(root, sizeof root, "cli_inspect_text");
}

static int teardown(void **state) {
    (void)state;
    dt_test_rm_rf(root);
    return 0;
}

/* a safetensors file by hand: the header text as given (padded to 8), then
 * n bytes of data */
static void write_st(const char *path, const char *header, const void *data, size_t n) {
    size_t h = strlen(header), pad = (8 - h % 8) % 8;
    unsigned char len[8];
    for (int i = 0; i < 8; i++) len[i] = (unsigned char)((uint64_t)(h + pad) >> (8 * i));
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(len, 1, 8, f), 8);
    assert_int_equal(fwrite(header, 1, h, f), h);
    for (size_t i = 0; i < pad; i++) fputc(' ', f);
    if (n) assert_int_equal(fwrite(data, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

/* `dtrain inspect path` (stdout and stderr) into out; its exit status */
static int inspect(const char *path) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "%s inspect '%s' 2>&1", cli(), path);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void has(const char *want) {
    if (!strstr(out, want)) fail_msg("inspect's output lacks '%s':\n%s", want, out);
}

/* no byte below 0x20 but newlines, none 0x7f */
static void no_raw_controls(void) {
    for (const unsigned char *p = (const unsigned char *)out; *p; p++)
        if ((*p < 0x20 && *p != '\n') || *p == 0x7f)
            fail_msg("inspect printed control byte 0x%02x at offset %td:\n%s", *p, (const char *)p - out, out);
}

static void test_control_characters(void **state) {
    (void)state;
    char p[128];
    snprintf(p, sizeof p, "%s/names.safetensors", root);
    float data[2] = {1, 2};
    write_st(p,
             "{\"__metadata__\":{\"model\":\"gpt\\u001b[2J\",\"note\\u001b]0;title\\u0007\":\"v\\r\\nx\","
             "\"step\":\"3\\u001b[1A\"},"
             "\"evil\\u001b[31mred\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
             "\"two\\nlines\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
             data, sizeof data);
    assert_int_equal(inspect(p), 0);
    no_raw_controls();
    has("model       gpt\\x1b[2J\n");
    has("note\\x1b]0;title\\x07 = v\\x0d\\x0ax\n");
    has("step        3\\x1b[1A (");
    has("  evil\\x1b[31mred  F32");
    has("  two\\x0alines     F32");   /* (the name column as wide as the longest name as printed) */

    /* a library error quoting a name: escaped too */
    snprintf(p, sizeof p, "%s/bad.safetensors", root);
    write_st(p, "{\"x\\u001b[31m\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,8]}}", data, sizeof data);
    assert_int_equal(inspect(p), 1);
    no_raw_controls();
    has("x\\x1b[31m");
}

static long file_size(const char *path) {
    struct stat sb;
    assert_int_equal(stat(path, &sb), 0);
    return (long)sb.st_size;
}

/* A two-rank set by hand: "a" [4] in pieces a@0 (rank 0, checksum recorded)
 * and a@2 (rank 1, none); "b" [1] whole on rank 0 with a checksum; "c" [1]
 * on rank 1 without one. All zeros: zlib CRC-32 of 8 zero bytes 6522df69,
 * of 4 zero bytes 2144df1c. */
static void test_pieces_partly_checked(void **state) {
    (void)state;
    char dir[128], p0[192], p1[192], ix[192], text[1024];
    snprintf(dir, sizeof dir, "%s/set", root);
    assert_int_equal(mkdir(dir, 0755), 0);
    snprintf(p0, sizeof p0, "%s/r0.safetensors", dir);
    snprintf(p1, sizeof p1, "%s/r1.safetensors", dir);
    snprintf(ix, sizeof ix, "%s/index.json", dir);
    static const unsigned char zero[12];
    write_st(p0,
             "{\"__metadata__\":{\"set\":\"S1\",\"rank\":\"0\",\"crc32.a@0\":\"6522df69\",\"crc32.b@0\":\"2144df1c\"},"
             "\"a@0\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
             "\"b@0\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}",
             zero, 12);
    write_st(p1,
             "{\"__metadata__\":{\"set\":\"S1\",\"rank\":\"1\"},"
             "\"a@2\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
             "\"c@0\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}",
             zero, 12);
    snprintf(text, sizeof text,
             "{\"format\":\"dtrain-zero-sharded-1\",\"world\":2,\"stage\":2,\"set\":\"S1\","
             "\"files\":[{\"name\":\"r0.safetensors\",\"bytes\":%ld},{\"name\":\"r1.safetensors\",\"bytes\":%ld}],"
             "\"tensors\":{\"a\":[4],\"b\":[1],\"c\":[1]},\"metadata\":{}}",
             file_size(p0), file_size(p1));
    FILE *f = fopen(ix, "wb");
    assert_non_null(f);
    fputs(text, f);
    assert_int_equal(fclose(f), 0);
    assert_int_equal(inspect(dir), 0);
    has("\n  a     F32    [4]                           16       2  ok in 1 of 2 pieces; 1 without a checksum\n");
    has("\n  b     F32    [1]                            4       1  ok\n");
    has("\n  c     F32    [1]                            4       1  -\n");
    has("checksums   ok: 1 tensors verified, 1 partly (the pieces with a recorded checksum match; the others have "
        "none, not checked), 1 without a recorded checksum (not checked)\n");
}

static void test_no_tensors(void **state) {
    (void)state;
    char p[128];
    snprintf(p, sizeof p, "%s/empty.safetensors", root);
    write_st(p, "{\"__metadata__\":{\"format\":\"pt\"}}", NULL, 0);
    assert_int_equal(inspect(p), 0);
    has("tensors     0\n");
    has("checksums   nothing to verify: the checkpoint holds no tensors\n");
    if (strstr(out, "verified")) fail_msg("inspect says something was verified:\n%s", out);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_control_characters),
        cmocka_unit_test(test_pieces_partly_checked),
        cmocka_unit_test(test_no_tensors),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
