/* Tensor parallelism as a dt_strategy (the design: tp_internal.h). The
 * hooks: prepare_model (gpt2: this rank's part; a user's model is checked in
 * setup), agree (on the world), setup
 * (groups, the model's comm, DDP or ZeRO over the replicas), the DDP hooks
 * passed on, grad_sumsq (clipping), save (whole tensors). With ZeRO
 * (dt_tp_zero_strategy) the strategy owns the step, loads and
 * sync_params (zero.c). */
#include <stdlib.h>
#include "parallel/common/common_internal.h"
#include "parallel/zero/zero_internal.h"
#include "tp_internal.h"
#include "util/log_internal.h"

static int has_inner(const dt_tp *s) { return s->inner.self != NULL; }

/* gpt2 builds this rank's part from cfg; any other model (a user's
 * build_model, which knows its rank) is checked once built, in setup */
static dt_status s_prepare(void *self, dt_model_cfg *cfg) {
    dt_tp *s = self;
    if (cfg->kind == DT_MODEL_GPT2) {
        cfg->tp_size = s->T;
        cfg->tp_rank = s->rank % s->T;
        cfg->tp_seq = s->opts.sequence_parallel;
    }
    return DT_OK;
}

/* The model holds this rank's parts: every split parameter is part rank % T
 * of T, and there is one (a model built whole would train T copies). */
static dt_status check_parts(const dt_tp *s, const dt_model *m) {
    int n = 0;
    for (int i = 0; i < m->n_params; i++) {
        const dt_param_split *p = &m->params[i]->split;
        if (p->parts <= 1) continue;
        if (p->parts != s->T || p->index != s->rank % s->T)
            return DT_ERR(DT_EINVAL, "tp.size %d: parameter %s of model %s is part %d of %d, but this rank is "
                          "tensor-parallel rank %d of %d", s->T, m->params[i]->name, m->name, p->index, p->parts,
                          s->rank % s->T, s->T);
        n++;
    }
    if (!n)
        return DT_ERR(DT_EINVAL, "tp.size %d: model %s was built whole (no parameter is split): tensor parallelism "
                      "needs gpt2 or a model built for its rank (nn.h dt_nn_add_linear_col / _row)", s->T, m->name);
    return DT_OK;
}

static dt_status s_agree(void *self, dt_agree *a) {
    dt_tp *s = self;
    dt_agree_add(a, "tp.size", "%d", s->T);
    dt_agree_add(a, "DTRAIN_TP_ALLREDUCE", "%s", dt_tp_allreduce_path());   /* comm.c: one path per group */
    dt_agree_add(a, "tp.zero_stage", "%d", s->zero_stage);
    dt_agree_add(a, "tp.sequence_parallel", "%d", s->opts.sequence_parallel ? 1 : 0);
    if (s->zero_stage) dt_par_describe_zero(&s->zopts, a);
    else dt_par_describe_ddp(&s->opts.ddp, a);
    return dt_pg_agree(s->world, a);
}

static dt_status s_setup(void *self, dt_run *r) {
    dt_tp *s = self;
    dt_model *m = r->model;
    DT_TRY(check_parts(s, m));
    DT_TRY(dt_tp_check_placement(s->world, s->T, NULL));   /* replica w / T: world ranks in order */
    if (s->opts.sequence_parallel && !(m->cfg.kind == DT_MODEL_GPT2 && m->cfg.tp_seq))
        return DT_ERR(DT_EINVAL, "tp.sequence_parallel: model %s is not built sequence-parallel (the built-in gpt2 "
                      "is; a user's model would sum its replicated gradients wrongly)", m->name);
    /* replica w / T holds ranks T*(w/T) .. +T-1; DP groups join equal w % T */
    DT_TRY(dt_pg_split(s->world, s->rank / s->T, s->rank, &s->tp_pg));
    /* ZeRO runs also on a group of one (dp == 1): the same code path and checkpoints */
    if (s->dp > 1 || s->zero_stage) DT_TRY(dt_pg_split(s->world, s->rank % s->T, s->rank, &s->dp_pg));
    dt_tp_comm_init(s);
    m->tp = &s->comm;
    if (!r->quiet && s->rank == 0)
        dt_log(DT_LOG_INFO, "dtrain: mesh: dp %d x tp %d%s (tensor-parallel groups of %d consecutive ranks%s; %s)\n",
               s->dp, s->T, s->zero_stage == 1 ? ", ZeRO-1 over the replicas" : s->zero_stage == 2 ? ", ZeRO-2 over the "
               "replicas" : s->zero_stage == 3 ? ", ZeRO-3 over the replicas" : "", s->T, m->cfg.kind == DT_MODEL_GPT2 &&
               m->cfg.tp_size == s->T ? ": attention by heads, MLP by columns, wte and the lm-head by vocabulary rows; wpe "
               "and LayerNorms whole on every rank" : "",
               s->node ? "all-reduces through node-shared memory" : "all-reduces through MPI");
    if (!r->quiet && s->rank == 0 && s->opts.sequence_parallel)
        dt_log(DT_LOG_INFO, "dtrain: sequence parallelism: outside attention and the MLP each tensor-parallel rank "
               "holds 1/%d of the positions (all-gather before, reduce-scatter after the split layers)\n", s->T);
    if (s->zero_stage) return dt_tp_zero_setup(s, r);   /* its own memory report */
    if (s->dp > 1) {
        DT_TRY(dt_ddp_strategy(s->dp_pg, &s->opts.ddp, &s->inner));
        int quiet = r->quiet;
        r->quiet = 1;   /* one report for the mesh, below */
        dt_status st = s->inner.setup(s->inner.self, r);
        r->quiet = quiet;
        DT_TRY(st);
    }
    size_t f = sizeof(float), trainable = dt_model_num_trainable(m);
    return dt_par_memory_report(s->world, "tp", m->param_flat.numel * f + r->param_copy_bytes, m->grad_flat.numel * f,
                                dt_optim_state_bytes(r->optim) * trainable, !r->quiet);
}

static dt_status s_before_forward(void *self, dt_run *r, int last) {
    dt_tp *s = self;
    if (last) s->bytes_at_step = s->stats.bytes;
    if (s->zero) {
        if (r->trace) {
            dt_pg_set_trace(s->dp_pg, r->trace);
            dt_pg_set_trace(s->zero->ag_pg, r->trace);
            s->zero->trace = r->trace;
        }
        dt_zero_set_lr(s->zero, r->lr);
        return dt_zero_before_forward(s->zero, r->graph, last);
    }
    return has_inner(s) ? s->inner.before_forward(s->inner.self, r, last) : DT_OK;
}

/* DDP first (its buckets may have reduced during backward), then, under
 * sequence parallelism, the replicated gradients' sum over the group
 * (tp_internal.h: the invariant): before clipping and the optimizer. ZeRO
 * (s->zero) finishes its reduction here, and the sum runs on its owned
 * shards (seq.c), before the strategy's step reads the norm. */
static dt_status s_after_backward(void *self, dt_run *r, int last) {
    dt_tp *s = self;
    if (s->zero) DT_TRY(last ? dt_zero_finish_backward(s->zero) : DT_OK);
    else if (has_inner(s)) DT_TRY(s->inner.after_backward(s->inner.self, r, last));
    if (last && s->opts.sequence_parallel)
        DT_TRY(s->zero ? dt_tp_sum_replicated_shards(s, s->zero) : dt_tp_sum_replicated_grads(s, r->model));
    if (last) {
        s->stats.steps++;
        s->stats.bytes_last_step = s->stats.bytes - s->bytes_at_step;
    }
    return DT_OK;
}

/* Sums over the replicas, each counted once: the ranks of a TP group hold
 * the same values (losses, evaluation counts), so only TP rank 0's enter the
 * sum; the sum runs over the world, so every rank learns it (a checkpoint
 * write that failed on rank 0 is seen by all). */
static dt_status s_allreduce_sum(void *self, double *x, int n) {
    dt_tp *s = self;
    if (s->rank % s->T)
        for (int i = 0; i < n; i++) x[i] = 0;
    return dt_par_allreduce_sum(s->world, x, n);
}

/* the ranks' parts differ, so one rank alone may fail on its own (fp16 working copy) */
static dt_status s_agree_status(void *self, dt_status mine, const char *what) {
    return dt_par_agree(((dt_tp *)self)->world, mine, what);
}

static dt_status s_grad_sumsq(void *self, dt_run *r, double *ss) { return dt_tp_grad_sumsq(self, r->model, ss); }
static dt_status s_save(void *self, dt_run *r, const char *path) { return dt_tp_save(self, r, path); }
static dt_status s_step(void *self, dt_run *r, float lr) { return dt_tp_zero_step(self, r, lr); }
/* ZeRO's own load: each rank reads its owned ranges, a split parameter's cut
 * from its part of the whole tensor (zero/checkpoint.c) */
static dt_status s_load(void *self, dt_run *r, const char *path) { return dt_zero_load(((dt_tp *)self)->zero, r, path); }
static dt_status s_sync(void *self, dt_run *r) {
    (void)r;
    return dt_zero_sync_params(((dt_tp *)self)->zero);
}
static dt_status s_refresh(void *self, dt_run *r) {
    (void)r;
    return dt_zero_refresh_trainable(((dt_tp *)self)->zero);
}

/* --unfreeze-at without ZeRO: every rank's trainable set alike (the parts
 * carry the same names), then DDP over the replicas re-cuts its buckets, or
 * one replica allocates the new gradients (the group's own sums look at
 * grad.data each step); the trainer refreshes the optimizer */
static dt_status s_refresh_plain(void *self, dt_run *r) {
    dt_tp *s = self;
    DT_TRY(dt_par_agree_trainable(r->model, s->world, "tp refresh_trainable"));
    if (has_inner(s)) return s->inner.refresh_trainable(s->inner.self, r);
    return dt_model_refresh_grads(r->model);
}

static void s_destroy(void *self) {
    dt_tp *s = self;
    if (has_inner(s)) s->inner.destroy(s->inner.self);
    if (s->dp_pg) dt_pg_set_trace(s->dp_pg, NULL);
    if (s->zero) dt_pg_set_trace(s->zero->ag_pg, NULL);
    dt_tp_zero_free(s);
    dt_pg_free(s->dp_pg);
    dt_pg_free(s->tp_pg);
    dt_tp_comm_free(s);
    free(s);
}

dt_status dt_tp_strategy(dt_pg *world, const dt_tp_opts *o, dt_strategy *out) {
    int W = dt_pg_size(world), T = o ? o->size : 0;
    if (T < 1 || W % T)
        return DT_ERR(DT_EINVAL, "tp.size %d must divide the world size %d (world = data-parallel replicas x tp.size)",
                      T, W);
    if (o->sequence_parallel && T < 2)
        return DT_ERR(DT_EINVAL, "tp.sequence_parallel needs tensor parallelism (tp.size > 1, got %d): it splits the "
                      "positions over the tensor-parallel group", T);
    if (o->ddp.dp.join)   /* DDP's join shadows collectives; the TP group's run inside forward */
        return DT_ERR(DT_EINVAL, "tp.size %d: uneven inputs (dp.join) do not combine with tensor parallelism", T);
    dt_tp *s = calloc(1, sizeof *s);
    if (!s) return DT_ERR(DT_ENOMEM, "out of memory");
    *s = (dt_tp){.opts = *o, .world = world, .T = T, .rank = dt_pg_rank(world), .dp = W / T};
    *out = (dt_strategy){.name = "tp", .rank = s->rank, .world = W, .self = s,
                         .data_rank = s->rank / T, .data_world = W / T,
                         .collective_forward = 1,   /* tp_reduce in every forward */
                         .prepare_model = s_prepare, .agree = s_agree, .setup = s_setup,
                         .before_forward = s_before_forward, .after_backward = s_after_backward,
                         .allreduce_sum = s_allreduce_sum, .agree_status = s_agree_status,
                         .grad_sumsq = s_grad_sumsq, .save = s_save, .refresh_trainable = s_refresh_plain,
                         .destroy = s_destroy};
    return DT_OK;
}

dt_status dt_tp_zero_strategy(dt_pg *world, const dt_tp_opts *tp, const dt_zero_opts *zero, dt_strategy *out) {
    int st = zero ? zero->stage : 0;
    if (st < 1 || st > 3) return DT_ERR(DT_EINVAL, "tp with ZeRO: stage %d (1, 2 or 3)", st);
    if (zero->dp.join)
        return DT_ERR(DT_EINVAL, "tp.size %d: uneven inputs (dp.join) do not combine with tensor parallelism",
                      tp ? tp->size : 0);
    DT_TRY(dt_tp_strategy(world, tp, out));
    dt_tp *s = out->self;
    s->zero_stage = st;
    s->zopts = *zero;
    out->name = dt_tp_label(s);
    out->owns_optimizer = 1;
    out->param_dtype = zero->param_dtype;
    out->step = s_step;
    out->load = s_load;
    out->sync_params = s_sync;
    out->refresh_trainable = s_refresh;
    out->grad_sumsq = NULL;   /* the step clips (dt_tp_zero_step) */
    /* the memory check: ZeRO's shares of this rank's parts (state, then grads, then params) */
    out->mem_div[0] = st >= 3 ? s->dp : 1;
    out->mem_div[1] = st >= 2 ? s->dp : 1;
    out->mem_div[2] = s->dp;
    return DT_OK;
}
