/* ZeRO over the replicas of the tensor-parallel mesh (tp_internal.h): the
 * DP group of each tensor-parallel rank shards that rank's parts with ZeRO
 * stage 1, 2 or 3 in place of DDP, and the strategy steps the shards
 * itself, by a global norm that counts every element of the whole model
 * once. */
#include <math.h>
#include <stdlib.h>
#include "parallel/common/common_internal.h"
#include "parallel/zero/zero_internal.h"
#include "tp_internal.h"

const char *dt_tp_label(const dt_tp *s) {
    static const char *labels[4] = {"tp", "tp+zero-1", "tp+zero-2", "tp+zero-3"};
    return labels[s->zero_stage >= 1 && s->zero_stage <= 3 ? s->zero_stage : 0];
}

dt_status dt_tp_zero_setup(dt_tp *s, dt_run *r) {
    dt_model *m = r->model;
    dt_zero_opts zo = s->zopts;
    zo.stage = s->zero_stage;
    zo.clip = 0;   /* the norm is the mesh's (dt_tp_zero_sumsq), not one DP group's */
    if ((r->clip > 0 || r->scaler) && zo.overlap_step == DT_ZERO_OVERLAP_INTERLEAVED)
        return DT_ERR(DT_EINVAL, "tp.size %d with ZeRO: gradient clipping and loss scaling need the global norm before "
                      "any shard is stepped, so they do not combine with zero.overlap_step interleaved (use "
                      "after-backward or off)", s->T);
    if (s->opts.sequence_parallel && zo.overlap_step == DT_ZERO_OVERLAP_INTERLEAVED)
        return DT_ERR(DT_EINVAL, "tp.size %d with ZeRO and sequence parallelism: the replicated parameters' gradient "
                      "shards are summed over the tensor-parallel group after backward, before any shard may be "
                      "stepped, so zero.overlap_step interleaved does not apply (use after-backward or off)", s->T);
    s->skip_split = calloc((size_t)m->n_params + 1, 1);
    s->skip_whole = calloc((size_t)m->n_params + 1, 1);
    if (!s->skip_split || !s->skip_whole) return DT_ERR(DT_ENOMEM, "out of memory");
    for (int i = 0; i < m->n_params; i++) {
        int split = m->params[i]->split.parts > 1;
        s->skip_split[i] = (unsigned char)split;
        s->skip_whole[i] = (unsigned char)!split;
    }
    DT_TRY(dt_zero_create(m, s->dp_pg, r->optim, &zo, &s->zero));
    s->zero->trace = r->trace;
    if (s->opts.sequence_parallel) DT_TRY(dt_tp_check_replicated_shards(s, s->zero));   /* seq.c: the sum's premise */
    dt_zero_memory mem = dt_zero_get_memory(s->zero);
    return dt_par_memory_report(s->world, dt_tp_label(s), mem.param_bytes, mem.grad_bytes, mem.optim_bytes,
                                !r->quiet);
}

/* The squared norm of the whole model's gradient. The owned shards of a DP
 * group are disjoint and cover its tensor-parallel rank's parameters, so
 * over the world every split part's element is owned once; a replicated
 * parameter's elements are owned once in every DP group, with the same
 * values (the invariant), so only tp rank 0's count. One double per rank,
 * added in rank order. */
dt_status dt_tp_zero_sumsq(dt_tp *s, double *ss) {
    double x = dt_zero_owned_sumsq(s->zero, s->skip_whole);   /* split parts */
    if (s->rank % s->T == 0) x += dt_zero_owned_sumsq(s->zero, s->skip_split);
    DT_TRY(dt_par_sum_rank_order(s->world, &x));
    *ss = x;
    return DT_OK;
}

dt_status dt_tp_zero_step(dt_tp *s, dt_run *r, float lr) {
    dt_zero_set_lr(s->zero, lr);
    float scale = 1.0f;
    if (r->clip > 0 || r->scaler) {
        double ss;
        DT_TRY(dt_tp_zero_sumsq(s, &ss));
        if (r->scaler) r->skipped = dt_loss_scaler_verdict(r->scaler, ss, r->clip, &scale);
        else scale = dt_clip_scale(sqrt(ss), r->clip);
    }
    return r->skipped ? dt_zero_skip_step(s->zero) : dt_zero_step_scaled(s->zero, scale);
}

void dt_tp_zero_free(dt_tp *s) {
    if (s->zero) dt_zero_free(s->zero);
    s->zero = NULL;
    free(s->skip_split);
    free(s->skip_whole);
    s->skip_split = s->skip_whole = NULL;
}
