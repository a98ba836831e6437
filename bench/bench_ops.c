/* bench_ops: forward+backward timings of the dense ops at GPT-2 "W1" shapes
 * (L=6, C=384, H=6, T=256, B=8, V=256 -> N = B*T = 2048 rows), each next to
 * raw cblas_sgemm calls of the same shapes measured in the same run, then one
 * full GPT-2 training step built from the ops with a per-op breakdown.
 *
 *   OMP_NUM_THREADS=2 OMP_WAIT_POLICY=passive ./bench_ops [iters [ops|unfused]]
 *   (default 5 iterations, best of; "ops" skips the full step; "unfused"
 *   builds the step from the unfused chains instead of the fused ops GPT-2
 *   uses: add + layernorm for add_layernorm, linear + gelu for linear_gelu)
 *
 * Each time is reported as wall and as "est" = process cpu time / threads,
 * which approximates the wall time on idle cores when the machine is shared.
 *
 * Op timings call the op (forward) and then its node's backward function
 * directly with a random upstream gradient, so they measure the op alone.
 * The fused ops are timed next to the chains they replace, both forward and
 * then backward through the whole tape (dt_graph_backward_from), so
 * the rows compare like with like.
 * GFLOP/s counts GEMM flops only: linear 3 x 2*N*in*out; attention counts
 * the useful causal flops 3 x 2 x 2*hs*T(T+1)/2 per (b, h).
 *
 * Bounds: a memory-bound op's time is set against bytes moved / the memory
 * bandwidth measured in the same run (a STREAM-style scale, a = s*b, over
 * 256 MiB); a FLOP-bound op's (linear, attention, conv) against its flops /
 * the sgemm rate of the same run ("op/sgemm"). The CNN section times the demo
 * CNN's convolutions (oneDNN and im2col), BatchNorm, ReLU and max-pool at
 * batch 64. */
#include <cblas.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "dtrain/ops.h"

enum { B = 8, T = 256, C = 384, H = 6, L = 6, V = 256, N = B * T };

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Process CPU time (all threads). On a shared machine wall time includes
 * time other jobs held the cores; cpu / threads estimates the unloaded wall
 * time (run with OMP_WAIT_POLICY=passive so idle threads sleep, not spin). */
static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
static int g_threads = 1;
static void keep_min(double *best, double v);
static double g_bw = 0;
static double g_rate = 0;   /* flop/s of raw sgemm (est), from the linear rows */   /* bytes/s, measured by measure_bw in this run */

/* STREAM-style scale a[i] = 3 b[i] with a and b together `foot` bytes (so
 * the rate is the one of the cache level or memory the op's data lives in):
 * 8 bytes per element (read b, write a), every thread; repeated to >= 64 MiB
 * moved per trial, best of 5 trials by process cpu / threads (robust on a
 * shared machine, like the ops' "est"). */
static double measure_bw(double foot) {
    int64_t n = (int64_t)(foot / 8);
    if (n < 4096) n = 4096;
    int reps = (int)((64.0 * 1048576) / (8.0 * (double)n)) + 1;
    float *a = malloc(sizeof(float) * (size_t)n), *b = malloc(sizeof(float) * (size_t)n);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) { a[i] = 0.f; b[i] = (float)(i & 1023); }
    double best = 1e30;
    for (int r = 0; r < 6; r++) {
        double c0 = cpu_now();
        for (int k = 0; k < reps; k++) {
#pragma omp parallel for schedule(static)
            for (int64_t i = 0; i < n; i++) a[i] = 3.0f * b[i];
        }
        double t = (cpu_now() - c0) / g_threads;
        if (r > 0) keep_min(&best, t);
    }
    volatile float sink = a[n / 2];
    (void)sink;
    free(a);
    free(b);
    return 8.0 * (double)n * reps / best;
}

static void fill(float *x, int64_t n, uint64_t seed, float scale) {
    dt_rng r;
    dt_rng_seed(&r, seed);
    for (int64_t i = 0; i < n; i++) x[i] = scale * (2.0f * dt_rng_uniform(&r) - 1.0f);
}

static dt_param *mkparam(const char *name, int ndim, const int64_t *shape, uint64_t seed, float scale) {
    dt_param *p = calloc(1, sizeof *p);
    if (!p || dt_param_init(p, name, ndim, shape) != DT_OK) {
        fprintf(stderr, "bench_ops: %s\n", dt_error_message());
        exit(1);
    }
    fill(dt_f32(&p->value), p->value.numel, seed, scale);
    return p;
}

static void freeparam(dt_param *p) {
    dt_param_free(p);
    free(p);
}

/* ---------------- single-op timings ---------------- */

typedef dt_tensor *(*op_fn)(dt_graph *g, dt_param **in, void *ctx);

/* Best-of-iterations times in seconds: wall, and process cpu / threads
 * ("est": what the wall time would be on otherwise idle cores). */
typedef struct op_time { double fwd, bwd, fwd_est, bwd_est; } op_time;

static void keep_min(double *best, double v) {
    if (v < *best) *best = v;
}
/* one iteration's forward / backward wall and process-cpu seconds into the best so far */
static void keep_best(op_time *best, double fwd, double bwd, double fwd_cpu, double bwd_cpu) {
    keep_min(&best->fwd, fwd);
    keep_min(&best->bwd, bwd);
    keep_min(&best->fwd_est, fwd_cpu / g_threads);
    keep_min(&best->bwd_est, bwd_cpu / g_threads);
}

static op_time time_op(op_fn f, dt_param **in, void *ctx, int iters) {
    dt_graph *g = dt_graph_create();
    op_time best = {1e30, 1e30, 1e30, 1e30};
    for (int it = 0; it < iters + 1; it++) {   /* +1 warm-up */
        dt_graph_reset(g);
        double c0 = cpu_now(), t0 = now();
        dt_tensor *y = f(g, in, ctx);
        double t1 = now(), c1 = cpu_now();
        if (!y || !y->grad_fn) {
            fprintf(stderr, "bench_ops: op failed: %s\n", dt_error_message());
            exit(1);
        }
        float *dy = dt_grad_of(g, y);
        fill(dy, y->numel, 7, 1.0f);
        double c2 = cpu_now(), t2 = now();
        y->grad_fn->backward(g, y->grad_fn);
        double t3 = now(), c3 = cpu_now();
        if (it == 0) continue;
        keep_best(&best, t1 - t0, t3 - t2, c1 - c0, c3 - c2);
    }
    dt_graph_free(g);
    return best;
}

typedef struct lin_ctx { int in, out; } lin_ctx;
static dt_tensor *f_linear(dt_graph *g, dt_param **in, void *ctx) {
    (void)ctx;
    return dt_op_linear(g, &in[0]->value, &in[1]->value, &in[2]->value, DT_W_IN_OUT);
}
static dt_tensor *f_attention(dt_graph *g, dt_param **in, void *ctx) {
    (void)ctx;
    return dt_op_attention(g, &in[0]->value, H);
}
static dt_tensor *f_layernorm(dt_graph *g, dt_param **in, void *ctx) {
    (void)ctx;
    return dt_op_layernorm(g, &in[0]->value, &in[1]->value, &in[2]->value, 1e-5f);
}
static dt_tensor *f_gelu(dt_graph *g, dt_param **in, void *ctx) {
    (void)ctx;
    return dt_op_gelu(g, &in[0]->value);
}
static dt_tensor *f_ce(dt_graph *g, dt_param **in, void *ctx) {
    return dt_op_cross_entropy(g, &in[0]->value, ctx);
}

/* ---- fused ops vs the chains they replace ----
 * ctx: where the function leaves a side output that a later op would consume
 * (add_layernorm's sum), or NULL. */
static dt_tensor *f_linear_gelu(dt_graph *g, dt_param **in, void *ctx) {
    (void)ctx;
    return dt_op_linear_gelu(g, &in[0]->value, &in[1]->value, &in[2]->value, DT_W_IN_OUT);
}
static dt_tensor *f_linear_then_gelu(dt_graph *g, dt_param **in, void *ctx) {
    (void)ctx;
    return dt_op_gelu(g, dt_op_linear(g, &in[0]->value, &in[1]->value, &in[2]->value, DT_W_IN_OUT));
}
static dt_tensor *f_add_layernorm(dt_graph *g, dt_param **in, void *ctx) {
    return dt_op_add_layernorm(g, &in[0]->value, &in[1]->value, &in[2]->value, &in[3]->value, 1e-5f, ctx);
}
static dt_tensor *f_add_then_layernorm(dt_graph *g, dt_param **in, void *ctx) {
    dt_tensor **sum = ctx;
    *sum = dt_op_add(g, &in[0]->value, &in[1]->value);
    return dt_op_layernorm(g, *sum, &in[2]->value, &in[3]->value, 1e-5f);
}

/* f forward, then backward through the tape from its output with a random
 * gradient, and a random gradient on the side output *side (when f sets
 * it), as the consumer of GPT-2's residual stream would give it. */
static op_time time_chain(op_fn f, dt_param **in, dt_tensor **side, int iters) {
    dt_graph *g = dt_graph_create();
    op_time best = {1e30, 1e30, 1e30, 1e30};
    float *dy = NULL;
    for (int it = 0; it < iters + 1; it++) {   /* +1 warm-up */
        dt_graph_reset(g);
        if (side) *side = NULL;
        double c0 = cpu_now(), t0 = now();
        dt_tensor *y = f(g, in, side);
        double t1 = now(), c1 = cpu_now();
        if (!y || !y->grad_fn || (side && !*side)) {
            fprintf(stderr, "bench_ops: op failed: %s\n", dt_error_message());
            exit(1);
        }
        if (!dy) {
            dy = malloc(sizeof(float) * (size_t)y->numel);
            fill(dy, y->numel, 7, 1.0f);
        }
        if (side) fill(dt_grad_of(g, *side), (*side)->numel, 8, 1.0f);
        double c2 = cpu_now(), t2 = now();
        if (dt_graph_backward_from(g, y, dy) != DT_OK) {
            fprintf(stderr, "bench_ops: backward: %s\n", dt_error_message());
            exit(1);
        }
        double t3 = now(), c3 = cpu_now();
        if (it == 0) continue;
        keep_best(&best, t1 - t0, t3 - t2, c1 - c0, c3 - c2);
    }
    free(dy);
    dt_graph_free(g);
    return best;
}

static void mem_row(const char *name, op_time t, double bytes, double foot);
static void print_row(const char *name, op_time t, double flops, double raw, double raw_est, double bytes);

/* GPT-2's two fusions at the W1 shapes, each under its unfused chain. */
static void bench_fused_ops(int iters) {
    printf("\nfused ops vs the chains they replace (fwd, then bwd through the tape)\n");
    {
        dt_param *x = mkparam("x", 2, (int64_t[]){N, C}, 1, 1.0f);
        dt_param *w = mkparam("w", 2, (int64_t[]){C, 4 * C}, 2, 0.05f);
        dt_param *b = mkparam("b", 1, (int64_t[]){4 * C}, 3, 0.1f);
        dt_param *in[3] = {x, w, b};
        double fl = 3.0 * 2.0 * N * C * 4.0 * C;
        print_row("linear+gelu 2048x384->1536", time_chain(f_linear_then_gelu, in, NULL, iters), fl, 0, 0, 0);
        print_row("linear_gelu (fused)", time_chain(f_linear_gelu, in, NULL, iters), fl, 0, 0, 0);
        freeparam(x); freeparam(w); freeparam(b);
    }
    {
        dt_param *x = mkparam("x", 2, (int64_t[]){N, C}, 4, 1.0f);
        dt_param *h = mkparam("h", 2, (int64_t[]){N, C}, 5, 1.0f);
        dt_param *w = mkparam("w", 1, (int64_t[]){C}, 6, 1.0f);
        dt_param *b = mkparam("b", 1, (int64_t[]){C}, 7, 1.0f);
        dt_param *in[4] = {x, h, w, b};
        dt_tensor *sum;
        /* bound for both rows: the fused op's traffic. fwd reads x, h, writes
         * s, y; bwd reads s, dy, ds, read-modify-writes dx, dh */
        double nc = (double)N * C * 4;
        mem_row("add+layernorm 2048x384", time_chain(f_add_then_layernorm, in, &sum, iters), 11.0 * nc, 8.0 * nc);
        mem_row("add_layernorm (fused)", time_chain(f_add_layernorm, in, &sum, iters), 11.0 * nc, 8.0 * nc);
        freeparam(x); freeparam(h); freeparam(w); freeparam(b);
    }
}

/* Raw SGEMMs of a linear layer's fwd + bwd: y = x w, dx = dy w^T, dw = x^T dy.
 * Returns best wall seconds; *est gets best cpu / threads. */
static double time_raw_linear(int in, int out, int iters, double *est) {
    float *x = malloc(sizeof(float) * N * in), *w = malloc(sizeof(float) * in * out);
    float *y = malloc(sizeof(float) * N * out), *dx = malloc(sizeof(float) * N * in);
    float *dw = malloc(sizeof(float) * in * out);
    fill(x, (int64_t)N * in, 1, 1.0f);
    fill(w, (int64_t)in * out, 2, 0.05f);
    fill(y, (int64_t)N * out, 3, 1.0f);
    memset(dx, 0, sizeof(float) * N * in);
    memset(dw, 0, sizeof(float) * in * out);
    double best = 1e30;
    *est = 1e30;
    for (int it = 0; it < iters + 1; it++) {
        double c0 = cpu_now(), t0 = now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, out, in, 1.0f, x, in, w, out, 0.0f, y, out);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, in, out, 1.0f, y, out, w, out, 1.0f, dx, in);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, in, out, N, 1.0f, x, in, y, out, 1.0f, dw, out);
        double t = now() - t0, c = (cpu_now() - c0) / g_threads;
        if (it > 0) {
            keep_min(&best, t);
            keep_min(est, c);
        }
    }
    free(x); free(w); free(y); free(dx); free(dw);
    return best;
}

/* bytes: moved by fwd + bwd; foot: the distinct bytes they touch (x, y, dy, dx):
 * the bandwidth bound is measured at that footprint (mem_row, below). */
static void print_row(const char *name, op_time t, double flops, double raw, double raw_est, double bytes) {
    double tot = t.fwd + t.bwd, est = t.fwd_est + t.bwd_est;
    printf("%-28s %7.2f %7.2f %8.2f %8.2f", name, t.fwd * 1e3, t.bwd * 1e3, tot * 1e3, est * 1e3);
    if (flops > 0)
        printf(" %8.1f %8.1f", flops / tot / 1e9, flops / est / 1e9);
    else
        printf(" %8s %8s", "-", "-");
    if (raw > 0)
        printf(" | %8.2f %8.2f %8.1f %8.1f  %3.0f%%", raw * 1e3, raw_est * 1e3, flops / raw / 1e9,
               flops / raw_est / 1e9, 100.0 * raw_est / est);
    else if (bytes > 0)
        printf(" | %.1f GB/s (est); bandwidth bound %.2f ms -> %3.0f%% of it", bytes / est / 1e9, bytes / g_bw * 1e3,
               100.0 * bytes / g_bw / est);
    else if (flops > 0 && g_rate > 0)
        printf(" | sgemm-rate bound %.2f ms -> %3.0f%% of it", flops / g_rate * 1e3, 100.0 * flops / g_rate / est);
    printf("\n");
}

static void mem_row(const char *name, op_time t, double bytes, double foot) {
    double keep = g_bw;
    g_bw = measure_bw(foot);
    print_row(name, t, 0, 0, 0, bytes);
    g_bw = keep;
}

/* Returns the raw SGEMM rate (flop/s, est) over the three linear shapes. */
static double bench_single_ops(int iters) {
    printf("%-28s %7s %7s %8s %8s %8s %8s | %8s %8s %8s %8s  %4s\n", "op (fwd+bwd)", "fwd", "bwd", "total",
           "est", "GF/s", "GF/s est", "sgemm", "est", "GF/s", "GF/s est", "op/sgemm");
    static const int lin[3][2] = {{C, 3 * C}, {C, 4 * C}, {4 * C, C}};
    double fl_sum = 0, raw_sum = 0;
    for (int k = 0; k < 3; k++) {
        int in = lin[k][0], out = lin[k][1];
        dt_param *x = mkparam("x", 2, (int64_t[]){N, in}, 1, 1.0f);
        dt_param *w = mkparam("w", 2, (int64_t[]){in, out}, 2, 0.05f);
        dt_param *b = mkparam("b", 1, (int64_t[]){out}, 3, 0.1f);
        op_time t = time_op(f_linear, (dt_param *[]){x, w, b}, NULL, iters);
        double raw_est, raw = time_raw_linear(in, out, iters, &raw_est);
        double fl = 3.0 * 2.0 * N * in * out;
        char name[64];
        snprintf(name, sizeof name, "linear %dx%d->%d", N, in, out);
        print_row(name, t, fl, raw, raw_est, 0);
        fl_sum += fl;
        raw_sum += raw_est;
        freeparam(x); freeparam(w); freeparam(b);
    }
    g_rate = fl_sum / raw_sum;
    {
        dt_param *qkv = mkparam("qkv", 3, (int64_t[]){B, T, 3 * C}, 4, 1.0f);
        op_time t = time_op(f_attention, (dt_param *[]){qkv}, NULL, iters);
        double fl = 3.0 * 2.0 * 2.0 * (C / H) * (T * (T + 1.0) / 2.0) * B * H;
        print_row("attention B8 T256 C384 H6", t, fl, 0, 0, 0);
        freeparam(qkv);
    }
    {
        dt_param *x = mkparam("x", 2, (int64_t[]){N, C}, 5, 1.0f);
        dt_param *w = mkparam("w", 1, (int64_t[]){C}, 6, 1.0f);
        dt_param *b = mkparam("b", 1, (int64_t[]){C}, 7, 1.0f);
        op_time t = time_op(f_layernorm, (dt_param *[]){x, w, b}, NULL, iters);
        /* fwd reads x, writes y; bwd reads x, dy, read-modify-writes dx */
        mem_row("layernorm 2048x384", t, 6.0 * N * C * 4, 4.0 * N * C * 4);
        freeparam(x); freeparam(w); freeparam(b);
    }
    {
        dt_param *x = mkparam("x", 2, (int64_t[]){N, 4 * C}, 8, 3.0f);
        op_time t = time_op(f_gelu, (dt_param *[]){x}, NULL, iters);
        mem_row("gelu 2048x1536", t, 6.0 * N * 4 * C * 4, 4.0 * N * 4 * C * 4);
        freeparam(x);
    }
    {
        dt_param *x = mkparam("logits", 2, (int64_t[]){N, V}, 9, 3.0f);
        int32_t *tg = malloc(sizeof(int32_t) * N);
        for (int i = 0; i < N; i++) tg[i] = (int32_t)((i * 31) % V);
        op_time t = time_op(f_ce, (dt_param *[]){x}, tg, iters);
        mem_row("cross_entropy 2048x256", t, 4.0 * N * V * 4, 2.0 * N * V * 4);
        free(tg);
        freeparam(x);
    }
    return fl_sum / raw_sum;
}

/* ---------------- the demo CNN's ops, batch 64 ---------------- */

typedef struct conv_ctx { int pad; } conv_ctx;
static dt_tensor *f_conv(dt_graph *g, dt_param **in, void *ctx) {
    return dt_op_conv2d(g, &in[0]->value, &in[1]->value, NULL, 1, ((conv_ctx *)ctx)->pad);
}
static dt_tensor *f_bn(dt_graph *g, dt_param **in, void *ctx) {
    (void)ctx;   /* in: x, gamma, beta, running mean, running var */
    return dt_op_batchnorm(g, &in[0]->value, &in[1]->value, &in[2]->value, &in[3]->value, &in[4]->value,
                           0.1f, 1e-5f, NULL);
}
static dt_tensor *f_relu(dt_graph *g, dt_param **in, void *ctx) {
    (void)ctx;
    return dt_op_relu(g, &in[0]->value);
}
static dt_tensor *f_pool(dt_graph *g, dt_param **in, void *ctx) {
    (void)ctx;
    return dt_op_maxpool2d(g, &in[0]->value, 2, 2);
}

static void bench_cnn_ops(int iters) {
    enum { NB = 64 };
    printf("\nthe demo CNN's ops at batch %d (GEMM-rate bound: the linear rows' sgemm rate, %.1f GF/s est)\n", NB,
           g_rate / 1e9);
    static const int conv[2][3] = {{1, 28, 32}, {32, 14, 64}};   /* C, H = W, OC; 5x5, pad 2 */
    for (int k = 0; k < 2; k++) {
        int Ci = conv[k][0], S = conv[k][1], OC = conv[k][2];
        dt_param *x = mkparam("x", 4, (int64_t[]){NB, Ci, S, S}, 11, 1.0f);
        dt_param *w = mkparam("w", 4, (int64_t[]){OC, Ci, 5, 5}, 12, 0.1f);
        x->value.requires_grad = k > 0;   /* conv1 reads the images: no dx */
        double fwd = 2.0 * NB * OC * Ci * 25.0 * S * S;
        for (int be = 0; be < 2; be++) {
            dt_conv_set_backend(be ? "im2col" : "onednn");
            char name[64];
            snprintf(name, sizeof name, "conv%d %s %dx%d->%d", k + 1, be ? "im2col" : "oneDNN", Ci, S, OC);
            op_time t = time_op(f_conv, (dt_param *[]){x, w}, &(conv_ctx){2}, iters);
            print_row(name, t, fwd * (k ? 3 : 2), 0, 0, 0);
        }
        dt_conv_set_backend("onednn");
        freeparam(x); freeparam(w);
    }
    int64_t n = (int64_t)NB * 32 * 28 * 28;
    dt_param *x = mkparam("x", 4, (int64_t[]){NB, 32, 28, 28}, 13, 1.0f);
    dt_param *ga = mkparam("gamma", 1, (int64_t[]){32}, 14, 1.0f), *be = mkparam("beta", 1, (int64_t[]){32}, 15, 0.1f);
    dt_param *rm = mkparam("rm", 1, (int64_t[]){32}, 16, 0.0f), *rv = mkparam("rv", 1, (int64_t[]){32}, 17, 1.0f);
    rm->value.requires_grad = rv->value.requires_grad = 0;
    /* two passes each way: fwd reads x twice, writes y; bwd reads x and dy twice, dx read+write */
    mem_row("batchnorm 64x32x28x28", time_op(f_bn, (dt_param *[]){x, ga, be, rm, rv}, NULL, iters), 9.0 * n * 4,
            4.0 * n * 4);
    /* fwd read + write; bwd reads x and dy, dx read + write */
    mem_row("relu 64x32x28x28", time_op(f_relu, (dt_param *[]){x}, NULL, iters), 6.0 * n * 4, 4.0 * n * 4);
    /* fwd reads x, writes y (n/4); bwd reads dy (n/4), dx read + write */
    mem_row("maxpool2 64x32x28x28", time_op(f_pool, (dt_param *[]){x}, NULL, iters), 3.5 * n * 4, 2.5 * n * 4);
    freeparam(x); freeparam(ga); freeparam(be); freeparam(rm); freeparam(rv);
}

/* ---------------- full GPT-2 step with per-op breakdown ---------------- */

#define MAX_NODES 256
#define MAX_KINDS 16
static struct { dt_node *node; dt_backward_fn fn; } g_wrapped[MAX_NODES];
static int g_nwrapped;
static struct { const char *op; double fwd, bwd; int count; } g_kind[MAX_KINDS];
static int g_nkind;

static int kind_of(const char *op) {
    for (int i = 0; i < g_nkind; i++)
        if (!strcmp(g_kind[i].op, op)) return i;
    if (g_nkind == MAX_KINDS) return MAX_KINDS - 1;
    g_kind[g_nkind].op = op;
    return g_nkind++;
}

/* Backward trampoline: time the original backward of this node. */
static void timed_backward(dt_graph *g, dt_node *n) {
    for (int i = 0; i < g_nwrapped; i++)
        if (g_wrapped[i].node == n) {
            double t0 = now();
            g_wrapped[i].fn(g, n);
            g_kind[kind_of(n->op)].bwd += now() - t0;
            return;
        }
}

/* Account an op's forward time (since g_t0) and wrap its node's backward. */
static double g_t0;
static dt_tensor *timed(const char *op, dt_tensor *y) {
    if (!y) {
        fprintf(stderr, "bench_ops: %s\n", dt_error_message());
        exit(1);
    }
    int k = kind_of(op);
    g_kind[k].fwd += now() - g_t0;
    g_kind[k].count++;
    if (y->grad_fn && g_nwrapped < MAX_NODES) {
        g_wrapped[g_nwrapped].node = y->grad_fn;
        g_wrapped[g_nwrapped++].fn = y->grad_fn->backward;
        y->grad_fn->backward = timed_backward;
    }
    return y;
}
/* The comma operator sequences the clock read before the op runs. */
#define TIMED(opname, expr) (g_t0 = now(), timed(opname, (expr)))

typedef struct gpt2 {
    dt_param *wte, *wpe, *lnf_w, *lnf_b;
    dt_param *ln1_w[L], *ln1_b[L], *attn_w[L], *attn_b[L], *proj_w[L], *proj_b[L];
    dt_param *ln2_w[L], *ln2_b[L], *fc_w[L], *fc_b[L], *fc2_w[L], *fc2_b[L];
} gpt2;

static void gpt2_init(gpt2 *m) {
    uint64_t s = 100;
    m->wte = mkparam("wte", 2, (int64_t[]){V, C}, s++, 0.02f);
    m->wpe = mkparam("wpe", 2, (int64_t[]){T, C}, s++, 0.02f);
    m->lnf_w = mkparam("lnf.w", 1, (int64_t[]){C}, s++, 1.0f);
    m->lnf_b = mkparam("lnf.b", 1, (int64_t[]){C}, s++, 0.0f);
    for (int l = 0; l < L; l++) {
        m->ln1_w[l] = mkparam("ln1.w", 1, (int64_t[]){C}, s++, 1.0f);
        m->ln1_b[l] = mkparam("ln1.b", 1, (int64_t[]){C}, s++, 0.0f);
        m->attn_w[l] = mkparam("attn.w", 2, (int64_t[]){C, 3 * C}, s++, 0.02f);
        m->attn_b[l] = mkparam("attn.b", 1, (int64_t[]){3 * C}, s++, 0.0f);
        m->proj_w[l] = mkparam("proj.w", 2, (int64_t[]){C, C}, s++, 0.02f);
        m->proj_b[l] = mkparam("proj.b", 1, (int64_t[]){C}, s++, 0.0f);
        m->ln2_w[l] = mkparam("ln2.w", 1, (int64_t[]){C}, s++, 1.0f);
        m->ln2_b[l] = mkparam("ln2.b", 1, (int64_t[]){C}, s++, 0.0f);
        m->fc_w[l] = mkparam("fc.w", 2, (int64_t[]){C, 4 * C}, s++, 0.02f);
        m->fc_b[l] = mkparam("fc.b", 1, (int64_t[]){4 * C}, s++, 0.0f);
        m->fc2_w[l] = mkparam("fc2.w", 2, (int64_t[]){4 * C, C}, s++, 0.02f);
        m->fc2_b[l] = mkparam("fc2.b", 1, (int64_t[]){C}, s++, 0.0f);
    }
}

static void gpt2_free(gpt2 *m) {
    dt_param **p = (dt_param **)m;
    for (size_t i = 0; i < sizeof *m / sizeof *p; i++) freeparam(p[i]);
}

static int g_unfused;   /* the step from the unfused chains ("unfused" on the command line) */

static dt_tensor *gpt2_step_forward(dt_graph *g, gpt2 *m, const int32_t *ids, const int32_t *pos,
                                    const int32_t *tgt) {
    int64_t sh[3] = {B, T, C};
    dt_tensor *tok = TIMED("embedding", dt_op_embedding(g, &m->wte->value, ids, N, 3, sh));
    dt_tensor *pe = TIMED("embedding", dt_op_embedding(g, &m->wpe->value, pos, N, 3, sh));
    dt_tensor *x = TIMED("add", dt_op_add(g, tok, pe));
    for (int l = 0; l < L; l++) {
        dt_tensor *h = TIMED("layernorm", dt_op_layernorm(g, x, &m->ln1_w[l]->value, &m->ln1_b[l]->value, 1e-5f));
        h = TIMED("linear", dt_op_linear(g, h, &m->attn_w[l]->value, &m->attn_b[l]->value, DT_W_IN_OUT));
        h = TIMED("attention", dt_op_attention(g, h, H));
        h = TIMED("linear", dt_op_linear(g, h, &m->proj_w[l]->value, &m->proj_b[l]->value, DT_W_IN_OUT));
        if (g_unfused) {
            x = TIMED("add", dt_op_add(g, x, h));
            h = TIMED("layernorm", dt_op_layernorm(g, x, &m->ln2_w[l]->value, &m->ln2_b[l]->value, 1e-5f));
            h = TIMED("linear", dt_op_linear(g, h, &m->fc_w[l]->value, &m->fc_b[l]->value, DT_W_IN_OUT));
            h = TIMED("gelu", dt_op_gelu(g, h));
        } else {   /* as GPT-2 (src/nn/gpt2.c) */
            h = TIMED("add_layernorm",
                      dt_op_add_layernorm(g, x, h, &m->ln2_w[l]->value, &m->ln2_b[l]->value, 1e-5f, &x));
            h = TIMED("linear_gelu", dt_op_linear_gelu(g, h, &m->fc_w[l]->value, &m->fc_b[l]->value, DT_W_IN_OUT));
        }
        h = TIMED("linear", dt_op_linear(g, h, &m->fc2_w[l]->value, &m->fc2_b[l]->value, DT_W_IN_OUT));
        x = TIMED("add", dt_op_add(g, x, h));
    }
    x = TIMED("layernorm", dt_op_layernorm(g, x, &m->lnf_w->value, &m->lnf_b->value, 1e-5f));
    x = TIMED("linear", dt_op_linear(g, x, &m->wte->value, NULL, DT_W_OUT_IN));   /* tied lm head */
    x = TIMED("reshape", dt_op_reshape(g, x, 2, (int64_t[]){N, V}));
    return TIMED("cross_entropy", dt_op_cross_entropy(g, x, tgt));
}

static void bench_step(int iters, double sgemm_rate) {
    gpt2 m;
    gpt2_init(&m);
    int32_t *ids = malloc(sizeof(int32_t) * N), *pos = malloc(sizeof(int32_t) * N), *tgt = malloc(sizeof(int32_t) * N);
    for (int i = 0; i < N; i++) {
        ids[i] = (int32_t)((i * 7 + 3) % V);
        pos[i] = i % T;
        tgt[i] = (int32_t)((i * 13 + 1) % V);
    }
    dt_graph *g = dt_graph_create();
    double best = 1e30, best_fwd = 0, best_est = 1e30;
    /* per-kind times of the best iteration */
    double kf[MAX_KINDS] = {0}, kb[MAX_KINDS] = {0};
    int kc[MAX_KINDS] = {0};
    float loss = 0;
    for (int it = 0; it < iters + 1; it++) {
        dt_graph_reset(g);
        g_nwrapped = 0;
        for (int k = 0; k < g_nkind; k++) g_kind[k].fwd = g_kind[k].bwd = 0, g_kind[k].count = 0;
        double c0 = cpu_now(), t0 = now();
        dt_tensor *l = gpt2_step_forward(g, &m, ids, pos, tgt);
        double t1 = now();
        if (dt_graph_backward(g, l) != DT_OK) {
            fprintf(stderr, "bench_ops: backward: %s\n", dt_error_message());
            exit(1);
        }
        double t = now() - t0, est = (cpu_now() - c0) / g_threads;
        loss = dt_f32(l)[0];
        if (it > 0) keep_min(&best_est, est);
        if (it > 0 && t < best) {
            best = t;
            best_fwd = t1 - t0;
            for (int k = 0; k < g_nkind; k++) kf[k] = g_kind[k].fwd, kb[k] = g_kind[k].bwd, kc[k] = g_kind[k].count;
        }
    }
    double hs = C / H;
    double lin_fl = 6.0 * N * (12.0 * C * C * L + (double)C * V);
    double att_fl = L * 3.0 * 2.0 * 2.0 * hs * (T * (T + 1.0) / 2.0) * B * H;
    printf("\nGPT-2 step (L=%d C=%d H=%d T=%d B=%d V=%d, %s), best of %d: %.1f ms (fwd %.1f, bwd %.1f), loss %.4f\n",
           L, C, H, T, B, V, g_unfused ? "unfused" : "fused ops", iters, best * 1e3, best_fwd * 1e3,
           (best - best_fwd) * 1e3, loss);
    double fl = lin_fl + att_fl;
    printf("  GEMM flops %.1f GFLOP (linear %.1f + causal attention %.1f)\n", fl / 1e9, lin_fl / 1e9, att_fl / 1e9);
    printf("  wall: %.1f GFLOP/s;  est (cpu/threads %.1f ms): %.1f GFLOP/s = %.0f%% of raw sgemm est %.1f GFLOP/s\n",
           fl / best / 1e9, best_est * 1e3, fl / best_est / 1e9, 100.0 * fl / best_est / sgemm_rate, sgemm_rate / 1e9);
    printf("  per-op wall time in the best step:\n");
    printf("  %-14s %6s %9s %9s %9s %7s\n", "op", "calls", "fwd ms", "bwd ms", "total ms", "share");
    double acc = 0;
    for (int k = 0; k < g_nkind; k++) {
        acc += kf[k] + kb[k];
        printf("  %-14s %6d %9.2f %9.2f %9.2f %6.1f%%\n", g_kind[k].op, kc[k], kf[k] * 1e3, kb[k] * 1e3,
               (kf[k] + kb[k]) * 1e3, 100.0 * (kf[k] + kb[k]) / best);
    }
    printf("  %-14s %6s %9s %9s %9.2f %6.1f%%  (tape walk, lazy grad zeroing, timers)\n", "other", "", "", "",
           (best - acc) * 1e3, 100.0 * (best - acc) / best);
    dt_graph_free(g);
    gpt2_free(&m);
    free(ids); free(pos); free(tgt);
}

int main(int argc, char **argv) {
    dt_blas_fix_core(argv);   /* the GEMM kernel family the CPU supports (ops.h) */
    int iters = argc > 1 ? atoi(argv[1]) : 5;
    if (iters < 1) iters = 1;
    g_threads = omp_get_max_threads();
    printf("bench_ops: OpenMP threads %d, best of %d iterations; times in ms; est = process cpu / threads\n\n",
           g_threads, iters);
    {
        char d[192];
        dt_gemm_describe(d, sizeof d);
        printf("GEMM: %s\n\n", d);
    }
    const char *what = argc > 2 ? argv[2] : "all";   /* all | ops | unfused */
    g_unfused = !strcmp(what, "unfused");
    g_bw = measure_bw(256.0 * 1048576);
    printf("memory bandwidth (scale over 256 MiB, %d threads): %.1f GB/s; memory-bound ops are set against the\n"
           "rate measured the same way at their own footprint (cache-resident data runs faster)\n\n",
           g_threads, g_bw / 1e9);
    double rate = bench_single_ops(iters);
    bench_fused_ops(iters);
    bench_cnn_ops(iters);
    if (strcmp(what, "ops") != 0) bench_step(iters, rate);
    return 0;
}
