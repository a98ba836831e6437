/* bench_pipeline: a pipeline's step time and bubble, measured by the
 * schedule's own timers, against the theory.
 *
 *   mpiexec -n P bench_pipeline [--wire fp32|bf16|fp16] [W1|W2|W3] [gpipe|1f1b|interleaved|zb-h1] [M ...]
 *
 * The micro-batch is fixed (W1: 2 sequences of 256 tokens, W3: 16 images), M
 * varies, so a step is M micro-batches. Per M: ms/step (median of the timed
 * steps), every rank's measured bubble (idle inside the schedule / schedule
 * time: waiting on a message, which includes exposed transfers), the
 * theoretical bubble, the time blocked on messages, parameters and
 * activation memory per rank, each rank's peak RSS (VmHWM: one process
 * per rank) and the activation / gradient bytes it sent per step (--wire:
 * dt_pipe_opts.wire; bench/pipeline_wire.sh runs it across simulated hosts). W2 at M = 4 is the global batch of bench_tp's 2 ranks
 * (bench/tp.sh runs it beside dp and tp). Quote the GEMM rate printed with it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "bench_workloads.h"
#include "dtrain/pipeline.h"

#define WARM 2
#define STEPS 6

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int run_one(dt_pg *world, bench_workload *w, dt_pipe_kind kind, int M, dt_dtype wire) {
    int rank = dt_pg_rank(world), P = dt_pg_size(world);
    dt_model *m;
    if (dt_model_create(&w->cfg, 1, &m) != DT_OK) return 1;
    dt_batch mb = bench_batch_make(w, 0);
    dt_batch *mbs = malloc((size_t)M * sizeof *mbs);
    for (int j = 0; j < M; j++) mbs[j] = mb;
    dt_optim_cfg oc = dt_optim_cfg_default(DT_OPTIM_ADAMW);
    int64_t step = 0;
    dt_run run = {.model = m, .optim = &oc, .lr = oc.lr, .quiet = 1, .step = &step, .seed = 1, .rank = 0,
                  .world = 1, .accum = M, .example = mb};
    dt_pipe_opts o;
    dt_pipe_opts_default(&o);
    o.stages = P;
    o.schedule = kind;
    o.virtual_stages = kind == DT_PIPE_INTERLEAVED ? 2 : 1;
    o.wire = wire;
    dt_strategy s;
    dt_status st = dt_pipe_strategy(world, &o, &s);
    if (st == DT_OK) st = s.setup(s.self, &run);
    double ms[STEPS], bubble = 0, wait = 0;
    dt_pipe_stats ps = {0};
    for (int i = 0; i < WARM + STEPS && st == DT_OK; i++) {
        double t0 = bench_now(), loss;
        st = s.forward_backward(s.self, &run, mbs, M, &loss);
        if (st == DT_OK) st = s.step(s.self, &run, oc.lr);
        step++;
        if (st != DT_OK || i < WARM) continue;
        ms[i - WARM] = (bench_now() - t0) * 1e3;
        dt_pipe_strategy_stats(&s, &ps);
        bubble += ps.bubble / STEPS;
        wait += ps.wait_us / 1e3 / STEPS;
    }
    if (st != DT_OK) {
        fprintf(stderr, "rank %d: %s\n", rank, dt_error_message());
        return 1;
    }
    qsort(ms, STEPS, sizeof ms[0], cmp_d);
    /* rank 0 prints every rank's line */
    float mine[8] = {(float)ms[STEPS / 2], (float)(100 * bubble), (float)wait, (float)(ps.param_bytes / 1048576.0),
                     (float)(ps.arena_bytes / 1048576.0), (float)ps.graphs, (float)bench_peak_rss_mib(),
                     (float)(ps.sent_bytes / 1048576.0)};
    float *all = malloc(sizeof mine * (size_t)P);
    dt_allgather(world, mine, all, 8, DT_F32, NULL);
    if (rank == 0) {
        double theory = dt_pipe_bubble_formula(kind, P, M, o.virtual_stages);
        for (int r = 0; r < P; r++)
            printf("%-11s P=%d M=%-3d rank %d: %8.1f ms/step  bubble %5.1f%% (theory %5.1f%%)  waited %7.1f ms  "
                   "params %6.2f MiB  activations %7.1f MiB (%2.0f tapes)  peak RSS %6.0f MiB  sent %7.2f MiB/step\n",
                   dt_pipe_kind_name(kind), P, M, r, all[8 * r], all[8 * r + 1], 100 * theory, all[8 * r + 2],
                   all[8 * r + 3], all[8 * r + 4], all[8 * r + 5], all[8 * r + 6], all[8 * r + 7]);
        fflush(stdout);
    }
    free(all);
    s.destroy(s.self);
    dt_model_free(m);
    free(mbs);
    bench_batch_free(&mb);
    return 0;
}

int main(int argc, char **argv) {
    dt_blas_fix_core(argv);   /* the GEMM kernel family the CPU supports (ops.h) */
    if (dt_dist_init(&argc, &argv, NULL) != DT_OK) { fprintf(stderr, "%s\n", dt_error_message()); return 1; }
    dt_pg *world;
    dt_pg_world(&world);
    dt_dtype wire = DT_F32;
    if (argc > 2 && !strcmp(argv[1], "--wire")) {
        if (!strcmp(argv[2], "bf16")) wire = DT_BF16;
        else if (!strcmp(argv[2], "fp16")) wire = DT_F16;
        else if (strcmp(argv[2], "fp32")) { fprintf(stderr, "--wire: unknown '%s' (fp32, bf16, fp16)\n", argv[2]); return 2; }
        argv += 2;
        argc -= 2;
    }
    const char *wl = argc > 1 ? argv[1] : "W1";
    dt_pipe_kind kind = DT_PIPE_1F1B;
    if (argc > 2 && dt_pipe_kind_parse(argv[2], &kind)) { fprintf(stderr, "%s\n", dt_error_message()); return 2; }
    bench_workload w;
    if (bench_workload_get(wl, &w)) { fprintf(stderr, "unknown workload %s (W1, W2, W3)\n", wl); return 2; }
    w.B = w.cfg.kind == DT_MODEL_GPT2 ? 2 : 16;   /* one micro-batch */
    if (dt_pg_rank(world) == 0)
        printf("bench_pipeline %s: %s wire, micro-batch %lld x %lld, %d ranks, sgemm %.0f GFLOP/s (1 thread, [%d,%d]x[%d,%d])\n", wl, wire == DT_F32 ? "fp32" : wire == DT_BF16 ? "bf16" : "fp16",
               (long long)w.B, (long long)w.T, dt_pg_size(world), bench_sgemm_gflops(w.gm, w.gk, w.gn), w.gm, w.gk,
               w.gk, w.gn);
    int rc = 0;
    int Ms[8] = {2, 4, 8, 16}, nM = 4;
    if (argc > 3) for (nM = 0; nM < 8 && 3 + nM < argc; nM++) Ms[nM] = atoi(argv[3 + nM]);
    for (int i = 0; i < nM && !rc; i++) rc = run_one(world, &w, kind, Ms[i], wire);
    dt_pg_free(world);
    dt_dist_finalize();
    return rc;
}
