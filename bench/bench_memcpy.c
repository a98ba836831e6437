/* bench_memcpy — the yardstick of a background checkpoint's copy: how long
 * copying N bytes of host memory takes on this machine, into a buffer
 * already touched (a reused copy buffer) and into fresh pages (the first
 * save), with 1 thread and with every OpenMP thread (the copy runs while
 * training waits, so its threads are idle). Best of R runs.
 *
 *   bench_memcpy [MiB (default 1424: GPT-2 124M with AdamW)] [R (default 5)] */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void copy(char *dst, const char *src, size_t n, int threads) {
#pragma omp parallel num_threads(threads)
    {
        int t = omp_get_thread_num(), k = omp_get_num_threads();
        size_t per = (n / (size_t)k + 4095) & ~(size_t)4095, at = per * (size_t)t;
        if (at < n) memcpy(dst + at, src + at, at + per > n ? n - at : per);
    }
}

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? strtoul(argv[1], NULL, 10) : 1424;
    int reps = argc > 2 ? atoi(argv[2]) : 5;
    size_t n = mib << 20;
    char *src = malloc(n), *dst = malloc(n);
    if (!src || !dst || reps < 1) { fprintf(stderr, "bench_memcpy: cannot allocate 2 x %zu MiB\n", mib); return 1; }
    memset(src, 1, n);
    int all = omp_get_max_threads();
    printf("| copy of %zu MiB | threads | ms (best of %d) | GB/s |\n|---|---|---|---|\n", mib, reps);
    for (int th = 1; th <= all; th = th == all ? all + 1 : all) {
        double best_fresh = 1e9, best = 1e9;
        for (int r = 0; r < reps; r++) {
            char *fresh = malloc(n);
            if (!fresh) return 1;
            double t0 = now_s();
            copy(fresh, src, n, th);
            double t1 = now_s();
            free(fresh);
            if (t1 - t0 < best_fresh) best_fresh = t1 - t0;
            t0 = now_s();
            copy(dst, src, n, th);
            t1 = now_s();
            if (t1 - t0 < best) best = t1 - t0;
        }
        printf("| into a reused buffer | %d | %.0f | %.1f |\n", th, best * 1e3, (double)n / best / 1e9);
        printf("| into fresh pages | %d | %.0f | %.1f |\n", th, best_fresh * 1e3, (double)n / best_fresh / 1e9);
    }
    free(src);
    free(dst);
    return 0;
}
