/* An optimizer over a model's whole flat layout: one segment per trainable
 * parameter (its offset, size, weight decay, group settings, has_grad as
 * the active flag: an unused parameter is not stepped, and where its
 * gradient is in grad_flat), compact state for those only: a frozen
 * parameter has no segment and costs no state (nor gradient: nn.h). The
 * trainer's own optimizer and a pipeline stage's use it. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "dtrain/strategy.h"

dt_status dt_optimizer_init_model(dt_optimizer *o, const dt_optim_cfg *cfg, const dt_model *m) {
    dt_optim_segment *segs = malloc((size_t)(m->n_params ? m->n_params : 1) * sizeof *segs);
    if (!segs) return DT_ERR(DT_ENOMEM, "out of memory");
    int n = 0;
    for (int i = 0; i < m->n_params; i++) {
        const dt_param *p = m->params[i];
        if (!p->requires_grad) continue;
        size_t gap = 0;
        if (m->grad_offsets && m->grad_offsets[i] == SIZE_MAX) {
            free(segs);
            return DT_ERR(DT_ESTATE, "optimizer: parameter %s is trainable but has no gradient storage (its "
                          "requires_grad changed since the gradients were laid out: dt_model_refresh_grads)", p->name);
        }
        if (m->grad_offsets) gap = m->offsets[i] - m->grad_offsets[i];
        segs[n++] = (dt_optim_segment){m->offsets[i], (size_t)p->value.numel, p->weight_decay, &p->has_grad, &p->hp, gap};
    }
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
    dt_status st = dt_optimizer_state_open(o);   /* bf16 state: copied through fp32 views (exact both ways) */
    if (st == DT_OK) st = dt_optimizer_state_open(&n);
    if (st != DT_OK) {
        dt_optimizer_state_close(o, 0);
        dt_optimizer_free(&n);
        return st;
    }
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
    dt_optimizer_state_close(&n, 1);
    dt_optimizer_state_close(o, 0);
    dt_optimizer_free(o);
    *o = n;
    return DT_OK;
}
