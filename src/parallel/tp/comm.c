/* The model's tensor-parallel collective: a blocking float32 sum over the
 * TP group (dt_tp_comm, ops.h), counted for benchmarks. For two ranks an MPI
 * sum is a + b on both; for more, Open MPI's algorithms combine the same
 * operands on every rank, so every rank gets the same bits (the invariant
 * of tp_internal.h). */
#include "tp_internal.h"

static dt_status tp_allreduce_sum(void *ctx, float *buf, int64_t n) {
    dt_tp *s = ctx;
    dt_work *w = NULL;
    DT_TRY(dt_allreduce(s->tp_pg, buf, buf, n, DT_F32, DT_RED_SUM, &w));
    s->stats.calls++;
    s->stats.bytes += (size_t)n * sizeof(float);
    return dt_work_wait(w);
}

void dt_tp_comm_init(dt_tp *s) {
    s->comm = (dt_tp_comm){.rank = dt_pg_rank(s->tp_pg), .size = dt_pg_size(s->tp_pg),
                           .allreduce_sum = tp_allreduce_sum, .ctx = s};
}

dt_tp_stats dt_tp_get_stats(const void *self) { return ((const dt_tp *)self)->stats; }
