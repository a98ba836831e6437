/* bench_tp: tensor parallelism against data parallelism on the same ranks
 * and the same global batch.
 *
 *   mpiexec -n 2 bench_tp [W2|W1|W2S] [steps] [dp|tp|tp+sp|both]   (bench/tp.sh runs it)
 *
 * Modes: dp (DDP over every rank, B sequences per rank), tp (--tp = the
 * world, one replica of B x world sequences) and tp+sp (the same with
 * sequence parallelism, --sequence-parallel; both = dp then tp), each for `steps` timed steps
 * after one warm-up, AdamW with clipping as the trainer steps. Per mode:
 * ms/step (median), parameter / gradient / optimizer-state MiB per rank,
 * activations (the tape arena's high-water mark: dt_graph_arena_bytes), peak RSS (of the process: run one mode per process to compare it), and the bytes each rank hands to all-reduces per step: tp
 * counts its group's (the comm callback's counter, dt_tp_stats; forward
 * and backward), DDP's payload is the whole gradient (uncompressed).
 * W2S: W2's body (L=12 C=768 H=12) with a byte vocabulary (V=256), so the
 * lm-head does not dominate. Quote lscpu's model with it. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "bench_workloads.h"
#include "dtrain/parallel.h"

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* tp: 0 = dp, 1 = tp, 2 = tp + sequence parallelism */
static int run_mode(dt_pg *world, const bench_workload *w0, int tp, int steps) {
    int rank = dt_pg_rank(world), W = dt_pg_size(world);
    bench_workload w = *w0;
    dt_strategy s;
    dt_status st;
    if (tp) {
        dt_tp_opts o = {.size = W, .sequence_parallel = tp == 2};
        dt_ddp_opts_default(&o.ddp);
        w.B = w0->B * W;   /* one replica: the global batch */
        st = dt_tp_strategy(world, &o, &s);
    } else {
        st = dt_ddp_strategy(world, NULL, &s);
    }
    if (st != DT_OK) { fprintf(stderr, "rank %d: %s\n", rank, dt_error_message()); return 1; }
    dt_model_cfg cfg = w.cfg;
    if (s.prepare_model) st = s.prepare_model(s.self, &cfg);
    dt_model *m = NULL;
    if (st == DT_OK) st = dt_model_create(&cfg, 1, &m);
    dt_graph *g = dt_graph_create();
    dt_optim_cfg oc = dt_optim_cfg_default(DT_OPTIM_ADAMW);
    dt_optimizer opt = {0};
    if (st == DT_OK) st = dt_optimizer_init_model(&opt, &oc, m);
    int64_t step = 0;
    int data_rank = s.data_world ? s.data_rank : rank, data_world = s.data_world ? s.data_world : W;
    dt_run run = {.model = m, .graph = g, .optim = &oc, .optimizer = &opt, .clip = 1.0f, .lr = oc.lr, .quiet = 1,
                  .step = &step, .seed = 1, .rank = data_rank, .world = data_world, .accum = 1};
    if (st == DT_OK) st = s.setup(s.self, &run);
    dt_batch b = bench_batch_make(&w, data_rank);   /* the ranks of a replica: the same batch */
    double *ms = calloc((size_t)steps, sizeof *ms);
    for (int i = 0; i < 1 + steps && st == DT_OK; i++) {
        double t0 = bench_now();
        dt_graph_reset(g);
        dt_graph_set_training(g, 1);
        st = s.before_forward(s.self, &run, 1);
        dt_tensor *loss = st == DT_OK ? dt_model_forward(m, g, &b, NULL) : NULL;
        if (!loss) { st = st != DT_OK ? st : DT_EINVAL; break; }
        st = dt_graph_backward(g, loss);
        if (st == DT_OK) st = s.after_backward(s.self, &run, 1);
        double ss = 0;
        if (st == DT_OK) {
            if (s.grad_sumsq) st = s.grad_sumsq(s.self, &run, &ss);
            else ss = dt_sumsq(m->grad_flat.data, m->grad_flat.numel);
        }
        if (st == DT_OK)
            st = dt_optimizer_step_range(&opt, oc.lr, m->param_flat.data, m->grad_flat.data, 0, m->param_flat.numel,
                                         dt_clip_scale(sqrt(ss), 1.0f));
        dt_optimizer_finish_step(&opt);
        dt_model_zero_grad(m);
        step++;
        if (i > 0) ms[i - 1] = (bench_now() - t0) * 1e3;
    }
    if (st != DT_OK) { fprintf(stderr, "rank %d: %s\n", rank, dt_error_message()); return 1; }
    qsort(ms, (size_t)steps, sizeof *ms, cmp_d);
    double mib = 1.0 / 1048576.0, f = sizeof(float);
    double comm = tp ? (double)dt_tp_get_stats(s.self).bytes_last_step : (double)m->grad_flat.numel * f;
    if (tp && W / cfg.tp_size > 1) comm += (double)m->grad_flat.numel * f;   /* (dp x tp: DDP too) */
    double v[6] = {ms[steps / 2], (double)m->param_flat.numel * f * mib, (double)m->grad_flat.numel * f * mib,
                   (double)dt_optimizer_state_nbytes(&opt) * mib, bench_peak_rss_mib(),
                   (double)dt_graph_arena_bytes(g) * mib};
    if (rank == 0)
        printf("%-5s x%d  batch %lld x %lld per replica  %8.1f ms/step  %6.0f tok/s  per rank: params %7.1f MiB  grads %7.1f  "
               "optimizer %7.1f  activations %7.1f  peak RSS %7.1f MiB  all-reduced %8.2f MiB/step\n",
               tp == 2 ? "tp+sp" : tp ? "tp" : "dp", W, (long long)w.B, (long long)w.T, v[0], (double)(w.B * w.T * (tp ? 1 : W)) / v[0] * 1e3,
               v[1], v[2], v[3], v[5], v[4], comm * mib);
    free(ms);
    bench_batch_free(&b);
    s.destroy(s.self);
    dt_graph_free(g);
    dt_optimizer_free(&opt);
    dt_model_free(m);
    return 0;
}

int main(int argc, char **argv) {
    dt_blas_fix_core(argv);
    if (dt_dist_init(&argc, &argv, NULL) != DT_OK) { fprintf(stderr, "%s\n", dt_error_message()); return 1; }
    dt_pg *world;
    dt_pg_world(&world);
    const char *wl = argc > 1 ? argv[1] : "W2S";
    int steps = argc > 2 ? atoi(argv[2]) : 3;
    const char *mode = argc > 3 ? argv[3] : "both";
    int both = !strcmp(mode, "both"), do_dp = both || !strcmp(mode, "dp"), do_tp = both || !strcmp(mode, "tp");
    int do_sp = !strcmp(mode, "tp+sp");
    bench_workload w;
    int small = !strcmp(wl, "W2S");
    if (bench_workload_get(small ? "W2" : wl, &w) || w.cfg.kind != DT_MODEL_GPT2 || steps < 1 ||
        !(both || do_dp || do_tp || do_sp)) {
        fprintf(stderr, "usage: bench_tp [W1|W2|W2S] [steps >= 1] [dp|tp|tp+sp|both]\n");
        return 2;
    }
    if (small) w.cfg.vocab = 256;
    if (dt_pg_rank(world) == 0) {
        bench_print_gemm();
        printf("bench_tp %s: L=%d C=%d H=%d V=%d, %d ranks, 1 warm-up + %d timed steps, same global batch\n", wl,
               w.cfg.n_layer, w.cfg.n_embd, w.cfg.n_head, w.cfg.vocab, dt_pg_size(world), steps);
    }
    int rc = do_dp ? run_mode(world, &w, 0, steps) : 0;
    if (!rc && do_tp) rc = run_mode(world, &w, 1, steps);
    if (!rc && do_sp) rc = run_mode(world, &w, 2, steps);
    dt_pg_free(world);
    dt_dist_finalize();
    return rc;
}
