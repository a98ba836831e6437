/* The library's output goes through the log handler: with a capturing
 * handler installed, a single-process run's start, progress and result lines
 * arrive there (and nothing on stdout); quiet runs log only the result; the default
 * handler writes info to stdout and warnings elsewhere.
 *
 * Which lines a run logs depends on the GEMM kernels OpenBLAS picked (a
 * fallback to SSE kernels adds a warning), so the test fixes them instead of
 * taking the machine's: the library is OpenBLAS (DTRAIN_GEMM) and the kernel
 * family it reports is SkylakeX, the widest, which no CPU wants more of
 * (DTRAIN_TEST_BLAS_CORE, ops/blas_core.c) — or Prescott, the fallback some
 * Intel AVX-512 CPUs get, whose warning line is then part of what is checked. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dtrain/log.h"
#include "dtrain/ops.h"
#include "dtrain/train.h"
#include "tmpdir.h"

static char g_dir[256], g_corpus[512], g_out[512];

static int group_setup(void **state) {
    (void)state;
    if (dt_test_tmpdir(g_dir, sizeof g_dir, "log")) return -1;
    snprintf(g_corpus, sizeof g_corpus, "%s/corpus.txt", g_dir);
    snprintf(g_out, sizeof g_out, "%s/stdout.txt", g_dir);
    FILE *f = fopen(g_corpus, "w");
    if (!f) return -1;
    for (int i = 0; i < 200; i++) fprintf(f, "an apple a day keeps %d doctors away\n", i % 11);
    fclose(f);
    unsetenv("DTRAIN_TTY");
    return 0;
}

static int group_teardown(void **state) {
    (void)state;
    dt_test_rm_rf(g_dir);
    return 0;
}

/* stdout into g_out until stdout_end, which returns the bytes written there. */
static int stdout_begin(void) {
    fflush(stdout);
    int saved = dup(STDOUT_FILENO);
    int fd = open(g_out, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    assert_true(saved >= 0 && fd >= 0);
    assert_true(dup2(fd, STDOUT_FILENO) >= 0);
    close(fd);
    return saved;
}
static long stdout_end(int saved) {
    fflush(stdout);
    assert_true(dup2(saved, STDOUT_FILENO) >= 0);
    close(saved);
    struct stat sb;
    assert_int_equal(stat(g_out, &sb), 0);
    return (long)sb.st_size;
}

#define MAX_MSGS 32
typedef struct capture { int n; dt_log_level level[MAX_MSGS]; char msg[MAX_MSGS][256]; } capture;
static void capture_log(void *ctx, dt_log_level level, const char *msg) {
    capture *c = ctx;
    if (c->n >= MAX_MSGS) return;
    c->level[c->n] = level;
    snprintf(c->msg[c->n], sizeof c->msg[c->n], "%s", msg);
    c->n++;
}

/* GPT-2 with L=1, C=16, maxT=16, V=256: wte V*C + wpe maxT*C + one block
 * (12 C^2 + 13 C) + ln_f 2 C = 4096 + 256 + 3280 + 32 = 7664 parameters. */
static void opts_gpt2(dt_train_opts *o) {
    dt_train_opts_default(o);
    o->model = dt_model_cfg_default(DT_MODEL_GPT2);
    o->model.n_layer = 1; o->model.n_embd = 16; o->model.n_head = 2; o->model.max_t = 16;
    o->data = DT_DATA_TEXT;
    o->data_path = g_corpus;
    o->batch = 4; o->seq = 16; o->steps = 3;
}

/* Create a trainer from o and run it with the log captured into *cap;
 * returns the trainer and the bytes the run wrote to stdout. */
static dt_trainer *run_captured(const dt_train_opts *o, capture *cap, long *printed) {
    dt_trainer *t = NULL;
    assert_int_equal(dt_trainer_create(o, NULL, &t), DT_OK);
    memset(cap, 0, sizeof *cap);
    dt_log_set_handler(capture_log, cap);
    int saved = stdout_begin();
    dt_status st = dt_trainer_run(t);
    *printed = stdout_end(saved);
    dt_log_set_handler(NULL, NULL);
    assert_int_equal(st, DT_OK);
    return t;
}

/* the GEMM line names the library main() holds the process to */
static const char *gemm_head(void) { return "dtrain: GEMM: OpenBLAS "; }

/* Pretend OpenBLAS picked kernel family `core` (read at each start-up line). */
static void fake_core(const char *core) { assert_int_equal(setenv("DTRAIN_TEST_BLAS_CORE", core, 1), 0); }

static void test_run_logs_through_handler(void **state) {
    (void)state;
    fake_core("SkylakeX");
    dt_train_opts o;
    opts_gpt2(&o);
    static capture cap;
    long printed;
    dt_trainer *t = run_captured(&o, &cap, &printed);
    assert_int_equal(printed, 0);   /* all of it went to the handler */

    /* start line, GEMM backend line, a progress line per step (not a terminal), result line */
    assert_int_equal(cap.n, 6);
    assert_int_equal(cap.level[0], DT_LOG_INFO);
    /* 3 steps of batch 4 x 16 tokens = 64 tokens each */
    assert_string_equal(cap.msg[0], "dtrain: gpt2, 7664 parameters, single x1, 3 steps of 64 tokens\n");
    assert_int_equal(cap.level[1], DT_LOG_INFO);
    assert_int_equal(strncmp(cap.msg[1], gemm_head(), strlen(gemm_head())), 0);
    for (int k = 2; k <= 4; k++) {
        char head[32];
        snprintf(head, sizeof head, "step %d/3  loss ", k - 1);
        assert_int_equal(cap.level[k], DT_LOG_PROGRESS);
        if (strncmp(cap.msg[k], head, strlen(head))) fail_msg("progress line %d: %s", k, cap.msg[k]);
        assert_non_null(strstr(cap.msg[k], " tok/s "));
        assert_int_equal(cap.msg[k][strlen(cap.msg[k]) - 1], '\n');
    }
    double loss, acc;
    assert_int_equal(dt_trainer_evaluate(t, &loss, &acc), DT_OK);   /* eval mode: same result again */
    char want[128];
    snprintf(want, sizeof want, "validation loss: %.4f  (token accuracy %.4f)\n", loss, acc);
    assert_int_equal(cap.level[5], DT_LOG_INFO);
    assert_string_equal(cap.msg[5], want);
    dt_trainer_free(t);
}

/* OpenBLAS on its SSE fallback kernels: the same lines plus, right after the
 * GEMM line, one warning naming the kernels, the CPU's ISA and the fix. */
static void test_fallback_kernels_add_a_warning(void **state) {
    (void)state;
    if (dt_cpu_isa_detect().isa == DT_ISA_SSE) skip();   /* an SSE-only CPU: Prescott is no fallback */
    fake_core("Prescott");
    dt_train_opts o;
    opts_gpt2(&o);
    static capture cap;
    long printed;
    dt_trainer *t = run_captured(&o, &cap, &printed);
    assert_int_equal(printed, 0);
    assert_int_equal(cap.n, 7);   /* start, GEMM, warning, 3 progress lines, result */
    assert_string_equal(cap.msg[0], "dtrain: gpt2, 7664 parameters, single x1, 3 steps of 64 tokens\n");
    assert_int_equal(strncmp(cap.msg[1], gemm_head(), strlen(gemm_head())), 0);
    assert_non_null(strstr(cap.msg[1], ", Prescott kernels (SSE) on an "));
    assert_int_equal(cap.level[2], DT_LOG_WARN);
    const char *warn = "OpenBLAS runs its Prescott kernels (SSE) on a CPU with ";
    if (strncmp(cap.msg[2], warn, strlen(warn))) fail_msg("warning line: %s", cap.msg[2]);
    assert_non_null(strstr(cap.msg[2], "set OPENBLAS_CORETYPE="));
    for (int k = 3; k <= 5; k++) assert_int_equal(cap.level[k], DT_LOG_PROGRESS);
    assert_int_equal(cap.level[6], DT_LOG_INFO);
    assert_int_equal(strncmp(cap.msg[6], "validation loss: ", 17), 0);
    dt_trainer_free(t);
}

static void test_quiet_run_logs_the_result_only(void **state) {
    (void)state;
    dt_train_opts o;
    opts_gpt2(&o);
    o.quiet = 1;
    fake_core("Prescott");   /* not even the fallback warning */
    static capture cap;
    long printed;
    dt_trainer *t = run_captured(&o, &cap, &printed);
    assert_int_equal(cap.n, 1);
    assert_int_equal(cap.level[0], DT_LOG_INFO);
    assert_int_equal(strncmp(cap.msg[0], "validation loss: ", 17), 0);
    assert_int_equal(printed, 0);
    dt_trainer_free(t);
}

/* Without a handler installed, the run prints its lines on stdout as before. */
static void test_default_handler_prints_to_stdout(void **state) {
    (void)state;
    dt_log_set_handler(NULL, NULL);
    int saved = stdout_begin();
    dt_log_default_handler(NULL, DT_LOG_INFO, "info line\n");
    dt_log_default_handler(NULL, DT_LOG_PROGRESS, "\rprogress");
    dt_log_default_handler(NULL, DT_LOG_WARN, "");   /* warnings go to stderr: nothing here */
    long printed = stdout_end(saved);
    assert_int_equal(printed, (long)strlen("info line\n\rprogress"));

    fake_core("SkylakeX");
    dt_train_opts o;
    opts_gpt2(&o);
    o.steps = 1;
    dt_trainer *t = NULL;
    assert_int_equal(dt_trainer_create(&o, NULL, &t), DT_OK);
    saved = stdout_begin();
    dt_status st = dt_trainer_run(t);
    printed = stdout_end(saved);
    dt_trainer_free(t);
    assert_int_equal(st, DT_OK);
    FILE *f = fopen(g_out, "r");
    assert_non_null(f);
    char line[256];
    assert_non_null(fgets(line, sizeof line, f));
    assert_string_equal(line, "dtrain: gpt2, 7664 parameters, single x1, 1 step of 64 tokens\n");
    assert_non_null(fgets(line, sizeof line, f));
    assert_int_equal(strncmp(line, gemm_head(), strlen(gemm_head())), 0);
    assert_non_null(fgets(line, sizeof line, f));
    assert_int_equal(strncmp(line, "step 1/1  loss ", 15), 0);
    assert_non_null(fgets(line, sizeof line, f));
    assert_int_equal(strncmp(line, "validation loss: ", 17), 0);
    assert_null(fgets(line, sizeof line, f));
    fclose(f);
    assert_true(printed > 0);
}

int main(void) {
    /* before the first GEMM: the library is chosen once per process */
    if (setenv("DTRAIN_GEMM", "openblas", 1) || unsetenv("OPENBLAS_CORETYPE") || unsetenv("DTRAIN_BLAS_REEXEC")) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_run_logs_through_handler),
        cmocka_unit_test(test_fallback_kernels_add_a_warning),
        cmocka_unit_test(test_quiet_run_logs_the_result_only),
        cmocka_unit_test(test_default_handler_prints_to_stdout),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
