/* Reading an optimizer's per-parameter state ("optim.<state>.<param>") from
 * a checkpoint into an optimizer over the model's layout (the trainer's, a
 * pipeline stage's). A parameter frozen in this run has no state to read; one
 * frozen when the checkpoint was written has none saved, which is right only
 * if it has never been stepped (its own step count, restored first, is 0):
 * it starts from zero state like a parameter PyTorch never stepped. */
#include <stdio.h>
#include <stdlib.h>
#include "dtrain/strategy.h"

/* fp32 tensors into o's fp32 view (bf16 state: the widened copy, rounded
 * back at the end; a parameter not in the file keeps its state). */
static dt_status read_states(const dt_ckpt *c, const char *what, const dt_model *m, const dt_optimizer *o) {
    int ns = dt_optim_state_per_elem(&o->cfg);
    for (int s = 0; s < ns; s++)
        for (int i = 0; i < m->n_params; i++) {
            const dt_param *p = m->params[i];
            float *dst = dt_optimizer_state_of(o, s, m->offsets[i]);
            if (!dst) continue;   /* frozen here */
            char nm[192];
            snprintf(nm, sizeof nm, "optim.%s.%s", dt_checkpoint_state_name(&o->cfg, s), p->name);
            if (!dt_ckpt_find(c, nm, NULL, NULL)) {
                dt_optimizer *mo = (dt_optimizer *)o;   /* (only read) */
                DT_TRY(dt_checkpoint_state_missing(what, m, i, &mo, 1, nm));
                continue;
            }
            DT_TRY(dt_checkpoint_read_param(c, nm, p, dst));
        }
    return DT_OK;
}

dt_status dt_checkpoint_read_states(const dt_ckpt *c, const char *what, const dt_model *m, dt_optimizer *o) {
    DT_TRY(dt_optimizer_state_open(o));
    dt_status s = read_states(c, what, m, o);
    dt_optimizer_state_close(o, s == DT_OK);
    return s;
}

dt_status dt_checkpoint_read_param(const dt_ckpt *c, const char *name, const dt_param *p, float *dst) {
    int64_t full[DT_MAX_DIMS];
    int nd = dt_param_full_shape(p, full);
    DT_TRY(dt_ckpt_expect(c, name, nd, full));
    if (p->split.parts <= 1) return dt_ckpt_read(c, name, 0, (size_t)p->value.numel, dst);
    size_t n = (size_t)dt_shape_numel(nd, full);   /* the whole tensor, without a split's padding */
    float *whole = malloc(n * sizeof *whole);   /* one whole tensor at a time */
    if (!whole) return DT_ERR(DT_ENOMEM, "out of memory reading %s (%zu floats)", name, n);
    dt_status s = dt_ckpt_read(c, name, 0, n, whole);
    if (s == DT_OK) dt_split_copy(&p->split, nd, full, p->split.index, whole, dst, 0);
    free(whole);
    return s;
}
