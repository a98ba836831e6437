/* The global gradient norm under tensor parallelism: sum over the group of
 * every split parameter's squares (each part once) plus the replicated
 * parameters' squares, once (they are the same on every rank: the
 * invariant of tp_internal.h). Every rank gets the same value: the split sum
 * is one double all-reduce, the replicated one the same bits everywhere. */
#include "parallel/common/common_internal.h"
#include "tp_internal.h"

dt_status dt_tp_grad_sumsq(dt_tp *s, const dt_model *m, double *ss) {
    double split = 0, whole = 0;
    for (int i = 0; i < m->n_params; i++) {
        const dt_param *p = m->params[i];
        if (!p->grad.data) continue;   /* frozen: no gradient */
        double v = dt_sumsq(p->grad.data, (size_t)p->grad.numel);
        if (p->split.parts > 1) split += v;
        else whole += v;
    }
    DT_TRY(dt_par_allreduce_sum(s->tp_pg, &split, 1));
    *ss = split + whole;
    return DT_OK;
}
