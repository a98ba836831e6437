/* bench_workloads.h — the shared benchmark workloads W1–W3
 * (../shared/WORKLOADS.md) and a fixed random batch, for every bench program.
 * Header-only: every bench .c file is its own executable. */
#ifndef DTRAIN_BENCH_WORKLOADS_H
#define DTRAIN_BENCH_WORKLOADS_H
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "dtrain/nn.h"

/* Wall clock, and the best-of-10 rate of cblas_sgemm on [M, K] x [K, N]: the
 * GEMM rate every bench quotes from the same run. */
static inline double bench_now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }

/* GFLOP/s of C[M, N] = A[M, K] · B[K, N], best of 10: through cblas_sgemm
 * (the reference WORKLOADS.md defines), or through dt_sgemm (the library
 * dtrain's GEMMs use, which may be oneDNN). */
static inline double bench_gemm_gflops(int M, int K, int N, int through_dtrain) {
    float *A = malloc(sizeof(float) * (size_t)M * K), *B = malloc(sizeof(float) * (size_t)K * N),
          *C = calloc((size_t)M * N, sizeof(float));
    for (size_t i = 0; i < (size_t)M * K; i++) A[i] = (float)(i % 13) / 13.f - .5f;
    for (size_t i = 0; i < (size_t)K * N; i++) B[i] = (float)(i % 11) / 11.f - .5f;
    double best = 1e30;
    for (int r = -1; r < 10; r++) {   /* r = -1: warm-up */
        double t0 = bench_now();
        if (through_dtrain) dt_sgemm(0, 0, M, N, K, 1.f, A, K, B, N, 0.f, C, N);
        else cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, K, 1.f, A, K, B, N, 0.f, C, N);
        double t = bench_now() - t0;
        if (r >= 0 && t < best) best = t;
    }
    free(A); free(B); free(C);
    return 2.0 * M * N * K / best / 1e9;
}

static inline double bench_sgemm_gflops(int M, int K, int N) { return bench_gemm_gflops(M, K, N, 0); }

/* The GEMM backend line every bench prints: which library and kernel family ran.
 * Each bench calls dt_blas_fix_core(argv) first, as the CLI does. */
static inline void bench_print_gemm(void) {
    char d[192];
    dt_gemm_describe(d, sizeof d);
    printf("GEMM: %s\n", d);
}

typedef struct bench_workload {
    dt_model_cfg cfg;
    int64_t B, T;        /* per-rank batch; T = 1 for the MLP */
    int gm, gk, gn;      /* largest GEMM of a step: [gm, gk] x [gk, gn] */
} bench_workload;

/* 0 and *w filled for "W1" | "W2" | "W3" | "CNN", else -1. */
static inline int bench_workload_get(const char *name, bench_workload *w) {
    memset(w, 0, sizeof *w);
    if (!strcmp(name, "W1")) {   /* GPT-2 small-ish, byte-level: 10.84M params */
        w->cfg = dt_model_cfg_default(DT_MODEL_GPT2);
        w->cfg.n_layer = 6; w->cfg.n_embd = 384; w->cfg.n_head = 6; w->cfg.vocab = 256; w->cfg.max_t = 256;
        w->B = 8; w->T = 256; w->gm = 2048; w->gk = 384; w->gn = 1536;
    } else if (!strcmp(name, "W2")) {   /* GPT-2 124M */
        w->cfg = dt_model_cfg_default(DT_MODEL_GPT2);
        w->cfg.n_layer = 12; w->cfg.n_embd = 768; w->cfg.n_head = 12; w->cfg.vocab = 50257; w->cfg.max_t = 1024;
        w->B = 4; w->T = 64; w->gm = 256; w->gk = 768; w->gn = 3072;
    } else if (!strcmp(name, "W3")) {   /* MLP 784 -> 4x2048 -> 10: 14.2M params, comm-heavy */
        w->cfg = dt_model_cfg_default(DT_MODEL_MLP);
        w->cfg.mlp_in = 784; w->cfg.mlp_out = 10; w->cfg.mlp_n_hidden = 4;
        for (int i = 0; i < 4; i++) w->cfg.mlp_hidden[i] = 2048;
        w->B = 64; w->T = 1; w->gm = 64; w->gk = 2048; w->gn = 2048;
    } else if (!strcmp(name, "CNN")) {   /* the README demo's model: 455k params, conv-bound */
        w->cfg = dt_model_cfg_default(DT_MODEL_CNN);
        /* reference GEMM 1024^3: oneDNN's convolutions outrun OpenBLAS on the
         * convs' own GEMM shapes (conv2 as [12544, 800] x [800, 64]), so the
         * rate of a large square GEMM is the stricter yardstick */
        w->B = 64; w->T = 1; w->gm = 1024; w->gk = 1024; w->gn = 1024;
    } else {
        return -1;
    }
    return 0;
}

/* This process's peak resident set (VmHWM) in MiB; 0 where /proc is absent.
 * One process per rank, so run one mode per process to compare it. */
static inline double bench_peak_rss_mib(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    double kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmHWM:", 6)) kb = atof(line + 6);
    if (f) fclose(f);
    return kb / 1024.0;
}

/* One random batch (seeded per rank), reused every step; free with
 * bench_batch_free. Token ids and labels uniform, images standard normal. */
static inline dt_batch bench_batch_make(const bench_workload *w, int rank) {
    const dt_model_cfg *c = &w->cfg;
    dt_rng r;
    dt_rng_seed(&r, 42 + (uint64_t)rank);
    int64_t n = w->B * w->T;
    int32_t *y = malloc(sizeof(int32_t) * (size_t)n);
    int classes = c->kind == DT_MODEL_GPT2 ? c->vocab : c->kind == DT_MODEL_CNN ? c->cnn_classes : c->mlp_out;
    for (int64_t i = 0; i < n; i++) y[i] = (int32_t)dt_rng_below(&r, (uint64_t)classes);
    dt_batch b = {.B = w->B, .T = w->T, .y = y};
    if (c->kind == DT_MODEL_GPT2) {
        int32_t *ids = malloc(sizeof(int32_t) * (size_t)n);
        for (int64_t i = 0; i < n; i++) ids[i] = (int32_t)dt_rng_below(&r, (uint64_t)c->vocab);
        dt_batch_add_input(&b, "ids", DT_I32, 2, (int64_t[]){w->B, w->T}, ids);
    } else if (c->kind == DT_MODEL_CNN) {
        float *img = malloc(sizeof(float) * (size_t)(w->B * 784));
        for (int64_t i = 0; i < w->B * 784; i++) img[i] = dt_rng_normal(&r);
        dt_batch_add_input(&b, "image", DT_F32, 4, (int64_t[]){w->B, 1, 28, 28}, img);
    } else {
        float *img = malloc(sizeof(float) * (size_t)(w->B * c->mlp_in));
        for (int64_t i = 0; i < w->B * c->mlp_in; i++) img[i] = dt_rng_normal(&r);
        dt_batch_add_input(&b, "image", DT_F32, 2, (int64_t[]){w->B, c->mlp_in}, img);
    }
    return b;
}

static inline void bench_batch_free(dt_batch *b) {
    free((void *)b->y);
    for (int k = 0; k < b->n_inputs; k++) free(b->in[k].data);
}
#endif
