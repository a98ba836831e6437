/* bench_gemm_bf16 — do 16-bit GEMMs pay on this CPU? (issue 29)
 *
 * For the GEMMs of one W1 or W2 training step (../shared/WORKLOADS.md), as
 * dtrain's Linear calls them (src/ops/linear.c, weights [in, out], the tied
 * lm-head [V, C]):
 *   fwd  y  = x · W         NN  [N, in]  x [in, out]
 *   dX   dx = dy · Wᵀ       NT  [N, out] x [out, in]
 *   dW   dw = xᵀ · dy       TN  [in, N]  x [N, out]
 * for qkv, attn proj, fc, fc proj (each n_layer times) and the lm-head, plus
 * attention's batched QKᵀ and P·V shapes ([B·H] products of T×hs×T and
 * T×T×hs; dtrain's attention has its own kernel, so these rows are for
 * reference only), it times, alternately in every round:
 *   blas   OpenBLAS cblas_sgemm, f32 (a loop over the batch for attention)
 *   dnnl   oneDNN matmul f32 (plain strided layouts, as dtrain holds them)
 *   bf16   oneDNN matmul, bf16 A and B, f32 C (f32 accumulation)
 *   bf16p  the same with B reordered once into the layout the primitive
 *          asks for (format_tag any), outside the timing
 *   cvtA / cvtB  f32 -> bf16 of each operand (round to nearest even, one
 *          OpenMP-parallel vectorizable loop), the price of autocast when an
 *          operand is not already held in bf16
 * and prints best and median GFLOP/s, the implementation oneDNN chose for
 * each case (dnnl_query_impl_info_str, e.g. brg:avx512_core_amx), and the
 * relative Frobenius error of each oneDNN result against OpenBLAS f32.
 *
 * Threads: OMP_NUM_THREADS (run the program once per count). AMX: Linux
 * makes a process ask for the XTILEDATA state (arch_prctl
 * ARCH_REQ_XCOMP_PERM) before it executes a tile instruction; the program
 * prints the permission before and after oneDNN's first primitive, and
 * --xtile asks for it itself before the first oneDNN call.
 *
 * usage: bench_gemm_bf16 [W1|W2] [--rounds R] [--xtile] [--only SUBSTR]
 */
#define _GNU_SOURCE
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <oneapi/dnnl/dnnl.h>
#include "dtrain/ops.h"
#include "bench_workloads.h"

#define ARCH_GET_XCOMP_PERM 0x1022
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

#define CHECK(x)                                                                     \
    do {                                                                             \
        dnnl_status_t s_ = (x);                                                      \
        if (s_ != dnnl_success) {                                                    \
            fprintf(stderr, "%s:%d: %s -> %d\n", __FILE__, __LINE__, #x, (int)s_); \
            exit(1);                                                                 \
        }                                                                            \
    } while (0)

typedef struct gcase {
    char name[32];
    int ta, tb;         /* A stored [K, M] / B stored [N, K] */
    int64_t M, N, K;    /* C[M, N] = op(A)[M, K] · op(B)[K, N] */
    int64_t batch;      /* > 1: batched (attention) */
    int mult;           /* times per training step */
    int linear;         /* 1: a Linear's GEMM (counted in the step total) */
    int cvt;            /* operands an autocast step converts here: 1 A, 2 B */
} gcase;

static int n_cases;
static gcase cases[64];

static void add(const char *name, int ta, int tb, int64_t M, int64_t N, int64_t K, int64_t batch, int mult,
                int linear, int cvt) {
    gcase *c = &cases[n_cases++];
    snprintf(c->name, sizeof c->name, "%s", name);
    c->ta = ta; c->tb = tb; c->M = M; c->N = N; c->K = K; c->batch = batch; c->mult = mult; c->linear = linear;
    c->cvt = cvt;
}

/* the three GEMMs of a Linear x[N, in] · W[in, out], n times a step. The
 * conversions an autocast step pays (cvt): x and the working copy of W once
 * in fwd, dy once in dX; dW reuses both (x kept in bf16 for backward). */
static void add_linear(const char *name, int64_t N, int64_t in, int64_t out, int n) {
    char b[32];
    snprintf(b, sizeof b, "%s fwd", name);
    add(b, 0, 0, N, out, in, 1, n, 1, 3);
    snprintf(b, sizeof b, "%s dX", name);
    add(b, 0, 1, N, in, out, 1, n, 1, 1);
    snprintf(b, sizeof b, "%s dW", name);
    add(b, 1, 0, in, out, N, 1, n, 1, 0);
}

/* the shapes as dtrain holds them (bench_workloads.h; W2's vocabulary is
 * 50257, not padded) */
static void workload(const char *name) {
    bench_workload w;
    if (bench_workload_get(name, &w) || w.cfg.kind != DT_MODEL_GPT2) {
        fprintf(stderr, "workload: W1 or W2\n");
        exit(2);
    }
    int64_t B = w.B, T = w.T, C = w.cfg.n_embd, L = w.cfg.n_layer, H = w.cfg.n_head, V = w.cfg.vocab;
    int64_t N = B * T, hs = C / H;
    add_linear("qkv", N, C, 3 * C, (int)L);
    add_linear("attn proj", N, C, C, (int)L);
    add_linear("fc", N, C, 4 * C, (int)L);
    add_linear("fc proj", N, 4 * C, C, (int)L);
    /* tied lm-head, weight wte[V, C]: y = x · wteᵀ, dx = dy · wte, dwte = dyᵀ · x */
    add("lm-head fwd", 0, 1, N, V, C, 1, 1, 1, 3);
    add("lm-head dX", 0, 0, N, C, V, 1, 1, 1, 1);
    add("lm-head dW", 1, 0, V, C, N, 1, 1, 1, 0);
    /* attention per (b, h): S = Q·Kᵀ (and dP = dO·Vᵀ), O = P·V (and dV, dQ,
     * dK); both operands converted every time (conservative) */
    add("att QK^T", 0, 1, T, T, hs, B * H, 2 * (int)L, 0, 3);
    add("att PV", 0, 0, T, hs, T, B * H, 4 * (int)L, 0, 3);
}

/* f32 -> bf16, round to nearest even (NaN not special-cased: benchmark data) */
static void to_bf16(const float *restrict x, uint16_t *restrict y, size_t n) {
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &x[i], sizeof u);
        u += 0x7fffu + ((u >> 16) & 1u);
        y[i] = (uint16_t)(u >> 16);
    }
}

static dnnl_engine_t eng;
static dnnl_stream_t strm;

/* md of op(X)[R, S] (batched), stored transposed when t */
static void md_of(dnnl_memory_desc_t *md, int64_t batch, int64_t R, int64_t S, int t, dnnl_data_type_t dt) {
    if (batch > 1) {
        dnnl_dims_t d = {batch, R, S}, st = {R * S, t ? 1 : S, t ? R : 1};
        CHECK(dnnl_memory_desc_init_by_strides(md, 3, d, dt, st));
    } else {
        dnnl_dims_t d = {R, S}, st = {t ? 1 : S, t ? R : 1};
        CHECK(dnnl_memory_desc_init_by_strides(md, 2, d, dt, st));
    }
}

typedef struct mm {
    dnnl_primitive_t p;
    dnnl_primitive_desc_t pd;   /* owns impl */
    dnnl_memory_t a, b, c;
    const char *impl;
} mm;

static void mm_make(mm *m, const gcase *g, dnnl_data_type_t dt, int packed, void *A, void *B, float *C) {
    dnnl_memory_desc_t amd, bmd, cmd, bany;
    md_of(&amd, g->batch, g->M, g->K, g->ta, dt);
    md_of(&bmd, g->batch, g->K, g->N, g->tb, dt);
    md_of(&cmd, g->batch, g->M, g->N, 0, dnnl_f32);
    if (packed) {
        if (g->batch > 1) {
            dnnl_dims_t d = {g->batch, g->K, g->N};
            CHECK(dnnl_memory_desc_init_by_tag(&bany, 3, d, dt, dnnl_format_tag_any));
        } else {
            dnnl_dims_t d = {g->K, g->N};
            CHECK(dnnl_memory_desc_init_by_tag(&bany, 2, d, dt, dnnl_format_tag_any));
        }
    }
    dnnl_matmul_desc_t desc;
    CHECK(dnnl_matmul_desc_init(&desc, &amd, packed ? &bany : &bmd, NULL, &cmd));
    dnnl_primitive_desc_t pd;
    CHECK(dnnl_primitive_desc_create(&pd, &desc, NULL, eng, NULL));
    CHECK(dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &m->impl));
    CHECK(dnnl_primitive_create(&m->p, pd));
    CHECK(dnnl_memory_create(&m->a, &amd, eng, A));
    CHECK(dnnl_memory_create(&m->c, &cmd, eng, C));
    if (packed) {   /* reorder plain B into the primitive's layout, once */
        const dnnl_memory_desc_t *wmd = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
        dnnl_memory_t plain;
        CHECK(dnnl_memory_create(&plain, &bmd, eng, B));
        CHECK(dnnl_memory_create(&m->b, wmd, eng, DNNL_MEMORY_ALLOCATE));
        dnnl_primitive_desc_t rpd;
        dnnl_primitive_t r;
        CHECK(dnnl_reorder_primitive_desc_create(&rpd, &bmd, eng, wmd, eng, NULL));
        CHECK(dnnl_primitive_create(&r, rpd));
        dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, plain}, {DNNL_ARG_TO, m->b}};
        CHECK(dnnl_primitive_execute(r, strm, 2, args));
        CHECK(dnnl_stream_wait(strm));
        dnnl_primitive_destroy(r);
        dnnl_primitive_desc_destroy(rpd);
        dnnl_memory_destroy(plain);
    } else {
        CHECK(dnnl_memory_create(&m->b, &bmd, eng, B));
    }
    m->pd = pd;
}

static void mm_run(const mm *m) {
    dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, m->a}, {DNNL_ARG_WEIGHTS, m->b}, {DNNL_ARG_DST, m->c}};
    CHECK(dnnl_primitive_execute(m->p, strm, 3, args));
    CHECK(dnnl_stream_wait(strm));
}

static void blas_run(const gcase *g, const float *A, const float *B, float *C) {
    int lda = (int)(g->ta ? g->M : g->K), ldb = (int)(g->tb ? g->K : g->N);
    for (int64_t i = 0; i < g->batch; i++)
        cblas_sgemm(CblasRowMajor, g->ta ? CblasTrans : CblasNoTrans, g->tb ? CblasTrans : CblasNoTrans, (int)g->M,
                    (int)g->N, (int)g->K, 1.f, A + i * g->M * g->K, lda, B + i * g->K * g->N, ldb, 0.f,
                    C + i * g->M * g->N, (int)g->N);
}

static double rel_err(const float *x, const float *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)x[i] - (double)ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static unsigned long xcomp_perm(void) {
    unsigned long bits = 0;
    if (syscall(SYS_arch_prctl, ARCH_GET_XCOMP_PERM, &bits)) return 0;
    return bits;
}

enum { V_BLAS, V_DNNL, V_BF16, V_BF16P, V_CVTA, V_CVTB, NV };

int main(int argc, char **argv) {
    dt_blas_fix_core(argv);   /* OpenBLAS's kernels for this CPU, as the CLI does */
    const char *w = "W1", *only = NULL;
    int rounds = 7, xtile = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--rounds") && i + 1 < argc) rounds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--xtile")) xtile = 1;
        else if (!strcmp(argv[i], "--only") && i + 1 < argc) only = argv[++i];
        else w = argv[i];
    }
    if (rounds < 1) rounds = 1;
    workload(w);

    unsigned long perm0 = xcomp_perm();
    if (xtile) {
        long r = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA);
        printf("--xtile: arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA) = %ld; XCOMP permission bits %#lx -> %#lx\n", r,
               perm0, xcomp_perm());
        perm0 = xcomp_perm();
    }
    const dnnl_version_t *v = dnnl_version();
    CHECK(dnnl_engine_create(&eng, dnnl_cpu, 0));
    CHECK(dnnl_stream_create(&strm, eng, dnnl_stream_default_flags));
    unsigned isa = (unsigned)dnnl_get_effective_cpu_isa();
    printf("workload %s, %d threads, %d rounds; oneDNN %d.%d.%d (%.8s), effective ISA 0x%x (%s)\n", w,
           omp_get_max_threads(), rounds, v->major, v->minor, v->patch, v->hash, isa,
           (isa & dnnl_cpu_isa_avx512_core_amx) == dnnl_cpu_isa_avx512_core_amx     ? "avx512_core_amx"
           : (isa & dnnl_cpu_isa_avx512_core_bf16) == dnnl_cpu_isa_avx512_core_bf16 ? "avx512_core_bf16"
                                                                                     : "below avx512_core_bf16");
    printf("OpenBLAS: %s\n", openblas_get_config());
    int first = 1;

    /* step totals in ms, [0] from medians, [1] from bests; Linear GEMMs and attention apart */
    double tot[2][2][NV] = {{{0}}}, pol[2][2] = {{0}};
    printf("%-16s %5s %5s %5s %4s %3s | %7s %7s %7s %7s | %6s %6s | %9s %9s | %s\n", "case", "M", "N", "K", "bat", "x",
           "blas", "dnnl", "bf16", "bf16p", "cvtA", "cvtB", "err_bf16", "err_dnnl", "impl f32 / bf16 / bf16p");
    printf("%-16s %5s %5s %5s %4s %3s | %31s | %13s |\n", "", "", "", "", "", "", "GFLOP/s best (median)",
           "ms best");
    for (int ci = 0; ci < n_cases; ci++) {
        gcase *g = &cases[ci];
        if (only && !strstr(g->name, only)) continue;
        size_t na = (size_t)(g->batch * g->M * g->K), nb = (size_t)(g->batch * g->K * g->N),
               nc = (size_t)(g->batch * g->M * g->N);
        float *A = malloc(na * sizeof *A), *B = malloc(nb * sizeof *B);
        float *Cref = calloc(nc, sizeof(float)), *Cd = calloc(nc, sizeof(float)), *Cb = calloc(nc, sizeof(float)),
              *Cp = calloc(nc, sizeof(float));
        uint16_t *Ah = malloc(na * sizeof *Ah), *Bh = malloc(nb * sizeof *Bh);
        srand(1234 + ci);
        for (size_t i = 0; i < na; i++) A[i] = (float)rand() / (float)RAND_MAX * 2.f - 1.f;
        for (size_t i = 0; i < nb; i++) B[i] = (float)rand() / (float)RAND_MAX * 2.f - 1.f;
        to_bf16(A, Ah, na);
        to_bf16(B, Bh, nb);
        mm f, h, hp;
        mm_make(&f, g, dnnl_f32, 0, A, B, Cd);
        if (first) {
            printf("XCOMP permission bits: %#lx before any oneDNN call, %#lx after its first primitive (XTILEDATA = bit 18)\n",
                   perm0, xcomp_perm());
        }
        mm_make(&h, g, dnnl_bf16, 0, Ah, Bh, Cb);
        mm_make(&hp, g, dnnl_bf16, 1, Ah, Bh, Cp);
        if (first) {
            printf("XCOMP permission bits after the first bf16 primitives: %#lx\n", xcomp_perm());
            first = 0;
        }
        /* warm-up, which also gives the results compared */
        double t0 = bench_now();
        blas_run(g, A, B, Cref);
        double t1 = bench_now() - t0;
        mm_run(&f); mm_run(&h); mm_run(&hp);
        double e_b = rel_err(Cb, Cref, nc), e_p = rel_err(Cp, Cref, nc), e_d = rel_err(Cd, Cref, nc);
        t0 = bench_now();
        blas_run(g, A, B, Cref);
        t1 = bench_now() - t0;
        int inner = (int)ceil(0.010 / (t1 > 1e-7 ? t1 : 1e-7));   /* a sample >= ~10 ms */
        if (inner < 1) inner = 1;
        if (inner > 2000) inner = 2000;
        double *ts = malloc(sizeof(double) * NV * (size_t)rounds);
        for (int r = 0; r < rounds; r++) {
            for (int k = 0; k < NV; k++) {
                int vv = (k + r) % NV;   /* rotate the order every round */
                double s = bench_now();
                for (int it = 0; it < inner; it++) {
                    switch (vv) {
                    case V_BLAS: blas_run(g, A, B, Cref); break;
                    case V_DNNL: mm_run(&f); break;
                    case V_BF16: mm_run(&h); break;
                    case V_BF16P: mm_run(&hp); break;
                    case V_CVTA: to_bf16(A, Ah, na); break;
                    case V_CVTB: to_bf16(B, Bh, nb); break;
                    }
                }
                ts[vv * rounds + r] = (bench_now() - s) / inner;
            }
        }
        double best[NV], med[NV];
        for (int k = 0; k < NV; k++) {
            double *x = ts + k * rounds;
            qsort(x, (size_t)rounds, sizeof *x, cmp_d);
            best[k] = x[0];
            med[k] = rounds % 2 ? x[rounds / 2] : 0.5 * (x[rounds / 2 - 1] + x[rounds / 2]);
            tot[0][!g->linear][k] += 1e3 * g->mult * med[k];
            tot[1][!g->linear][k] += 1e3 * g->mult * best[k];
        }
        pol[0][!g->linear] += 1e3 * g->mult * ((g->cvt & 1 ? med[V_CVTA] : 0) + (g->cvt & 2 ? med[V_CVTB] : 0));
        pol[1][!g->linear] += 1e3 * g->mult * ((g->cvt & 1 ? best[V_CVTA] : 0) + (g->cvt & 2 ? best[V_CVTB] : 0));
        double fl = 2.0 * (double)g->M * (double)g->N * (double)g->K * (double)g->batch / 1e9;
        printf("%-16s %5lld %5lld %5lld %4lld %3d | %7.1f %7.1f %7.1f %7.1f | %6.3f %6.3f | %9.2e %9.2e | %s / %s / %s\n",
               g->name, (long long)g->M, (long long)g->N, (long long)g->K, (long long)g->batch, g->mult,
               fl / best[V_BLAS], fl / best[V_DNNL], fl / best[V_BF16], fl / best[V_BF16P], 1e3 * best[V_CVTA],
               1e3 * best[V_CVTB], e_b, e_d, f.impl, h.impl, hp.impl);
        printf("%-16s %5s %5s %5s %4s %3s | %7.1f %7.1f %7.1f %7.1f | %6.3f %6.3f | %9.2e %9s | median; bf16p err\n",
               "", "", "", "", "", "", fl / med[V_BLAS], fl / med[V_DNNL], fl / med[V_BF16], fl / med[V_BF16P],
               1e3 * med[V_CVTA], 1e3 * med[V_CVTB], e_p, "");
        for (int b = 1; b >= 0; b--) {
            const double *x = b ? best : med;
            double f32 = x[V_BLAS] < x[V_DNNL] ? x[V_BLAS] : x[V_DNNL];
            double cv = (g->cvt & 1 ? x[V_CVTA] : 0) + (g->cvt & 2 ? x[V_CVTB] : 0);
            printf("%-16s speed-up f32 (faster of blas, dnnl) / bf16 plain, %s: GEMM only %.2fx, + autocast's "
                   "conversions (%s) %.2fx, + both operands %.2fx\n",
                   "", b ? "best" : "median", f32 / x[V_BF16], g->cvt == 3 ? "A,B" : g->cvt == 1 ? "A" : "none",
                   f32 / (x[V_BF16] + cv), f32 / (x[V_BF16] + x[V_CVTA] + x[V_CVTB]));
        }
        fflush(stdout);
        free(ts);
        free(A); free(B); free(Cref); free(Cd); free(Cb); free(Cp); free(Ah); free(Bh);
        dnnl_primitive_destroy(f.p); dnnl_primitive_destroy(h.p); dnnl_primitive_destroy(hp.p);
        dnnl_primitive_desc_destroy(f.pd); dnnl_primitive_desc_destroy(h.pd); dnnl_primitive_desc_destroy(hp.pd);
        dnnl_memory_destroy(f.a); dnnl_memory_destroy(f.b); dnnl_memory_destroy(f.c);
        dnnl_memory_destroy(h.a); dnnl_memory_destroy(h.b); dnnl_memory_destroy(h.c);
        dnnl_memory_destroy(hp.a); dnnl_memory_destroy(hp.b); dnnl_memory_destroy(hp.c);
    }
    for (int b = 1; b >= 0; b--)
        for (int a = 0; a < 2; a++) {
            const double *x = tot[b][a];
            printf("STEP %s %-9s ms/step: blas %7.1f  dnnl %7.1f  bf16 %7.1f  bf16p %7.1f | autocast cvt %6.1f, "
                   "all-operand cvt %6.1f | f32 blas / (bf16 + autocast cvt) %.2fx\n",
                   b ? "best  " : "median", a ? "attention" : "Linear", x[V_BLAS], x[V_DNNL], x[V_BF16], x[V_BF16P],
                   pol[b][a], x[V_CVTA] + x[V_CVTB], x[V_BLAS] / (x[V_BF16] + pol[b][a]));
        }
    dnnl_stream_destroy(strm);
    dnnl_engine_destroy(eng);
    return 0;
}
