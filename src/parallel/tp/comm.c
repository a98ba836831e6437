/* The model's tensor-parallel collectives: a blocking float32 sum (and max) over the
 * TP group (dt_tp_comm, ops.h), counted for benchmarks. On one machine the
 * sum is dt_allreduce_node: every rank adds the T parts in rank order, the
 * same bits on every rank by construction (the invariant of tp_internal.h).
 * Through MPI (DTRAIN_TP_ALLREDUCE=mpi, or a group across machines, which
 * setup refuses) a sum of two ranks is a + b on both; for more, Open MPI's
 * algorithms combine the same operands on every rank. */
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

const char *dt_tp_allreduce_path(void) {
    const char *e = getenv("DTRAIN_TP_ALLREDUCE");
    return e && !strcmp(e, "mpi") ? "mpi" : "node";
}

void dt_tp_comm_init(dt_tp *s) {
    dt_pg_topo t;
    dt_pg_topology(s->tp_pg, &t);
    s->node = t.machines == 1 && !strcmp(dt_tp_allreduce_path(), "node");
    s->comm = (dt_tp_comm){.rank = dt_pg_rank(s->tp_pg), .size = dt_pg_size(s->tp_pg),
                           .allreduce_sum = tp_allreduce_sum, .allreduce_max = tp_allreduce_max, .ctx = s};
}

dt_tp_stats dt_tp_get_stats(const void *self) { return ((const dt_tp *)self)->stats; }
