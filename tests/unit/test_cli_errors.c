/* The CLI turns bad input into one clear line on stderr and a non-zero exit. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <string.h>
#include <sys/wait.h>
#include "dtrain/version.h"
#include "tmpdir.h"

/* Runs the CLI with args; returns exit code, stderr's first line in err. */
static int run(const char *args, char *err, size_t n) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s %s 2>&1 >/dev/null", DT_CLI_PATH, args);
    FILE *p = popen(cmd, "r");
    err[0] = 0;
    int lines = 0;
    char line[1024];
    while (fgets(line, sizeof line, p)) { if (!lines++) snprintf(err, n, "%s", line); }
    int st = pclose(p);
    if (lines > 1) return -100;   /* more than one line of error output */
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void expect_error(const char *args, const char *needle) {
    char err[1024];
    int rc = run(args, err, sizeof err);
    if (rc <= 0 || !strstr(err, needle)) fail_msg("'%s': rc=%d, stderr='%s' (wanted '%s')", args, rc, err, needle);
}

static void test_bad_flags(void **state) {
    (void)state;
    expect_error("train --bogus", "unknown option '--bogus'");
    expect_error("train --lr", "--lr needs a value");
    expect_error("train --lr abc", "--lr: invalid value 'abc'");
    expect_error("train --batch 0 --steps 1", "--batch must be positive");
    expect_error("train --recompute layers", "--recompute: unknown mode 'layers' (none, blocks)");
    /* a setting of another model or optimizer than the one that runs would do nothing */
    expect_error("train --model gpt2 --hidden 16 --steps 1", "--hidden is not a setting of --model gpt2 (it is mlp's)");
    expect_error("train --layers 2 --steps 1", "--layers is not a setting of --model mlp (it is gpt2's)");
    expect_error("train --momentum 0.9 --steps 1", "--momentum is sgd's setting; this run's optimizer is adamw");
    expect_error("train --optim sgd --beta1 0.8 --steps 1", "--beta1 is adamw's setting; this run's optimizer is sgd");
    /* a batch larger than the data is that, not an allocation failure */
    expect_error("train --model mlp --hidden 16 --batch 10000000 --steps 1", "--batch 10000000 is more than the 60000 training samples");
    /* numbers as written: no leading blank (" -1" read as the unsigned 2^64 - 1), no trailing comma */
    expect_error("train --seed ' -1' --steps 1", "--seed: invalid value ' -1'");
    expect_error("train --hidden 16, --steps 1", "--hidden: invalid value '16,'");
    expect_error("train --hidden 1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17 --steps 1", "--hidden: at most 16 values");
    /* a forgotten value: the next flag is not taken as it (a file named --quiet was written) */
    expect_error("train --save --quiet --steps 1", "--save needs a value (FILE), not the flag --quiet");
    expect_error("train --metrics --save=x.st", "--metrics needs a value (FILE), not the flag --save=x.st");
    expect_error("train --model resnet", "unknown model 'resnet'");
    expect_error("train --model gpt2 --data fashion-mnist", "takes 'ids' int32");
    /* the library names the models' settings (arch.max_t); the CLI writes their flags */
    expect_error("train --model gpt2 --seq 200 --steps 1", "--seq 200 must be in 1..128 (the model's --max-t)");
    expect_error("train --model cnn --channels 3", "--channels needs 2 values (C1,C2)");
    /* the models' own checks name flags, not fields (they said n_embd, n_head, "L, C, H, V and maxT") */
    expect_error("train --model gpt2 --embd 30 --heads 4 --steps 1", "gpt2: --embd 30 is not divisible by --heads 4");
    expect_error("train --model gpt2 --layers 0 --steps 1", "gpt2: --layers 0 must be positive");
    expect_error("train --model gpt2 --vocab 70000 --steps 1", "gpt2: --vocab 70000 exceeds 65536");
    /* a one-class loss: refused by the validator, naming the flag (it came from the build, naming none) */
    expect_error("train --model gpt2 --vocab 1 --steps 1", "gpt2: --vocab 1: the model predicts one of at least 2 tokens");
    expect_error("train --model cnn --fc 0 --steps 1", "cnn: --fc 0 must be positive");
    expect_error("train --data imagenet", "unknown dataset 'imagenet' (fashion-mnist, text, shard)");
    expect_error("train --optim lion", "unknown optimizer 'lion'");
    expect_error("frobnicate", "unknown command");
    expect_error("train --init a --resume b", "exclusive");
    expect_error("train --optim sgd --nesterov --steps 1", "nesterov");
    /* ZeRO flags: contradictions are refused, none silently ignored */
    expect_error("train --zero 5", "stage must be 0, 1, 2 or 3");
    expect_error("train --overlap-step interleaved", "applies to ZeRO only");
    expect_error("train --zero 1 --overlap-step sideways", "--overlap-step: unknown 'sideways'");
    /* --compress and --no-shm apply to ZeRO too (tests/scripts/test_zero_wire_cli.sh) */
    expect_error("train --zero 1 --compress int8", "--compress: unknown 'int8' (none, bf16, fp16)");
    expect_error("train --zero 2 --zero-prefetch 1", "--zero-prefetch applies to ZeRO stage 3 only");
    expect_error("train --zero 3 --zero-prefetch -1", "--zero-prefetch must be >= 0");
    /* pipeline flags */
    expect_error("train --pp 0", "--pp must be >= 1");
    expect_error("train --pp 2 --schedule wavefront", "--schedule: unknown 'wavefront'");
    expect_error("train --pp 2 --batch 10 --microbatches 4", "--batch 10 does not split into --microbatches 4");
    expect_error("train --pp 2 --accum 2", "--accum does not combine with a pipeline");
    expect_error("train --pp 2 --virtual-stages 2", "more than 1 needs --schedule interleaved");
    expect_error("train --pp 2 --schedule interleaved --virtual-stages -1", "--virtual-stages -1 must be >= 1");
    expect_error("train --virtual-stages 0", "--virtual-stages 0 must be >= 1");   /* (0 was taken as the default) */
    expect_error("train --pp 2 --schedule 1f1b --max-outstanding 2", "--max-outstanding applies to --schedule gpipe");
    expect_error("train --pp 2 --microbatches 0", "--microbatches must be >= 1");
    /* the mesh dp x pp x tp: the world is a multiple of P x T */
    expect_error("train --model gpt2 --heads 4 --tp 2 --pp 2 --nproc 6",
                 "--tp 2 x --pp 2 = 4 ranks per replica does not divide --nproc 6");
    /* ZeRO across tensor-parallel replicas: without node-shared parameters, saving one file */
    expect_error("train --model gpt2 --heads 4 --tp 2 --zero 2 --node-params --nproc 4",
                 "--tp 2 does not combine with --node-params");
    expect_error("train --model gpt2 --heads 4 --tp 2 --zero 2 --save-format sharded --nproc 4",
                 "--tp 2 does not combine with --save-format");
    /* numbers that mean nothing, or whose products overflow, are refused before anything runs */
    expect_error("train --nproc 0", "--nproc must be >= 1 (got 0)");
    expect_error("train --nproc -2", "--nproc must be >= 1 (got -2)");
    expect_error("train --nproc 100000", "--nproc 100000: at most");
    expect_error("train --bucket-mb 0", "--bucket-mb 0: must be at least 4 bytes");
    expect_error("train --first-bucket-mb 0", "--first-bucket-mb 0: must be at least 4 bytes");
    expect_error("train --bucket-mb -1", "--bucket-mb -1: must be at least");
    expect_error("train --bucket-mb 1e30", "at most 65536 MB");
    expect_error("train --eval-batches -1", "--eval-batches must be >= 0");
    expect_error("train --unfreeze-at 3", "--unfreeze-at needs --freeze PATTERN");
    expect_error("train --freeze fc1.weight --unfreeze-at -1", "--unfreeze-at must be >= 0");
    expect_error("train --model gpt2 --eval-batches 9223372036854775807", "--eval-batches 9223372036854775807 x --batch 64 is too large");
    expect_error("train --log-every -1", "--log-every must be >= 0");
    expect_error("train --stop-after -1", "--stop-after must be >= 0");
    expect_error("train --threads 1000000", "--threads 1000000: at most");
    expect_error("train --batch 9223372036854775807", "--batch 9223372036854775807 x --accum 1 is too large");
    expect_error("train --batch 1099511627777", "--batch 1099511627777 x --accum 1 is too large");   /* 2^40 + 1 */
    expect_error("train --model gpt2 --batch 9223372036854775807", "--batch 9223372036854775807 x --accum 1 x --seq 64 is too large");
    expect_error("train --model gpt2 --batch 1000000 --accum 2000000", "--batch 1000000 x --accum 2000000 x --seq 64");
}

static void test_missing_and_corrupt_files(void **state) {
    (void)state;
    expect_error("train --data-path /nonexistent/dir --steps 1", "/nonexistent/dir");
    expect_error("train --model gpt2 --data shard --data-path /nonexistent.bin --steps 1", "/nonexistent.bin");
    expect_error("train --resume /nonexistent.safetensors --steps 1", "/nonexistent.safetensors");
    char dir[64], path[128], args[512];
    assert_int_equal(dt_test_tmpdir(dir, sizeof dir, "cli_errors"), 0);
    snprintf(path, sizeof path, "%s/dt_cli_garbage.safetensors", dir);
    FILE *f = fopen(path, "w");
    fputs("this is not a safetensors file at all", f);
    fclose(f);
    snprintf(args, sizeof args, "train --init %s --steps 1", path);
    expect_error(args, "dt_cli_garbage.safetensors");
    /* the model comes from --init / --resume: when the file cannot be read,
     * the error names it, not what the default model makes of token data */
    char shard[160];
    snprintf(shard, sizeof shard, "%s/tokens.bin", dir);
    int32_t header[256] = {20240520, 1, 2000};
    uint16_t tokens[2000];
    for (int i = 0; i < 2000; i++) tokens[i] = (uint16_t)(i % 100);
    f = fopen(shard, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(header, sizeof header, 1, f), 1);
    assert_int_equal(fwrite(tokens, sizeof tokens, 1, f), 1);
    fclose(f);
    snprintf(args, sizeof args, "eval --init %s/missing.st --data shard --data-path %s", dir, shard);
    expect_error(args, "--init: ");
    expect_error(args, "missing.st");
    snprintf(args, sizeof args, "eval --init %s --data shard --data-path %s", path, shard);
    expect_error(args, "dt_cli_garbage.safetensors");
    snprintf(args, sizeof args, "train --resume %s/missing.st --data shard --data-path %s --steps 1", dir, shard);
    expect_error(args, "--resume: ");
    dt_test_rm_rf(dir);
}

/* Runs the CLI under `timeout 30` with stdout and stderr together in out;
 * returns the exit code (124: timed out). */
static int run_all(const char *args, char *out, size_t n) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "timeout 30 %s %s 2>&1", DT_CLI_PATH, args);
    FILE *p = popen(cmd, "r");
    size_t len = fread(out, 1, n - 1, p);
    out[len] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* An output path that cannot be written fails at start-up, before step 1:
 * with 10^9 steps the run could only end this fast by failing first. */
static void expect_fails_before_training(const char *flag, const char *path) {
    char args[512], out[8192];
    snprintf(args, sizeof args, "train --model mlp --hidden 16 --batch 8 --steps 1000000000 --log-every 1 %s %s",
             flag, path);
    int rc = run_all(args, out, sizeof out);
    if (rc == 0 || rc == 124 || !strstr(out, flag) || !strstr(out, path) || strstr(out, "step 1/"))
        fail_msg("'%s': rc=%d (124: still training after 30 s), output: %.400s", args, rc, out);
}

static void test_outputs_checked_at_startup(void **state) {
    (void)state;
    expect_fails_before_training("--save", "/nonexistent_dt_dir/x.st");
    expect_fails_before_training("--trace", "/nonexistent_dt_dir/t.json");
    expect_fails_before_training("--metrics", "/nonexistent_dt_dir/m.jsonl");
    expect_fails_before_training("--save", "/tmp");   /* a directory where a file goes */
    /* a link to the file: the rename would replace the link and leave its target stale */
    char dir[] = "/tmp/dt_save_link_XXXXXX", link[64], target[64];
    assert_non_null(mkdtemp(dir));
    snprintf(target, sizeof target, "%s/real.st", dir);
    snprintf(link, sizeof link, "%s/link.st", dir);
    assert_int_equal(symlink(target, link), 0);
    expect_fails_before_training("--save", link);
    char args[256], out[8192];
    snprintf(args, sizeof args, "train --model mlp --hidden 16 --batch 8 --steps 1 --save %s", link);
    run_all(args, out, sizeof out);
    if (!strstr(out, "symbolic link")) fail_msg("--save LINK: %.400s", out);
    unlink(link);
    rmdir(dir);
}

/* A checkpoint whose record is bad (the seed "x") is refused for that, not
 * for a model flag the user never gave (the run was built from defaults:
 * "saved with --hidden 16, this run has 256,256"). */
static void test_bad_record_named(void **state) {
    (void)state;
    char dir[] = "/tmp/dt_bad_record_XXXXXX", path[64], args[256], out[8192];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/a.st", dir);
    snprintf(args, sizeof args, "train --model mlp --hidden 16 --batch 8 --steps 1 --threads 1 --quiet --save %s", path);
    assert_int_equal(run_all(args, out, sizeof out), 0);
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    char head[4096];
    size_t n = fread(head, 1, sizeof head - 1, f);
    head[n] = 0;
    char *at = n > 8 ? strstr(head + 8, "\"seed\":\"1\"") : NULL;   /* past the 8-byte header length */
    assert_non_null(at);
    assert_int_equal(fseek(f, (long)(at - head) + 8, SEEK_SET), 0);
    assert_int_equal(fputc('x', f), 'x');   /* same length: the file stays well-formed */
    assert_int_equal(fclose(f), 0);
    snprintf(args, sizeof args, "train --resume %s --steps 3 --batch 8", path);
    int rc = run_all(args, out, sizeof out);
    if (rc == 0 || !strstr(out, "metadata 'seed' = 'x'") || strstr(out, "--hidden"))
        fail_msg("rc %d: %.400s", rc, out);
    unlink(path);
    rmdir(dir);
}

static void test_version(void **state) {
    (void)state;
    char cmd[512], out[256], want[64];
    snprintf(cmd, sizeof cmd, "%s --version", DT_CLI_PATH);
    FILE *p = popen(cmd, "r");
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = 0;
    assert_int_equal(pclose(p), 0);
    snprintf(want, sizeof want, "dtrain %s\n", dt_version());   /* the library's own, as linked */
    assert_string_equal(out, want);
}

static void test_help_lists_flags(void **state) {
    (void)state;
    char cmd[512];
    snprintf(cmd, sizeof cmd, "%s train --help", DT_CLI_PATH);
    FILE *p = popen(cmd, "r");
    char buf[16384];
    size_t n = fread(buf, 1, sizeof buf - 1, p);
    buf[n] = 0;
    assert_int_equal(pclose(p), 0);
    const char *flags[] = {"--model", "--resume", "--save", "--metrics", "--nproc", "--threads", "--seed"};
    for (int i = 0; i < 7; i++) assert_non_null(strstr(buf, flags[i]));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_flags),
        cmocka_unit_test(test_missing_and_corrupt_files),
        cmocka_unit_test(test_outputs_checked_at_startup),
        cmocka_unit_test(test_bad_record_named),
        cmocka_unit_test(test_help_lists_flags),
        cmocka_unit_test(test_version),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
