/* The model's tensor-parallel collectives: a blocking float32 sum (and max,
 * and sequence parallelism's all-gather / reduce-scatter) over the TP group
 * (dt_tp_comm, ops.h), counted for benchmarks. On one machine the
 * sum is dt_allreduce_node: every rank adds the T parts in rank order, the
 * same bits on every rank by construction (the invariant of tp_internal.h).
 * Through MPI (DTRAIN_TP_ALLREDUCE=mpi, or a group across machines, which
 * setup refuses) a sum of two ranks is a + b on both; for more, Open MPI's
 * algorithms combine the same operands on every rank. The all-gather and
 * reduce-scatter go through MPI (each rank's result is its own). */
#include <stdlib.h>
#include <string.h>
#include "tp_internal.h"

static dt_status tp_allreduce_sum(void *ctx, float *buf, int64_t n) {
    dt_tp *s = ctx;
    dt_work *w = NULL;
    DT_TRY(s->node ? dt_allreduce_node(s->tp_pg, buf, buf, n, DT_RED_SUM, &w)
                   : dt_allreduce(s->tp_pg, buf, buf, n, DT_F32, DT_RED_SUM, &w));
    s->stats.calls++;
    s->stats.bytes += (size_t)n * sizeof(float);
    return dt_work_wait(w);
}

/* The vocabulary-parallel loss and accuracy (n = rows of a micro-batch, small):
 * an all-gather of every rank's n floats, then the maximum here; exact, so
 * the same bits on every rank. */
static dt_status tp_allreduce_max(void *ctx, float *buf, int64_t n) {
    dt_tp *s = ctx;
    float *all = malloc((size_t)n * (size_t)s->T * sizeof *all + 1);
    if (!all) return DT_ERR(DT_ENOMEM, "tp: out of memory for the maximum of %lld floats", (long long)n);
    dt_work *w = NULL;
    dt_status st = dt_allgather(s->tp_pg, buf, all, n, DT_F32, &w);
    if (st == DT_OK) st = dt_work_wait(w);
    for (int k = 0; st == DT_OK && k < s->T; k++) {
        const float *part = all + (size_t)k * (size_t)n;
        for (int64_t i = 0; i < n; i++) buf[i] = part[i] > buf[i] ? part[i] : buf[i];
    }
    free(all);
    s->stats.calls++;
    s->stats.bytes += (size_t)n * (size_t)s->T * sizeof(float);
    return st;
}

/* Sequence parallelism's collectives (ops.h: the [rows, size, n] view).
 * MPI concatenates by rank, [size, rows, n]; for rows > 1 the data goes
 * through s->stage (grown on demand, kept: one whole activation's floats,
 * outside the graph's arena) and is reordered here. rows == 1 needs no
 * reorder and no stage. */
static float *stage_of(dt_tp *s, size_t n) {
    if (n > s->stage_n) {
        float *p = realloc(s->stage, n * sizeof *p);
        if (!p) { DT_ERR(DT_ENOMEM, "tp: out of memory for a staging buffer of %zu floats", n); return NULL; }
        s->stage = p;
        s->stage_n = n;
    }
    return s->stage;
}

static dt_status tp_allgather(void *ctx, const float *in, float *out, int64_t n, int64_t rows) {
    dt_tp *s = ctx;
    int T = s->T;
    size_t total = (size_t)n * (size_t)rows * (size_t)T;
    float *dst = rows == 1 ? out : stage_of(s, total);
    if (!dst) return dt_error_code();
    dt_work *w = NULL;
    DT_TRY(dt_allgather(s->tp_pg, in, dst, n * rows, DT_F32, &w));
    DT_TRY(dt_work_wait(w));
    for (int64_t j = 0; rows > 1 && j < rows; j++)   /* [T, rows, n] -> [rows, T, n] */
        for (int r = 0; r < T; r++)
            memcpy(out + ((size_t)j * (size_t)T + (size_t)r) * (size_t)n,
                   dst + ((size_t)r * (size_t)rows + (size_t)j) * (size_t)n, (size_t)n * sizeof *out);
    s->stats.calls++;
    s->stats.bytes += total * sizeof(float) / 2;   /* half an all-reduce of the whole tensor (parallel.h) */
    return DT_OK;
}

static dt_status tp_reduce_scatter(void *ctx, const float *in, float *out, int64_t n, int64_t rows) {
    dt_tp *s = ctx;
    int T = s->T;
    size_t total = (size_t)n * (size_t)rows * (size_t)T;
    float *stage = rows == 1 ? NULL : stage_of(s, total);
    if (rows > 1 && !stage) return dt_error_code();
    for (int64_t j = 0; rows > 1 && j < rows; j++)   /* [rows, T, n] -> [T, rows, n] */
        for (int r = 0; r < T; r++)
            memcpy(stage + ((size_t)r * (size_t)rows + (size_t)j) * (size_t)n,
                   in + ((size_t)j * (size_t)T + (size_t)r) * (size_t)n, (size_t)n * sizeof *out);
    dt_work *w = NULL;
    DT_TRY(dt_reduce_scatter(s->tp_pg, rows == 1 ? in : stage, out, n * rows, DT_F32, DT_RED_SUM, &w));
    DT_TRY(dt_work_wait(w));
    s->stats.calls++;
    s->stats.bytes += total * sizeof(float) / 2;   /* half an all-reduce of the whole tensor (parallel.h) */
    return DT_OK;
}

const char *dt_tp_allreduce_path(void) {
    const char *e = getenv("DTRAIN_TP_ALLREDUCE");
    return e && !strcmp(e, "mpi") ? "mpi" : "node";
}

void dt_tp_comm_init(dt_tp *s) {
    dt_pg_topo t;
    dt_pg_topology(s->tp_pg, &t);
    s->node = t.machines == 1 && !strcmp(dt_tp_allreduce_path(), "node");
    s->comm = (dt_tp_comm){.rank = dt_pg_rank(s->tp_pg), .size = dt_pg_size(s->tp_pg),
                           .allreduce_sum = tp_allreduce_sum, .allreduce_max = tp_allreduce_max, .ctx = s,
                           .allgather = tp_allgather, .reduce_scatter = tp_reduce_scatter};
}

void dt_tp_comm_free(dt_tp *s) {
    free(s->stage);
    s->stage = NULL;
    s->stage_n = 0;
    free(s->sum_buf);
    s->sum_buf = NULL;
    s->sum_n = 0;
}

dt_tp_stats dt_tp_get_stats(const void *self) { return ((const dt_tp *)self)->stats; }
