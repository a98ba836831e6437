/* dt_trainer_run: the step loop with progress line, metrics, checkpoints, final evaluation. */
#include <fcntl.h>
#include <stdio.h>   /* snprintf */
#include <stdlib.h>
#include <unistd.h>
#include "stop_internal.h"
#include "trainer_internal.h"
#include "util/clock.h"
#include "util/log_internal.h"

static void fmt_eta(double s, char *buf, size_t n) {
    long v = s > 0 ? (long)(s + 0.5) : 0;
    snprintf(buf, n, "%ld:%02ld:%02ld", v / 3600, (v / 60) % 60, v % 60);
}

static int64_t items_per_step(const dt_trainer *t) {   /* targets (samples or tokens), all ranks */
    return t->opts.batch * t->opts.accum * t->strat.data_world * t->data.sample.targets;
}

/* progress_file: the completed step count, rewritten in place (best effort:
 * only a launcher's summary reads it) */
static void write_progress(const char *path, int64_t step) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) return;
    char b[32];
    int n = snprintf(b, sizeof b, "%lld\n", (long long)step);
    if (write(fd, b, (size_t)n) != n) { /* nothing to do: best effort */ }
    close(fd);
}

/* The step loop; *code = the agreed stop code (0: ran to total_steps, -1: --stop-after). */
static dt_status train_steps(dt_trainer *t, dt_stop_sync *stop, int tty, int lead, int64_t log_every, int *code) {
    const dt_train_opts *o = &t->opts;
    const char *unit = t->data.rate_unit;
    double t_start = dt_mono_s(), t_prev = t_start;
    int64_t first = t->step;
    /* uneven: this rank's own steps, then join (uneven.c) */
    int64_t end = o->uneven ? t->own_steps : t->total_steps;
    /* a request that came while the job started (loading data, a checkpoint,
     * the model) stops it before its first step, agreed like any other */
    if (t->step < end && dt_trainer_all_ranks_step(t, t->step)) {
        DT_TRY(dt_stop_sync_begin(stop));
        DT_TRY(dt_stop_sync_end(stop, code));
        if (*code) return DT_OK;
    }
    while (t->step < end) {
        double loss;
        /* only while every rank runs steps: a joined rank answers no other collective */
        int every_rank = dt_trainer_all_ranks_step(t, t->step);
        if (every_rank) DT_TRY(dt_stop_sync_begin(stop));
        DT_TRY(dt_trainer_step(t, &loss));
        if (every_rank) DT_TRY(dt_stop_sync_end(stop, code));
        double tn = dt_mono_s(), dt = tn - t_prev;
        t_prev = tn;
        double rate = items_per_step(t) / (dt > 0 ? dt : 1e-9);
        double avg = (tn - t_start) / (double)(t->step - first);
        char eta[32];
        fmt_eta(avg * (double)(t->total_steps - t->step), eta, sizeof eta);
        if (tty)
            dt_log(DT_LOG_PROGRESS, "\rstep %lld/%lld  loss %.4f  %.0f %s  %.1f ms/step  ETA %s   ", (long long)t->step,
                   (long long)t->total_steps, loss, rate, unit, dt * 1e3, eta);
        else if (lead && (t->step % log_every == 0 || t->step == t->total_steps))
            dt_log(DT_LOG_PROGRESS, "step %lld/%lld  loss %.4f  %.0f %s  %.1f ms/step  ETA %s\n", (long long)t->step,
                   (long long)t->total_steps, loss, rate, unit, dt * 1e3, eta);
        if (t->metrics.f) {   /* loss scaling: the scale the step ran with, and whether it was skipped */
            const char *keys[6] = {"step", "loss", "lr", "ms", "loss_scale", "skipped"};
            double vals[6] = {(double)t->step, loss, dt_lr_at(&t->sched, t->step - 1), dt * 1e3, t->last_scale,
                              t->run.skipped};
            DT_TRY(dt_jsonl_write(&t->metrics, t->run.scaler ? 6 : 4, keys, vals));
        }
        if (o->sample_every > 0 && t->step % o->sample_every == 0 && t->strat.rank == t->lead_rank)
            DT_TRY(dt_trainer_sample(t, tty));
        if (o->progress_file && t->strat.rank == 0) write_progress(o->progress_file, t->step);
        /* a stop after any other step saves in stop_early; after the last,
         * the run ends as usual, which takes this save for the final one */
        if (o->save && o->save_every > 0 && t->step % o->save_every == 0 && (!*code || t->step >= t->total_steps))
            DT_TRY(dt_trainer_save_background(t, o->save));
        if (*code) {   /* agreed: every rank stops after this step (unless it was the last) */
            if (t->step >= t->total_steps) *code = 0;
            return DT_OK;
        }
        if (o->stop_after > 0 && t->step - first >= o->stop_after) {
            *code = -1;
            return DT_OK;   /* testing aid: behave as if killed here */
        }
    }
    if (o->uneven) DT_TRY(dt_trainer_uneven_join(t));
    return DT_OK;
}

/* Stopped by a request (signal) after step t->step: checkpoint (unless the
 * final one was written already, before evaluation), say so once. */
static dt_status stop_early(dt_trainer *t, int code, int in_eval) {
    const char *save = t->opts.save;
    if (save && !in_eval) DT_TRY(dt_trainer_save_background(t, save));
    DT_TRY(dt_trainer_save_settle(t));   /* (in evaluation: the final save, started before it) */
    dt_stop_set_stopped(code);
    if (t->strat.rank == 0) {
        const char *when = in_eval ? " during evaluation" : "";
        if (save) dt_log(DT_LOG_INFO, "interrupted at step %lld%s, saved to %s\n", (long long)t->step, when, save);
        else dt_log(DT_LOG_INFO, "interrupted at step %lld%s, not saved (no train.save)\n", (long long)t->step, when);
    }
    return DT_OK;
}

dt_status dt_trainer_run(dt_trainer *t) {
    DT_TRY(dt_trainer_usable(t, "dt_trainer_run"));
    const dt_train_opts *o = &t->opts;
    int leader = t->strat.rank == t->lead_rank;   /* the result line: also when quiet */
    int lead = leader && !o->quiet;                /* start-up and progress lines */
    /* Under mpirun every rank's stdout is a pty even when the user's is not:
     * the --nproc launcher passes the real answer down in DTRAIN_TTY. */
    const char *tty_env = getenv("DTRAIN_TTY");
    int tty = lead && (tty_env ? tty_env[0] == '1' : t->strat.world == 1 && isatty(STDOUT_FILENO));
    int64_t log_every = o->log_every > 0 ? o->log_every : (t->total_steps >= 20 ? t->total_steps / 20 : 1);
    const dt_dataset *d = &t->data;
    if (lead) {
        size_t whole = t->model_params_whole;   /* > model_params: this rank holds tp parts */
        char part[64] = "";
        if (whole != t->model_params) snprintf(part, sizeof part, " (%zu on each tensor-parallel rank)", t->model_params);
        long long left = (long long)(t->total_steps - t->step);
        dt_log(DT_LOG_INFO, "dtrain: %s, %zu parameters%s, %s x%d, %lld step%s of %lld %s\n",
               t->model->name, whole, part, t->strat.name, t->strat.world, left, left == 1 ? "" : "s",
               (long long)items_per_step(t), d->unit);
    }
    if (lead) {
        char desc[192];
        dt_gemm_describe(desc, sizeof desc);
        dt_dtype sd = dt_train_saved_dtype(&t->opts), pd = dt_train_param_dtype(&t->opts);
        dt_log(DT_LOG_INFO, "dtrain: GEMM: %s; %s%s%s\n", desc, dt_gemm_precision_describe(),
               pd == DT_BF16 ? "; weights: a bf16 working copy of fp32 masters (1-D ones exact)"
               : pd == DT_F16 ? "; weights: an fp16 working copy of fp32 masters (1-D ones exact)" : "",
               sd != DT_F32 && t->opts.recompute == DT_RECOMPUTE_BLOCKS
                   ? "; activations: every block recomputed in backward, so none kept in 16 bits"
               : sd == DT_BF16 ? "; activations kept for backward in bf16" : sd == DT_F16 ? "; activations kept for backward in fp16"
               : t->opts.precision == DT_PREC_BF16 && t->opts.saved_activations == DT_SAVED_AUTO ? "; activations fp32 (--saved-activations bf16 halves them for ~10% "
                                                     "more step time)" : "");
        if (dt_gemm_backend_in_use() == DT_GEMM_OPENBLAS) dt_blas_warn_fallback();
    }
    dt_stop_sync *stop = calloc(1, sizeof *stop);   /* heap: see dt_stop_sync_abandon */
    if (!stop) return DT_ERR(DT_ENOMEM, "out of memory");
    dt_stop_set_stopped(0);
    dt_status s = dt_stop_sync_init(stop, t->strat.world);
    if (s != DT_OK) { free(stop); return s; }
    int code = 0;
    int64_t start_step = t->step;
    s = train_steps(t, stop, tty, lead, log_every, &code);
    if (s == DT_OK) {
        dt_stop_sync_free(stop);
        free(stop);
    } else {
        dt_stop_sync_abandon(stop);   /* peers may be waiting elsewhere: no collective teardown */
    }
    if (tty) dt_log(DT_LOG_PROGRESS, "\n");
    if (s == DT_OK && lead && t->run.scaler)
        dt_log(DT_LOG_INFO, "dtrain: loss scaling: %lld of %lld steps skipped (a gradient not finite), scale now %g\n",
               (long long)t->scaler.skipped, (long long)(t->step - start_step), (double)t->scaler.scale);
    if (s == DT_OK && code < 0) s = dt_trainer_save_settle(t);   /* what a --stop-after run saved is on disk */
    if (s != DT_OK || code < 0) return s;   /* code < 0: --stop-after */
    if (code) return stop_early(t, code, 0);
    /* the loop's --save-every may have saved this very step already; a
     * request during the final save is agreed in evaluation's first round */
    int saved = o->save_every > 0 && t->step % o->save_every == 0 && t->step > start_step;
    if (o->save && !saved) DT_TRY(dt_trainer_save_background(t, o->save));   /* written while evaluation runs */
    double loss, acc;
    DT_TRY(dt_trainer_evaluate(t, &loss, &acc));
    if ((code = dt_train_stopped()) != 0) return stop_early(t, code, 1);
    DT_TRY(dt_trainer_save_settle(t));
    if (leader) {
        if (d->headline_loss)   /* "validation loss: 1.2345  (token accuracy 0.4567)" */
            dt_log(DT_LOG_INFO, "%s loss: %.4f  (%s %.4f)\n", d->eval_name, loss, d->metric, acc);
        else                    /* "test accuracy: 0.8765  test loss: 0.3456" */
            dt_log(DT_LOG_INFO, "%s %s: %.4f  %s loss: %.4f\n", d->eval_name, d->metric, acc, d->eval_name, loss);
    }
    return DT_OK;
}
