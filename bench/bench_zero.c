/* bench_zero — per-rank memory and step time of ZeRO stages 0–3 on the shared
 * workloads (../shared/WORKLOADS.md). Stage 0 is plain DDP with a full AdamW.
 *
 *   mpiexec -n 2 --bind-to core -x OMP_NUM_THREADS=1 bench_zero W1 --stage 2
 *   mpiexec -n 4 --oversubscribe -x OMP_NUM_THREADS=1 bench_zero W2 --stage 3 --steps 2
 *   options: --stage 0..3  --overlap off|after-backward|interleaved  --steps N
 *            --node-params 1 (ZeRO: one parameter copy per machine)
 *            --bucket-mb F  --prefetch N
 *
 * Prints, per rank (the maximum over ranks): MiB held for parameters,
 * gradients and optimizer state; the high-water mark of the temporary
 * full-size bucket buffers (stage 2/3 gradients, stage 3 gathered
 * parameters); the process peak RSS after set-up (the model is built whole
 * before sharding) and the RSS growth during training; ms/step with the time
 * blocked on reductions and on parameter all-gathers. Random data. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include "dtrain/parallel.h"
#include "dtrain/zero.h"
#include "bench_workloads.h"

#define MIB (1024.0 * 1024.0)


/* resident set: current (statm) and peak (getrusage), bytes */
static double rss_now(void) {
    long pages = 0, res = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f) { if (fscanf(f, "%ld %ld", &pages, &res) != 2) res = 0; fclose(f); }
    return (double)res * 4096.0;
}
static double rss_peak(void) { struct rusage ru; getrusage(RUSAGE_SELF, &ru); return (double)ru.ru_maxrss * 1024.0; }

static int die(const char *what) { fprintf(stderr, "bench_zero: %s: %s\n", what, dt_error_message()); MPI_Abort(MPI_COMM_WORLD, 1); return 1; }

int main(int argc, char **argv) {
    dt_blas_fix_core(argv);   /* the GEMM kernel family the CPU supports (ops.h) */
    if (argc < 2 || argv[1][0] == '-') {
        fprintf(stderr, "usage: bench_zero W1|W2|W3 [--stage 0..3] [--overlap off|after-backward|interleaved] "
                        "[--steps N] [--bucket-mb F] [--prefetch N] [--node-params 0|1] [--param-dtype fp32|bf16|fp16]\n");
        return 2;
    }
    const char *w = argv[1];
    int stage = 1, steps = 5, warm = 2;
    dt_zero_opts zo;
    dt_zero_opts_default(&zo);
    dt_ddp_opts dopts;
    dt_ddp_opts_default(&dopts);
    const char *ov = "after-backward";
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) { fprintf(stderr, "bench_zero: %s needs a value\n", a); return 2; }
        i++;
        if (!strcmp(a, "--stage")) stage = atoi(v);
        else if (!strcmp(a, "--steps")) steps = atoi(v);
        else if (!strcmp(a, "--prefetch")) zo.prefetch = atoi(v);
        else if (!strcmp(a, "--node-params")) zo.node_params = atoi(v);
        else if (!strcmp(a, "--param-dtype")) {   /* ZeRO's 16-bit working copy (stages 1-3) */
            if (!strcmp(v, "bf16")) zo.param_dtype = DT_BF16;
            else if (!strcmp(v, "fp16")) zo.param_dtype = DT_F16;
            else if (strcmp(v, "fp32")) { fprintf(stderr, "bench_zero: --param-dtype fp32|bf16|fp16\n"); return 2; }
        }
        else if (!strcmp(a, "--bucket-mb")) zo.dp.bucket_bytes = dopts.dp.bucket_bytes = (size_t)(atof(v) * MIB);
        else if (!strcmp(a, "--overlap")) {
            ov = v;
            if (!strcmp(v, "off")) zo.overlap_step = DT_ZERO_OVERLAP_OFF;
            else if (!strcmp(v, "after-backward")) zo.overlap_step = DT_ZERO_OVERLAP_AFTER_BACKWARD;
            else if (!strcmp(v, "interleaved")) zo.overlap_step = DT_ZERO_OVERLAP_INTERLEAVED;
            else { fprintf(stderr, "bench_zero: --overlap off|after-backward|interleaved\n"); return 2; }
        } else { fprintf(stderr, "bench_zero: unknown option %s\n", a); return 2; }
    }
    if (stage < 0 || stage > 3 || steps < 1) { fprintf(stderr, "bench_zero: --stage 0..3, --steps >= 1\n"); return 2; }
    zo.stage = stage;
    bench_workload wl;
    if (bench_workload_get(w, &wl)) { fprintf(stderr, "bench_zero: unknown workload %s\n", w); return 2; }
    const dt_model_cfg c = wl.cfg;

    if (dt_dist_init(&argc, &argv, NULL) != DT_OK) { fprintf(stderr, "%s\n", dt_error_message()); return 1; }
    dt_cpu_set_flush_denormal(1);   /* as the trainer does: no denormal slow path late in a run */
    dt_pg *pg;
    dt_pg_world(&pg);
    int rank = dt_pg_rank(pg), world = dt_pg_size(pg);

    dt_model *m;
    if (dt_model_create(&c, 1, &m) != DT_OK) return die("model");
    dt_optim_cfg oc = dt_optim_cfg_default(DT_OPTIM_ADAMW);
    oc.lr = 3e-4f; oc.weight_decay = 0;
    dt_ddp *ddp = NULL;
    dt_zero *z = NULL;
    dt_optimizer opt = {0};
    double mem[5] = {0};   /* params, grads, optim, grad window, param window (bytes) */
    if (stage == 0) {
        if (dt_ddp_create(m, pg, &dopts, &ddp) != DT_OK) return die("ddp");
        dt_optim_segment seg = {0, m->param_flat.numel, 1, NULL, NULL, 0};
        if (dt_optimizer_init(&opt, &oc, &seg, 1, 0, m->param_flat.numel) != DT_OK) return die("optimizer");
        double full = (double)m->param_flat.numel * 4;
        mem[0] = full; mem[1] = (double)m->grad_flat.numel * 4;
        mem[2] = (double)dt_optimizer_state_nbytes(&opt);
        mem[3] = mem[4] = 0;
    } else {
        if (dt_zero_create(m, pg, &oc, &zo, &z) != DT_OK) return die("zero");
    }
    double rss_setup = rss_peak();

    dt_graph *g = dt_graph_create();
    dt_batch b = bench_batch_make(&wl, rank);

    double t_total = 0, rss_before = 0, rss_train_peak = 0;
    dt_zero_stats zs0 = {0}, zs1 = {0};
    dt_ddp_stats ds0 = {0};
    for (int s = 0; s < steps + warm; s++) {
        MPI_Barrier(MPI_COMM_WORLD);
        if (s == warm) {
            rss_before = rss_now();
            if (z) zs0 = dt_zero_get_stats(z);
            if (ddp) ds0 = dt_ddp_get_stats(ddp);
        }
        double t0 = bench_now();
        dt_graph_reset(g);
        if (z) { dt_zero_set_lr(z, oc.lr); if (dt_zero_before_forward(z, g, 1) != DT_OK) return die("before_forward"); }
        if (ddp) dt_ddp_before_forward(ddp, g, 1);
        dt_tensor *loss = dt_model_forward(m, g, &b, NULL);
        if (!loss) return die("forward");
        if (dt_graph_backward(g, loss) != DT_OK) return die("backward");
        if (z) {
            if (dt_zero_finish_backward(z) != DT_OK || dt_zero_step(z, NULL) != DT_OK) return die("zero step");
        } else {
            if (dt_ddp_finish_backward(ddp) != DT_OK) return die("ddp backward");
            dt_optimizer_step_range(&opt, oc.lr, m->param_flat.data, m->grad_flat.data, 0, m->param_flat.numel, 1.f);
            dt_optimizer_finish_step(&opt);
        }
        dt_model_zero_grad(m);
        double t1 = bench_now();
        if (s >= warm) {
            t_total += t1 - t0;
            double cur = rss_now();
            if (cur > rss_train_peak) rss_train_peak = cur;
        }
    }
    double wait_ms = 0, gwait_ms = 0;
    if (z) {
        dt_zero_stats zs = dt_zero_get_stats(z);   /* before the final sync: timed steps only */
        zs1 = zs;
        wait_ms = (zs.wait_us - zs0.wait_us) / 1e3 / steps;
        gwait_ms = (zs.gather_wait_us - zs0.gather_wait_us) / 1e3 / steps;
        if (dt_zero_sync_params(z) != DT_OK) return die("sync_params");
        dt_zero_memory zm = dt_zero_get_memory(z);
        mem[0] = (double)zm.param_bytes; mem[1] = (double)zm.grad_bytes; mem[2] = (double)zm.optim_bytes;
        mem[3] = (double)zm.grad_window_peak; mem[4] = (double)zm.param_window_peak;
    } else {
        dt_ddp_stats st = dt_ddp_get_stats(ddp);
        wait_ms = (st.wait_us - ds0.wait_us) / 1e3 / steps;
    }
    /* maximum over ranks of every figure */
    double mine[12] = {mem[0], mem[1], mem[2], mem[3], mem[4], rss_setup, rss_train_peak, rss_train_peak - rss_before,
                       t_total / steps * 1e3, wait_ms + gwait_ms,
                       (double)(zs1.bytes_gathered - zs0.bytes_gathered) / steps,
                       (double)(zs1.bytes_reduced - zs0.bytes_reduced) / steps}, mx[12];
    MPI_Allreduce(mine, mx, 12, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (rank == 0) {
        printf("%s ranks=%d stage=%d overlap=%s params=%zu\n", w, world, stage, stage ? ov : "ddp", dt_model_num_params(m));
        printf("  per rank MiB: params %.1f  grads %.1f  optim %.1f  (grad window %.1f, param window %.1f)\n",
               mx[0] / MIB, mx[1] / MIB, mx[2] / MIB, mx[3] / MIB, mx[4] / MIB);
        printf("  RSS MiB: peak after set-up %.0f, peak while training %.0f (growth %+.0f)\n", mx[5] / MIB, mx[6] / MIB,
               mx[7] / MIB);
        printf("  ms/step %.1f  blocked: reductions %.1f, param gathers %.1f (rank 0)\n", mx[8], wait_ms, gwait_ms);
        if (z)
            printf("  per rank per step: all-gather %.2f MiB, reduce-scatter %.2f MiB (parameters %s)\n", mx[10] / MIB,
                   mx[11] / MIB, zo.param_dtype == DT_BF16 ? "bf16" : zo.param_dtype == DT_F16 ? "fp16" : "fp32");
        printf("RESULT workload=%s ranks=%d stage=%d overlap=%s ms=%.2f params_mib=%.2f grads_mib=%.2f optim_mib=%.2f "
               "grad_window_mib=%.2f param_window_mib=%.2f rss_setup_mib=%.0f rss_train_mib=%.0f wait_ms=%.2f gather_ms=%.2f "
               "node_params=%d gather_mib=%.2f reduce_mib=%.2f param_dtype=%s\n",
               w, world, stage, stage ? ov : "ddp", mx[8], mx[0] / MIB, mx[1] / MIB, mx[2] / MIB, mx[3] / MIB, mx[4] / MIB,
               mx[5] / MIB, mx[6] / MIB, wait_ms, gwait_ms, z ? dt_zero_node_params(z, NULL) : 0, mx[10] / MIB,
               mx[11] / MIB, zo.param_dtype == DT_BF16 ? "bf16" : zo.param_dtype == DT_F16 ? "fp16" : "fp32");
    }
    dt_zero_free(z);
    dt_ddp_free(ddp);
    dt_optimizer_free(&opt);
    dt_graph_free(g);
    dt_model_free(m);
    bench_batch_free(&b);
    dt_pg_free(pg);
    dt_dist_finalize();
    return 0;
}
