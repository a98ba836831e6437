/* Which parameters got a gradient on any rank this step (find_unused_params).
 *
 * A parameter no rank used must not be stepped (PyTorch: its grad stays
 * None), one that some rank used must be stepped on every rank with the
 * averaged gradient. Each rank knows its own uses (dt_param.has_grad, over
 * all micro-steps); one small sum over the group makes them agree, like
 * PyTorch DDP's all-reduce of its locally-used map. Shared by DDP and ZeRO. */
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include "common_internal.h"

dt_status dt_par_used_start(dt_par_used *u, dt_model *m, dt_pg *pg, int contribute) {
    if (u->work) return DT_ERR(DT_ESTATE, "used-parameter map: a sum is already in flight");
    int n = m->n_params;
    if (u->n < n) {
        float *map = realloc(u->map, (size_t)n * sizeof *map);
        if (!map) return DT_ERR(DT_ENOMEM, "out of memory for the used-parameter map (%d parameters)", n);
        u->map = map;
        u->n = n;
    }
    for (int i = 0; i < n; i++) u->map[i] = contribute && m->params[i]->has_grad ? 1.0f : 0.0f;
    /* counts of ranks, exact in float32 below 2^24 ranks */
    DT_TRY(dt_allreduce(pg, u->map, u->map, n, DT_F32, DT_RED_SUM, &u->work));
    u->started = 1;
    return DT_OK;
}

dt_status dt_par_used_finish(dt_par_used *u, dt_model *m) {
    if (!u->started) return DT_OK;
    u->started = 0;
    dt_status s = dt_work_wait(u->work);
    u->work = NULL;
    DT_TRY(s);
    for (int i = 0; m && i < m->n_params; i++) m->params[i]->has_grad = u->map[i] > 0.0f;
    return DT_OK;
}

void dt_par_used_free(dt_par_used *u) {
    if (u->work) dt_work_wait(u->work);
    free(u->map);
    *u = (dt_par_used){0};
}

void dt_par_unused_add(dt_par_unused *u, const char *name) {
    if (u->n++ >= 4) return;
    size_t l = strlen(u->names);
    snprintf(u->names + l, sizeof u->names - l, "%s'%s'", l ? ", " : "", name);
}

dt_status dt_par_unused_error(const dt_par_unused *u, const char *who) {
    return DT_ERR(DT_EINVAL, "%s: parameter%s %s%s received no gradient in this step; if that is expected "
                  "enable dp.find_unused_params", who, u->n > 1 ? "s" : "", u->names,
                  u->n > 4 ? " and more" : "");
}
