/* bench_recompute — what activation recompute and 16-bit saved activations
 * cost and save, single process.
 *
 *   OMP_NUM_THREADS=2 bench_recompute W1|W2 [rounds] [steps per round] [none|blocks|bf16]
 *
 * Each round trains `steps` AdamW steps with --recompute none, then the same
 * with blocks, then with none and the activations kept in bf16
 * (--saved-activations bf16, dt_graph_pack16; fp32 products), on one model
 * and one fixed random batch (the modes take turns so machine drift hits
 * all alike). Reports per mode: activation memory (the graph arena's
 * high-water mark: activations, their gradients, tape, and the scratch arena
 * of recompute and bf16), ms per step (median over rounds) split into
 * forward+backward and optimizer, and the ratios to none; plus the GFLOP/s
 * of cblas_sgemm on the workload's largest layer in the same run. A mode
 * named last runs alone, so the process's peak RSS (printed) is that mode's. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dtrain/optim.h"
#include "bench_workloads.h"

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int fail(const char *what) {
    fprintf(stderr, "bench_recompute: %s: %s\n", what, dt_error_message());
    return 1;
}

int main(int argc, char **argv) {
    dt_blas_fix_core(argv);   /* the GEMM kernel family the CPU supports (ops.h) */
    bench_workload w;
    if (argc < 2 || bench_workload_get(argv[1], &w) != 0) {
        fprintf(stderr, "usage: bench_recompute W1|W2|W3 [rounds] [steps per round] [none|blocks|bf16]\n");
        return 2;
    }
    int rounds = argc > 2 ? atoi(argv[2]) : 3, steps = argc > 3 ? atoi(argv[3]) : 3, only = -1;
    const char *name[] = {"none", "blocks", "bf16"};
    for (int k = 0; argc > 4 && k < 3; k++) only = strcmp(argv[4], name[k]) ? only : k;
    if (argc > 4 && only < 0) { fprintf(stderr, "bench_recompute: mode '%s' is not none, blocks or bf16\n", argv[4]); return 2; }
    if (rounds < 1 || steps < 1) { fprintf(stderr, "bench_recompute: rounds and steps must be >= 1\n"); return 2; }
    dt_cpu_set_flush_denormal(1);   /* as the trainer does: a memorised batch drifts into denormals */
    dt_model *m;
    if (dt_model_create(&w.cfg, 1, &m) != DT_OK) return fail("model");
    dt_optim_cfg oc = dt_optim_cfg_default(DT_OPTIM_ADAMW);
    dt_optimizer opt;
    dt_optim_segment seg = {0, m->param_flat.numel, 1, NULL, NULL, 0};
    if (dt_optimizer_init(&opt, &oc, &seg, 1, 0, m->param_flat.numel) != DT_OK) return fail("optimizer");
    dt_batch b = bench_batch_make(&w, 0);
    enum { NM = 3 };
    dt_graph *g[NM] = {dt_graph_create(), dt_graph_create(), dt_graph_create()};   /* one per mode: separate high-water marks */
    double *fb[NM], *op[NM];
    for (int k = 0; k < NM; k++) {
        fb[k] = calloc((size_t)rounds, sizeof(double));
        op[k] = calloc((size_t)rounds, sizeof(double));
    }
    double loss[NM] = {0, 0, 0};
    for (int r = 0; r <= rounds; r++) {   /* round 0 warms up (arena growth, page faults) */
        for (int k = 0; k < NM; k++) {
            if (only >= 0 && k != only) continue;
            dt_model_set_recompute(m, k == 1 ? DT_RECOMPUTE_BLOCKS : DT_RECOMPUTE_NONE);
            dt_model_set_saved_dtype(m, k == 2 ? DT_BF16 : DT_F32);
            double t_fb = 0, t_op = 0;
            for (int s = 0; s < steps; s++) {
                double t0 = bench_now();
                dt_graph_reset(g[k]);
                dt_tensor *l = dt_model_forward(m, g[k], &b, NULL);
                if (!l) return fail("forward");
                if (dt_graph_backward(g[k], l) != DT_OK) return fail("backward");
                double t1 = bench_now();
                loss[k] = dt_f32(l)[0];
                if (dt_optimizer_step_range(&opt, oc.lr, m->param_flat.data, m->grad_flat.data, 0,
                                            m->param_flat.numel, 1.f) != DT_OK)
                    return fail("step");
                dt_optimizer_finish_step(&opt);
                dt_model_zero_grad(m);
                t_fb += t1 - t0;
                t_op += bench_now() - t1;
            }
            if (r) { fb[k][r - 1] = t_fb / steps; op[k][r - 1] = t_op / steps; }
        }
    }
    double med_fb[NM], med_op[NM];
    for (int k = 0; k < NM; k++) {
        qsort(fb[k], (size_t)rounds, sizeof(double), cmp);
        qsort(op[k], (size_t)rounds, sizeof(double), cmp);
        med_fb[k] = fb[k][rounds / 2];
        med_op[k] = op[k][rounds / 2];
    }
    double gf = bench_sgemm_gflops(w.gm, w.gk, w.gn);
    printf("%s: %zu params, B=%lld T=%lld, %d rounds x %d steps, sgemm [%d,%d]x[%d,%d] %.1f GFLOP/s\n", argv[1],
           dt_model_num_params(m), (long long)w.B, (long long)w.T, rounds, steps, w.gm, w.gk, w.gk, w.gn, gf);
    printf("%-8s %14s %14s %12s %12s %10s\n", "mode", "activation MiB", "fwd+bwd ms", "optim ms", "step ms", "last loss");
    for (int k = 0; k < NM; k++)
        if (only < 0 || k == only)
        printf("%-8s %14.1f %14.1f %12.1f %12.1f %10.4f\n", name[k], dt_graph_arena_bytes(g[k]) / 1048576.0,
               med_fb[k] * 1e3, med_op[k] * 1e3, (med_fb[k] + med_op[k]) * 1e3, loss[k]);
    if (only >= 0) printf("peak RSS %.1f MiB (%s alone)\n", bench_peak_rss_mib(), name[only]);
    else printf("blocks/none: activation memory %.3fx (%.2fx lower), fwd+bwd time %.3fx, step time %.3fx\n",
           (double)dt_graph_arena_bytes(g[1]) / (double)dt_graph_arena_bytes(g[0]),
           (double)dt_graph_arena_bytes(g[0]) / (double)dt_graph_arena_bytes(g[1]), med_fb[1] / med_fb[0],
           (med_fb[1] + med_op[1]) / (med_fb[0] + med_op[0]));
    if (only < 0) printf("bf16/none: activation memory %.3fx, fwd+bwd time %.3fx, step time %.3fx\n",
           (double)dt_graph_arena_bytes(g[2]) / (double)dt_graph_arena_bytes(g[0]), med_fb[2] / med_fb[0],
           (med_fb[2] + med_op[2]) / (med_fb[0] + med_op[0]));
    for (int k = 0; k < NM; k++) { dt_graph_free(g[k]); free(fb[k]); free(op[k]); }
    bench_batch_free(&b);
    dt_optimizer_free(&opt);
    dt_model_free(m);
    return 0;
}
