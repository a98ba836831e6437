/* dtrain train --nproc 2: re-launches under mpirun, trains, writes one trace
 * per rank with the DDP timeline; an error on the ranks is reported with the
 * rank and ends the job (no hang). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include "tmpdir.h"
#include <cjson/cJSON.h>
#include "cli_env.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

static char dir[64], corpus[128];

static int setup(void **state) {
    (void)state;
    dt_test_cli_mpi_env();
    if (dt_test_tmpdir(dir, sizeof dir, "nproc") != 0) return -1;
    snprintf(corpus, sizeof corpus, "%s/corpus.txt", dir);
    FILE *f = fopen(corpus, "w");
    for (int i = 0; i < 300; i++) fprintf(f, "a stitch in time saves nine %d\n", i % 17);
    fclose(f);
    return 0;
}

/* Runs a shell command; returns its exit status and captured output. */
static int sh(const char *cmd, char *out, size_t n) {
    FILE *p = popen(cmd, "r");
    size_t k = fread(out, 1, n - 1, p);
    out[k] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int count_events(const cJSON *events, const char *prefix) {
    int n = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, events) {
        const cJSON *name = cJSON_GetObjectItem(e, "name");
        if (cJSON_IsString(name) && !strncmp(name->valuestring, prefix, strlen(prefix))) n++;
    }
    return n;
}

static void test_two_ranks_train_and_trace(void **state) {
    (void)state;
    char cmd[1024], out[8192], trace[128];
    snprintf(trace, sizeof trace, "%s/trace.json", dir);
    snprintf(cmd, sizeof cmd,
             "%s train --nproc 2 --model gpt2 --layers 1 --embd 16 --heads 2 --max-t 16 --seq 16 --batch 4 "
             "--data text --data-path %s --steps 3 --bucket-mb 0.004 --first-bucket-mb 0.004 --trace %s 2>&1",
             DT_CLI_PATH, corpus, trace);
    int rc = sh(cmd, out, sizeof out);
    if (rc != 0) fail_msg("rc=%d output:\n%s", rc, out);
    assert_non_null(strstr(out, "ddp x2"));
    assert_non_null(strstr(out, "validation loss"));
    for (int r = 0; r < 2; r++) {
        char path[160];
        snprintf(path, sizeof path, "%s.rank%d", trace, r);
        FILE *f = fopen(path, "rb");
        assert_non_null(f);
        static char buf[1 << 20];
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[n] = 0;
        cJSON *j = cJSON_Parse(buf);
        assert_non_null(j);
        const cJSON *ev = cJSON_GetObjectItem(j, "traceEvents");
        assert_true(cJSON_IsArray(ev));
        assert_int_equal(count_events(ev, "forward"), 3);
        assert_int_equal(count_events(ev, "backward"), 3);
        assert_int_equal(count_events(ev, "optimizer"), 3);
        assert_true(count_events(ev, "bucket ready") >= 3 * 2);   /* tiny buckets: several per step */
        assert_true(count_events(ev, "allreduce") >= 3 * 2);
        assert_int_equal(count_events(ev, "wait reductions"), 3);
        cJSON_Delete(j);
    }
}

/* Gradients summed in shared memory (default) or by MPI: for two ranks both
 * are a + b, so the trained model and its validation loss are the same. */
static void test_no_shm_same_result(void **state) {
    (void)state;
    char val[2][64];
    for (int k = 0; k < 2; k++) {
        char cmd[1024], out[8192];
        snprintf(cmd, sizeof cmd,
                 "%s train --nproc 2 --model gpt2 --layers 1 --embd 16 --heads 2 --max-t 16 --seq 16 --batch 4 "
                 "--data text --data-path %s --steps 4 --bucket-mb 0.004 %s 2>&1",
                 DT_CLI_PATH, corpus, k ? "--no-shm" : "");
        int rc = sh(cmd, out, sizeof out);
        if (rc != 0) fail_msg("rc=%d output:\n%s", rc, out);
        /* the path really differs: the start-up line says which */
        if (!strstr(out, k ? "ddp on 1 machine x 2 ranks: gradients reduced by MPI collectives: --no-shm"
                          : "ddp on 1 machine x 2 ranks: gradients in shared memory"))
            fail_msg("start-up line does not name the %s path:\n%s", k ? "MPI" : "shared-memory", out);
        const char *v = strstr(out, "validation loss");
        if (!v) {
            fail_msg("no validation loss in:\n%s", out);
            return;
        }
        size_t len = strcspn(v, "\n");
        if (len >= sizeof val[k]) len = sizeof val[k] - 1;
        memcpy(val[k], v, len);
        val[k][len] = 0;
    }
    assert_string_equal(val[0], val[1]);
}

static void test_error_on_all_ranks_printed_once_and_ends_job(void **state) {
    (void)state;
    char cmd[1024], out[16384];
    snprintf(cmd, sizeof cmd, "%s train --nproc 2 --model mlp --steps 2 --resume %s/missing.safetensors 2>&1",
             DT_CLI_PATH, dir);
    int rc = sh(cmd, out, sizeof out);
    assert_int_not_equal(rc, 0);
    /* every rank fails alike: one line for the job, no rank tag (cli/errors.c) */
    const char *e = strstr(out, "dtrain: error: ");   /* 15 chars */
    if (!e || !strstr(e, "missing.safetensors") || strstr(e + 15, "error:")) fail_msg("output:\n%s", out);
}

static int teardown(void **state) {
    (void)state;
    dt_test_rm_rf(dir);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_two_ranks_train_and_trace),
        cmocka_unit_test(test_no_shm_same_result),
        cmocka_unit_test(test_error_on_all_ranks_printed_once_and_ends_job),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
