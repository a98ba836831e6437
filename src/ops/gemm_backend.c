/* Which library runs dtrain's GEMMs: OpenBLAS or oneDNN.
 *
 * Every GEMM in dtrain goes through dt_ops_sgemm, and this file decides, once
 * per process, which library it calls. Neither wins everywhere, so the
 * default follows what was measured (2 threads, one run each, GFLOP/s
 * OpenBLAS / oneDNN, docs/PERFORMANCE.md has the table):
 *   AMD Zen 4, AVX-512 (Cooperlake kernels / oneDNN avx512_core):
 *     1024^3 165-211 / 204-224; W1's GEMMs 170-216 / 179-230;
 *     W3 backward 64x2048x2048 NN 164-175 / 210-213. oneDNN wins.
 *   the same CPU held to AVX2 (Haswell kernels / ONEDNN_MAX_CPU_ISA=AVX2):
 *     even, except oneDNN's NN product on 64 rows: 195 / 102. OpenBLAS.
 *   Intel Xeon family 6 model 207, AVX-512 (the figures): OpenBLAS's
 *     SkylakeX kernels ~300 on 1024^3, oneDNN 164-276 on W1-W3 shapes. OpenBLAS.
 * Hence: oneDNN on AMD CPUs where oneDNN runs AVX-512 kernels, OpenBLAS
 * elsewhere. DTRAIN_GEMM=openblas|onednn (or dt_gemm_set_backend) overrides.
 *
 * Constraint: every rank of a job must use the same library (bitwise DDP and
 * ZeRO equivalence rests on identical GEMMs); the choice depends only on the
 * CPU model and the environment, which mpiexec gives every rank alike. */
#include <omp.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <oneapi/dnnl/dnnl.h>
#include "dtrain/error.h"
#include "ops_internal.h"

#define GEMM_ENV "DTRAIN_GEMM"

enum { FROM_DEFAULT, FROM_ENV, FROM_CALL };
static _Atomic int g_backend = -1;   /* dt_gemm_backend; -1: not chosen yet */
static _Atomic int g_from = FROM_DEFAULT;

const char *dt_gemm_backend_name(dt_gemm_backend b) { return b == DT_GEMM_ONEDNN ? "onednn" : "openblas"; }

static int parse(const char *name, dt_gemm_backend *out) {
    if (!name) return -1;
    if (!strcmp(name, "openblas")) *out = DT_GEMM_OPENBLAS;
    else if (!strcmp(name, "onednn")) *out = DT_GEMM_ONEDNN;
    else return -1;
    return 0;
}

dt_status dt_gemm_backend_decide(dt_cpu_isa cpu, dt_isa onednn_isa, const char *user, dt_gemm_backend *out) {
    if (user && *user) {
        if (parse(user, out))
            return DT_ERR(DT_EINVAL, "%s='%s': expected openblas or onednn", GEMM_ENV, user);
        return DT_OK;
    }
    *out = cpu.amd && onednn_isa >= DT_ISA_AVX512 ? DT_GEMM_ONEDNN : DT_GEMM_OPENBLAS;
    return DT_OK;
}

dt_isa dt_onednn_isa(void) {
    /* the ISA oneDNN's kernels use: the CPU's, capped by ONEDNN_MAX_CPU_ISA.
     * dnnl_cpu_isa_t values are bit sets, each including the ones below it */
    unsigned isa = (unsigned)dnnl_get_effective_cpu_isa();
    if ((isa & dnnl_cpu_isa_avx512_core) == dnnl_cpu_isa_avx512_core) return DT_ISA_AVX512;
    if ((isa & dnnl_cpu_isa_avx2) == dnnl_cpu_isa_avx2) return DT_ISA_AVX2;
    if ((isa & dnnl_cpu_isa_avx) == dnnl_cpu_isa_avx) return DT_ISA_AVX;
    return DT_ISA_SSE;
}

/* The user's valid DTRAIN_GEMM, else the default; an invalid value leaves
 * the default here and dt_gemm_backend_check reports it. */
static dt_gemm_backend resolve(void) {
    int b = atomic_load(&g_backend);
    if (b >= 0) return (dt_gemm_backend)b;
    dt_gemm_backend out;
    const char *user = getenv(GEMM_ENV);
    int from = FROM_DEFAULT;
    if (user && *user && !parse(user, &out)) from = FROM_ENV;
    else dt_gemm_backend_decide(dt_cpu_isa_detect(), dt_onednn_isa(), NULL, &out);
    int expected = -1;
    if (atomic_compare_exchange_strong(&g_backend, &expected, (int)out)) atomic_store(&g_from, from);
    return (dt_gemm_backend)atomic_load(&g_backend);   /* a racing first call chose the same */
}

dt_gemm_backend dt_gemm_backend_in_use(void) { return resolve(); }

dt_status dt_gemm_backend_check(void) {
    if (atomic_load(&g_from) == FROM_CALL) return DT_OK;
    dt_gemm_backend b;
    return dt_gemm_backend_decide(dt_cpu_isa_detect(), DT_ISA_SSE, getenv(GEMM_ENV), &b);
}

dt_status dt_gemm_set_backend(const char *name) {
    dt_gemm_backend b;
    if (parse(name, &b)) return DT_ERR(DT_EINVAL, "GEMM backend '%s': expected openblas or onednn", name ? name : "(null)");
    atomic_store(&g_backend, (int)b);
    atomic_store(&g_from, FROM_CALL);
    return DT_OK;
}

void dt_gemm_describe(char *buf, size_t n) {
    dt_gemm_backend b = resolve();
    if (b == DT_GEMM_OPENBLAS) {
        dt_blas_info info;
        dt_blas_info_get(&info);
        dt_blas_describe(&info, buf, n);
        return;
    }
    const dnnl_version_t *v = dnnl_version();
    dt_cpu_isa cpu = dt_cpu_isa_detect();
    snprintf(buf, n, "oneDNN %d.%d.%d, %s kernels on an %s CPU (%s)", v->major, v->minor, v->patch,
             dt_isa_name(dt_onednn_isa()), dt_isa_name(cpu.isa),
             atomic_load(&g_from) == FROM_ENV    ? "DTRAIN_GEMM set by the user"
             : atomic_load(&g_from) == FROM_CALL ? "chosen by the program"
                                                 : "dtrain's default on AMD AVX-512 CPUs; DTRAIN_GEMM=openblas selects OpenBLAS");
}

/* oneDNN 2.6.3's generated GEMM kernels (AVX2 and AVX-512) point rsp into a
 * heap workspace while they run, so a signal handled on a thread inside one
 * writes its frame over the heap (oneDNN issue 4845, fixed upstream in 2026,
 * not in Debian 12's package). dtrain handles SIGTERM / SIGINT / SIGUSR1 to
 * stop and save, so that is every preemption: test_signal_stop aborted with
 * "corrupted size vs. prev_size" in 3 of 12 runs. Asynchronous signals are
 * therefore held back from every thread that can run those kernels: the
 * OpenMP workers keep them blocked for good (they reach the main thread
 * instead), and the calling thread blocks them for the call; a signal that
 * arrives meanwhile is delivered when the call returns. Synchronous signals
 * (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP) cannot be held and stay as they
 * are. */
static void async_signals(sigset_t *set) {
    sigfillset(set);
    const int sync[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGKILL, SIGSTOP};
    for (size_t i = 0; i < sizeof sync / sizeof *sync; i++) sigdelset(set, sync[i]);
}

static _Atomic int g_workers_held;   /* OpenMP team size whose workers block them */

static void hold_in_workers(void) {
    int n = omp_get_max_threads();
    if (omp_in_parallel() || n <= atomic_load(&g_workers_held)) return;
#pragma omp parallel num_threads(n)
    if (omp_get_thread_num() != 0) {   /* each worker builds its own set: nothing shared */
        sigset_t mine;
        async_signals(&mine);
        pthread_sigmask(SIG_BLOCK, &mine, NULL);
    }
    atomic_store(&g_workers_held, n);
}

void dt_ops_hold_signals(sigset_t *old) {
    sigset_t set;
    async_signals(&set);
    hold_in_workers();
    pthread_sigmask(SIG_BLOCK, &set, old);
}

int dt_ops_sgemm_onednn(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                        const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    sigset_t old;
    dt_ops_hold_signals(&old);
    dnnl_status_t st = dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return st == dnnl_success;
}
