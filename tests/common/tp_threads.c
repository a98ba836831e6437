/* tp_threads.h: T threads, one barrier, buffers published by pointer. */
#include "tp_threads.h"
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct group {
    int T;
    pthread_barrier_t bar;
    float *buf[TP_THREADS_MAX];
    const float *in[TP_THREADS_MAX];
} group;

typedef struct member {
    group *g;
    dt_tp_comm comm;
    tp_thread_fn fn;
    void *arg;
} member;

/* publish, combine in rank order into a private copy, wait, write back */
static dt_status combine(void *ctx, float *buf, int64_t n, int max) {
    member *me = ctx;
    group *g = me->g;
    float *out = malloc((size_t)n * sizeof *out + 1);
    g->buf[me->comm.rank] = buf;
    pthread_barrier_wait(&g->bar);
    for (int64_t i = 0; out && i < n; i++) {
        float v = g->buf[0][i];
        for (int r = 1; r < g->T; r++) v = max ? (g->buf[r][i] > v ? g->buf[r][i] : v) : v + g->buf[r][i];
        out[i] = v;
    }
    pthread_barrier_wait(&g->bar);   /* every rank has read every buffer */
    if (out) memcpy(buf, out, (size_t)n * sizeof *out);
    free(out);
    return out ? DT_OK : DT_ERR(DT_ENOMEM, "tp_threads: out of memory");
}
static dt_status sum(void *ctx, float *buf, int64_t n) { return combine(ctx, buf, n, 0); }
static dt_status max(void *ctx, float *buf, int64_t n) { return combine(ctx, buf, n, 1); }

/* Sequence parallelism's [rows, T, n] collectives: publish in, read every
 * rank's, wait until all have read. reduce_scatter sums in rank order. */
static dt_status seq_coll(void *ctx, const float *in, float *out, int64_t n, int64_t rows, int gather) {
    member *me = ctx;
    group *g = me->g;
    int T = g->T, r = me->comm.rank;
    g->in[r] = in;
    pthread_barrier_wait(&g->bar);
    for (int64_t j = 0; j < rows; j++) {
        if (gather) {
            for (int k = 0; k < T; k++)
                memcpy(out + (j * T + k) * n, g->in[k] + j * n, (size_t)n * sizeof *out);
            continue;
        }
        for (int64_t i = 0; i < n; i++) {
            float v = g->in[0][(j * T + r) * n + i];
            for (int k = 1; k < T; k++) v += g->in[k][(j * T + r) * n + i];
            out[j * n + i] = v;
        }
    }
    pthread_barrier_wait(&g->bar);
    return DT_OK;
}
static dt_status allgather(void *ctx, const float *in, float *out, int64_t n, int64_t rows) {
    return seq_coll(ctx, in, out, n, rows, 1);
}
static dt_status reduce_scatter(void *ctx, const float *in, float *out, int64_t n, int64_t rows) {
    return seq_coll(ctx, in, out, n, rows, 0);
}

static void *run_one(void *p) {
    member *me = p;
    me->fn(&me->comm, me->arg);
    return NULL;
}

int tp_threads_run(int T, tp_thread_fn fn, void *args, size_t arg_size) {
    if (T < 1 || T > TP_THREADS_MAX) return -1;
    group g = {.T = T};
    member m[TP_THREADS_MAX];
    pthread_t th[TP_THREADS_MAX];
    if (pthread_barrier_init(&g.bar, NULL, (unsigned)T)) return -1;
    int started = 0, rc = 0;
    for (int r = 0; r < T; r++) {
        m[r] = (member){.g = &g, .fn = fn, .arg = (char *)args + (size_t)r * arg_size,
                        .comm = {.rank = r, .size = T, .allreduce_sum = sum, .allreduce_max = max,
                                 .allgather = allgather, .reduce_scatter = reduce_scatter}};
        m[r].comm.ctx = &m[r];
    }
    for (; started < T; started++)
        if (pthread_create(&th[started], NULL, run_one, &m[started])) { rc = -1; break; }
    for (int r = 0; r < started; r++) pthread_join(th[r], NULL);
    pthread_barrier_destroy(&g.bar);
    return rc;
}
