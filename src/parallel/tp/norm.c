/* The global gradient norm under tensor parallelism: sum over the group of
 * every split parameter's squares (each part once) plus the replicated
 * parameters' squares, once (they are the same on every rank: the
 * invariant of tp_internal.h). Every rank gets the same value: each rank's
 * split sum (tp rank 0: plus the replicated one) added over the group in
 * rank order from the exact doubles -- as ZeRO's norm adds its ranks'
 * (tp/zero.c), and not as dt_par_allreduce_sum's float sums of three-float
 * splits, which lost ~1e-8 of the norm and so flipped the clip factor of
 * TP-DDP against TP-ZeRO now and then. */
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
    double x = split + (s->rank % s->T == 0 ? whole : 0.0);
    DT_TRY(dt_par_sum_rank_order(s->tp_pg, &x));
    *ss = x;
    return DT_OK;
}
