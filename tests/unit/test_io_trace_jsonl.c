/* Chrome trace output and metrics JSONL. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <cjson/cJSON.h>
#include "dtrain/io.h"
#include "tmpdir.h"

static char g_dir[64];
static char g_path[256];

static int setup_dir(void **state) {
    (void)state;
    if (dt_test_tmpdir(g_dir, sizeof g_dir, "io_trace") != 0) return -1;
    snprintf(g_path, sizeof g_path, "%s/out", g_dir);
    return 0;
}

static int teardown_dir(void **state) {
    (void)state;
    dt_test_rm_rf(g_dir);
    return 0;
}

static char *read_text(const char *path) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    assert_non_null(s);
    assert_int_equal(fread(s, 1, (size_t)n, f), (size_t)n);
    s[n] = 0;
    fclose(f);
    return s;
}

static cJSON *load_trace(const char *path) {
    char *text = read_text(path);
    cJSON *root = cJSON_Parse(text);
    free(text);
    assert_non_null(root);
    assert_true(cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(root, "traceEvents")));
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(root, "displayTimeUnit")->valuestring, "ms");
    return root;
}

static const char *str_field(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static double num_field(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    assert_true(cJSON_IsNumber(v));
    return v->valuedouble;
}

/* Metadata event naming (pid, tid) as `what` = value, or NULL. */
static const char *meta_name(const cJSON *events, const char *what, int pid, int tid) {
    const cJSON *e;
    cJSON_ArrayForEach(e, events) {
        const char *ph = str_field(e, "ph"), *name = str_field(e, "name");
        if (!ph || strcmp(ph, "M") || !name || strcmp(name, what)) continue;
        if ((int)num_field(e, "pid") != pid) continue;
        if (tid >= 0 && (int)num_field(e, "tid") != tid) continue;
        return str_field(cJSON_GetObjectItemCaseSensitive(e, "args"), "name");
    }
    return NULL;
}

static void test_trace_null_safe(void **state) {
    (void)state;
    dt_trace_event(NULL, "x", "y", 0, 1.0, 2.0);
    dt_trace_instant(NULL, "x", 1);
    assert_true(dt_trace_now_us(NULL) == 0.0);
    assert_int_equal(dt_trace_close(NULL), DT_OK);
    dt_trace *t = (dt_trace *)&t;
    assert_int_equal(dt_trace_open(&t, "", 0), DT_EINVAL);
    assert_null(t);
}

static void test_trace_events(void **state) {
    (void)state;
    dt_trace *t = NULL;
    assert_int_equal(dt_trace_open(&t, g_path, 3), DT_OK);
    assert_non_null(t);
    double t0 = dt_trace_now_us(t);
    struct timespec ts = {0, 2000000};
    nanosleep(&ts, NULL);
    double t1 = dt_trace_now_us(t);
    assert_true(t0 >= 0.0);
    assert_true(t1 - t0 >= 1000.0);   /* slept 2 ms */
    char name[32];
    snprintf(name, sizeof name, "step%d", 7);
    dt_trace_event(t, name, "compute", 0, 100.0, 350.5);
    memset(name, 'Z', sizeof name - 1);   /* the name must have been copied */
    dt_trace_event(t, "allreduce \"bucket\" 0\\1\n", "comm", 1, 200.25, 900.0);
    dt_trace_event(t, "no-cat", NULL, 4, 10.0, 5.0);   /* reversed: dur 0 */
    dt_trace_instant(t, "checkpoint", 0);
    assert_int_equal(access(g_path, F_OK), -1);   /* buffered until close */
    assert_int_equal(dt_trace_close(t), DT_OK);

    cJSON *root = load_trace(g_path);
    cJSON *ev = cJSON_GetObjectItemCaseSensitive(root, "traceEvents");
    assert_string_equal(meta_name(ev, "process_name", 3, -1), "rank 3");
    assert_string_equal(meta_name(ev, "thread_name", 3, 0), "compute");
    assert_string_equal(meta_name(ev, "thread_name", 3, 1), "comm");
    assert_string_equal(meta_name(ev, "thread_name", 3, 4), "lane 4");
    int found = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, ev) {
        const char *ph = str_field(e, "ph"), *n = str_field(e, "name");
        assert_non_null(ph);
        assert_non_null(n);
        assert_int_equal((int)num_field(e, "pid"), 3);
        if (!strcmp(n, "step7")) {
            assert_string_equal(ph, "X");
            assert_string_equal(str_field(e, "cat"), "compute");
            assert_true(fabs(num_field(e, "ts") - 100.0) < 1e-6);
            assert_true(fabs(num_field(e, "dur") - 250.5) < 1e-6);
            assert_int_equal((int)num_field(e, "tid"), 0);
            found |= 1;
        } else if (!strcmp(n, "allreduce \"bucket\" 0\\1\n")) {
            assert_string_equal(ph, "X");
            assert_string_equal(str_field(e, "cat"), "comm");
            assert_true(fabs(num_field(e, "ts") - 200.25) < 1e-6);
            assert_true(fabs(num_field(e, "dur") - 699.75) < 1e-6);
            assert_int_equal((int)num_field(e, "tid"), 1);
            found |= 2;
        } else if (!strcmp(n, "no-cat")) {
            assert_null(cJSON_GetObjectItemCaseSensitive(e, "cat"));
            assert_true(num_field(e, "dur") == 0.0);
            assert_int_equal((int)num_field(e, "tid"), 4);
            found |= 4;
        } else if (!strcmp(n, "checkpoint")) {
            assert_string_equal(ph, "i");
            assert_true(num_field(e, "ts") >= t1);
            found |= 8;
        }
    }
    assert_int_equal(found, 15);
    cJSON_Delete(root);
}

/* Compute and comm threads recording at once: nothing lost or garbled. */
typedef struct thr_arg { dt_trace *t; int lane; int n; } thr_arg;

static void *record_thread(void *p) {
    thr_arg *a = p;
    char name[32];
    for (int i = 0; i < a->n; i++) {
        snprintf(name, sizeof name, "%s%d", a->lane ? "comm" : "op", i);
        double b = dt_trace_now_us(a->t);
        dt_trace_event(a->t, name, a->lane ? "comm" : "compute", a->lane, b, b + 1.0);
    }
    return NULL;
}

static void test_trace_two_threads(void **state) {
    (void)state;
    enum { N = 5000 };
    dt_trace *t = NULL;
    assert_int_equal(dt_trace_open(&t, g_path, 1), DT_OK);
    thr_arg a = {t, 0, N}, b = {t, 1, N};
    pthread_t ta, tb;
    assert_int_equal(pthread_create(&ta, NULL, record_thread, &a), 0);
    assert_int_equal(pthread_create(&tb, NULL, record_thread, &b), 0);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    assert_int_equal(dt_trace_close(t), DT_OK);

    cJSON *root = load_trace(g_path);
    cJSON *ev = cJSON_GetObjectItemCaseSensitive(root, "traceEvents");
    static unsigned char seen[2][N];
    memset(seen, 0, sizeof seen);
    int count[2] = {0, 0};
    const cJSON *e;
    cJSON_ArrayForEach(e, ev) {
        if (strcmp(str_field(e, "ph"), "X")) continue;
        int lane = (int)num_field(e, "tid");
        assert_true(lane == 0 || lane == 1);
        const char *n = str_field(e, "name");
        const char *prefix = lane ? "comm" : "op";
        assert_int_equal(strncmp(n, prefix, strlen(prefix)), 0);
        int i = atoi(n + strlen(prefix));
        assert_true(i >= 0 && i < N);
        assert_int_equal(seen[lane][i], 0);
        seen[lane][i] = 1;
        count[lane]++;
        assert_true(fabs(num_field(e, "dur") - 1.0) < 1e-3);
    }
    assert_int_equal(count[0], N);
    assert_int_equal(count[1], N);
    cJSON_Delete(root);
}

static void test_trace_bad_path(void **state) {
    (void)state;
    char p[300];
    snprintf(p, sizeof p, "%s/missing/trace.json", g_dir);
    dt_trace *t = NULL;
    assert_int_equal(dt_trace_open(&t, p, 0), DT_OK);
    dt_trace_event(t, "x", "compute", 0, 0.0, 1.0);
    assert_int_equal(dt_trace_close(t), DT_EIO);
    assert_non_null(strstr(dt_error_message(), p));
}

/* ---- jsonl ---- */

static void test_jsonl_lines(void **state) {
    (void)state;
    dt_jsonl j;
    assert_int_equal(dt_jsonl_open(&j, g_path), DT_OK);
    const char *k1[] = {"step", "loss", "lr", "neg", "big", "nan", "inf", "tiny", "q\"k"};
    double v1[] = {3.0, 2.5, 3e-4, -7.0, 1e20, NAN, -INFINITY, 3.14159265358979, 1.0};
    assert_int_equal(dt_jsonl_write(&j, 9, k1, v1), DT_OK);
    /* Flushed after each line: visible before close. */
    char *text = read_text(g_path);
    assert_string_equal(text, "{\"step\":3,\"loss\":2.5,\"lr\":0.0003,\"neg\":-7,\"big\":1e+20,"
                              "\"nan\":null,\"inf\":null,\"tiny\":3.14159265,\"q\\\"k\":1}\n");
    free(text);
    dt_jsonl_close(&j);
    dt_jsonl_close(&j);   /* idempotent */
    assert_int_equal(dt_jsonl_write(&j, 9, k1, v1), DT_ESTATE);

    /* Reopen: append, not truncate. */
    assert_int_equal(dt_jsonl_open(&j, g_path), DT_OK);
    const char *k2[] = {"step", "tokens_per_s"};
    double v2[] = {4.0, 12345.678901234};
    assert_int_equal(dt_jsonl_write(&j, 2, k2, v2), DT_OK);
    assert_int_equal(dt_jsonl_write(&j, 0, NULL, NULL), DT_OK);
    dt_jsonl_close(&j);

    text = read_text(g_path);
    int lines = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n"), lines++) {
        cJSON *o = cJSON_Parse(line);
        assert_non_null(o);
        assert_true(cJSON_IsObject(o));
        if (lines == 0) {
            assert_true(num_field(o, "step") == 3.0);
            assert_true(num_field(o, "loss") == 2.5);
            assert_true(fabs(num_field(o, "lr") - 3e-4) < 1e-12);
            assert_true(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(o, "nan")));
            assert_true(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(o, "inf")));
            assert_true(num_field(o, "q\"k") == 1.0);
        } else if (lines == 1) {
            assert_true(num_field(o, "step") == 4.0);
            assert_true(fabs(num_field(o, "tokens_per_s") - 12345.6789) < 1e-3);
        } else {
            assert_null(o->child);   /* {} */
        }
        cJSON_Delete(o);
    }
    assert_int_equal(lines, 3);
    free(text);
}

/* A resumed run's stale lines go, and only its own: the file holds an
 * earlier run (steps 1..4 and its evaluation at 4), then the resumed run's
 * (steps 1..3, its evaluation at 3, steps 4..5 of an attempt that died).
 * Resuming the step-3 checkpoint drops the second run's lines past step 3;
 * the first run's steps 4 and its evaluation stay (they were cut, with
 * everything after them, when the cut was the first line past step 3). */
static void test_jsonl_drop_after_keeps_earlier_runs(void **state) {
    (void)state;
    const char *lines[] = {
        "{\"step\":1,\"loss\":2}", "{\"step\":2,\"loss\":2}", "{\"step\":3,\"loss\":2}",
        "{\"step\":4,\"loss\":2}", "{\"step\":4,\"eval_loss\":1}",
        "{\"step\":1,\"loss\":3}", "{\"step\":2,\"loss\":3}", "{\"step\":3,\"loss\":3}",
        "{\"step\":3,\"eval_loss\":1.5}", "{\"step\":4,\"loss\":3}", "{\"step\":5,\"loss\":3}",
    };
    FILE *f = fopen(g_path, "w");
    assert_non_null(f);
    for (size_t i = 0; i < sizeof lines / sizeof *lines; i++) fprintf(f, "%s\n", lines[i]);
    fclose(f);
    assert_int_equal(dt_jsonl_drop_after(g_path, 3), DT_OK);
    char want[1024] = "";
    for (size_t i = 0; i < 9; i++) {   /* all but the second run's steps 4 and 5 */
        strcat(want, lines[i]);
        strcat(want, "\n");
    }
    char *got = read_text(g_path);
    assert_string_equal(got, want);
    free(got);
    /* one run: the first line past the step on (an evaluation's line past it too) */
    assert_int_equal(dt_jsonl_drop_after(g_path, 2), DT_OK);
    got = read_text(g_path);
    want[0] = 0;
    for (size_t i = 0; i < 7; i++) {
        strcat(want, lines[i]);
        strcat(want, "\n");
    }
    assert_string_equal(got, want);
    free(got);
}

static void test_jsonl_bad_path(void **state) {
    (void)state;
    char p[300];
    snprintf(p, sizeof p, "%s/missing/metrics.jsonl", g_dir);
    dt_jsonl j;
    assert_int_equal(dt_jsonl_open(&j, p), DT_EIO);
    assert_non_null(strstr(dt_error_message(), p));
    assert_null(j.f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_trace_null_safe, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_trace_events, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_trace_two_threads, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_trace_bad_path, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_jsonl_lines, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_jsonl_bad_path, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_jsonl_drop_after_keeps_earlier_runs, setup_dir, teardown_dir),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
