/* Parameter groups by name pattern (optim.h): each group's set fields are
 * written into the matching parameters' hp, in group order. Everything is
 * validated before anything changes, so a bad group leaves the model as it
 * was. */
#include <fnmatch.h>
#include <math.h>
#include "dtrain/optim.h"

dt_optim_group dt_optim_group_make(const char *pattern) {
    return (dt_optim_group){pattern, NAN, NAN, NAN, NAN, NULL};
}

/* NaN (unset) passes; otherwise finite and in [lo, hi) (hi_open) or [lo, inf). */
static int bad(float x, float lo, int below_one) {
    if (isnan(x)) return 0;
    return !isfinite(x) || x < lo || (below_one && x >= 1.0f);
}

static dt_status check_group(const dt_model *m, const dt_optim_group *g, int k) {
    const char *who = g->who ? g->who : "parameter group";
    if (!g->pattern || !g->pattern[0]) return DT_ERR(DT_EINVAL, "%s (group %d): empty name pattern", who, k + 1);
    const char *pat = g->pattern;
    if (bad(g->lr_scale, 0.0f, 0))
        return DT_ERR(DT_EINVAL, "%s '%s': lr scale %g must be finite and >= 0", who, pat, (double)g->lr_scale);
    if (bad(g->weight_decay, 0.0f, 0))
        return DT_ERR(DT_EINVAL, "%s '%s': weight decay %g must be finite and >= 0", who, pat,
                      (double)g->weight_decay);
    if (bad(g->beta1, 0.0f, 1) || bad(g->beta2, 0.0f, 1))
        return DT_ERR(DT_EINVAL, "%s '%s': betas (%g, %g) must be in [0, 1)", who, pat, (double)g->beta1,
                      (double)g->beta2);
    for (int i = 0; i < m->n_params; i++)
        if (fnmatch(g->pattern, m->params[i]->name, 0) == 0) return DT_OK;
    return DT_ERR(DT_EINVAL, "%s '%s' matches no parameter of model %s (names look like '%s')", who, pat,
                  m->name, m->n_params ? m->params[0]->name : "(none)");
}

dt_status dt_optim_apply_groups(dt_model *m, const dt_optim_group *g, int n) {
    if (n < 0 || (n > 0 && !g)) return DT_ERR(DT_EINVAL, "parameter groups: %d groups without a table", n);
    for (int k = 0; k < n; k++) DT_TRY(check_group(m, &g[k], k));
    for (int i = 0; i < m->n_params; i++) {
        dt_param_hparams *h = &m->params[i]->hp;
        *h = (dt_param_hparams){NAN, NAN, NAN, NAN};
        for (int k = 0; k < n; k++) {
            if (fnmatch(g[k].pattern, m->params[i]->name, 0) != 0) continue;
            if (!isnan(g[k].lr_scale)) h->lr_scale = g[k].lr_scale;
            if (!isnan(g[k].weight_decay)) h->weight_decay = g[k].weight_decay;
            if (!isnan(g[k].beta1)) h->beta1 = g[k].beta1;
            if (!isnan(g[k].beta2)) h->beta2 = g[k].beta2;
        }
    }
    return DT_OK;
}
