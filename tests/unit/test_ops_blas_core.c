/* The GEMM kernel-family check: CPU features x the family OpenBLAS reports x
 * the user's OPENBLAS_CORETYPE -> keep or re-execute with a better family;
 * the warning a library user gets; and the CLI's start-up line (it re-executes
 * itself, a user's setting wins). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "dtrain/log.h"
#include "dtrain/ops.h"

typedef struct decide_case {
    dt_isa cpu; int amd; const char *core, *user;
    dt_blas_action want; const char *want_fix;   /* NULL: no better family */
} decide_case;

static void test_decide_table(void **state) {
    (void)state;
    static const decide_case cases[] = {
        /* the Sapphire/Emerald Rapids case: unknown model, Prescott fallback */
        {DT_ISA_AVX512, 0, "Prescott", NULL, DT_BLAS_REEXEC, "SkylakeX"},
        {DT_ISA_AVX512, 0, "Prescott", "", DT_BLAS_REEXEC, "SkylakeX"},      /* empty = unset */
        {DT_ISA_AVX512, 1, "Haswell", NULL, DT_BLAS_REEXEC, "SkylakeX"},     /* AMD Zen 4 seen as AVX2 */
        {DT_ISA_AVX512, 0, "Nehalem", NULL, DT_BLAS_REEXEC, "SkylakeX"},
        {DT_ISA_AVX2, 0, "Prescott", NULL, DT_BLAS_REEXEC, "Haswell"},
        {DT_ISA_AVX2, 1, "Prescott", NULL, DT_BLAS_REEXEC, "Zen"},           /* an AMD AVX2 CPU */
        {DT_ISA_AVX2, 1, "Barcelona", NULL, DT_BLAS_REEXEC, "Zen"},
        {DT_ISA_AVX2, 0, "Sandybridge", NULL, DT_BLAS_REEXEC, "Haswell"},
        {DT_ISA_AVX, 0, "Core2", NULL, DT_BLAS_REEXEC, "Sandybridge"},
        {DT_ISA_AVX, 1, "Opteron(SSE3)", NULL, DT_BLAS_REEXEC, "Bulldozer"},
        /* the family already fits: keep */
        {DT_ISA_AVX512, 0, "SkylakeX", NULL, DT_BLAS_KEEP, NULL},
        {DT_ISA_AVX512, 0, "Cooperlake", NULL, DT_BLAS_KEEP, NULL},
        {DT_ISA_AVX512, 0, "SapphireRapids", NULL, DT_BLAS_KEEP, NULL},
        {DT_ISA_AVX512, 1, "cooperlake", NULL, DT_BLAS_KEEP, NULL},          /* case-insensitive */
        {DT_ISA_AVX2, 1, "Zen", NULL, DT_BLAS_KEEP, NULL},
        {DT_ISA_AVX2, 0, "Haswell", NULL, DT_BLAS_KEEP, NULL},
        {DT_ISA_AVX2, 0, "SkylakeX", NULL, DT_BLAS_KEEP, NULL},              /* higher than the CPU: not ours to judge */
        {DT_ISA_SSE, 0, "Prescott", NULL, DT_BLAS_KEEP, NULL},               /* nothing better exists */
        /* a name we do not know is never judged slower */
        {DT_ISA_AVX512, 0, "NewCoreFrom2030", NULL, DT_BLAS_KEEP, NULL},
        {DT_ISA_AVX512, 0, "", NULL, DT_BLAS_KEEP, NULL},
        {DT_ISA_AVX512, 0, NULL, NULL, DT_BLAS_KEEP, NULL},
        /* a user-set OPENBLAS_CORETYPE always wins: keep, but the faster family is still known */
        {DT_ISA_AVX512, 0, "Prescott", "Prescott", DT_BLAS_KEEP, "SkylakeX"},
        {DT_ISA_AVX512, 1, "Haswell", "Haswell", DT_BLAS_KEEP, "SkylakeX"},
        {DT_ISA_AVX2, 1, "Zen", "Zen", DT_BLAS_KEEP, NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const decide_case *c = &cases[i];
        const char *fix = "untouched";
        dt_blas_action a = dt_blas_core_decide((dt_cpu_isa){c->cpu, c->amd}, c->core, c->user, &fix);
        if (a != c->want || (c->want_fix ? !fix || strcmp(fix, c->want_fix) : fix != NULL))
            fail_msg("case %zu (cpu %s%s, core %s, user %s): action %d fix %s; wanted %d fix %s", i,
                     dt_isa_name(c->cpu), c->amd ? " AMD" : "", c->core ? c->core : "NULL",
                     c->user ? c->user : "unset", a, fix ? fix : "NULL", c->want, c->want_fix ? c->want_fix : "NULL");
    }
}

/* What this machine offers, found independently of dt_cpu_isa_detect. */
static dt_isa machine_isa(int *amd) {
    __builtin_cpu_init();
    *amd = __builtin_cpu_is("amd");
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")) return DT_ISA_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return DT_ISA_AVX2;
    if (__builtin_cpu_supports("avx")) return DT_ISA_AVX;
    return DT_ISA_SSE;
}

static const char *family_for(dt_isa isa, int amd) {
    return isa == DT_ISA_AVX512 ? "SkylakeX" : isa == DT_ISA_AVX2 ? (amd ? "Zen" : "Haswell")
         : isa == DT_ISA_AVX ? (amd ? "Bulldozer" : "Sandybridge") : NULL;
}

static void test_detect_matches_cpuid(void **state) {
    (void)state;
    int amd;
    dt_isa want = machine_isa(&amd);
    dt_cpu_isa got = dt_cpu_isa_detect();
    assert_int_equal(got.isa, want);
    assert_int_equal(got.amd != 0, amd != 0);
}

static char g_warn[512];
static void capture(void *ctx, dt_log_level level, const char *msg) {
    (void)ctx;
    if (level == DT_LOG_WARN) snprintf(g_warn, sizeof g_warn, "%s", msg);
}

/* A library user whose OpenBLAS runs a fallback gets one line naming the fix. */
static void test_library_warning(void **state) {
    (void)state;
    int amd;
    dt_isa isa = machine_isa(&amd);
    const char *fix = family_for(isa, amd);
    if (!fix) skip();   /* an SSE-only CPU has nothing better */
    dt_log_set_handler(capture, NULL);
    unsetenv("OPENBLAS_CORETYPE");
    setenv("DTRAIN_TEST_BLAS_CORE", "Prescott", 1);
    g_warn[0] = 0;
    assert_int_equal(dt_blas_warn_fallback(), 1);
    char want[64];
    snprintf(want, sizeof want, "OPENBLAS_CORETYPE=%s", fix);
    if (!strstr(g_warn, want) || !strstr(g_warn, "Prescott")) fail_msg("warning '%s' lacks '%s'", g_warn, want);
    /* the user chose the slow family: no warning */
    setenv("OPENBLAS_CORETYPE", "Prescott", 1);
    g_warn[0] = 0;
    assert_int_equal(dt_blas_warn_fallback(), 0);
    assert_string_equal(g_warn, "");
    unsetenv("OPENBLAS_CORETYPE");
    unsetenv("DTRAIN_TEST_BLAS_CORE");
    dt_log_set_handler(NULL, NULL);
}

/* The CLI's "dtrain: GEMM: ..." line for one environment. */
static void gemm_line(const char *env, char *out, size_t n) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "env -u OPENBLAS_CORETYPE -u DTRAIN_BLAS_REEXEC -u DTRAIN_GEMM %s %s train --steps 1 --batch 8 2>&1",
             env, DT_CLI_PATH);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    char line[1024];
    out[0] = 0;
    while (fgets(line, sizeof line, p))
        if (!strncmp(line, "dtrain: GEMM: ", 14)) snprintf(out, n, "%s", line);
    assert_int_equal(pclose(p), 0);
    if (!out[0]) fail_msg("no 'dtrain: GEMM:' line with '%s'", env);
}

static void test_cli_startup_line(void **state) {
    (void)state;
    char line[1024], want[128];
    /* (OpenBLAS chosen explicitly: on an AMD AVX-512 CPU oneDNN is the default,
     * test_ops_gemm_backend covers that line) */
    gemm_line("DTRAIN_GEMM=openblas", line, sizeof line);
    assert_non_null(strstr(line, "OpenBLAS "));
    assert_non_null(strstr(line, " kernels ("));

    /* a user's setting wins, even a slow one, and the line says who chose it */
    gemm_line("DTRAIN_GEMM=openblas OPENBLAS_CORETYPE=Prescott", line, sizeof line);
    if (!strstr(line, "Prescott kernels") || !strstr(line, "set by the user")) fail_msg("user-set: '%s'", line);

    /* OpenBLAS falls back (simulated): the CLI re-executes with the right family */
    int amd;
    dt_isa isa = machine_isa(&amd);
    const char *fix = family_for(isa, amd);
    if (!fix) return;
    gemm_line("DTRAIN_GEMM=openblas DTRAIN_TEST_BLAS_CORE=Prescott", line, sizeof line);
    snprintf(want, sizeof want, "%s kernels", fix);
    if (!strstr(line, want) || !strstr(line, "set by dtrain; OpenBLAS had chosen Prescott"))
        fail_msg("fallback: '%s' (wanted '%s')", line, want);
}

/* Re-executed, the CLI keeps its name (ps, top and pgrep show "dtrain", not
 * "exe"): start a long run with a simulated fallback, wait until the process
 * carries the re-exec marker in its environment, read its comm. */
static void test_reexec_keeps_name(void **state) {
    (void)state;
    int amd;
    dt_isa isa = machine_isa(&amd);
    if (!family_for(isa, amd)) skip();   /* no better family: no re-exec */
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int null = open("/dev/null", O_WRONLY);
        if (null >= 0) { dup2(null, STDOUT_FILENO); dup2(null, STDERR_FILENO); }
        unsetenv("OPENBLAS_CORETYPE");
        unsetenv("DTRAIN_BLAS_REEXEC");
        setenv("DTRAIN_GEMM", "openblas", 1);
        setenv("DTRAIN_TEST_BLAS_CORE", "Prescott", 1);
        execl(DT_CLI_PATH, "dtrain", "train", "--steps", "1000000", "--batch", "8", "--quiet", (char *)NULL);
        _exit(127);
    }
    char path[64], comm[64] = "", env[65536];
    int seen = 0;
    for (int i = 0; i < 2000 && !seen; i++) {   /* up to 20 s; normally a few ms */
        snprintf(path, sizeof path, "/proc/%d/environ", (int)pid);
        int fd = open(path, O_RDONLY);
        ssize_t n = fd >= 0 ? read(fd, env, sizeof env - 1) : -1;
        if (fd >= 0) close(fd);
        for (ssize_t k = 0; k + 19 <= n && !seen; k++) seen = !memcmp(env + k, "DTRAIN_BLAS_REEXEC=", 19);
        if (!seen) nanosleep(&(struct timespec){0, 10000000}, NULL);
    }
    if (seen) {
        snprintf(path, sizeof path, "/proc/%d/comm", (int)pid);
        FILE *f = fopen(path, "r");
        if (f) {
            if (!fgets(comm, sizeof comm, f)) comm[0] = 0;
            fclose(f);
        }
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    if (!seen) fail_msg("the CLI never re-executed with DTRAIN_TEST_BLAS_CORE=Prescott");
    assert_string_equal(comm, "dtrain\n");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reexec_keeps_name),
        cmocka_unit_test(test_decide_table),
        cmocka_unit_test(test_detect_matches_cpuid),
        cmocka_unit_test(test_library_warning),
        cmocka_unit_test(test_cli_startup_line),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
