/* Keeping part of a model: a pipeline stage holds only the parameters of its
 * blocks. The others are freed and leave m->params and their modules' lists;
 * the kept ones keep their names (checkpoints stay global) and registration
 * order (index is renumbered to the new position), and are laid out again (reverse registration order, as at build). */
#include <stdlib.h>
#include <string.h>
#include "model_internal.h"

dt_status dt_model_keep_params(dt_model *m, const unsigned char *keep) {
    if (!m || !keep) return DT_ERR(DT_EINVAL, "keep params: model or mask is NULL");
    if (!m->built) return DT_ERR(DT_ESTATE, "model %s: keep params before dt_model_build", m->name);
    for (int i = 0; i < m->n_modules; i++) {   /* modules first: they point at params */
        dt_module *mod = m->modules[i];
        int n = 0;
        for (int j = 0; j < mod->n_params; j++)
            if (keep[mod->params[j]->index]) mod->params[n++] = mod->params[j];
        mod->n_params = n;
    }
    int n = 0;
    for (int i = 0; i < m->n_params; i++) {
        dt_param *p = m->params[i];
        if (keep[i]) { m->params[n++] = p; continue; }   /* (renumbered below) */
        dt_param_free(p);   /* its views into the flats are not freed; the flats are replaced below */
        free(p);
    }
    m->n_params = n;
    for (int i = 0; i < n; i++) m->params[i]->index = i;   /* index = position: offsets[], DDP tables */
    size_t *off = malloc((size_t)(n ? n : 1) * sizeof *off);
    if (!off) return DT_ERR(DT_ENOMEM, "out of memory");
    size_t pos = 0;
    for (int i = n - 1; i >= 0; i--) {
        off[i] = pos;
        pos += (size_t)m->params[i]->value.numel;
    }
    m->n_elems = pos;
    dt_status s = dt_model_set_layout(m, off, pos ? pos : 1);   /* (a stage may own no parameter) */
    free(off);
    return s;
}
