/* bench_generate — what the KV cache buys: generating N and 4N tokens.
 *
 *   OMP_NUM_THREADS=1 bench_generate [N] [rounds]     (default N 128, 3 rounds)
 *
 * A GPT-2 of 6 layers, width 384, 6 heads, vocab 256, context 4N + 1
 * (random weights: the cost does not depend on them), greedy from a
 * 1-token prompt. Prints ms (median over rounds) for N and 4N tokens with
 * the KV cache (each token one token's forward: ~4x, plus attention over a
 * longer cache) and without it (a forward over the whole prefix per token:
 * ~16x), and the ratios. The context holds every token, so no refill
 * happens. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "dtrain/generate.h"

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* median ms of `rounds` generations of n tokens */
static double run(dt_model *m, int n, int no_cache, int rounds, int32_t *out) {
    double t[16];
    int32_t prompt = 'a';
    dt_gen_opts o = {.temperature = 0, .no_cache = no_cache};
    for (int r = 0; r < rounds; r++) {
        double t0 = now_ms();
        if (dt_generate(m, &prompt, 1, n, &o, out, NULL, NULL) != DT_OK) {
            fprintf(stderr, "bench_generate: %s\n", dt_error_message());
            exit(1);
        }
        t[r] = now_ms() - t0;
    }
    qsort(t, (size_t)rounds, sizeof *t, cmp);
    return t[rounds / 2];
}

int main(int argc, char **argv) {
    dt_blas_fix_core(argv);   /* the GEMM kernel family the CPU supports (ops.h) */
    int N = argc > 1 ? atoi(argv[1]) : 128, rounds = argc > 2 ? atoi(argv[2]) : 3;
    if (N < 1 || rounds < 1 || rounds > 16) {
        fprintf(stderr, "usage: bench_generate [N >= 1] [rounds 1..16]\n");
        return 2;
    }
    dt_cpu_set_flush_denormal(1);
    dt_model_cfg c = dt_model_cfg_default(DT_MODEL_GPT2);
    c.n_layer = 6; c.n_embd = 384; c.n_head = 6; c.vocab = 256; c.max_t = 4 * N + 1;
    dt_model *m;
    if (dt_model_create(&c, 1, &m) != DT_OK) {
        fprintf(stderr, "bench_generate: %s\n", dt_error_message());
        return 1;
    }
    int32_t *out = malloc(4 * (size_t)N * sizeof *out);
    if (!out) return 1;
    run(m, N, 0, 1, out);   /* warm-up: threads, arena */
    printf("GPT-2 L=%d C=%d H=%d V=%d, greedy, 1-token prompt, median of %d\n", c.n_layer, c.n_embd, c.n_head,
           c.vocab, rounds);
    double kn = run(m, N, 0, rounds, out), k4 = run(m, 4 * N, 0, rounds, out);
    printf("KV cache:      %5d tokens %9.1f ms   %5d tokens %9.1f ms   ratio %.2f\n", N, kn, 4 * N, k4, k4 / kn);
    double fn = run(m, N, 1, rounds, out), f4 = run(m, 4 * N, 1, rounds, out);
    printf("whole prefix:  %5d tokens %9.1f ms   %5d tokens %9.1f ms   ratio %.2f\n", N, fn, 4 * N, f4, f4 / fn);
    printf("KV cache speed-up at %d tokens: %.1fx\n", 4 * N, f4 / k4);
    free(out);
    dt_model_free(m);
    return 0;
}
