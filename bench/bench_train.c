/* bench_train — training throughput on the shared workloads (../shared/WORKLOADS.md).
 *
 *   OMP_NUM_THREADS=2 bench_train W1 [steps]            single process
 *   mpiexec -n 2 -x OMP_NUM_THREADS=1 bench_train W1     DDP (one rank per core)
 *   options after the step count: --no-overlap, --bucket-mb F, --deterministic,
 *   --compress-bf16 (gradients reduced as bf16: half the bytes),
 *   --no-shm (buckets reduced by MPI collectives even when all ranks share the
 *   machine; default: in node-shared memory, see dist.h section 6),
 *   --no-comm (under mpiexec: every rank trains alone, steps kept in lock-step
 *   by the barrier; the ceiling that compute and memory contention between
 *   ranks on one machine leave for DDP)
 *
 * Prints ms/step, samples or tokens/s, achieved model GFLOP/s, and the GFLOP/s
 * of cblas_sgemm on the workload's largest layer shape measured in the same
 * run (the ratio is the figure of merit). With DDP also the time blocked
 * waiting for gradient reductions after backward (the exposed communication).
 * Random data, the same batch every step: the model memorises it and the
 * gradients shrink towards the denormal range, so denormals are flushed to
 * zero as the trainer does (otherwise ms/step grows several-fold with the
 * step count); then throughput does not depend on the values. */
#include <cblas.h>
#include <mpi.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "dtrain/parallel.h"
#include "bench_workloads.h"

int main(int argc, char **argv) {
    dt_blas_fix_core(argv);   /* the GEMM kernel family the CPU supports (ops.h) */
    if (argc < 2) {
        fprintf(stderr, "usage: bench_train W1|W2|W3|CNN [steps] [--no-overlap] [--bucket-mb F] [--deterministic] [--no-comm]\n"
                        "       [--compress-bf16] [--no-shm]\n");
        return 2;
    }
    const char *w = argv[1];
    int steps = argc > 2 ? atoi(argv[2]) : 10;
    dt_ddp_opts dopts;
    dt_ddp_opts_default(&dopts);
    int no_comm = 0;
    for (int i = 3; i < argc; i++) {
        if (!strcmp(argv[i], "--no-overlap")) dopts.no_overlap = 1;
        else if (!strcmp(argv[i], "--deterministic")) dopts.dp.deterministic = 1;
        else if (!strcmp(argv[i], "--no-comm")) no_comm = 1;
        else if (!strcmp(argv[i], "--no-shm")) dopts.dp.shm = DT_DP_SHM_OFF;
        else if (!strcmp(argv[i], "--compress-bf16")) dopts.dp.wire = DT_BF16;
        else if (!strcmp(argv[i], "--bucket-mb") && i + 1 < argc) dopts.dp.bucket_bytes = (size_t)(atof(argv[++i]) * 1048576);
    }
    if (dt_dist_init(&argc, &argv, NULL) != DT_OK) { fprintf(stderr, "%s\n", dt_error_message()); return 1; }
    dt_cpu_set_flush_denormal(1);   /* as the trainer does: no denormal slow path late in a run */
    dt_pg *pg;
    dt_pg_world(&pg);
    int rank = dt_pg_rank(pg), world = dt_pg_size(pg);

    bench_workload wl;
    if (bench_workload_get(w, &wl)) { fprintf(stderr, "unknown workload %s\n", w); return 2; }
    const dt_model_cfg c = wl.cfg;
    const int64_t B = wl.B, T = wl.T;
    const int gm = wl.gm, gk = wl.gk, gn = wl.gn;

    dt_model *m;
    if (dt_model_create(&c, 1, &m) != DT_OK) { fprintf(stderr, "%s\n", dt_error_message()); return 1; }
    dt_ddp *ddp = NULL;
    if (world > 1 && !no_comm && dt_ddp_create(m, pg, &dopts, &ddp) != DT_OK) { fprintf(stderr, "%s\n", dt_error_message()); return 1; }
    dt_optim_cfg oc = dt_optim_cfg_default(DT_OPTIM_ADAMW);
    oc.lr = 3e-4f; oc.weight_decay = 0;
    dt_optimizer opt;
    dt_optim_segment seg = {0, m->param_flat.numel, 1, NULL, NULL, 0};
    dt_optimizer_init(&opt, &oc, &seg, 1, 0, m->param_flat.numel);
    dt_graph *g = dt_graph_create();
    dt_batch b = bench_batch_make(&wl, rank);
    double t_fwd = 0, t_bwd = 0, t_opt = 0, t_total = 0, t_best = 1e30;
    int warm = 2;
    /* The VM's speed drifts (neighbours share memory bandwidth): the sgemm
     * reference is taken before and after the steps (best of both), and the
     * best step is reported beside the mean, so one slow phase cannot tilt
     * the share either way. */
    double sg_before = bench_sgemm_gflops(gm, gk, gn);   /* on every rank at once, as at the end */
    int own = dt_gemm_backend_in_use() != DT_GEMM_OPENBLAS;   /* dtrain's GEMMs are not cblas_sgemm's */
    double own_before = own ? bench_gemm_gflops(gm, gk, gn, 1) : 0;
    dt_ddp_stats warm_stats = {0};
    for (int s = 0; s < steps + warm; s++) {
        if (world > 1) MPI_Barrier(MPI_COMM_WORLD);
        double t0 = bench_now();
        dt_graph_reset(g);
        if (ddp) dt_ddp_before_forward(ddp, g, 1);
        dt_tensor *loss = dt_model_forward(m, g, &b, NULL);
        if (!loss) { fprintf(stderr, "%s\n", dt_error_message()); return 1; }
        double t1 = bench_now();
        if (dt_graph_backward(g, loss) != DT_OK) { fprintf(stderr, "%s\n", dt_error_message()); return 1; }
        if (ddp && dt_ddp_finish_backward(ddp) != DT_OK) { fprintf(stderr, "%s\n", dt_error_message()); return 1; }
        double t2 = bench_now();
        dt_optimizer_step_range(&opt, oc.lr, m->param_flat.data, m->grad_flat.data, 0, m->param_flat.numel, 1.f);
        dt_optimizer_finish_step(&opt);
        dt_model_zero_grad(m);
        double t3 = bench_now();
        if (s == warm - 1 && ddp) warm_stats = dt_ddp_get_stats(ddp);
        if (s >= warm) {
            t_fwd += t1 - t0; t_bwd += t2 - t1; t_opt += t3 - t2; t_total += t3 - t0;
            if (t3 - t0 < t_best) t_best = t3 - t0;
        }
    }
    double wait_ms = 0;
    if (ddp) {
        dt_ddp_stats st = dt_ddp_get_stats(ddp);
        wait_ms = (st.wait_us - warm_stats.wait_us) / 1e3 / (double)(st.steps - warm_stats.steps);
    }
    double items = (double)B * (c.kind == DT_MODEL_GPT2 ? T : 1) * world;
    double flops = dt_model_flops_per_item(m, T) * items;
    double ms = t_total / steps * 1e3;
    double achieved = flops / (t_total / steps) / 1e9 / world;   /* per rank */
    double sg = bench_sgemm_gflops(gm, gk, gn);
    if (sg_before > sg) sg = sg_before;
    double own_sg = own ? bench_gemm_gflops(gm, gk, gn, 1) : 0;
    if (own_before > own_sg) own_sg = own_before;
    double achieved_best = flops / t_best / 1e9 / world;
    if (rank == 0) {
        bench_print_gemm();
        printf("%s ranks=%d threads/rank=%d params=%zu buckets=%d\n", w, world, omp_get_max_threads(),
               dt_model_num_params(m), ddp ? dt_ddp_num_buckets(ddp) : 0);
        printf("  ms/step %.1f (fwd %.1f, bwd+comm %.1f, optim %.1f)  %s/s %.0f\n", ms, t_fwd / steps * 1e3,
               t_bwd / steps * 1e3, t_opt / steps * 1e3, c.kind == DT_MODEL_GPT2 ? "tokens" : "samples", items / (t_total / steps));
        printf("  achieved %.1f GFLOP/s per rank; sgemm %dx%dx%d %.1f GFLOP/s in this run -> %.0f%%\n", achieved, gm, gk, gn,
               sg, 100.0 * achieved / sg);
        printf("  best step %.1f ms: %.1f GFLOP/s per rank -> %.0f%% of that sgemm\n", t_best * 1e3, achieved_best,
               100.0 * achieved_best / sg);
        if (own)
            printf("  dtrain's own GEMM (%s) on that shape: %.1f GFLOP/s -> %.0f%% (mean), %.0f%% (best step)\n",
                   dt_gemm_backend_name(dt_gemm_backend_in_use()), own_sg, 100.0 * achieved / own_sg,
                   100.0 * achieved_best / own_sg);
        if (ddp) printf("  exposed comm wait %.2f ms/step, %.1f MB reduced per step (%s)\n", wait_ms,
                        (double)m->grad_flat.numel * 4 / 1e6,
                        dt_ddp_uses_shared_memory(ddp) ? "node-shared memory" : "MPI collectives");
        printf("RESULT workload=%s ranks=%d%s%s ms=%.3f best_ms=%.3f items_per_s=%.1f gflops=%.2f sgemm=%.2f own_gemm=%.2f wait_ms=%.3f\n", w, world,
               no_comm ? " no_comm=1" : "", ddp && dt_ddp_uses_shared_memory(ddp) ? " shm=1" : "", ms, t_best * 1e3,
               items / (t_total / steps), achieved, sg, own_sg, wait_ms);
    }
    dt_ddp_free(ddp);
    dt_optimizer_free(&opt);
    dt_graph_free(g);
    dt_model_free(m);
    bench_batch_free(&b);
    dt_pg_free(pg);
    dt_dist_finalize();
    return 0;
}
