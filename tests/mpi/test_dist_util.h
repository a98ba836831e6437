/* Helpers shared by the tests/mpi/test_dist_*.c programs.
 *
 * Every rank runs every test in the same order. A failed check prints the
 * rank, location and last dtrain error, then MPI_Abort()s the job (tests only),
 * so one rank failing makes mpiexec exit non-zero instead of hanging.
 */
#ifndef TEST_DIST_UTIL_H
#define TEST_DIST_UTIL_H

#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "dtrain/dist.h"

#ifndef DIST_TEST_MODE
#define DIST_TEST_MODE DT_PROGRESS_POLL
#endif

static const char *t_current = "";

static inline int t_rank(void) { int r = 0; MPI_Comm_rank(MPI_COMM_WORLD, &r); return r; }
static inline int t_size(void) { int n = 1; MPI_Comm_size(MPI_COMM_WORLD, &n); return n; }

static inline void t_fail(const char *file, int line, const char *what) {
    fprintf(stderr, "rank %d: %s:%d: [%s] check failed: %s (last dtrain error: %s: %s)\n", t_rank(), file, line,
            t_current, what, dt_status_name(dt_error_code()), dt_error_message());
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    exit(1);
}

#define T_CHECK(c) do { if (!(c)) t_fail(__FILE__, __LINE__, #c); } while (0)
#define T_OK(e) do { if ((e) != DT_OK) t_fail(__FILE__, __LINE__, #e " != DT_OK"); } while (0)
#define T_EXPECT(e, code) do { dt_error_clear(); if ((e) != (code)) t_fail(__FILE__, __LINE__, #e " != " #code); \
                               T_CHECK(dt_error_message()[0] != 0); } while (0)

static inline void t_begin(const char *name) { t_current = name; }
static inline void t_end(void) {
    MPI_Barrier(MPI_COMM_WORLD);
    if (t_rank() == 0) printf("ok %s (np=%d, %s)\n", t_current, t_size(),
                              dt_dist_progress_mode() == DT_PROGRESS_THREAD ? "thread" : "poll");
    fflush(stdout);
}

static inline double t_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* float -> dtype -> float */
static inline float t_round(float x, dt_dtype t) {
    if (t == DT_BF16) return dt_bf16_to_f32(dt_f32_to_bf16(x));
    if (t == DT_F16) return dt_f16_to_f32(dt_f32_to_f16(x));
    return x;
}

static inline void *t_alloc(int64_t n, dt_dtype t) {
    void *p = calloc((size_t)(n > 0 ? n : 1), dt_dtype_size(t));
    T_CHECK(p);
    return p;
}

/* buf (dtype t) <- src (float) */
static inline void t_fill(void *buf, dt_dtype t, const float *src, int64_t n) {
    if (n > 0) dt_convert(buf, t, src, DT_F32, (size_t)n);
}

/* Bitwise compare buf (dtype t) with expected floats rounded to t. Returns the
 * first mismatching index or -1. */
static inline int64_t t_mismatch(const void *buf, dt_dtype t, const float *expect, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        if (t == DT_F32) {
            uint32_t a, b;
            memcpy(&a, (const float *)buf + i, 4);
            memcpy(&b, expect + i, 4);
            if (a != b) return i;
        } else {
            uint16_t a = ((const uint16_t *)buf)[i];
            uint16_t b = t == DT_BF16 ? dt_f32_to_bf16(expect[i]) : dt_f32_to_f16(expect[i]);
            if (a != b) return i;
        }
    }
    return -1;
}

static inline void t_expect_eq(const void *buf, dt_dtype t, const float *expect, int64_t n, const char *what) {
    int64_t i = t_mismatch(buf, t, expect, n);
    if (i >= 0) {
        float got;
        dt_convert(&got, DT_F32, (const char *)buf + (size_t)i * dt_dtype_size(t), t, 1);
        fprintf(stderr, "rank %d: [%s] %s (%s, n=%lld): element %lld = %.9g, expected %.9g\n", t_rank(), t_current,
                what, dt_dtype_name(t), (long long)n, (long long)i, (double)got, (double)expect[i]);
        t_fail(__FILE__, __LINE__, what);
    }
}

/* Sanitizer builds (-DDTRAIN_SANITIZE=ON): Open MPI leaks a little at
 * init/finalize. Keep its components loaded and unwind fully so that
 * LeakSanitizer sees the MPI frames, and suppress only leaks whose allocation
 * stack runs through Open MPI and its dependencies. Unused otherwise. */
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "fast_unwind_on_malloc=0"; }
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void) {
    return "leak:libmpi.so\nleak:libopen-pal.so\nleak:libopen-rte.so\nleak:mca_\nleak:libhwloc\n"
           "leak:libpmix\nleak:libevent\n";
}

static inline void t_init(int *argc, char ***argv) {
    setenv("OMPI_MCA_mca_base_component_disable_dlclose", "1", 0);
    dt_dist_opts o = {0};
    o.progress = DIST_TEST_MODE;
    if (dt_dist_init(argc, argv, &o) != DT_OK) {
        fprintf(stderr, "dt_dist_init: %s\n", dt_error_message());
        exit(1);
    }
}

#endif
