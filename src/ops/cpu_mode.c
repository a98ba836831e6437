/* Floating-point mode of the compute threads: flush denormals to zero.
 * x86 SIMD arithmetic on denormal inputs or results (|x| < 2^-126) takes a
 * microcode assist costing ~100 cycles; MXCSR.FTZ/DAZ turn those values into
 * zeros instead. MXCSR is per thread, so the OpenMP workers (which OpenBLAS
 * shares) are set too. */
#include <omp.h>
#include "dtrain/error.h"
#include "dtrain/ops.h"
#if defined(__x86_64__) || defined(__i386__)
#include <pmmintrin.h>
#include <xmmintrin.h>
#define DT_HAVE_MXCSR 1

static void set_this_thread(int on) {
    _MM_SET_FLUSH_ZERO_MODE(on ? _MM_FLUSH_ZERO_ON : _MM_FLUSH_ZERO_OFF);
    _MM_SET_DENORMALS_ZERO_MODE(on ? _MM_DENORMALS_ZERO_ON : _MM_DENORMALS_ZERO_OFF);
}
#endif

dt_status dt_cpu_set_flush_denormal(int on) {
#ifdef DT_HAVE_MXCSR
    set_this_thread(on);
    int n = omp_get_max_threads();
#pragma omp parallel num_threads(n)
    set_this_thread(on);
    return DT_OK;
#else
    (void)on;
    return DT_ERR(DT_EINVAL, "flushing denormals is implemented for x86 only (set train.keep_denormals)");
#endif
}

int dt_cpu_flush_denormal(void) {
#ifdef DT_HAVE_MXCSR
    return _MM_GET_FLUSH_ZERO_MODE() == _MM_FLUSH_ZERO_ON && _MM_GET_DENORMALS_ZERO_MODE() == _MM_DENORMALS_ZERO_ON;
#else
    return 0;
#endif
}
