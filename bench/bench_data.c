/* bench_data — what a token dataset costs a rank: the time to open it, the
 * rank's own memory (RssAnon) and resident set (VmRSS, peak VmHWM) after
 * opening, and the rate at which batches of random windows are drawn from
 * it (the first pass reads pages from the page cache or disk, the second
 * from pages already mapped). Run one dataset per process: peaks are the
 * process's.
 *
 *   bench_data make DIR SHARDS TOKENS_PER_SHARD   writes llm.c shards (ids < 50257)
 *   bench_data make-text DIR FILES BYTES_PER_FILE writes text files (printable bytes)
 *   bench_data DIR [T=1024] [B=8] [BATCHES=2000] [KIND=shard|text]
 *                                                 opens DIR as KIND and draws */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "dtrain/data.h"
#include "bench_workloads.h"

static long status_kb(const char *field) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    long kb = -1;
    size_t n = strlen(field);
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, field, n) && line[n] == ':' && sscanf(line + n + 1, "%ld", &kb) == 1) break;
    fclose(f);
    return kb;
}

static int make(const char *dir, int shards, long per) {
    if (mkdir(dir, 0755) != 0) { perror(dir); return 1; }
    uint16_t *v = malloc((size_t)per * sizeof *v);
    if (!v) return 1;
    uint64_t x = 88172645463325252ull;
    for (int k = 0; k < shards; k++) {
        for (long i = 0; i < per; i++) {   /* xorshift64 ids in [0, 50257) */
            x ^= x << 13; x ^= x >> 7; x ^= x << 17;
            v[i] = (uint16_t)(x % 50257);
        }
        char path[4096];
        snprintf(path, sizeof path, "%s/train_%06d.bin", dir, k);
        if (dt_token_shard_write(path, v, per) != DT_OK) { fprintf(stderr, "%s\n", dt_error_message()); return 1; }
    }
    free(v);
    printf("wrote %d shards x %ld tokens to %s\n", shards, per, dir);
    return 0;
}

static int make_text(const char *dir, int files, long per) {
    if (mkdir(dir, 0755) != 0) { perror(dir); return 1; }
    char *v = malloc((size_t)per);
    if (!v) return 1;
    uint64_t x = 88172645463325252ull;
    for (int k = 0; k < files; k++) {
        for (long i = 0; i < per; i++) {   /* printable ASCII and newlines */
            x ^= x << 13; x ^= x >> 7; x ^= x << 17;
            v[i] = x % 64 == 0 ? '\n' : (char)(' ' + x % 95);
        }
        char path[4096];
        snprintf(path, sizeof path, "%s/part_%06d.txt", dir, k);
        FILE *f = fopen(path, "wb");
        if (!f || fwrite(v, 1, (size_t)per, f) != (size_t)per || fclose(f) != 0) { perror(path); return 1; }
    }
    free(v);
    printf("wrote %d text files x %ld bytes to %s\n", files, per, dir);
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 5 && !strcmp(argv[1], "make")) return make(argv[2], atoi(argv[3]), atol(argv[4]));
    if (argc >= 5 && !strcmp(argv[1], "make-text")) return make_text(argv[2], atoi(argv[3]), atol(argv[4]));
    if (argc < 2 || argv[1][0] == '-') {
        fprintf(stderr, "usage: bench_data make DIR SHARDS TOKENS_PER_SHARD | make-text DIR FILES BYTES_PER_FILE | "
                "DIR [T] [B] [BATCHES] [shard|text]\n");
        return 2;
    }
    int T = argc > 2 ? atoi(argv[2]) : 1024, B = argc > 3 ? atoi(argv[3]) : 8;
    long batches = argc > 4 ? atol(argv[4]) : 2000;
    const char *kind = argc > 5 ? argv[5] : "shard";
    if (T < 1 || B < 1 || batches < 1) { fprintf(stderr, "T, B and BATCHES must be positive\n"); return 2; }
    long anon0 = status_kb("RssAnon"), rss0 = status_kb("VmRSS");
    double t0 = bench_now();
    dt_dataset d;
    dt_dataset_opts o = {.path = argv[1], .seq = T};
    if (dt_dataset_open(kind, &o, &d) != DT_OK) { fprintf(stderr, "%s\n", dt_error_message()); return 1; }
    double open_s = bench_now() - t0;
    long anon = status_kb("RssAnon") - anon0, rss = status_kb("VmRSS") - rss0;
    int64_t n = d.size[DT_SPLIT_TRAIN];
    printf("open %s (%s): %lld training windows of %d (%.2f G tokens) in %.2f s; rank's own memory +%.1f MiB, "
           "resident +%.1f MiB, peak resident %.1f MiB\n", argv[1], kind, (long long)n, T, (double)n * T / 1e9, open_s,
           anon / 1024.0, rss / 1024.0, status_kb("VmHWM") / 1024.0);
    int32_t *x = malloc((size_t)B * T * sizeof *x), *y = malloc((size_t)B * T * sizeof *y);
    int64_t *idx = malloc((size_t)B * sizeof *idx);
    if (!x || !y || !idx) return 1;
    void *xs[1] = {x};
    for (int pass = 0; pass < 2; pass++) {
        uint64_t r = 0x9E3779B97F4A7C15ull;   /* the same windows both passes */
        long sum = 0;
        t0 = bench_now();
        for (long b = 0; b < batches; b++) {
            for (int i = 0; i < B; i++) {
                r ^= r << 13; r ^= r >> 7; r ^= r << 17;
                idx[i] = (int64_t)(r % (uint64_t)n);
            }
            dt_dataset_batch(&d, DT_SPLIT_TRAIN, idx, B, xs, y);
            sum += y[0];
        }
        double s = bench_now() - t0;
        printf("%s pass: %ld batches of %d x %d in %.3f s: %.1f us/batch, %.1f M tok/s (checksum %ld); own memory "
               "+%.1f MiB, resident +%.1f MiB\n", pass ? "second" : "first", batches, B, T, s, 1e6 * s / batches,
               (double)batches * B * T / s / 1e6, sum, (status_kb("RssAnon") - anon0) / 1024.0,
               (status_kb("VmRSS") - rss0) / 1024.0);
    }
    dt_dataset_close(&d);
    free(x); free(y); free(idx);
    return 0;
}
