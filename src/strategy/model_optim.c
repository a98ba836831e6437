/* An optimizer over a model's whole flat layout: one segment per trainable
 * parameter (its offset, size, weight decay, group settings and has_grad as
 * the active flag: an unused parameter is not stepped), compact state for
 * those only: a frozen parameter has no segment and costs no state. The
 * trainer's own optimizer and a pipeline stage's use it. */
#include <stdlib.h>
#include <string.h>
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

/* The trainable set changed: a new compact optimizer over the parameters
 * trainable now. One that had a segment before keeps its state and its own
 * step count exactly; a newly trainable one starts with zero state and 0
 * own steps (as a parameter PyTorch never stepped); a newly frozen one loses
 * its state. The step count and settings carry over. On failure o is kept. */
dt_status dt_optimizer_refresh_model(dt_optimizer *o, const dt_model *m) {
    dt_optimizer n;
    DT_TRY(dt_optimizer_init_model(&n, &o->cfg, m));
    n.step = o->step;
    int ns = dt_optim_state_per_elem(&o->cfg);
    for (int k = 0; k < n.n_segs; k++) {
        const dt_optim_segment *s = &n.segs[k];
        int j = dt_optimizer_find_segment(o, s->offset);
        if (j < 0 || o->segs[j].numel != s->numel) {
            n.skipped[k] = n.step;   /* never stepped */
            continue;
        }
        n.skipped[k] = o->skipped[j];
        for (int q = 0; q < ns; q++) {
            float *from = dt_optimizer_state_of(o, q, s->offset), *to = dt_optimizer_state_of(&n, q, s->offset);
            if (from && to) memcpy(to, from, s->numel * sizeof *to);
        }
    }
    dt_optimizer_free(o);
    *o = n;
    return DT_OK;
}
