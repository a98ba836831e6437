/* DDP as a dt_strategy for the shared training loop. */
#include <stdlib.h>
#include "ddp_internal.h"
#include "parallel/common/common_internal.h"
#include "util/log_internal.h"

typedef struct ddp_strat { dt_pg *pg; dt_ddp_opts opts; dt_ddp *ddp; } ddp_strat;

static dt_status s_setup(void *self, dt_run *r) {
    ddp_strat *s = self;
    DT_TRY(dt_ddp_create(r->model, s->pg, &s->opts, &s->ddp));
    s->ddp->trace = r->trace;
    if (!r->quiet && dt_pg_rank(s->pg) == 0 && dt_pg_size(s->pg) > 1) {
        const char *why = s->opts.dp.shm == DT_DP_SHM_OFF ? "dp.shm off"
                        : s->opts.dp.wire == DT_BF16 ? "dp.wire bf16" : s->opts.dp.wire == DT_F16 ? "dp.wire fp16"
                        : s->opts.hook ? "a custom communication hook" : dt_pg_shared_unavailable(s->pg);
        char where[96];
        dt_pg_topo t;
        dt_pg_topology(s->pg, &t);
        dt_pg_topology_describe(s->pg, where, sizeof where);
        if (dt_ddp_uses_shared_memory(s->ddp))
            dt_log(DT_LOG_INFO, "dtrain: ddp on %s: gradients in shared memory, summed in place (dp.shm off: MPI collectives)\n", where);
        else if (t.hierarchical && !s->opts.hook)
            dt_log(DT_LOG_INFO, "dtrain: ddp on %s: gradients reduced hierarchically (inside each machine, then across "
                   "machines in %d lanes%s)\n", where, t.lanes,
                   s->opts.dp.wire == DT_BF16 ? ", as bf16" : s->opts.dp.wire == DT_F16 ? ", as fp16" : "");
        else
            dt_log(DT_LOG_INFO, "dtrain: ddp on %s: gradients reduced by MPI collectives%s%s\n", where, why[0] ? ": " : "", why);
    }
    const dt_model *m = r->model;   /* frozen parameters: no gradient, no optimizer state */
    size_t f = sizeof(float), trainable = dt_model_num_trainable(m);
    return dt_par_memory_report(s->pg, "ddp", m->param_flat.numel * f + r->param_copy_bytes, m->grad_flat.numel * f,
                                dt_optim_state_bytes(r->optim) * trainable, !r->quiet);
}
static dt_status s_before_forward(void *self, dt_run *r, int last) {
    ddp_strat *s = self;
    s->ddp->trace = r->trace;
    if (r->trace) dt_pg_set_trace(s->pg, r->trace);
    return dt_ddp_before_forward(s->ddp, r->graph, last);
}
static dt_status s_after_backward(void *self, dt_run *r, int last) {
    (void)r;
    ddp_strat *s = self;
    return last ? dt_ddp_finish_backward(s->ddp) : DT_OK;
}
static dt_status s_join(void *self, dt_run *r) {
    ddp_strat *s = self;
    DT_TRY(dt_ddp_join(s->ddp));
    /* every rank now holds the model of a rank that joined last (ddp/join.c);
     * the optimizer state and step counts must be that rank's too, or a
     * checkpoint written by rank 0 pairs its model with rank 0's stale moments */
    return r->optimizer ? dt_par_bcast_optimizer(s->pg, r->optimizer, s->ddp->bufs.root) : DT_OK;
}
static dt_status s_allreduce_sum(void *self, double *x, int n) { return dt_par_allreduce_sum(((ddp_strat *)self)->pg, x, n); }
static dt_status s_agree(void *self, dt_agree *a) {
    ddp_strat *s = self;
    dt_par_describe_ddp(&s->opts, a);
    return dt_pg_agree(s->pg, a);
}
static dt_status s_refresh(void *self, dt_run *r) {
    (void)r;
    return dt_ddp_refresh_trainable(((ddp_strat *)self)->ddp);
}
static void s_destroy(void *self) {
    ddp_strat *s = self;
    dt_pg_set_trace(s->pg, NULL);
    dt_ddp_free(s->ddp);
    free(s);
}

dt_status dt_ddp_strategy(dt_pg *pg, const dt_ddp_opts *o, dt_strategy *out) {
    ddp_strat *s = calloc(1, sizeof *s);
    if (!s) return DT_ERR(DT_ENOMEM, "out of memory");
    s->pg = pg;
    if (o) s->opts = *o;
    else dt_ddp_opts_default(&s->opts);
    *out = (dt_strategy){.name = "ddp", .rank = dt_pg_rank(pg), .world = dt_pg_size(pg), .self = s,
                         .setup = s_setup, .before_forward = s_before_forward,
                         .after_backward = s_after_backward, .allreduce_sum = s_allreduce_sum,
                         .destroy = s_destroy, .agree = s_agree, .refresh_trainable = s_refresh,
                         .join = s->opts.dp.join ? s_join : NULL};
    return DT_OK;
}
