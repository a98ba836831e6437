/* Which GEMM kernels run, and correcting OpenBLAS's choice.
 *
 * OpenBLAS (DYNAMIC_ARCH) picks its kernel family ("core") when the library is
 * loaded, from a table of CPU models. A model newer than the table (Debian's
 * 0.3.21 on a Sapphire/Emerald Rapids Xeon) falls back to Prescott (SSE3)
 * kernels: every GEMM ~4x slower and nothing says so. The family can only be
 * chosen through OPENBLAS_CORETYPE *before* the library loads, so the fix is
 * to compare the family with the ISA the CPU and OS actually offer and, when
 * the family is lower, re-execute the program with OPENBLAS_CORETYPE set.
 *
 * Constraint: a user-set OPENBLAS_CORETYPE always wins (no re-exec, no
 * warning: it is a deliberate choice, e.g. forcing the AVX2 path to compare). */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif
#include "dtrain/ops.h"
#include "util/log_internal.h"

#define REEXEC_ENV "DTRAIN_BLAS_REEXEC"     /* set on the re-executed process: never loop */
#define FAKE_CORE_ENV "DTRAIN_TEST_BLAS_CORE" /* tests: pretend OpenBLAS chose this family */

const char *dt_isa_name(dt_isa isa) {
    switch (isa) {
    case DT_ISA_AVX512: return "AVX-512";
    case DT_ISA_AVX2: return "AVX2";
    case DT_ISA_AVX: return "AVX";
    default: return "SSE";
    }
}

dt_cpu_isa dt_cpu_isa_detect(void) {
    dt_cpu_isa c = {DT_ISA_SSE, 0};
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();   /* libgcc also checks the OS saves the wide registers (XCR0) */
    c.amd = __builtin_cpu_is("amd");
    if (__builtin_cpu_supports("avx")) c.isa = DT_ISA_AVX;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) c.isa = DT_ISA_AVX2;
    /* what OpenBLAS's SkylakeX kernels need */
    if (c.isa == DT_ISA_AVX2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
        c.isa = DT_ISA_AVX512;
#endif
    return c;
}

/* OpenBLAS 0.3.21's x86-64 kernel families by the widest vector ISA they use.
 * Unknown names (other architectures, newer releases) count as SSE only when
 * they are known fallbacks; anything else is assumed fine (never re-exec on a
 * name we cannot judge). */
static int core_isa(const char *core, dt_isa *out) {
    static const struct { const char *name; dt_isa isa; } table[] = {
        {"SapphireRapids", DT_ISA_AVX512}, {"Cooperlake", DT_ISA_AVX512}, {"SkylakeX", DT_ISA_AVX512},
        {"Haswell", DT_ISA_AVX2}, {"Zen", DT_ISA_AVX2},
        {"Sandybridge", DT_ISA_AVX}, {"Bulldozer", DT_ISA_AVX}, {"Piledriver", DT_ISA_AVX},
        {"Steamroller", DT_ISA_AVX}, {"Excavator", DT_ISA_AVX},
        {"Prescott", DT_ISA_SSE}, {"Core2", DT_ISA_SSE}, {"Penryn", DT_ISA_SSE}, {"Dunnington", DT_ISA_SSE},
        {"Nehalem", DT_ISA_SSE}, {"Atom", DT_ISA_SSE}, {"Barcelona", DT_ISA_SSE}, {"Opteron", DT_ISA_SSE},
        {"Opteron(SSE3)", DT_ISA_SSE}, {"Bobcat", DT_ISA_SSE}, {"Nano", DT_ISA_SSE},
    };
    for (size_t i = 0; core && i < sizeof table / sizeof table[0]; i++)
        if (!strcasecmp(core, table[i].name)) { *out = table[i].isa; return 1; }
    return 0;
}

dt_blas_action dt_blas_core_decide(dt_cpu_isa cpu, const char *core, const char *user_coretype,
                                   const char **fix) {
    *fix = NULL;
    dt_isa have;
    if (!core_isa(core, &have) || have >= cpu.isa) return DT_BLAS_KEEP;
    switch (cpu.isa) {
    case DT_ISA_AVX512: *fix = "SkylakeX"; break;
    case DT_ISA_AVX2: *fix = cpu.amd ? "Zen" : "Haswell"; break;
    case DT_ISA_AVX: *fix = cpu.amd ? "Bulldozer" : "Sandybridge"; break;
    default: return DT_BLAS_KEEP;
    }
    if (user_coretype && *user_coretype) return DT_BLAS_KEEP;   /* the user's choice wins */
    return DT_BLAS_REEXEC;
}

static const char *reported_core(void) {
    const char *fake = getenv(FAKE_CORE_ENV);
    const char *user = getenv("OPENBLAS_CORETYPE");
    if (fake && *fake && !(user && *user)) return fake;
    return openblas_get_corename();
}

void dt_blas_info_get(dt_blas_info *out) {
    memset(out, 0, sizeof *out);
    const char *num = strpbrk(OPENBLAS_VERSION, "0123456789");   /* " OpenBLAS 0.3.21 " */
    snprintf(out->backend, sizeof out->backend, "OpenBLAS %s", num ? num : "(unknown version)");
    char *sp = strchr(out->backend + 9, ' ');
    if (sp) *sp = 0;
    snprintf(out->core, sizeof out->core, "%s", reported_core());
    out->cpu = dt_cpu_isa_detect();
    const char *user = getenv("OPENBLAS_CORETYPE");
    out->user_set = user && *user && !getenv(REEXEC_ENV);
    out->set_by_dtrain = getenv(REEXEC_ENV) != NULL;
    const char *fix;
    dt_blas_core_decide(out->cpu, out->core, NULL, &fix);
    if (fix) snprintf(out->fix, sizeof out->fix, "%s", fix);
    dt_isa isa;
    out->core_isa = core_isa(out->core, &isa) ? isa : out->cpu.isa;
}

void dt_blas_describe(const dt_blas_info *b, char *buf, size_t n) {
    char why[96] = "";
    const char *chose = getenv(REEXEC_ENV);
    if (b->set_by_dtrain)
        snprintf(why, sizeof why, " (OPENBLAS_CORETYPE set by dtrain; OpenBLAS had chosen %s)", chose ? chose : "?");
    else if (b->user_set)
        snprintf(why, sizeof why, " (OPENBLAS_CORETYPE set by the user)");
    snprintf(buf, n, "%s, %s kernels (%s) on an %s CPU%s", b->backend, b->core, dt_isa_name(b->core_isa),
             dt_isa_name(b->cpu.isa), why);
}

/* The re-executed process's name (comm: what top and pgrep show) is the
 * basename of the file executed -- "dtrain" when the real path could be
 * read, "exe" when exec had to fall back to /proc/self/exe (a binary replaced
 * or deleted since it started), and the link's target, not the link, when the
 * program was started through a symbolic link. Setting it back to the
 * basename of argv[0] gives the name the program was started as in every
 * case (at most 15 bytes, as the kernel keeps). */
static void keep_name(const char *argv0) {
#ifdef __linux__
    if (!argv0 || !*argv0) return;
    const char *b = strrchr(argv0, '/');
    b = b && b[1] ? b + 1 : argv0;
    char name[16];
    snprintf(name, sizeof name, "%s", b);
    prctl(PR_SET_NAME, name, 0, 0, 0);
#else
    (void)argv0;
#endif
}

void dt_blas_fix_core(char **argv) {
    if (getenv(REEXEC_ENV)) {   /* already re-executed once */
        keep_name(argv ? argv[0] : NULL);
        return;
    }
    const char *fix, *chose = reported_core();
    if (dt_blas_core_decide(dt_cpu_isa_detect(), chose, getenv("OPENBLAS_CORETYPE"), &fix) != DT_BLAS_REEXEC)
        return;
    if (setenv(REEXEC_ENV, chose, 1) || setenv("OPENBLAS_CORETYPE", fix, 1)) return;
    /* the program's own path, not /proc/self/exe: the kernel names the
     * process after the file executed, and ps, top and pgrep should still
     * say "dtrain" rather than "exe" (keep_name then restores argv[0]'s
     * basename in the new image, whichever file was executed); argv is
     * passed unchanged, so ps's command line keeps the original argv[0] */
    char self[4096];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len > 0) {
        self[len] = 0;
        execv(self, argv);
    }
    execv("/proc/self/exe", argv);
    /* exec failed: carry on with the slow kernels; dt_blas_warn_fallback says so */
    unsetenv("OPENBLAS_CORETYPE");
    unsetenv(REEXEC_ENV);
}

int dt_blas_warn_fallback(void) {
    dt_blas_info b;
    dt_blas_info_get(&b);
    if (b.user_set || !b.fix[0]) return 0;
    dt_log(DT_LOG_WARN, "OpenBLAS runs its %s kernels (%s) on a CPU with %s: GEMMs run several times slower; "
                        "set OPENBLAS_CORETYPE=%s in the environment before the program starts\n",
           b.core, dt_isa_name(b.core_isa), dt_isa_name(b.cpu.isa), b.fix);
    return 1;
}
