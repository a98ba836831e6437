/* Tensor parallelism inside pipeline stages: the mesh dp x pp x tp.
 *
 * Each stage is GPT-2's blocks of that stage built split T ways (the same
 * build as dt_tp_strategy's: cfg.tp_size / tp_rank, set by the pipeline's
 * prepare_model hook before the trainer builds the model), and its T ranks
 * of one replica run the split layers' all-reduces through the tp room's
 * dt_tp_comm over their group (tp/comm.c: the pipeline reuses it rather
 * than a copy, so whatever the tp room's collective does the stage does).
 * Everything else in the pipeline is per tensor-parallel rank and unchanged:
 * the stages' [B, T, C] activations and their gradients are replicated on the
 * T ranks (tp_internal.h's invariant), so rank t of stage s sends to rank t of
 * stage s + 1 (the pipeline group joins equal tp ranks), tied parameters pair
 * equal tp ranks the same way, and DDP runs over the replicas with equal
 * (stage, tp rank). What needs the group: the clip norm (a split parameter's
 * parts summed over the group, a replicated one counted once per stage:
 * strategy.c) and checkpoints, whose sets hold whole tensors under global
 * names (split ones gathered here, written by tp rank 0: ckpt.c; a load
 * reads the whole tensor and keeps this rank's part). ZeRO over the replicas
 * of (stage, tp rank) shards that rank's parts: its norm counts replicated
 * parameters on tp rank 0 only (dp.c) and its sets are written from the
 * replicas' shards put together (ckpt.c).
 * Sequence parallelism (o.sequence_parallel, cfg.tp_seq): the activations
 * between blocks are this tp rank's positions [B, T/T_tp, C] (the blocks
 * declare DT_DIM_SEQ_PART), so the sends between equal tp ranks carry the
 * shard, and the replicated parameters' partial gradients are summed over
 * the stage's group in the step, after the replicas' DDP and the tied
 * totals, before the clip norm (strategy.c s_step). With ZeRO the gradients
 * are owned shards by then: the stage's tp ranks have equal ZeRO layouts
 * (checked at setup), so the owned ranges of the replicated parameters are
 * summed over the group instead (tp/seq.c dt_tp_sum_replicated_shards). */
#include <stdlib.h>
#include "pipe_internal.h"
#include "parallel/tp/tp_internal.h"

dt_status dt_pipe_tp_prepare(const dt_pipe *p, dt_model_cfg *cfg) {
    if (p->lay.T <= 1) return DT_OK;
    if (cfg->kind != DT_MODEL_GPT2)
        return DT_ERR(DT_EINVAL, "tp.size %d: tensor parallelism inside pipeline stages is built for the gpt2 model "
                      "only (this run's model is %s)", p->lay.T, dt_model_kind_name(cfg->kind));
    cfg->tp_size = p->lay.T;
    cfg->tp_rank = p->lay.tp_rank;
    cfg->tp_seq = p->o.sequence_parallel;
    return DT_OK;
}

dt_status dt_pipe_tp_attach(dt_pipe *p, dt_model *m) {
    if (p->lay.T <= 1) return DT_OK;
    if (m->cfg.kind != DT_MODEL_GPT2 || m->cfg.tp_size != p->lay.T)   /* a user's builder (train.build_model) */
        return DT_ERR(DT_EINVAL, "tp.size %d: tensor parallelism inside pipeline stages needs the built-in gpt2 model "
                      "(model %s was built whole)", p->lay.T, m->name);
    dt_tp *t = calloc(1, sizeof *t);
    if (!t) return DT_ERR(DT_ENOMEM, "out of memory");
    *t = (dt_tp){.world = p->comm.world, .tp_pg = p->tp.pg, .T = p->lay.T, .rank = dt_pg_rank(p->comm.world),
                 .dp = p->lay.D};
    dt_tp_comm_init(t);
    p->tp.tp = t;
    m->tp = &t->comm;
    return DT_OK;
}

/* Sequence parallelism: the stage's replicated gradients (partial sums of
 * this rank's positions) summed over its tensor-parallel group (tp/seq.c);
 * with ZeRO the owned ranges of their reduced shards (the stage's tp ranks
 * have equal ZeRO layouts: dt_pipe_tp_check_shards at setup). */
dt_status dt_pipe_tp_sum_replicated(dt_pipe *p) {
    if (p->lay.T <= 1 || !p->o.sequence_parallel) return DT_OK;
    return p->dp.zero ? dt_tp_sum_replicated_shards(p->tp.tp, p->dp.zero) : dt_tp_sum_replicated_grads(p->tp.tp, p->m);
}

dt_status dt_pipe_tp_check_shards(dt_pipe *p) {
    return p->lay.T > 1 && p->o.sequence_parallel && p->dp.zero ? dt_tp_check_replicated_shards(p->tp.tp, p->dp.zero)
                                                                 : DT_OK;
}

dt_status dt_pipe_tp_split_sumsq(dt_pipe *p, double *split) {
    return p->lay.T > 1 ? dt_par_sum_rank_order(p->tp.pg, split) : DT_OK;
}

dt_status dt_pipe_tp_whole(dt_pipe *p, const dt_param *q, const float *local, float **whole) {
    *whole = NULL;
    if (p->lay.T <= 1 || q->split.parts <= 1) return DT_OK;
    size_t n = (size_t)q->value.numel, T = (size_t)p->lay.T;
    float *parts = malloc(n * T * sizeof *parts);
    if (!parts) return DT_ERR(DT_ENOMEM, "pipeline checkpoint: out of memory gathering %s (%zu floats)", q->name, n * T);
    dt_work *w = NULL;
    dt_status s = dt_allgather(p->tp.pg, local, parts, (int64_t)n, DT_F32, &w);
    if (s == DT_OK) s = dt_work_wait(w);
    if (s != DT_OK || p->lay.tp_rank != 0) { free(parts); return s; }
    int64_t full[DT_MAX_DIMS];
    int nd = dt_param_full_shape(q, full);   /* (the parts may hold padding rows: n * T >= whole) */
    float *out = malloc((size_t)dt_shape_numel(nd, full) * sizeof *out);
    if (!out) { free(parts); return DT_ERR(DT_ENOMEM, "pipeline checkpoint: out of memory for %s", q->name); }
    for (int k = 0; k < p->lay.T; k++)   /* rank k of the group holds part k */
        dt_split_copy(&q->split, nd, full, k, out, parts + (size_t)k * n, 1);
    free(parts);
    *whole = out;
    return DT_OK;
}

void dt_pipe_tp_free(dt_pipe *p) {
    if (p->tp.tp) dt_tp_comm_free(p->tp.tp);
    free(p->tp.tp);   /* its group is p->tp.pg, freed with the pipeline's groups */
    p->tp.tp = NULL;
}
