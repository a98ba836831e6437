/* Per-parameter training settings, applied to the built model before the
 * configuration agreement (which lists them per parameter) and before any
 * strategy sees the model: --freeze PATTERN (repeatable) and the parameter
 * groups (--no-decay, --lr-scale; optim.h). */
#include "trainer_internal.h"

dt_status dt_trainer_freeze(dt_trainer *t) {
    dt_model *m = t->model;
    for (int k = 0; k < t->opts.n_freeze; k++)
        if (dt_model_freeze(m, t->opts.freeze[k]) == 0)
            return DT_ERR(DT_EINVAL, "--freeze '%s' matches no parameter of model %s (names look like '%s')",
                          t->opts.freeze[k], m->name, m->n_params ? m->params[0]->name : "(none)");
    return dt_optim_apply_groups(m, t->opts.groups, t->opts.n_groups);
}
