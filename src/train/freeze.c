/* Per-parameter training settings, applied to the built model before the
 * configuration agreement (which lists them per parameter) and before any
 * strategy sees the model: --freeze PATTERN (repeatable) and the parameter
 * groups (--no-decay, --lr-scale; optim.h). */
#include <fnmatch.h>
#include "trainer_internal.h"
#include "util/log_internal.h"

dt_status dt_trainer_freeze(dt_trainer *t) {
    dt_model *m = t->model;
    if (t->opts.eval_only)   /* nothing trains: no gradients, no optimizer state, in any strategy */
        for (int i = 0; i < m->n_params; i++) m->params[i]->requires_grad = 0;
    for (int k = 0; k < t->opts.n_freeze; k++)
        if (dt_model_freeze(m, t->opts.freeze[k]) == 0)
            return DT_ERR(DT_EINVAL, "train.freeze '%s' matches no parameter of model %s (names look like '%s')",
                          t->opts.freeze[k], m->name, m->n_params ? m->params[0]->name : "(none)");
    DT_TRY(dt_model_refresh_grads(m));   /* frozen parameters: no gradient memory */
    return dt_optim_apply_groups(m, t->opts.groups, t->opts.n_groups);
}

/* --unfreeze-at: the --freeze patterns' parameters train from this step on. */
dt_status dt_trainer_unfreeze(dt_trainer *t) {
    dt_model *m = t->model;
    for (int k = 0; k < t->opts.n_freeze; k++)
        for (int i = 0; i < m->n_params; i++)
            if (fnmatch(t->opts.freeze[k], m->params[i]->name, 0) == 0) m->params[i]->requires_grad = 1;
    t->unfrozen = 1;
    return dt_trainer_refresh_trainable(t);
}

/* the strategy has its own refresh, or there is none to do (one process) */
static int can_refresh(const dt_trainer *t) {
    return t->strat.refresh_trainable || !(t->strat.owns_optimizer || t->strat.world > 1);
}

dt_status dt_trainer_check_unfreeze(const dt_trainer *t) {
    if (t->opts.unfreeze_at <= 0 || t->opts.eval_only || can_refresh(t)) return DT_OK;
    return DT_ERR(DT_EINVAL, "train.unfreeze_at %lld: strategy %s cannot change the trainable parameters during a run "
                  "(DDP, ZeRO, tensor parallelism and one process can); train without train.unfreeze_at, or save before that step and "
                  "resume without train.freeze", (long long)t->opts.unfreeze_at, t->strat.name);
}

dt_status dt_trainer_refresh_trainable(dt_trainer *t) {
    DT_TRY(dt_trainer_usable(t, "dt_trainer_refresh_trainable"));
    if (t->strat.refresh_trainable) DT_TRY(t->strat.refresh_trainable(t->strat.self, &t->run));
    else if (!can_refresh(t))
        return DT_ERR(DT_EINVAL, "strategy %s cannot change the trainable parameters during a run (train.unfreeze_at, "
                      "dt_trainer_refresh_trainable): DDP, ZeRO, tensor parallelism and one process can", t->strat.name);
    else DT_TRY(dt_model_refresh_grads(t->model));   /* one process (the strategies do their own) */
    if (!t->strat.owns_optimizer) DT_TRY(dt_optimizer_refresh_model(&t->optim, t->model));
    if (!t->opts.quiet && t->strat.rank == 0)
        dt_log(DT_LOG_INFO, "step %lld: trainable parameters refreshed: %zu of %zu train\n", (long long)t->step,
               dt_model_num_trainable(t->model), dt_model_num_params(t->model));
    return DT_OK;
}
