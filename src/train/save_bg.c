/* Background checkpoints: a save copies this step's state into host memory
 * (the strategy's own save, captured by the io layer's writer: io.h,
 * background writes) and returns; a thread writes the files while training
 * goes on. At most one save is in flight: the next one, the end of the run
 * and a stop first settle it.
 *
 * Settling is collective over the strategy: each rank waits for its own
 * files, the ranks agree (one small sum), and only then does rank 0 wait for
 * the set's index, which commits it. Whatever happens, a set is committed
 * only when every rank's shard is complete on disk (the index waits for
 * them), so a failure or a kill leaves the previous checkpoint the one that
 * loads; after a failure the ranks agree on, every rank removes the shard
 * files it wrote for the set (dt_bg_writer_abandon). */
#include <stdio.h>
#include "trainer_internal.h"
#include "util/clock.h"
#include "util/log_internal.h"

/* Sum of x over ranks (DT_OK alone without a strategy sum: one process). */
static dt_status sum_ranks(dt_trainer *t, double *x, int n) {
    return t->strat.allreduce_sum && t->strat.world > 1 ? t->strat.allreduce_sum(t->strat.self, x, n) : DT_OK;
}

/* s on this rank -> the same outcome on every rank: a local failure keeps its
 * message, the others name the first failing rank. */
static dt_status agree(dt_trainer *t, dt_status s, const char *what) {
    double v[2] = {s != DT_OK ? 1.0 : 0.0, s != DT_OK ? (double)(t->strat.rank + 1) : 0.0};
    char keep[1024];
    snprintf(keep, sizeof keep, "%s", s != DT_OK ? dt_error_message() : "");
    dt_status c = sum_ranks(t, v, 2);
    if (c != DT_OK) return c;
    if (s != DT_OK) return DT_ERR(s, "%s", keep);
    if (v[0] == 0) return DT_OK;
    /* DT_ECOMM: another rank's failure seen from here (its own line is the one the CLI prints) */
    if (v[0] == 1) return DT_ERR(DT_ECOMM, "%s failed on rank %d (see its error)", what, (int)v[1] - 1);
    return DT_ERR(DT_ECOMM, "%s failed on %d ranks (see their errors)", what, (int)v[0]);
}

/* The error of a sharded save the ranks agreed failed (each removed its new
 * files): what is left says so. */
static dt_status save_failed(const dt_trainer *t, dt_status s, int64_t step) {
    if (!t->strat.save_is_dir || s == DT_OK) return s;
    char keep[1024];
    snprintf(keep, sizeof keep, "%s", dt_error_message());
    return DT_ERR(s, "%s (checkpoint of step %lld not saved: every rank removed its new files; the previous one in "
                  "%s is unchanged)", keep, (long long)step, t->opts.save ? t->opts.save : "?");
}

dt_status dt_trainer_save_settle(dt_trainer *t) {
    if (!t->bg || t->bg_step < 0) return DT_OK;
    char what[1200];
    snprintf(what, sizeof what, "background checkpoint of step %lld to %s", (long long)t->bg_step,
             t->opts.save ? t->opts.save : "?");
    int64_t step = t->bg_step;
    t->bg_step = -1;
    dt_status s = dt_bg_writer_wait(t->bg, 0);   /* this rank's files */
    s = agree(t, s, what);
    if (s == DT_OK) s = agree(t, dt_bg_writer_wait(t->bg, 1), what);   /* rank 0's index: the commit */
    if (s != DT_OK) {   /* not committed: every rank removes its shard of the set (the previous set stays) */
        char keep[1024];
        snprintf(keep, sizeof keep, "%s", dt_error_message());
        dt_bg_writer_abandon(t->bg);
        return save_failed(t, DT_ERR(s, "%s", keep), step);
    }
    if (s == DT_OK && t->strat.rank == t->lead_rank && !t->opts.quiet)
        dt_log(DT_LOG_INFO, "dtrain: checkpoint of step %lld written to %s in the background (%.1f s; training "
               "paused %.0f ms: %.0f for the copy, %.0f waiting for the previous save; %.1f MiB held on rank %d)\n",
               (long long)step, t->opts.save, dt_mono_s() - t->bg_t0, (t->bg_copy_s + t->bg_wait_s) * 1e3,
               t->bg_copy_s * 1e3, t->bg_wait_s * 1e3, (double)dt_bg_writer_peak_bytes(t->bg) / 1048576.0,
               t->strat.rank);
    return s;
}

dt_status dt_trainer_save_background(dt_trainer *t, const char *path) {
    DT_TRY(dt_trainer_usable(t, "dt_trainer_save_background"));
    if (t->opts.save_sync) {
        double t0 = dt_mono_s();
        DT_TRY(save_failed(t, dt_trainer_save(t, path), t->step));
        if (t->strat.rank == t->lead_rank && !t->opts.quiet)
            dt_log(DT_LOG_INFO, "dtrain: checkpoint of step %lld written to %s (%.1f s; training paused for the "
                   "whole write, --save-sync)\n", (long long)t->step, path, dt_mono_s() - t0);
        return DT_OK;
    }
    double w0 = dt_mono_s();
    DT_TRY(dt_trainer_save_settle(t));
    double waited = dt_mono_s() - w0;
    if (!t->bg) {
        t->bg_step = -1;
        DT_TRY(dt_bg_writer_create(&t->bg));
    }
    double t0 = dt_mono_s();
    dt_bg_writer_capture(t->bg);
    dt_status s = dt_trainer_save(t, path);   /* collective parts run now; files are queued */
    dt_bg_writer_capture(NULL);
    t->bg_copy_s = dt_mono_s() - t0;
    t->bg_wait_s = waited;
    t->bg_t0 = t0;
    t->bg_step = t->step;
    if (s != DT_OK) {   /* queued pieces of a failed save must not commit a set */
        char keep[1024];
        snprintf(keep, sizeof keep, "%s", dt_error_message());
        dt_bg_writer_abandon(t->bg);   /* (its shards too: the ranks agreed inside the save) */
        t->bg_step = -1;
        return save_failed(t, DT_ERR(s, "%s", keep), t->step);
    }
    return DT_OK;
}
