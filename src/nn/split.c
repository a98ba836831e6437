/* Tensor-parallel parameters: one rank's part of a whole tensor
 * (autograd.h dt_param_split). Along dimension `dim` the whole tensor is
 * [groups x parts x n]; part k is [groups x n], n contiguous slabs of
 * `inner` elements per group and per index of the dimensions before dim.
 * With pad (groups 1) the whole dimension is D = parts x n - pad: the slabs
 * of a part past D are padding, zeros in the part and absent from the
 * whole. */
#include <stdlib.h>
#include <string.h>
#include "model_internal.h"

int dt_param_full_shape(const dt_param *p, int64_t *shape) {
    int nd = p->value.ndim;
    memcpy(shape, p->value.shape, sizeof p->value.shape);
    if (p->split.parts > 1) shape[p->split.dim] = shape[p->split.dim] * p->split.parts - p->split.pad;
    return nd;
}

void dt_split_copy(const dt_param_split *s, int ndim, const int64_t *full_shape, int part, float *full, float *local,
                   int to_full) {
    int64_t outer = 1, inner = 1;
    for (int d = 0; d < s->dim; d++) outer *= full_shape[d];
    for (int d = s->dim + 1; d < ndim; d++) inner *= full_shape[d];
    int64_t D = full_shape[s->dim], n = (D + s->pad) / ((int64_t)s->groups * s->parts);
    /* slabs of this part inside D (pad: the last parts' tails are padding) */
    int64_t first = (int64_t)part * n, have = D - first < 0 ? 0 : D - first < n ? D - first : n;
    if (s->pad <= 0) have = n;
    size_t run = (size_t)(have * inner), tail = (size_t)((n - have) * inner);
    for (int64_t o = 0; o < outer; o++)
        for (int g = 0; g < s->groups; g++) {
            float *f = full + (o * D + ((int64_t)g * s->parts + part) * n) * inner;
            float *l = local + (o * s->groups * n + (int64_t)g * n) * inner;
            if (to_full) {
                if (run) memcpy(f, l, run * sizeof *f);
            } else {
                if (run) memcpy(l, f, run * sizeof *f);
                if (tail) memset(l + run, 0, tail * sizeof *l);
            }
        }
}

dt_param *dt_model_add_param_split(dt_model *m, dt_module *mod, const char *leaf, int ndim, const int64_t *full_shape,
                                   dt_init init, dt_param_split split) {
    if (split.parts <= 1 || !m || !full_shape || m->build_err != DT_OK || m->built)   /* its checks and messages */
        return dt_model_add_param(m, mod, leaf, ndim, full_shape, init);
    const dt_param_split *s = &split;
    if (ndim < 1 || ndim > DT_MAX_DIMS || s->dim < 0 || s->dim >= ndim || s->groups < 1 || s->index < 0 ||
        s->index >= s->parts || s->pad < 0 || (s->pad && s->groups != 1) ||
        (full_shape[s->dim] + s->pad) % ((int64_t)s->groups * s->parts)) {
        dt_status e = DT_ERR(DT_EINVAL, "model %s: parameter %s%s%s: cannot split dimension %d of %lld (+ %d padding) "
                             "into %d groups x %d parts (taking part %d)", m->name, mod ? mod->name : "",
                             mod ? "." : "", leaf, s->dim,
                             ndim >= 1 && s->dim >= 0 && s->dim < ndim ? (long long)full_shape[s->dim] : -1LL, s->pad,
                             s->groups, s->parts, s->index);
        return dt_nn_build_failed(m, e);
    }
    int64_t local_shape[DT_MAX_DIMS], numel = 1;
    for (int d = 0; d < ndim; d++) {
        local_shape[d] = d == s->dim ? (full_shape[d] + s->pad) / s->parts : full_shape[d];
        numel *= full_shape[d];
    }
    /* zeros draw nothing; the whole tensor is drawn below, in this parameter's turn */
    dt_param *p = dt_model_add_param(m, mod, leaf, ndim, local_shape, DT_INIT_ZERO);
    if (!p) return NULL;
    float *full = malloc((size_t)numel * sizeof *full);
    if (!full) {
        return dt_nn_build_failed(m, DT_ERR(DT_ENOMEM, "out of memory initialising parameter %s", p->name));
    }
    dt_nn_init_values(full, numel, &m->init_rng, init);
    p->split = split;
    dt_split_copy(s, ndim, full_shape, s->index, full, dt_f32(&p->value), 0);
    free(full);
    return p;
}

size_t dt_model_num_params_whole(const dt_model *m) {
    size_t n = 0;
    for (int i = 0; i < m->n_params; i++) {
        int64_t full[DT_MAX_DIMS];
        int nd = dt_param_full_shape(m->params[i], full);
        n += (size_t)dt_shape_numel(nd, full);
    }
    return n;
}
