/* bench_comm — dist layer: bandwidth vs raw MPI, and compute/communication overlap.
 *
 * usage: mpiexec -n 2 bench_comm [bw] [overlap] [shm] [calls] [tp] [--mode poll|thread] [--max 64M]
 *                                [--mib 16] [--ms 200] [--t 0.3] [--tick 0.5] [--seg 4M]
 *                                [--op allreduce] [--n 10] [--collectives flat|hierarchical] [--rounds 3]
 *   bw       per size 64 KiB .. --max: time per call and bus bandwidth of
 *            raw MPI_Allreduce, dt_allreduce (blocking / async+wait /
 *            deterministic), raw MPI_Reduce_scatter_block vs dt_reduce_scatter,
 *            and the ratio dt/raw (time; > 1 means slower than raw MPI).
 *   overlap  a --mib MiB f32 allreduce issued async, then --ms ms of register-
 *            only compute in ~0.1 ms slices with dt_pg_tick() between slices,
 *            then dt_work_wait. hidden = (T_compute + T_comm - T_total) / T_comm.
 *   shm      per size 64 KiB .. --max: in-place f32 sum of zeros (so repeated
 *            calls keep the values) by raw MPI_Allreduce(MPI_IN_PLACE), by
 *            dt_allreduce on private memory, and by dt_allreduce on node-shared
 *            memory (dist.h section 6); the ratios to raw MPI (time).
 *   tp       the tensor-parallel group's shapes (W1 and W2 of WORKLOADS.md:
 *            [B, T, C] activations, 3 B T floats of the vocabulary-parallel
 *            loss): in-place f32 sum of private memory by raw MPI_Allreduce,
 *            dt_allreduce and dt_allreduce_node (the node-shared staging
 *            window, tp/comm.c's default on one machine); --rounds rounds
 *            (default 3), the variants alternating inside each round.
 *   calls    --n calls of one --op (allreduce | allreduce-det |
 *            allreduce-cross-bf16 | reduce-scatter | allgather) on --mib MiB of f32, after 2 warm-up calls; prints the
 *            group's machines, path and ms per call. With --collectives
 *            flat|hierarchical; bench/multihost.sh runs it on simulated
 *            hosts and reads the bytes that crossed from the links' counters.
 * The progress mode is fixed at dt_dist_init: run once per mode.
 * time = max over ranks of the mean per call; busbw as nccl-tests
 * (allreduce: algbw * 2(n-1)/n, reduce-scatter: algbw * (n-1)/n).
 */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "dtrain/dist.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void die(const char *what) {
    fprintf(stderr, "bench_comm: %s: %s\n", what, dt_error_message());
    MPI_Abort(MPI_COMM_WORLD, 1);
}
#define OK(e) do { if ((e) != DT_OK) die(#e); } while (0)

static size_t parse_size(const char *s) {
    char *e;
    double v = strtod(s, &e);
    if (*e == 'k' || *e == 'K') v *= 1024;
    if (*e == 'm' || *e == 'M') v *= 1048576;
    return (size_t)v;
}

static double max_all(double t) {
    MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return t;
}

/* ---- bandwidth ---- */

enum { RAW_AR, DT_AR, DT_AR_ASYNC, DT_AR_DET, RAW_RS, DT_RS, NV };
static const char *vname[NV] = {"MPI_Allreduce", "dt_allreduce", "dt_allreduce async+wait",
                                "dt_allreduce deterministic", "MPI_Reduce_scatter_block", "dt_reduce_scatter"};

static void run_variant(int v, dt_pg *pg, MPI_Comm raw, float *a, float *b, int count, int n) {
    dt_work *w;
    switch (v) {
    case RAW_AR: MPI_Allreduce(a, b, count, MPI_FLOAT, MPI_SUM, raw); break;
    case DT_AR: OK(dt_allreduce(pg, a, b, count, DT_F32, DT_RED_SUM, NULL)); break;
    case DT_AR_ASYNC: OK(dt_allreduce(pg, a, b, count, DT_F32, DT_RED_SUM, &w)); OK(dt_work_wait(w)); break;
    case DT_AR_DET: OK(dt_allreduce(pg, a, b, count, DT_F32, DT_RED_SUM | DT_RED_DETERMINISTIC, NULL)); break;
    case RAW_RS: MPI_Reduce_scatter_block(a, b, count / n, MPI_FLOAT, MPI_SUM, raw); break;
    case DT_RS: OK(dt_reduce_scatter(pg, a, b, count / n, DT_F32, DT_RED_SUM, NULL)); break;
    }
}

static void bench_bw(dt_pg *pg, size_t maxb, double target) {
    int me = dt_pg_rank(pg), n = dt_pg_size(pg);
    MPI_Comm raw;
    MPI_Comm_dup(MPI_COMM_WORLD, &raw);
    float *a = malloc(maxb + 64), *b = malloc(maxb + 64);
    for (size_t i = 0; i < maxb / 4; i++) { a[i] = (float)(me + 1); b[i] = 0; }
    if (!me) printf("# bandwidth: %d ranks, f32 sum; time = mean per call (max over ranks)\n"
                    "# %9s %-28s %10s %10s %8s\n", n, "size", "variant", "time_us", "busbw_GB/s", "dt/raw");
    for (size_t bytes = 64 << 10; bytes <= maxb; bytes *= 4) {
        int count = (int)(bytes / 4 / (size_t)n * (size_t)n);
        double t[NV];
        for (int v = 0; v < NV; v++) {
            run_variant(v, pg, raw, a, b, count, n);   /* warm-up */
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = now();
            run_variant(v, pg, raw, a, b, count, n);
            double t1 = max_all(now() - t0);
            int iters = (int)(target / (t1 > 1e-6 ? t1 : 1e-6));
            if (iters < 3) iters = 3;
            if (iters > 2000) iters = 2000;
            MPI_Barrier(MPI_COMM_WORLD);
            t0 = now();
            for (int i = 0; i < iters; i++) run_variant(v, pg, raw, a, b, count, n);
            t[v] = max_all((now() - t0) / iters);
            int rs = v == RAW_RS || v == DT_RS;
            float expect = (float)(n * (n + 1) / 2);
            if (b[0] != expect || b[(rs ? count / n : count) - 1] != expect) {
                if (!me) printf("WRONG RESULT in %s\n", vname[v]);
            }
            double busf = rs ? (double)(n - 1) / n : 2.0 * (n - 1) / n;
            double ratio = v == RAW_AR || v == RAW_RS ? 1.0 : t[v] / t[v < RAW_RS ? RAW_AR : RAW_RS];
            if (!me)
                printf("  %8zuK %-28s %10.1f %10.3f %8.2f\n", bytes >> 10, vname[v], t[v] * 1e6,
                       (double)bytes / t[v] / 1e9 * busf, ratio);
        }
        fflush(stdout);
    }
    free(a);
    free(b);
    MPI_Comm_free(&raw);
}

/* ---- node-shared memory vs MPI, in place ---- */

static double time_calls(int v, dt_pg *pg, MPI_Comm raw, float *x, int count, double target) {
    for (int rep = 0; rep < 2; rep++) {   /* warm-up, then calibrated */
        int iters = 1;
        if (rep) {
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = now();
            if (v == 0) MPI_Allreduce(MPI_IN_PLACE, x, count, MPI_FLOAT, MPI_SUM, raw);
            else OK(dt_allreduce(pg, x, x, count, DT_F32, DT_RED_SUM, NULL));
            double t1 = max_all(now() - t0);
            iters = (int)(target / (t1 > 1e-6 ? t1 : 1e-6));
            if (iters < 3) iters = 3;
            if (iters > 2000) iters = 2000;
        }
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = now();
        for (int i = 0; i < iters; i++) {
            if (v == 0) MPI_Allreduce(MPI_IN_PLACE, x, count, MPI_FLOAT, MPI_SUM, raw);
            else OK(dt_allreduce(pg, x, x, count, DT_F32, DT_RED_SUM, NULL));
        }
        double t = max_all((now() - t0) / iters);
        if (rep) return t;
    }
    return 0;
}

static void bench_shm(dt_pg *pg, size_t maxb, double target) {
    int me = dt_pg_rank(pg), n = dt_pg_size(pg);
    MPI_Comm raw;
    MPI_Comm_dup(MPI_COMM_WORLD, &raw);
    float *priv = calloc(maxb / 4 + 16, sizeof(float)), *shared = NULL;
    OK(dt_pg_alloc_shared(pg, maxb / 4 + 16, &shared));
    if (!shared) {
        if (!me) printf("# shm: the ranks do not share one machine; nothing to compare\n");
        free(priv);
        MPI_Comm_free(&raw);
        return;
    }
    if (!me) printf("# in-place f32 allreduce, %d ranks; time = mean per call (max over ranks)\n"
                    "# %9s %12s %12s %12s %9s %9s\n", n, "size", "MPI_us", "dt_mpi_us", "dt_shm_us", "mpi/raw", "shm/raw");
    for (size_t bytes = 64 << 10; bytes <= maxb; bytes *= 4) {
        int count = (int)(bytes / 4);
        double t_raw = time_calls(0, pg, raw, priv, count, target);
        double t_dt = time_calls(1, pg, raw, priv, count, target);
        double t_shm = time_calls(1, pg, raw, shared, count, target);
        if (priv[0] != 0.0f || shared[count - 1] != 0.0f) { if (!me) printf("WRONG RESULT\n"); }
        if (!me)
            printf("  %8zuK %12.1f %12.1f %12.1f %9.2f %9.2f\n", bytes >> 10, t_raw * 1e6, t_dt * 1e6, t_shm * 1e6,
                   t_dt / t_raw, t_shm / t_raw);
        fflush(stdout);
    }
    OK(dt_pg_free_shared(pg, shared));
    free(priv);
    MPI_Comm_free(&raw);
}

/* ---- the tensor-parallel group's all-reduce: MPI vs the node-shared window ---- */

static void tp_call(int v, dt_pg *pg, MPI_Comm raw, float *x, int count) {
    if (v == 0) MPI_Allreduce(MPI_IN_PLACE, x, count, MPI_FLOAT, MPI_SUM, raw);
    else if (v == 1) OK(dt_allreduce(pg, x, x, count, DT_F32, DT_RED_SUM, NULL));
    else OK(dt_allreduce_node(pg, x, x, count, DT_RED_SUM, NULL));
}

static void bench_tp(dt_pg *pg, int rounds, double target) {
    static const struct { const char *what; int count; } shape[] = {
        {"W2 [4,64,768]", 4 * 64 * 768}, {"W1 [8,256,384]", 8 * 256 * 384},
        {"W2 loss 3x[256]", 3 * 4 * 64}, {"W1 loss 3x[2048]", 3 * 8 * 256}};
    static const char *vn[3] = {"MPI_Allreduce", "dt_allreduce", "dt_allreduce_node"};
    int me = dt_pg_rank(pg), n = dt_pg_size(pg);
    MPI_Comm raw;
    MPI_Comm_dup(MPI_COMM_WORLD, &raw);
    float *x = calloc((size_t)8 * 256 * 384, sizeof *x);
    if (!me) printf("# tensor-parallel all-reduce, %d ranks, in place on private memory; us per call (max over ranks "
                    "of the mean), variants alternating in each round\n# %-18s %-18s %s\n", n, "shape", "variant", "round 1 ..");
    for (size_t k = 0; k < sizeof shape / sizeof shape[0]; k++) {
        double t[3][16];
        int R = rounds < 16 ? rounds : 16;
        for (int r = 0; r < R; r++)
            for (int v = 0; v < 3; v++) {
                tp_call(v, pg, raw, x, shape[k].count);   /* warm-up (and the window's first growth) */
                MPI_Barrier(MPI_COMM_WORLD);
                double t0 = now();
                tp_call(v, pg, raw, x, shape[k].count);
                double t1 = max_all(now() - t0);
                int iters = (int)(target / (t1 > 1e-6 ? t1 : 1e-6));
                iters = iters < 5 ? 5 : iters > 5000 ? 5000 : iters;
                MPI_Barrier(MPI_COMM_WORLD);
                t0 = now();
                for (int i = 0; i < iters; i++) tp_call(v, pg, raw, x, shape[k].count);
                t[v][r] = max_all((now() - t0) / iters);
            }
        if (x[0] != 0.0f || x[shape[k].count - 1] != 0.0f) { if (!me) printf("WRONG RESULT\n"); }
        for (int v = 0; v < 3 && !me; v++) {
            printf("  %-18s %-18s", shape[k].what, vn[v]);
            for (int r = 0; r < R; r++) printf(" %8.1f", t[v][r] * 1e6);
            printf("\n");
        }
        fflush(stdout);
    }
    free(x);
    MPI_Comm_free(&raw);
}

/* ---- overlap ---- */

static volatile float sink;
/* Register-only FMA chains: no memory traffic, no MPI calls. */
static void work(long n) {
    float a[8], m = 0.9999f, c = 1e-6f;
    for (int i = 0; i < 8; i++) a[i] = (float)i;
    for (long it = 0; it < n; it++)
        for (int i = 0; i < 8; i++) a[i] = a[i] * m + c;
    sink += a[0] + a[7];
}

/* compute n iterations in `slices` pieces, ticking the progress engine in between */
static void compute(long n, int slices) {
    long per = n / slices;
    for (int s = 0; s < slices; s++) {
        work(per);
        dt_dist_tick();
    }
}

static void bench_overlap(dt_pg *pg, size_t mib, double target_s) {
    int me = dt_pg_rank(pg), n = dt_pg_size(pg);
    int count = (int)(mib << 20) / 4;
    float *x = malloc((size_t)count * 4);
    for (int i = 0; i < count; i++) x[i] = 1.0f;
    /* calibrate compute to ~target_s (no communication running) */
    long iters = 1000000;
    double t0 = now();
    work(iters);
    double tc = now() - t0;
    for (int k = 0; k < 2; k++) {
        iters = (long)((double)iters * target_s / tc);
        t0 = now();
        work(iters);
        tc = now() - t0;
    }
    int slices = (int)(target_s / 1e-4);   /* ~0.1 ms per slice */
    /* Rounds interleave the four measurements so they see the same machine
     * load; each keeps its best (minimum) over the rounds. */
    enum { ROUNDS = 5 };
    double tcomp = 1e9, tcomm = 1e9, best[2] = {1e9, 1e9}, bcomp[2] = {0, 0}, bwait[2] = {0, 0};
    for (int r = 0; r < ROUNDS; r++) {
        MPI_Barrier(MPI_COMM_WORLD);
        t0 = now();
        compute(iters, slices);
        double t = max_all(now() - t0);
        if (t < tcomp) tcomp = t;
        MPI_Barrier(MPI_COMM_WORLD);
        t0 = now();
        OK(dt_allreduce(pg, x, x, count, DT_F32, DT_RED_SUM, NULL));
        t = max_all(now() - t0);
        if (t < tcomm) tcomm = t;
        /* variant 0: compute without any call into the library; 1: with ticks */
        for (int variant = 0; variant < 2; variant++) {
            for (int i = 0; i < count; i++) x[i] = 1.0f;
            MPI_Barrier(MPI_COMM_WORLD);
            double s = now();
            dt_work *w;
            OK(dt_allreduce(pg, x, x, count, DT_F32, DT_RED_SUM, &w));
            if (variant) compute(iters, slices); else work(iters);
            double c = now() - s;
            OK(dt_work_wait(w));
            double tot = now() - s;
            double v[2] = {tot, c};
            MPI_Allreduce(MPI_IN_PLACE, v, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
            if (x[0] != (float)n || x[count - 1] != (float)n) { if (!me) printf("WRONG RESULT\n"); }
            if (v[0] < best[variant]) { best[variant] = v[0]; bcomp[variant] = v[1]; bwait[variant] = v[0] - v[1]; }
        }
    }
    const char *mode = dt_dist_progress_mode() == DT_PROGRESS_THREAD ? "thread" : "poll";
    if (!me) printf("# overlap: %d ranks, %zu MiB f32 allreduce, mode %s, best of %d: compute alone %.1f ms, "
                    "allreduce alone %.1f ms\n", n, mib, mode, ROUNDS, tcomp * 1e3, tcomm * 1e3);
    for (int variant = 0; variant < 2; variant++) {
        double hidden = (tcomp + tcomm - best[variant]) / tcomm;
        if (!me)
            printf("  %-6s %-22s total %7.1f ms = compute %7.1f (x%.2f) + wait %6.1f  -> %4.0f%% of comm hidden\n",
                   mode, variant ? "compute + dt_dist_tick" : "compute, no dt calls", best[variant] * 1e3,
                   bcomp[variant] * 1e3, bcomp[variant] / tcomp, bwait[variant] * 1e3, 100 * hidden);
    }
    free(x);
}

/* ---- calls: one operation repeated (bytes on the wire: bench/multihost.sh) ---- */

static void bench_calls(dt_pg *pg, const char *op, size_t mib, int n) {
    int size = dt_pg_size(pg);
    size_t count = mib * 262144;   /* floats */
    if (strcmp(op, "allreduce") && strcmp(op, "allreduce-det") && strcmp(op, "allreduce-cross-bf16") &&
        strcmp(op, "reduce-scatter") && strcmp(op, "allgather")) {
        fprintf(stderr, "bench_comm: --op %s: expected allreduce, allreduce-det, allreduce-cross-bf16, reduce-scatter "
                        "or allgather\n", op);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    count -= count % (size_t)size;
    float *a = calloc(count, sizeof *a), *b = calloc(count, sizeof *b);
    if (!a || !b) die("out of memory");
    int64_t chunk = (int64_t)(count / (size_t)size);
    double t = 0;
    for (int k = -2; k < n; k++) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = now();
        if (!strcmp(op, "allreduce")) OK(dt_allreduce(pg, a, a, (int64_t)count, DT_F32, DT_RED_AVG, NULL));
        else if (!strcmp(op, "allreduce-cross-bf16"))
            OK(dt_allreduce(pg, a, a, (int64_t)count, DT_F32, DT_RED_AVG | DT_RED_CROSS_BF16, NULL));
        else if (!strcmp(op, "allreduce-det"))
            OK(dt_allreduce(pg, a, a, (int64_t)count, DT_F32, DT_RED_AVG | DT_RED_DETERMINISTIC, NULL));
        else if (!strcmp(op, "reduce-scatter")) OK(dt_reduce_scatter(pg, a, b, chunk, DT_F32, DT_RED_AVG, NULL));
        else OK(dt_allgather(pg, a, b, chunk, DT_F32, NULL));
        if (k >= 0) t += now() - t0;
    }
    t = max_all(t / (n > 0 ? n : 1));
    char where[96];
    dt_pg_topo topo;
    dt_pg_topology(pg, &topo);
    dt_pg_topology_describe(pg, where, sizeof where);
    if (dt_pg_rank(pg) == 0)
        printf("calls: %s %zu MiB x %d on %s (%s): %.2f ms/call\n", op, mib, n, where,
               topo.hierarchical ? "hierarchical" : "flat", t * 1e3);
    free(a);
    free(b);
}

int main(int argc, char **argv) {
    dt_dist_opts o = {0};
    int do_bw = 0, do_ov = 0, do_shm = 0, do_calls = 0, do_tp = 0, ncalls = 10, rounds = 3;
    const char *op = "allreduce";
    size_t maxb = 64u << 20, mib = 16;
    double ms = 200, target = 0.3;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "bw")) do_bw = 1;
        else if (!strcmp(argv[i], "overlap")) do_ov = 1;
        else if (!strcmp(argv[i], "shm")) do_shm = 1;
        else if (!strcmp(argv[i], "calls")) do_calls = 1;
        else if (!strcmp(argv[i], "tp")) do_tp = 1;
        else if (!strcmp(argv[i], "--rounds") && i + 1 < argc) rounds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--op") && i + 1 < argc) op = argv[++i];
        else if (!strcmp(argv[i], "--n") && i + 1 < argc) ncalls = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--collectives") && i + 1 < argc) {
            i++;
            o.collectives = !strcmp(argv[i], "flat") ? DT_COLL_FLAT : DT_COLL_HIERARCHICAL;
        }
        else if (!strcmp(argv[i], "--mode") && i + 1 < argc) {
            i++;
            o.progress = !strcmp(argv[i], "thread") ? DT_PROGRESS_THREAD : DT_PROGRESS_POLL;
        } else if (!strcmp(argv[i], "--max") && i + 1 < argc) maxb = parse_size(argv[++i]);
        else if (!strcmp(argv[i], "--mib") && i + 1 < argc) mib = (size_t)atol(argv[++i]);
        else if (!strcmp(argv[i], "--ms") && i + 1 < argc) ms = atof(argv[++i]);
        else if (!strcmp(argv[i], "--t") && i + 1 < argc) target = atof(argv[++i]);
        else if (!strcmp(argv[i], "--tick") && i + 1 < argc) o.tick_ms = atof(argv[++i]);
        else if (!strcmp(argv[i], "--seg") && i + 1 < argc) o.segment_bytes = parse_size(argv[++i]);
    }
    if (!do_bw && !do_ov && !do_shm && !do_calls && !do_tp) do_bw = do_ov = do_shm = 1;
    if (dt_dist_init(&argc, &argv, &o) != DT_OK) {
        fprintf(stderr, "bench_comm: %s\n", dt_error_message());
        return 1;
    }
    dt_pg *world;
    OK(dt_pg_world(&world));
    if (do_bw) bench_bw(world, maxb, target);
    if (do_ov) bench_overlap(world, mib, ms * 1e-3);
    if (do_shm) bench_shm(world, maxb, target);
    if (do_calls) bench_calls(world, op, mib, ncalls);
    if (do_tp) bench_tp(world, rounds, target);
    OK(dt_pg_free(world));
    dt_dist_finalize();
    return 0;
}
