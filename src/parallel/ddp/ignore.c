/* DDP parameters_to_ignore (PyTorch's _set_params_and_buffers_to_ignore_for_model):
 * parameters matching a name or fnmatch glob of opts.params_to_ignore join no
 * bucket and are left out of every parameter broadcast, so each rank keeps
 * its own value and gradient; with find_unused_params they also keep their
 * own has_grad (the used-parameter sum would otherwise make it "some rank
 * used it"). Buffers are not affected. */
#include <fnmatch.h>
#include <stdlib.h>
#include <string.h>
#include "ddp_internal.h"

dt_status dt_ddp_match_ignored(dt_ddp *d) {
    const dt_ddp_opts *o = &d->opts;
    dt_model *m = d->model;
    if (o->n_params_to_ignore == 0) return DT_OK;
    size_t n1 = (size_t)(m->n_params ? m->n_params : 1);
    d->ignored = calloc(n1, 1);
    d->ignored_has = calloc(n1, 1);
    if (!d->ignored || !d->ignored_has) return DT_ERR(DT_ENOMEM, "out of memory");
    for (int k = 0; k < o->n_params_to_ignore; k++) {
        const char *pat = o->params_to_ignore[k];
        if (!pat || !*pat) return DT_ERR(DT_EINVAL, "ddp: params_to_ignore[%d] is empty", k);
        int hits = 0;
        for (int i = 0; i < m->n_params; i++)
            if (fnmatch(pat, m->params[i]->name, 0) == 0) {
                d->ignored[i] = 1;
                hits++;
            }
        if (!hits) return DT_ERR(DT_EINVAL, "ddp: params_to_ignore pattern '%s' matches no parameter of the model", pat);
    }
    return DT_OK;
}

dt_status dt_ddp_bcast_params(dt_ddp *d, int root) {
    dt_model *m = d->model;
    float *keep = NULL;
    size_t n_keep = 0, at = 0;
    for (int i = 0; d->ignored && i < m->n_params; i++)
        if (d->ignored[i]) n_keep += (size_t)m->params[i]->value.numel;
    /* one broadcast of the whole buffer, the ignored parameters put back after */
    if (n_keep && !(keep = malloc(n_keep * sizeof *keep))) return DT_ERR(DT_ENOMEM, "out of memory");
    for (int i = 0; keep && i < m->n_params; i++)
        if (d->ignored[i]) {
            size_t n = (size_t)m->params[i]->value.numel;
            memcpy(keep + at, dt_f32(&m->params[i]->value), n * sizeof *keep);
            at += n;
        }
    dt_status s = dt_broadcast(d->pg, m->param_flat.data, (int64_t)m->param_flat.numel, DT_F32, root, NULL);
    at = 0;
    for (int i = 0; keep && i < m->n_params; i++)
        if (d->ignored[i]) {
            size_t n = (size_t)m->params[i]->value.numel;
            memcpy(dt_f32(&m->params[i]->value), keep + at, n * sizeof *keep);
            at += n;
        }
    free(keep);
    return s;
}

void dt_ddp_ignored_save_has_grad(dt_ddp *d) {
    for (int i = 0; d->ignored && i < d->model->n_params; i++)
        d->ignored_has[i] = (unsigned char)(d->model->params[i]->has_grad != 0);
}

void dt_ddp_ignored_restore_has_grad(dt_ddp *d) {
    for (int i = 0; d->ignored && i < d->model->n_params; i++)
        if (d->ignored[i]) d->model->params[i]->has_grad = d->ignored_has[i];
}
