/* Uneven inputs in the training loop (opts.uneven): each data rank trains on
 * its own files (data.h's uneven split) for its own number of steps; ranks
 * whose data ran out join through the strategy (dt_strategy.join: DDP or
 * ZeRO 1/2 with join) until every rank has.
 *
 * Step counts are agreed once, at creation: every rank's count, the
 * smallest (common_steps: steps 0 .. common_steps - 1 run on every rank)
 * and the largest (total_steps: the final step every rank reports). In the
 * common steps the loop is the usual one (loss averaged over ranks, stop
 * requests agreed); after them a joined rank is inside the strategy's join
 * and answers only the strategy's collectives, so the trainer issues no
 * other: the loss is the active rank's own and stop requests wait for the
 * end. Progress comes from the lowest rank among those with the most steps,
 * active to the end. */
#include <stdint.h>
#include "trainer_internal.h"
#include "util/log_internal.h"

#define COUNTS_PER_SUM 16   /* dt_strategy.allreduce_sum takes up to 16 values */

dt_status dt_trainer_uneven_steps(dt_trainer *t, int64_t steps_per_epoch) {
    const dt_train_opts *o = &t->opts;
    int world = t->strat.data_world, me = t->strat.data_rank;
    int64_t own = steps_per_epoch * o->epochs;
    if (o->steps && own > o->steps) own = o->steps;
    t->own_steps = t->common_steps = t->total_steps = own;
    t->lead_rank = 0;
    int64_t low = own, high = own;
    int low_rank = me, lead = me;
    if (world > 1 && t->strat.allreduce_sum) {
        low = INT64_MAX;
        high = -1;
    }
    /* every rank's count, COUNTS_PER_SUM ranks per sum (each rank fills its
     * slot; counts arrive exactly); ties go to the lowest rank */
    for (int base = 0; world > 1 && t->strat.allreduce_sum && base < world; base += COUNTS_PER_SUM) {
        double c[COUNTS_PER_SUM] = {0};
        if (me >= base && me < base + COUNTS_PER_SUM) c[me - base] = (double)own;
        DT_TRY(t->strat.allreduce_sum(t->strat.self, c, COUNTS_PER_SUM));
        for (int r = base; r < world && r < base + COUNTS_PER_SUM; r++) {
            int64_t n = (int64_t)c[r - base];
            if (n < low) { low = n; low_rank = r; }
            if (n > high) { high = n; lead = r; }
        }
    }
    if (low < 1)
        return DT_ERR(DT_EINVAL, "train.uneven: rank %d's files hold fewer samples per epoch than one step "
                      "(train.batch %lld x train.accum %d); give it more data or use fewer ranks", low_rank,
                      (long long)o->batch, o->accum);
    t->common_steps = low;
    t->total_steps = high;
    t->lead_rank = lead;
    return DT_OK;
}

int dt_trainer_all_ranks_step(const dt_trainer *t, int64_t step) {
    return !t->opts.uneven || step < t->common_steps;
}

dt_status dt_trainer_uneven_join(dt_trainer *t) {
    int64_t trained = t->step;
    if (t->strat.world > 1) {
        if (!t->strat.join)
            return DT_ERR(DT_EINVAL, "train.uneven: strategy %s cannot join (use DDP or zero.stage 1 or 2)",
                          t->strat.name ? t->strat.name : "?");
        DT_TRY(t->strat.join(t->strat.self, &t->run));
    }
    t->step = t->total_steps;
    if (!t->opts.quiet)
        dt_log(DT_LOG_INFO, "dtrain: rank %d: trained %lld steps on its own data, joined for %lld; finished at step %lld/%lld\n",
               t->strat.rank, (long long)trained, (long long)(t->total_steps - trained), (long long)t->step,
               (long long)t->total_steps);
    return DT_OK;
}
