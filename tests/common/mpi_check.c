/* Checks for the multi-rank tests; see mpi_check.h. */
#include "mpi_check.h"
#include <strings.h>
#include <time.h>

static const char *cur_test = "";

int t_rank(void) { int r = 0; MPI_Comm_rank(MPI_COMM_WORLD, &r); return r; }
int t_size(void) { int n = 1; MPI_Comm_size(MPI_COMM_WORLD, &n); return n; }
const char *t_name(void) { return cur_test; }

void t_fail(const char *file, int line, const char *what) {
    fprintf(stderr, "rank %d: %s:%d: [%s] check failed: %s (last dtrain error: %s: %s)\n", t_rank(), file, line,
            cur_test, what, dt_status_name(dt_error_code()), dt_error_message());
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    exit(1);
}

static const char *mode_name(dt_progress_mode m) {
    return m == DT_PROGRESS_THREAD ? "thread" : m == DT_PROGRESS_POLL ? "poll" : "default";
}

void t_begin(const char *name) { cur_test = name; }
void t_end(void) {
    MPI_Barrier(MPI_COMM_WORLD);
    if (t_rank() == 0) printf("ok %s (np=%d, %s)\n", cur_test, t_size(), mode_name(dt_dist_progress_mode()));
    fflush(stdout);
}

dt_progress_mode t_expected_mode(void) {
    const char *e = getenv("DTRAIN_PROGRESS");
    if (!e || !*e || !strcasecmp(e, "poll")) return DT_PROGRESS_POLL;
    if (!strcasecmp(e, "thread")) return DT_PROGRESS_THREAD;
    fprintf(stderr, "DTRAIN_PROGRESS=%s: the tests know only poll and thread\n", e);
    exit(1);
}

/* Sanitizer builds (-DDTRAIN_SANITIZE=ON): Open MPI leaks a little at
 * init/finalize. Keep its components loaded and unwind fully so that
 * LeakSanitizer sees the MPI frames, and suppress only leaks whose allocation
 * stack runs through Open MPI and its dependencies. Unused otherwise. These
 * override the sanitizer runtime's weak defaults in every program that links
 * this file (every tests/mpi program: they all call t_init). */
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "fast_unwind_on_malloc=0"; }
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void) {
    return "leak:libmpi.so\nleak:libopen-pal.so\nleak:libopen-rte.so\nleak:mca_\nleak:libhwloc\n"
           "leak:libpmix\nleak:libevent\n";
}

void t_init(int *argc, char ***argv) {
    setenv("OMPI_MCA_mca_base_component_disable_dlclose", "1", 0);
    dt_progress_mode want = t_expected_mode();
    dt_dist_opts o = {0};
    o.progress = DT_PROGRESS_DEFAULT;   /* the library reads DTRAIN_PROGRESS itself */
    if (dt_dist_init(argc, argv, &o) != DT_OK) {
        fprintf(stderr, "dt_dist_init: %s\n", dt_error_message());
        exit(1);
    }
    t_begin("t_init: progress mode as DTRAIN_PROGRESS asks");
    T_CHECK(dt_dist_progress_mode() == want);
    t_begin("");
}

/* ---- comparisons ---- */
int64_t t_mismatch(const void *buf, dt_dtype t, const float *expect, int64_t n) {
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

void t_dtype_eq_at(const char *file, int line, const void *buf, dt_dtype t, const float *expect, int64_t n,
                   const char *what) {
    int64_t i = t_mismatch(buf, t, expect, n);
    if (i < 0) return;
    float got;
    dt_convert(&got, DT_F32, (const char *)buf + (size_t)i * dt_dtype_size(t), t, 1);
    fprintf(stderr, "rank %d: [%s] %s (%s, n=%lld): element %lld = %.9g, expected %.9g\n", t_rank(), cur_test, what,
            dt_dtype_name(t), (long long)n, (long long)i, (double)got, (double)expect[i]);
    t_fail(file, line, what);
}

void t_bitwise_at(const char *file, int line, const float *got, const float *want, size_t n, const char *what) {
    if (!memcmp(got, want, n * sizeof(float))) return;
    size_t i = 0, bad = 0;
    for (size_t k = 0; k < n; k++)
        if (memcmp(&got[k], &want[k], sizeof(float))) { if (!bad++) i = k; }
    fprintf(stderr, "rank %d: [%s] %s: %zu of %zu elements differ; first at %zu: %.9g vs %.9g (rel diff %.3g)\n",
            t_rank(), cur_test, what, bad, n, i, (double)got[i], (double)want[i], t_rel_diff(got, want, n));
    t_fail(file, line, what);
}

double t_rel_diff(const float *a, const float *b, size_t n) {
    double d = 0, s = 0;
    for (size_t i = 0; i < n; i++) {
        double e = (double)a[i] - (double)b[i];
        d += e * e;
        s += (double)b[i] * (double)b[i];
    }
    if (s == 0) return d == 0 ? 0 : INFINITY;
    return sqrt(d / s);
}

void t_near_at(const char *file, int line, const float *got, const float *want, size_t n, double rtol,
               const char *what) {
    double r = t_rel_diff(got, want, n);
    if (getenv("DTT_VERBOSE") && t_rank() == 0) printf("  %s: rel diff %.3g (tol %.3g)\n", what, r, rtol);
    if (r <= rtol) return;
    fprintf(stderr, "rank %d: [%s] %s: relative difference %.3g > %.3g\n", t_rank(), cur_test, what, r, rtol);
    t_fail(file, line, what);
}

void t_same_on_ranks_at(const char *file, int line, const float *x, size_t n, const char *what) {
    T_CHECK(n <= (size_t)INT32_MAX);
    float *r0 = t_copy(x, n);
    MPI_Bcast(r0, (int)n, MPI_FLOAT, 0, MPI_COMM_WORLD);
    int bad = memcmp(r0, x, n * sizeof *r0) != 0, any = 0;
    MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (any) {
        if (bad) t_bitwise_at(file, line, x, r0, n, what);
        fprintf(stderr, "rank %d: [%s] %s: %d rank(s) differ from rank 0\n", t_rank(), cur_test, what, any);
        t_fail(file, line, what);
    }
    free(r0);
}

/* ---- helpers ---- */
double t_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

float t_round(float x, dt_dtype t) {
    if (t == DT_BF16) return dt_bf16_to_f32(dt_f32_to_bf16(x));
    if (t == DT_F16) return dt_f16_to_f32(dt_f32_to_f16(x));
    return x;
}

void *t_alloc(int64_t n, dt_dtype t) {
    void *p = calloc((size_t)(n > 0 ? n : 1), dt_dtype_size(t));
    T_CHECK(p);
    return p;
}

void t_fill(void *buf, dt_dtype t, const float *src, int64_t n) {
    if (n > 0) dt_convert(buf, t, src, DT_F32, (size_t)n);
}

int t_differs(const float *a, const float *b, size_t n) { return memcmp(a, b, n * sizeof(float)) != 0; }

float *t_copy(const float *x, size_t n) {
    float *c = malloc(n ? n * sizeof *c : 1);
    T_CHECK(c != NULL);
    if (n) memcpy(c, x, n * sizeof *c);
    return c;
}
