/* An optimizer over a model's whole flat layout: one segment per trainable
 * parameter (its offset, size, weight decay, group settings and has_grad as
 * the active flag: an unused parameter is not stepped), compact state for
 * those only: a frozen parameter has no segment and costs no state. The
 * trainer's own optimizer and a pipeline stage's use it. */
#include <stdlib.h>
#include "dtrain/strategy.h"

dt_status dt_optimizer_init_model(dt_optimizer *o, const dt_optim_cfg *cfg, const dt_model *m) {
    dt_optim_segment *segs = malloc((size_t)(m->n_params ? m->n_params : 1) * sizeof *segs);
    if (!segs) return DT_ERR(DT_ENOMEM, "out of memory");
    int n = 0;
    for (int i = 0; i < m->n_params; i++)
        if (m->params[i]->requires_grad)
            segs[n++] = (dt_optim_segment){m->offsets[i], (size_t)m->params[i]->value.numel, m->params[i]->weight_decay,
                                           &m->params[i]->has_grad, &m->params[i]->hp};
    dt_status s = dt_optimizer_init_compact(o, cfg, segs, n, m->param_flat.numel);
    free(segs);
    return s;
}
