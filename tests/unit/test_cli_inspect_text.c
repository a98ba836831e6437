/* dtrain inspect on hand-made checkpoints: what it prints is what the file
 * holds, safely and truthfully.
 *  - tensor names, metadata keys and values and error messages holding
 *    control characters (ESC sequences, newlines, BEL, CR) are printed
 *    escaped (\x1b, \x0a, ...), never raw to the terminal. */
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

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_control_characters),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
