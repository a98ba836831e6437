/* ZeRO as a dt_strategy: owns the optimizer step and checkpoints; prints the
 * per-rank memory report at start-up. */
#include <stdlib.h>
#include "parallel/common/common_internal.h"
#include "zero_internal.h"
#include "util/log_internal.h"

typedef struct zero_strat {
    dt_pg *pg;
    dt_zero_opts opts;
    dt_zero_ckpt_format fmt;
    const char *name;   /* "zero-<stage>" */
    dt_zero *z;
} zero_strat;

static dt_status s_setup(void *self, dt_run *r) {
    zero_strat *s = self;
    s->opts.clip = r->scaler ? 0.0f : r->clip;   /* loss scaling: s_step clips the unscaled norm */
    if (r->scaler && s->opts.overlap_step == DT_ZERO_OVERLAP_INTERLEAVED)
        return DT_ERR(DT_EINVAL, "zero: loss scaling needs every gradient checked before any shard is stepped, "
                      "which zero.overlap_step interleaved does inside backward (use after-backward or off)");
    DT_TRY(dt_zero_create(r->model, s->pg, r->optim, &s->opts, &s->z));
    dt_pg_topo t;
    dt_pg_topology(s->pg, &t);
    if (!r->quiet && dt_pg_rank(s->pg) == 0 && t.machines > 1) {
        char where[96];
        dt_pg_topology_describe(s->pg, where, sizeof where);
        dt_log(DT_LOG_INFO, "dtrain: %s on %s: gradients reduce-scattered and parameters gathered %s\n", s->name, where,
               t.hierarchical ? "hierarchically (each chunk crosses into a machine once)" : "by MPI collectives");
    }
    const char *why = NULL;
    int node = dt_zero_node_params(s->z, &why);
    if (!r->quiet && dt_pg_rank(s->pg) == 0 && s->opts.node_params) {
        if (node)
            dt_log(DT_LOG_INFO, "dtrain: %s: parameters once per machine in shared memory (%.1f MiB per machine), "
                   "each shard gathered into every other machine once per step%s\n", s->name,
                   (double)dt_model_num_params(r->model) * sizeof(float) / 1048576.0,
                   s->opts.stage == 3 ? "; stage 3 keeps them whole like stage 2 (no per-module gathers)" : "");
        else
            dt_log(DT_LOG_INFO, "dtrain: %s: node-shared parameters unavailable (%s); parameters stay per rank\n",
                   s->name, why && *why ? why : "?");
    }
    dt_zero_memory mem = dt_zero_get_memory(s->z);
    return dt_par_memory_report(s->pg, s->name, mem.param_bytes, mem.grad_bytes, mem.optim_bytes, !r->quiet);
}
static dt_status s_before_forward(void *self, dt_run *r, int last) {
    zero_strat *s = self;
    if (r->trace) {
        dt_pg_set_trace(s->pg, r->trace);
        dt_pg_set_trace(s->z->ag_pg, r->trace);
        s->z->trace = r->trace;
    }
    dt_zero_set_lr(s->z, r->lr);
    return dt_zero_before_forward(s->z, r->graph, last);
}
static dt_status s_after_backward(void *self, dt_run *r, int last) {
    (void)r;
    zero_strat *s = self;
    return last ? dt_zero_finish_backward(s->z) : DT_OK;
}
static dt_status s_step(void *self, dt_run *r, float lr) {
    zero_strat *s = self;
    dt_zero_set_lr(s->z, lr);
    if (!r->scaler) return dt_zero_step(s->z, NULL);
    /* loss scaling (strategy.h): the norm over every rank's shards decides for all */
    double ss = 0;
    DT_TRY(dt_zero_global_sumsq(s->z, &ss));
    float scale;
    r->skipped = dt_loss_scaler_verdict(r->scaler, ss, r->clip, &scale);
    return r->skipped ? dt_zero_skip_step(s->z) : dt_zero_step_scaled(s->z, scale);
}
static dt_status s_save(void *self, dt_run *r, const char *path) {
    zero_strat *s = self;
    return dt_zero_save(s->z, r, path, s->fmt);
}
static dt_status s_load(void *self, dt_run *r, const char *path) {
    zero_strat *s = self;
    return dt_zero_load(s->z, r, path);
}
static dt_status s_sync(void *self, dt_run *r) {
    (void)r;
    return dt_zero_sync_params(((zero_strat *)self)->z);
}
static dt_status s_join(void *self, dt_run *r) {
    (void)r;
    return dt_zero_join(((zero_strat *)self)->z);
}
static dt_status s_allreduce_sum(void *self, double *x, int n) { return dt_par_allreduce_sum(((zero_strat *)self)->pg, x, n); }
static dt_status s_agree(void *self, dt_agree *a) {
    zero_strat *s = self;
    dt_par_describe_zero(&s->opts, a);
    dt_agree_add(a, "zero.save_format", "%s", s->fmt == DT_ZERO_CKPT_CONSOLIDATED ? "consolidated" : "sharded");
    return dt_pg_agree(s->pg, a);
}
static dt_status s_refresh(void *self, dt_run *r) {
    (void)r;
    return dt_zero_refresh_trainable(((zero_strat *)self)->z);
}
static void s_destroy(void *self) {
    zero_strat *s = self;
    dt_pg_set_trace(s->pg, NULL);
    if (s->z) dt_pg_set_trace(s->z->ag_pg, NULL);
    dt_zero_free(s->z);
    free(s);
}

dt_status dt_zero_strategy(dt_pg *pg, const dt_zero_opts *o, dt_zero_ckpt_format fmt, dt_strategy *out) {
    zero_strat *s = calloc(1, sizeof *s);
    if (!s) return DT_ERR(DT_ENOMEM, "out of memory");
    s->pg = pg;
    if (o) s->opts = *o;
    else dt_zero_opts_default(&s->opts);
    s->fmt = fmt;
    static const char *names[4] = {"zero", "zero-1", "zero-2", "zero-3"};
    s->name = names[s->opts.stage >= 1 && s->opts.stage <= 3 ? s->opts.stage : 0];
    *out = (dt_strategy){.name = s->name, .collective_forward = s->opts.stage == 3, .rank = dt_pg_rank(pg), .world = dt_pg_size(pg), .self = s,
                         .setup = s_setup, .before_forward = s_before_forward,
                         .after_backward = s_after_backward, .allreduce_sum = s_allreduce_sum,
                         .destroy = s_destroy, .owns_optimizer = 1, .step = s_step, .save = s_save,
                         .load = s_load, .sync_params = s_sync, .save_is_dir = fmt != DT_ZERO_CKPT_CONSOLIDATED,
                         .agree = s_agree, .refresh_trainable = s_refresh,
                         .join = s->opts.dp.join ? s_join : NULL, .param_dtype = s->opts.param_dtype};
    int n = dt_pg_size(pg), st = s->opts.stage;   /* stage 1 shards the optimizer, 2 also gradients, 3 parameters */
    out->mem_div[0] = st >= 3 ? n : 1;
    out->mem_div[1] = st >= 2 ? n : 1;
    out->mem_div[2] = n;
    return DT_OK;
}
