/* Resharding through the CLI: `dtrain train --nproc 2 --zero 2` stops after 3
 * of 6 steps with a sharded checkpoint; it is resumed by one process (batch
 * doubled) and by 4 ranks at ZeRO stage 2 (batch halved), so every global
 * batch is the same as in an uninterrupted 2-rank run. Per-step losses
 * (--metrics) and the final parameters (--save-format consolidated) match
 * that run to ~1e-4 relative. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include "tmpdir.h"
#include <cjson/cJSON.h>
#include <math.h>
#include "cli_env.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "dtrain/io.h"

#define STEPS 6
#define STOP 3
#define TOL 1e-4

static char dir[64], corpus[128];

static int setup(void **state) {
    (void)state;
    dt_test_cli_mpi_env();
    if (dt_test_tmpdir(dir, sizeof dir, "cli_zero") != 0) return -1;
    snprintf(corpus, sizeof corpus, "%s/corpus.txt", dir);
    FILE *f = fopen(corpus, "w");
    if (!f) return -1;
    for (int i = 0; i < 400; i++) fprintf(f, "many hands make light work %d, said the %d-th ant.\n", i % 23, i % 7);
    fclose(f);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    dt_test_rm_rf(dir);
    return 0;
}

static char out[1 << 16];

/* Runs `dtrain train <common> <extra>`; returns the exit status, output in out. */
static int run(const char *extra) {
    static char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "%s train --model gpt2 --layers 2 --embd 32 --heads 2 --max-t 16 --seq 16 --data text --data-path %s "
             "--steps %d --lr 3e-3 --seed 11 --eval-batches 2 --quiet --threads 1 %s 2>&1",
             DT_CLI_PATH, corpus, STEPS, extra);
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

/* losses[step - 1] from a --metrics file; returns the number of step lines. */
static int read_losses(const char *path, double *losses) {
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char line[1024];
    int n = 0;
    for (int i = 0; i < STEPS; i++) losses[i] = NAN;
    while (fgets(line, sizeof line, f)) {
        cJSON *j = cJSON_Parse(line);
        assert_non_null(j);
        const cJSON *s = cJSON_GetObjectItem(j, "step"), *l = cJSON_GetObjectItem(j, "loss");
        if (cJSON_IsNumber(s) && cJSON_IsNumber(l)) {
            int step = (int)s->valuedouble;
            assert_true(step >= 1 && step <= STEPS);
            losses[step - 1] = l->valuedouble;
            n++;
        }
        cJSON_Delete(j);
    }
    fclose(f);
    return n;
}

static void expect_losses(const double *got, const double *want, int from, int to, const char *what) {
    for (int s = from; s <= to; s++) {
        double rel = fabs(got[s - 1] - want[s - 1]) / fabs(want[s - 1]);
        if (!(rel <= TOL)) fail_msg("%s: step %d loss %.9g vs uninterrupted %.9g (rel %.3g)", what, s, got[s - 1], want[s - 1], rel);
    }
}

/* Every parameter (not optimizer state) of got matches want: ||a-b|| / ||b|| <= TOL over all of them. */
static void expect_params(const char *got_path, const char *want_path) {
    dt_safetensors got, want;
    assert_int_equal(dt_safetensors_load(got_path, &got), DT_OK);
    assert_int_equal(dt_safetensors_load(want_path, &want), DT_OK);
    double d = 0, s = 0;
    int n = 0;
    for (int i = 0; i < want.n_tensors; i++) {
        const dt_st_tensor *w = &want.tensors[i];
        if (!strncmp(w->name, "optim.", 6)) continue;
        const dt_st_tensor *g;
        if (dt_safetensors_expect(&got, w->name, DT_F32, w->ndim, w->shape, &g) != DT_OK)
            fail_msg("%s: %s", got_path, dt_error_message());
        const float *a = g->data, *b = w->data;
        for (size_t k = 0; k < w->nbytes / sizeof(float); k++) {
            d += ((double)a[k] - b[k]) * ((double)a[k] - b[k]);
            s += (double)b[k] * b[k];
        }
        n++;
    }
    assert_true(n >= 10);
    double rel = sqrt(d / s);
    if (getenv("DT_TEST_VERBOSE")) print_message("%s: parameters rel diff %.3g\n", got_path, rel);
    if (!(rel <= TOL)) fail_msg("%s: parameters differ from %s by %.3g relative", got_path, want_path, rel);
    const char *step = dt_safetensors_meta(&got, "step");
    assert_non_null(step);
    assert_string_equal(step, "6");
    dt_safetensors_free(&got);
    dt_safetensors_free(&want);
}

static void test_resume_at_other_world_sizes(void **state) {
    (void)state;
    char extra[1024], ref[128], ref_m[128], ck[128], a_m[128], one[128], one_m[128], four[128], four_m[128];
    snprintf(ref, sizeof ref, "%s/ref.safetensors", dir);
    snprintf(ref_m, sizeof ref_m, "%s/ref.jsonl", dir);
    snprintf(ck, sizeof ck, "%s/ckpt", dir);
    snprintf(a_m, sizeof a_m, "%s/a.jsonl", dir);
    snprintf(one, sizeof one, "%s/one.safetensors", dir);
    snprintf(one_m, sizeof one_m, "%s/one.jsonl", dir);
    snprintf(four, sizeof four, "%s/four.safetensors", dir);
    snprintf(four_m, sizeof four_m, "%s/four.jsonl", dir);

    /* uninterrupted: 2 ranks x batch 4 */
    snprintf(extra, sizeof extra, "--nproc 2 --zero 2 --batch 4 --save-format consolidated --save %s --metrics %s", ref, ref_m);
    train(extra);
    /* interrupted after 3 steps with a sharded checkpoint */
    snprintf(extra, sizeof extra, "--nproc 2 --zero 2 --batch 4 --save %s --save-every %d --stop-after %d --metrics %s",
             ck, STOP, STOP, a_m);
    train(extra);
    char idx[160];
    snprintf(idx, sizeof idx, "%s/index.json", ck);
    assert_int_equal(access(idx, R_OK), 0);
    /* resumed by one process (no ZeRO: the plain loader reads the set), batch 8 */
    snprintf(extra, sizeof extra, "--batch 8 --resume %s --save %s --metrics %s", ck, one, one_m);
    train(extra);
    /* resumed by 4 ranks at stage 2, batch 2 */
    snprintf(extra, sizeof extra, "--nproc 4 --zero 2 --batch 2 --resume %s --save-format consolidated --save %s --metrics %s",
             ck, four, four_m);
    train(extra);

    double r[STEPS], a[STEPS], o[STEPS], f[STEPS];
    assert_int_equal(read_losses(ref_m, r), STEPS);
    assert_int_equal(read_losses(a_m, a), STOP);
    assert_int_equal(read_losses(one_m, o), STEPS - STOP);
    assert_int_equal(read_losses(four_m, f), STEPS - STOP);
    expect_losses(a, r, 1, STOP, "interrupted run");
    expect_losses(o, r, STOP + 1, STEPS, "resumed by 1 process");
    expect_losses(f, r, STOP + 1, STEPS, "resumed by 4 ranks");
    if (getenv("DT_TEST_VERBOSE"))
        for (int s = 0; s < STEPS; s++) print_message("step %d: ref %.9g  1p %.9g  4r %.9g\n", s + 1, r[s], o[s], f[s]);
    expect_params(one, ref);
    expect_params(four, ref);
}

/* One process stops after 1 step (8 samples); 3 ranks cannot split that
 * position evenly: every rank fails with a message, the job ends. */
static void test_position_not_divisible(void **state) {
    (void)state;
    char extra[512], ck[128];
    snprintf(ck, sizeof ck, "%s/one_step.safetensors", dir);
    snprintf(extra, sizeof extra, "--batch 8 --save %s --save-every 1 --stop-after 1", ck);
    train(extra);
    snprintf(extra, sizeof extra, "--nproc 3 --zero 1 --batch 2 --resume %s", ck);
    assert_int_not_equal(run(extra), 0);
    if (!strstr(out, "world size 1 after 8 samples") || !strstr(out, "3 ranks")) fail_msg("output:\n%s", out);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_resume_at_other_world_sizes),
        cmocka_unit_test(test_position_not_divisible),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
