/* Which library runs the GEMMs (src/ops/gemm_backend.c): the decision table
 * (CPU vendor x oneDNN's ISA x DTRAIN_GEMM -> OpenBLAS or oneDNN, a user's
 * setting wins, a wrong one is an error naming it), dt_sgemm's product
 * through each library against a double-precision one (every transpose,
 * alpha and beta, leading dimensions wider than the rows), and the CLI's
 * start-up line and error for each setting. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "dtrain/error.h"
#include "dtrain/ops.h"

static void test_decide_table(void **state) {
    (void)state;
    static const struct {
        dt_isa isa; int amd; dt_isa dnnl; const char *user; dt_status want_st; dt_gemm_backend want;
    } c[] = {
        {DT_ISA_AVX512, 1, DT_ISA_AVX512, NULL, DT_OK, DT_GEMM_ONEDNN},    /* Zen 4: measured faster */
        {DT_ISA_AVX512, 1, DT_ISA_AVX512, "", DT_OK, DT_GEMM_ONEDNN},      /* empty = unset */
        {DT_ISA_AVX512, 1, DT_ISA_AVX2, NULL, DT_OK, DT_GEMM_OPENBLAS},    /* ONEDNN_MAX_CPU_ISA=AVX2 */
        {DT_ISA_AVX2, 1, DT_ISA_AVX2, NULL, DT_OK, DT_GEMM_OPENBLAS},      /* Zen 3 */
        {DT_ISA_AVX512, 0, DT_ISA_AVX512, NULL, DT_OK, DT_GEMM_OPENBLAS},  /* Intel Xeon */
        {DT_ISA_AVX2, 0, DT_ISA_AVX2, NULL, DT_OK, DT_GEMM_OPENBLAS},
        {DT_ISA_SSE, 0, DT_ISA_SSE, NULL, DT_OK, DT_GEMM_OPENBLAS},
        /* the user's choice wins either way */
        {DT_ISA_AVX512, 1, DT_ISA_AVX512, "openblas", DT_OK, DT_GEMM_OPENBLAS},
        {DT_ISA_AVX512, 0, DT_ISA_AVX512, "onednn", DT_OK, DT_GEMM_ONEDNN},
        {DT_ISA_SSE, 0, DT_ISA_SSE, "onednn", DT_OK, DT_GEMM_ONEDNN},
        /* and a wrong one is refused */
        {DT_ISA_AVX512, 1, DT_ISA_AVX512, "OneDNN", DT_EINVAL, DT_GEMM_OPENBLAS},
        {DT_ISA_AVX2, 0, DT_ISA_AVX2, "mkl", DT_EINVAL, DT_GEMM_OPENBLAS},
    };
    for (size_t i = 0; i < sizeof c / sizeof *c; i++) {
        dt_cpu_isa cpu = {c[i].isa, c[i].amd};
        dt_gemm_backend got = (dt_gemm_backend)99;
        dt_status st = dt_gemm_backend_decide(cpu, c[i].dnnl, c[i].user, &got);
        if (st != c[i].want_st) fail_msg("case %zu: status %d, want %d", i, (int)st, (int)c[i].want_st);
        if (st == DT_OK && got != c[i].want) fail_msg("case %zu: %s, want %s", i, dt_gemm_backend_name(got),
                                                       dt_gemm_backend_name(c[i].want));
        if (st != DT_OK) {
            char want[64];
            snprintf(want, sizeof want, "DTRAIN_GEMM='%s'", c[i].user);
            if (!strstr(dt_error_message(), want)) fail_msg("case %zu: message '%s'", i, dt_error_message());
        }
    }
}

static void test_set_backend(void **state) {
    (void)state;
    assert_int_equal(dt_gemm_set_backend("blas"), DT_EINVAL);
    assert_non_null(strstr(dt_error_message(), "'blas'"));
    assert_int_equal(dt_gemm_set_backend(NULL), DT_EINVAL);
    assert_int_equal(dt_gemm_set_backend("onednn"), DT_OK);
    assert_int_equal(dt_gemm_backend_in_use(), DT_GEMM_ONEDNN);
    assert_int_equal(dt_gemm_backend_check(), DT_OK);   /* a program's choice stands */
    char d[192];
    dt_gemm_describe(d, sizeof d);
    if (strncmp(d, "oneDNN ", 7) || !strstr(d, "chosen by the program")) fail_msg("'%s'", d);
    assert_int_equal(dt_gemm_set_backend("openblas"), DT_OK);
    assert_int_equal(dt_gemm_backend_in_use(), DT_GEMM_OPENBLAS);
    dt_gemm_describe(d, sizeof d);
    if (strncmp(d, "OpenBLAS ", 9)) fail_msg("'%s'", d);
}

static uint64_t rng = 0x2545f4914f6cdd1dull;
static float urand(void) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)(rng >> 40) / (float)(1u << 24) - 0.5f;
}

/* C = alpha op(A) op(B) + beta C through dt_sgemm, against doubles; the
 * columns past N (ldc > N) must stay as they were. */
static void check_product(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, float beta) {
    int64_t lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 1, ldc = N + 2;
    int64_t ra = ta ? K : M, rb = tb ? N : K;   /* stored rows */
    float *A = malloc((size_t)(ra * lda) * sizeof *A), *B = malloc((size_t)(rb * ldb) * sizeof *B);
    float *C = malloc((size_t)(M * ldc) * sizeof *C), *C0 = malloc((size_t)(M * ldc) * sizeof *C0);
    for (int64_t i = 0; i < ra * lda; i++) A[i] = urand();
    for (int64_t i = 0; i < rb * ldb; i++) B[i] = urand();
    for (int64_t i = 0; i < M * ldc; i++) C[i] = C0[i] = urand();
    dt_sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < ldc; j++) {
            if (j >= N) {
                if (C[i * ldc + j] != C0[i * ldc + j]) fail_msg("column %lld past N written", (long long)j);
                continue;
            }
            double ref = beta * (double)C0[i * ldc + j], mag = fabs(ref);
            for (int64_t k = 0; k < K; k++) {
                double p = alpha * (double)(ta ? A[k * lda + i] : A[i * lda + k]) * (tb ? B[j * ldb + k] : B[k * ldb + j]);
                ref += p;
                mag += fabs(p);
            }
            if (fabs(C[i * ldc + j] - ref) > 2e-5 * mag + 1e-6)
                fail_msg("%s %c%c %lldx%lldx%lld alpha %g beta %g: C[%lld, %lld] = %g, want %g",
                         dt_gemm_backend_name(dt_gemm_backend_in_use()), ta ? 'T' : 'N', tb ? 'T' : 'N', (long long)M,
                         (long long)N, (long long)K, alpha, beta, (long long)i, (long long)j, C[i * ldc + j], ref);
        }
    free(A); free(B); free(C); free(C0);
}

static void test_products(void **state) {
    (void)state;
    static const char *const backends[] = {"openblas", "onednn"};
    for (int b = 0; b < 2; b++) {
        assert_int_equal(dt_gemm_set_backend(backends[b]), DT_OK);
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++) {
                check_product(ta, tb, 7, 5, 3, 1.0f, 0.0f);
                check_product(ta, tb, 33, 65, 129, 0.5f, 1.0f);
                check_product(ta, tb, 1, 17, 40, 1.0f, 0.25f);
            }
        check_product(0, 1, 16, 24, 2048, 1.0f, 1.0f);   /* the small-batch path's shape */
        check_product(0, 0, 3, 4, 0, 1.0f, 0.5f);        /* K = 0: C = beta C */
    }
}

/* The CLI's "dtrain: GEMM: ..." line (or its error) for one environment. */
static int cli_line(const char *env, const char *head, char *out, size_t n) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "env -u DTRAIN_GEMM -u ONEDNN_MAX_CPU_ISA %s %s train --steps 1 --batch 8 2>&1", env,
             DT_CLI_PATH);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    char line[1024];
    out[0] = 0;
    while (fgets(line, sizeof line, p))
        if (!out[0] && strstr(line, head)) snprintf(out, n, "%s", line);
    int rc = pclose(p);
    if (!out[0]) fail_msg("no '%s' line with '%s'", head, env);
    return rc;
}

static void test_cli(void **state) {
    (void)state;
    char line[1024];
    assert_int_equal(cli_line("DTRAIN_GEMM=onednn", "dtrain: GEMM: ", line, sizeof line), 0);
    if (strncmp(line, "dtrain: GEMM: oneDNN ", 21) || !strstr(line, "DTRAIN_GEMM set by the user")) fail_msg("'%s'", line);
    assert_int_equal(cli_line("DTRAIN_GEMM=openblas", "dtrain: GEMM: ", line, sizeof line), 0);
    if (strncmp(line, "dtrain: GEMM: OpenBLAS ", 23)) fail_msg("'%s'", line);

    /* nothing set: oneDNN on an AMD AVX-512 CPU, OpenBLAS otherwise */
    dt_cpu_isa cpu = dt_cpu_isa_detect();
    const char *want = cpu.amd && cpu.isa == DT_ISA_AVX512 ? "dtrain: GEMM: oneDNN " : "dtrain: GEMM: OpenBLAS ";
    assert_int_equal(cli_line("", "dtrain: GEMM: ", line, sizeof line), 0);
    if (strncmp(line, want, strlen(want))) fail_msg("default: '%s', want '%s...'", line, want);
    /* oneDNN held to AVX2: it is slow on some shapes there, so OpenBLAS */
    assert_int_equal(cli_line("ONEDNN_MAX_CPU_ISA=AVX2", "dtrain: GEMM: ", line, sizeof line), 0);
    if (strncmp(line, "dtrain: GEMM: OpenBLAS ", 23)) fail_msg("AVX2: '%s'", line);
    if (cpu.isa >= DT_ISA_AVX2) {
        assert_int_equal(cli_line("DTRAIN_GEMM=onednn ONEDNN_MAX_CPU_ISA=AVX2", "dtrain: GEMM: ", line, sizeof line), 0);
        if (!strstr(line, "oneDNN") || !strstr(line, ", AVX2 kernels")) fail_msg("oneDNN AVX2: '%s'", line);
    }

    /* a wrong name: refused before training, the message names the variable */
    assert_int_not_equal(cli_line("DTRAIN_GEMM=mkl", "DTRAIN_GEMM='mkl': expected openblas or onednn", line,
                                  sizeof line), 0);
}

/* oneDNN 2.6.3's GEMM kernels run with rsp in the heap: a signal handled on
 * a thread inside one writes its frame there (glibc then aborts with
 * "corrupted size vs. prev_size"). dt_sgemm holds asynchronous signals back
 * from such threads. Here a second thread (which blocks the signal itself,
 * so that it lands on the GEMM threads or waits) sends SIGUSR1 every 50 us
 * while the main thread runs oneDNN products: the heap must survive, the
 * products stay right, and the handler still runs (once the call returns). */
static volatile sig_atomic_t g_handled;
static void on_usr1(int sig) { (void)sig; g_handled++; }

typedef struct pelter { _Atomic int stop, sent; } pelter;
static void *pelt(void *arg) {
    pelter *p = arg;
    sigset_t s;
    sigemptyset(&s);
    sigaddset(&s, SIGUSR1);
    pthread_sigmask(SIG_BLOCK, &s, NULL);
    while (!p->stop) {
        kill(getpid(), SIGUSR1);
        p->sent++;
        nanosleep(&(struct timespec){0, 50000}, NULL);
    }
    return NULL;
}

static void test_signals_during_gemm(void **state) {
    (void)state;
    assert_int_equal(dt_gemm_set_backend("onednn"), DT_OK);
    struct sigaction sa, old;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr1;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    assert_int_equal(sigaction(SIGUSR1, &sa, &old), 0);
    const int64_t n = 384;
    float *A = malloc((size_t)(n * n) * sizeof *A), *B = malloc((size_t)(n * n) * sizeof *B);
    float *C = malloc((size_t)(n * n) * sizeof *C);
    for (int64_t i = 0; i < n * n; i++) { A[i] = urand(); B[i] = urand(); }
    pelter p;
    atomic_init(&p.stop, 0);
    atomic_init(&p.sent, 0);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, pelt, &p), 0);
    for (int it = 0; it < 400; it++) {
        dt_sgemm(it & 1, 0, n, n, n, 1.0f, A, n, B, n, 0.0f, C, n);
        void *churn = malloc((size_t)(1 + it % 7) * 4096);   /* frees and merges: where glibc notices */
        free(churn);
    }
    p.stop = 1;
    pthread_join(th, NULL);
    /* one product checked in full: A · B */
    dt_sgemm(0, 0, n, n, n, 1.0f, A, n, B, n, 0.0f, C, n);
    for (int64_t i = 0; i < n; i += 37)
        for (int64_t j = 0; j < n; j++) {
            double ref = 0, mag = 0;
            for (int64_t k = 0; k < n; k++) { ref += (double)A[i * n + k] * B[k * n + j]; mag += fabs((double)A[i * n + k] * B[k * n + j]); }
            if (fabs(C[i * n + j] - ref) > 2e-5 * mag + 1e-6) fail_msg("C[%lld, %lld] = %g, want %g", (long long)i, (long long)j, C[i * n + j], ref);
        }
    free(A); free(B); free(C);
    assert_true(atomic_load(&p.sent) > 100);
    assert_true(g_handled > 0);   /* held back, not lost */
    sigaction(SIGUSR1, &old, NULL);
    assert_int_equal(dt_gemm_set_backend("openblas"), DT_OK);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_decide_table),
        cmocka_unit_test(test_set_backend),
        cmocka_unit_test(test_products),
        cmocka_unit_test(test_cli),
        cmocka_unit_test(test_signals_during_gemm),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
