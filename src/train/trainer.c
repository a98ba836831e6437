/* The training loop shared by every strategy. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "stop_internal.h"
#include "trainer_internal.h"

/* run.example: the first `batch` training samples (fewer if the set is smaller). */
static dt_status example_batch(dt_trainer *t) {
    int64_t n = t->opts.batch, size = t->data.size[DT_SPLIT_TRAIN];
    if (n > size) n = size;
    if (n <= 0) return DT_ERR(DT_EINVAL, "the training set is empty");
    for (int64_t i = 0; i < n; i++) {
        t->idx[i] = i;
        t->row_keys[i] = dt_dropout_row_key(t->model->dropout_seed, (uint64_t)t->step, (uint64_t)i);
    }
    t->run.example = dt_trainer_batch(t, DT_SPLIT_TRAIN, n);
    return DT_OK;
}

/* train.init / train.resume can be opened: checked before the data, so that
 * an unreadable file is what the error names, not what a model built
 * without it makes of the data (the CLI takes the model from the file) */
static dt_status ckpt_readable(const dt_train_opts *o) {
    const char *path = o->init ? o->init : o->resume;
    if (!path) return DT_OK;
    dt_ckpt *c;
    dt_status e = dt_ckpt_open(path, &c);
    if (e != DT_OK) {
        char why[512];
        snprintf(why, sizeof why, "%s", dt_error_message());
        return DT_ERR(e, "train.%s: %s", o->init ? "init" : "resume", why);
    }
    dt_ckpt_close(c);
    return DT_OK;
}

/* A resumed run keeps its data order: the checkpoint's position is one of
 * its seed's order, and another seed's order from there would repeat some
 * samples and skip others this epoch. (Evaluation draws none: any seed.) */
static dt_status same_seed(const dt_train_opts *o) {
    dt_ckpt_model cm;
    if (dt_checkpoint_read_model(o->resume, &cm) != DT_OK) {   /* (the load says what is wrong with it) */
        dt_error_clear();
        return DT_OK;
    }
    if (!cm.has_seed || cm.seed == o->seed) return DT_OK;
    return DT_ERR(DT_EINVAL, "%s was saved with train.seed %llu, this run has %llu (a resumed run keeps its data "
                  "order: resume with the same seed)", o->resume, (unsigned long long)cm.seed,
                  (unsigned long long)o->seed);
}

dt_status dt_trainer_create(const dt_train_opts *o, const dt_strategy *strat, dt_trainer **out) {
    if (!o || !out) return DT_ERR(DT_EINVAL, "dt_trainer_create: %s is NULL", !o ? "opts" : "out");
    *out = NULL;
    DT_TRY(dt_train_opts_validate(o));
    dt_trainer *t = calloc(1, sizeof *t);
    if (!t) return DT_ERR(DT_ENOMEM, "out of memory");
    t->opts = *o;
    t->save_lock = -1;
    if (strat) t->strat = *strat;
    else t->strat = (dt_strategy){.name = "single", .rank = 0, .world = 1};
    if (t->strat.data_world <= 0) { t->strat.data_rank = t->strat.rank; t->strat.data_world = t->strat.world; }
    if (t->strat.owns_optimizer && !t->strat.step) {
        dt_status e = DT_ERR(DT_EINVAL, "strategy %s owns the optimizer but has no step()", t->strat.name ? t->strat.name : "?");
        free(t);
        return e;
    }
    if (o->threads > 0) omp_set_num_threads(o->threads);
    dt_status s = dt_cpu_set_flush_denormal(!o->keep_denormals);
    if (s == DT_OK) s = dt_gemm_set_precision((dt_precision)o->precision);
    if (s == DT_OK && dt_train_loss_scaling(o))
        s = dt_loss_scaler_init(&t->scaler, o->loss_scale_init > 0 ? o->loss_scale_init : DT_LOSS_SCALE_INIT,
                                o->loss_scale != DT_LOSS_SCALE_FIXED,
                                o->loss_scale_window > 0 ? o->loss_scale_window : DT_LOSS_SCALE_WINDOW);
    dt_dtype pd = dt_train_param_dtype(o);
    if (s == DT_OK && t->strat.owns_optimizer && (dt_dtype)t->strat.param_dtype != pd)
        s = DT_ERR(DT_EINVAL, "train.param_dtype is %s but strategy %s computes with %s weights (set the same param_dtype "
                   "in its options)", dt_dtype_name(pd), t->strat.name ? t->strat.name : "?",
                   dt_dtype_name((dt_dtype)t->strat.param_dtype));
    if (!t->strat.owns_optimizer) t->wcopy.dtype = pd;
    if (s == DT_OK) s = dt_trainer_check_unfreeze(t);
    /* one rank: before any work a bad path would waste; several: in
     * claim_outputs, after the agreement, where all ranks meet */
    if (s == DT_OK && t->strat.world <= 1) s = dt_trainer_check_outputs(t);
    if (s == DT_OK) s = ckpt_readable(o);
    if (s == DT_OK) s = dt_trainer_load_data(t);
    if (s == DT_OK) s = dt_trainer_fit_model(t);
    /* the strategy's say in the build (tp: this rank's part) before the
     * memory check, which sizes that part */
    if (s == DT_OK && t->strat.prepare_model) s = t->strat.prepare_model(t->strat.self, &t->opts.model);
    if (s == DT_OK) s = dt_trainer_check_memory(t);   /* sized, not yet allocated */
    if (s == DT_OK && o->build_model) dt_error_clear();   /* what it says, if it fails, is its own */
    if (s == DT_OK) s = o->build_model ? o->build_model(o->build_user, o->seed, &t->model)
                                       : dt_model_create(&t->opts.model, o->seed, &t->model);
    if (s != DT_OK && o->build_model && !dt_error_message()[0])   /* a user's builder that said nothing */
        s = DT_ERR(s, "train.build_model failed (returned %s without a message)", dt_status_name(s));
    if (s == DT_OK && !t->model) s = DT_ERR(DT_EINVAL, "build_model returned no model");
    if (s == DT_OK && !t->model->built) s = DT_ERR(DT_EINVAL, "model %s: build_model must end with dt_model_build", t->model->name);
    if (s == DT_OK) s = dt_trainer_check_data(t);
    if (s == DT_OK) s = dt_trainer_check_sample(t);   /* the same on every rank */
    if (s == DT_OK) s = dt_trainer_freeze(t);   /* before the agreement lists "frozen" and any strategy sees it */
    if (s == DT_OK) s = dt_trainer_agree(t);   /* before the strategy's first collective */
    if (s == DT_OK) s = dt_trainer_claim_outputs(t);   /* paths agreed, the save directory's lock (rank 0), before step 1 */
    /* a mode only when asked: none must not unmark blocks a user's builder marked */
    if (s == DT_OK && o->recompute != DT_RECOMPUTE_NONE) dt_model_set_recompute(t->model, o->recompute);
    /* as recompute: AUTO resolving to fp32 leaves a user's builder's marks alone; asked for, it sets every block */
    if (s == DT_OK && (o->saved_activations != DT_SAVED_AUTO || dt_train_saved_dtype(o) != DT_F32))
        dt_model_set_saved_dtype(t->model, dt_train_saved_dtype(o));
    if (s == DT_OK && o->init) s = dt_model_load_params(t->model, o->init);
    if (s == DT_OK && !(t->graph = dt_graph_create())) s = DT_ENOMEM;
    if (s == DT_OK && !t->strat.owns_optimizer) s = dt_optimizer_init_model(&t->optim, &t->opts.optim, t->model);
    /* uneven: the data already holds only this rank's files, sampled whole */
    if (s == DT_OK) s = dt_sampler_init(&t->sampler, t->data.size[DT_SPLIT_TRAIN], o->seed, 1,
                                        o->uneven ? 0 : t->strat.data_rank, o->uneven ? 1 : t->strat.data_world, 0);
    if (s == DT_OK) s = dt_trainer_check_sizes(t);   /* the same on every rank: before uneven's collective */
    if (s == DT_OK) {
        int64_t per_step = o->batch * o->accum;
        int64_t steps_per_epoch = t->sampler.per_rank / per_step;
        if (o->uneven) s = dt_trainer_uneven_steps(t, steps_per_epoch);   /* collective: sets total_steps */
        else if (steps_per_epoch < 1 && o->steps == 0)
            s = DT_ERR(DT_EINVAL, "an epoch (%lld samples per rank) is smaller than one step (%lld)",
                       (long long)t->sampler.per_rank, (long long)per_step);
        if (!o->uneven) t->total_steps = o->steps ? o->steps : steps_per_epoch * o->epochs;
        t->sched = (dt_lr_schedule){o->optim.lr, o->min_lr, o->warmup, o->min_lr < o->optim.lr ? t->total_steps : 0};
        if (o->min_lr == 0 && o->warmup == 0) t->sched.total = 0;   /* constant LR unless asked */
    }
    if (s == DT_OK) {
        t->run = (dt_run){.model = t->model, .graph = t->graph, .optim = &t->opts.optim, .clip = o->clip,
                          .lr = o->optim.lr, .quiet = o->quiet, .step = &t->step, .sampler = &t->sampler,
                          .seed = o->seed, .rank = t->strat.data_rank, .world = t->strat.data_world,
                          .accum = o->accum, .data = o->data, .optimizer = t->strat.owns_optimizer ? NULL : &t->optim,
                          .scaler = dt_train_loss_scaling(o) ? &t->scaler : NULL,
                          .param_copy_bytes = t->wcopy.dtype != DT_F32 ? t->model->param_flat.numel * sizeof(float) : 0};
        s = example_batch(t);
    }
    if (s == DT_OK && o->resume && !o->eval_only) s = same_seed(o);
    if (s == DT_OK && o->resume && !t->strat.load) s = dt_checkpoint_load(t, o->resume);
    if (s == DT_OK) {   /* before setup: a pipeline stage then holds only its part */
        t->model_params = dt_model_num_params(t->model);
        t->model_params_whole = dt_model_num_params_whole(t->model);
    }
    if (s == DT_OK && t->strat.setup) s = t->strat.setup(t->strat.self, &t->run);
    t->run.example = (dt_batch){0};   /* setup only: the buffers are reused for training */
    if (s == DT_OK && o->resume && t->strat.load) s = t->strat.load(t->strat.self, &t->run, o->resume);
    if (s == DT_OK && o->resume && !o->eval_only && t->step > t->total_steps)   /* a run that would train "-N steps" */
        s = o->steps ? DT_ERR(DT_EINVAL, "train.steps %lld is below step %lld of checkpoint %s", (long long)o->steps,
                              (long long)t->step, o->resume)
                     : DT_ERR(DT_EINVAL, "train.epochs %d (%lld steps) end before step %lld of checkpoint %s", o->epochs,
                              (long long)t->total_steps, (long long)t->step, o->resume);
    /* (at step unfreeze_at itself the parameters are still frozen: the step
     * that follows unfreezes them, resumed or not) */
    if (s == DT_OK && o->resume && !o->eval_only && o->unfreeze_at > 0 && t->step > o->unfreeze_at)
        s = DT_ERR(DT_EINVAL, "checkpoint %s is at step %lld, not before train.unfreeze_at %lld: its train.freeze parameters "
                   "already train, so resume it without train.freeze and train.unfreeze_at", o->resume, (long long)t->step,
                   (long long)o->unfreeze_at);
    /* resumed: the steps after the checkpoint are logged again, not twice */
    if (s == DT_OK && o->metrics && o->resume && !o->eval_only && t->strat.rank == 0)
        s = dt_jsonl_drop_after(o->metrics, t->step);
    /* the rank that runs every step writes them (uneven: the one with the most data) */
    if (s == DT_OK && o->metrics && t->strat.rank == t->lead_rank) s = dt_jsonl_open(&t->metrics, o->metrics);
    if (s == DT_OK && o->trace) {
        char path[4096];
        dt_trainer_trace_path(t, path, sizeof path);
        s = dt_trace_open(&t->trace, path, t->strat.rank);
        t->run.trace = t->trace;
    }
    if (s != DT_OK) { dt_trainer_free(t); return s; }
    *out = t;
    return DT_OK;
}

dt_status dt_trainer_usable(const dt_trainer *t, const char *fn) {
    if (!t) return DT_ERR(DT_EINVAL, "%s: trainer is NULL", fn);
    if (t->finished)
        return DT_ERR(DT_ESTATE, "%s: dt_trainer_finish already ran (its strategy and outputs are closed): only "
                      "dt_trainer_free may follow", fn);
    return DT_OK;
}

dt_status dt_trainer_save(dt_trainer *t, const char *path) {
    DT_TRY(dt_trainer_usable(t, "dt_trainer_save"));
    if (t->strat.save) return t->strat.save(t->strat.self, &t->run, path);
    return dt_checkpoint_save(t, path);
}

void dt_trainer_free(dt_trainer *t) {
    if (!t) return;
    dt_trainer_finish(t);   /* strategy, trace, metrics (a no-op when done); an error path: the result has nowhere to go */
    dt_graph_free(t->graph);   /* before the model: resetting the tape touches its params */
    if (t->model) dt_working_copy_leave(&t->wcopy, t->model);
    dt_model_free(t->model);
    dt_working_copy_free(&t->wcopy);
    dt_optimizer_free(&t->optim);
    dt_sampler_free(&t->sampler);
    dt_trainer_free_data(t);
    dt_ckpt_unlock_dir(t->save_lock);
    free(t);
}

/* Next full local batch into slot k; crosses epoch boundaries (the partial
 * tail is dropped, and every rank drops the same amount because shards are
 * equal-sized). Also the rows' dropout keys (train.h: row_keys): a full call
 * leaves the sampler in the batch's epoch with its cursor just past it, so
 * row i was local position cursor - B + i, global r + p * world. */
static int64_t next_batch(dt_trainer *t, int k) {
    const dt_sampler *sp = &t->sampler;
    int64_t B = t->opts.batch, *idx = t->idx + k * B, n = dt_sampler_next(&t->sampler, B, idx);
    if (n < B) n = dt_sampler_next(&t->sampler, B, idx);
    if (n < B) return n;
    /* uneven: each rank samples its own files alone; its rank keeps the keys apart */
    uint64_t base = (uint64_t)sp->epoch * (uint64_t)sp->n + (t->opts.uneven ? (uint64_t)t->strat.data_rank << 48 : 0);
    for (int64_t i = 0; i < B; i++) {
        int64_t g = sp->rank + (sp->cursor - B + i) * (int64_t)sp->world;
        t->row_keys[k * B + i] = dt_dropout_row_key(t->model->dropout_seed, (uint64_t)t->step, base + (uint64_t)g);
    }
    return n;
}

/* A step never spans two epochs: fewer than batch x accum samples left in
 * this one are dropped, as one process at --batch B x K drops them (else a
 * pipeline, or --accum K, trained on other samples than --batch B x K from
 * the second epoch on). A whole epoch smaller than a step (cursor 0) is still
 * drawn across epochs, micro-batch by micro-batch. */
static dt_status skip_epoch_tail(dt_trainer *t) {
    const dt_sampler *sp = &t->sampler;
    int64_t step = t->opts.batch * t->opts.accum;
    if (sp->cursor == 0 || sp->per_rank - sp->cursor >= step) return DT_OK;
    return dt_sampler_seek(&t->sampler, sp->epoch + 1, 0);
}

/* All K micro-batches first, then the strategy runs them (pipeline). */
static dt_status step_scheduled(dt_trainer *t, double *loss_sum) {
    int K = t->opts.accum;
    dt_batch *mb = malloc((size_t)K * sizeof *mb);
    if (!mb) return DT_ERR(DT_ENOMEM, "out of memory for %d micro-batch descriptors", K);
    dt_status s = DT_OK;
    for (int k = 0; k < K && s == DT_OK; k++) {   /* drawn in the order one process would draw them */
        if (next_batch(t, k) < t->opts.batch)
            s = DT_ERR(DT_EINVAL, "dataset too small for batch %lld", (long long)t->opts.batch);
        else mb[k] = dt_trainer_batch_in(t, k, DT_SPLIT_TRAIN, t->opts.batch);
    }
    if (s == DT_OK) s = t->strat.forward_backward(t->strat.self, &t->run, mb, K, loss_sum);
    free(mb);
    return s;
}

/* The squared gradient norm train.clip clips by: the strategy's when it
 * splits parameters over ranks (tensor parallelism), else the local flat
 * gradient's. */
static dt_status grad_sumsq(dt_trainer *t, double *ss) {
    if (t->strat.grad_sumsq) return t->strat.grad_sumsq(t->strat.self, &t->run, ss);
    *ss = dt_sumsq(t->model->grad_flat.data, t->model->grad_flat.numel);
    return DT_OK;
}

/* Loss scaling with the trainer's optimizer (strategy.h): the squared norm
 * of the gradients (reduced: DDP's equal on every rank, but for
 * params_to_ignore; tensor parallelism's over its split) and one small sum
 * of "not finite" over the ranks, so every rank skips alike. */
static dt_status scaled_verdict(dt_trainer *t, float *scale) {
    double ss;
    DT_TRY(grad_sumsq(t, &ss));
    if (t->strat.allreduce_sum && t->strat.world > 1) {
        double bad = isfinite(ss) ? 0.0 : 1.0;
        DT_TRY(t->strat.allreduce_sum(t->strat.self, &bad, 1));
        if (bad > 0) ss = INFINITY;
    }
    t->run.skipped = dt_loss_scaler_verdict(&t->scaler, ss, t->opts.clip, scale);
    return DT_OK;
}

/* The working copy (train.param_dtype). fp16 refuses a parameter beyond its
 * range; where ranks hold different parameters (tensor-parallel parts) one
 * rank alone may refuse, so the strategy agrees on it before any collective.
 * On failure dt_trainer_step / _evaluate leave the copy. */
static dt_status enter_working_copy(dt_trainer *t) {
    dt_status s = dt_working_copy_enter(&t->wcopy, t->model);
    if (t->wcopy.dtype == DT_F16 && t->strat.agree_status)
        s = t->strat.agree_status(t->strat.self, s, "the fp16 working copy of the parameters");
    return s;
}

static dt_status step_impl(dt_trainer *t, double *loss_out) {
    dt_model *m = t->model;
    int K = t->opts.accum;
    double loss_sum = 0;
    int every_rank = dt_trainer_all_ranks_step(t, t->step);   /* else (uneven) the loss stays this rank's */
    if (t->opts.unfreeze_at > 0 && t->step == t->opts.unfreeze_at && !t->unfrozen) DT_TRY(dt_trainer_unfreeze(t));
    double t0 = dt_trace_now_us(t->trace);
    float lr = dt_lr_at(&t->sched, t->step);
    t->run.lr = lr;
    DT_TRY(enter_working_copy(t));   /* param_dtype: forward and backward read the rounded weights */
    DT_TRY(skip_epoch_tail(t));
    if (t->strat.forward_backward) DT_TRY(step_scheduled(t, &loss_sum));
    for (int k = 0; !t->strat.forward_backward && k < K; k++) {
        int last = k == K - 1;
        if (next_batch(t, 0) < t->opts.batch)
            return DT_ERR(DT_EINVAL, "dataset too small for batch %lld", (long long)t->opts.batch);
        dt_batch b = dt_trainer_batch(t, DT_SPLIT_TRAIN, t->opts.batch);
        dt_graph_reset(t->graph);
        dt_graph_set_training(t->graph, 1);
        if (t->strat.before_forward) DT_TRY(t->strat.before_forward(t->strat.self, &t->run, last));
        double f0 = dt_trace_now_us(t->trace);
        dt_tensor *loss = dt_model_forward(m, t->graph, &b, NULL);
        if (!loss) return dt_error_code() ? dt_error_code() : DT_EINVAL;
        double f1 = dt_trace_now_us(t->trace);
        dt_trace_event(t->trace, "forward", "compute", 0, f0, f1);
        loss_sum += dt_f32(loss)[0];
        /* loss scaling: the seed is S / K (strategy.h), S a power of two when dynamic */
        DT_TRY(dt_graph_backward_scaled(t->graph, loss, t->run.scaler ? t->scaler.scale / (float)K : 1.0f / (float)K));
        dt_trace_event(t->trace, "backward", "compute", 0, f1, dt_trace_now_us(t->trace));
        if (t->strat.after_backward) DT_TRY(t->strat.after_backward(t->strat.self, &t->run, last));
    }
    dt_working_copy_leave(&t->wcopy, m);   /* the optimizer steps the masters */
    double o0 = dt_trace_now_us(t->trace);
    t->run.skipped = 0;
    t->last_scale = t->scaler.scale;
    if (t->strat.owns_optimizer) {
        DT_TRY(t->strat.step(t->strat.self, &t->run, lr));
    } else {
        float scale = 1.0f;
        if (t->run.scaler) {
            DT_TRY(scaled_verdict(t, &scale));
        } else if (t->opts.clip > 0) {
            double ss;
            DT_TRY(grad_sumsq(t, &ss));
            scale = dt_clip_scale(sqrt(ss), t->opts.clip);
        }
        if (!t->run.skipped) {
            DT_TRY(dt_optimizer_step_range(&t->optim, lr, m->param_flat.data, m->grad_flat.data, 0, m->param_flat.numel, scale));
            dt_optimizer_finish_step(&t->optim);
        }
        dt_model_zero_grad(m);
    }
    if (t->run.scaler) dt_loss_scaler_update(&t->scaler, t->run.skipped);
    t->step++;
    dt_trace_event(t->trace, "optimizer", "compute", 0, o0, dt_trace_now_us(t->trace));
    dt_trace_event(t->trace, "step", "compute", 0, t0, dt_trace_now_us(t->trace));
    double loss = loss_sum / K;
    if (t->strat.allreduce_sum && every_rank) {
        DT_TRY(t->strat.allreduce_sum(t->strat.self, &loss, 1));
        loss /= t->strat.data_world;
    }
    t->last_loss = loss;
    if (loss_out) *loss_out = loss;
    if (!isfinite(loss))   /* (fp16: the forward's products overflow; a loss scale only guards the backward) */
        return DT_ERR(DT_EINVAL, "loss is %g at step %lld (%s)", loss, (long long)t->step,
                      t->opts.precision == DT_PREC_FP16 ? "fp16 products overflow past 65504 in the forward pass? try "
                      "train.precision bf16, or lower train.optim.lr" : "lower train.optim.lr?");
    return DT_OK;
}

dt_status dt_trainer_step(dt_trainer *t, double *loss_out) {
    DT_TRY(dt_trainer_usable(t, "dt_trainer_step"));
    if (t->opts.eval_only)
        return DT_ERR(DT_EINVAL, "dt_trainer_step: this trainer was created with train.eval_only (to evaluate): it has "
                      "no gradients or optimizer state");
    dt_status s = step_impl(t, loss_out);
    dt_working_copy_leave(&t->wcopy, t->model);   /* also after a failure: between steps the views are the masters' */
    return s;
}

/* Evaluation batches handed to the strategy's forward_only, up to one step's
 * worth of slots at a time. */
typedef struct eval_group { int n; dt_batch b[64]; } eval_group;

static dt_status eval_flush(dt_trainer *t, eval_group *q, double *sums) {
    dt_status s = q->n ? t->strat.forward_only(t->strat.self, &t->run, q->b, q->n, sums) : DT_OK;
    q->n = 0;
    return s;
}

/* One round of evaluation: this rank's batch at `start` (counted when below
 * limit), queued for a scheduling strategy or run at once. */
static dt_status eval_round(dt_trainer *t, eval_group *q, int slots, int64_t start, int64_t limit, double *sums) {
    const dt_dataset *d = &t->data;
    int64_t B = t->opts.batch;
    int counted = start < limit;
    int64_t s0 = counted ? start : 0;
    int64_t n = limit - s0 < B ? limit - s0 : B;
    if (q) {   /* a scheduling strategy: all ranks of a replica see the same batches */
        if (!counted && !t->strat.collective_forward) return DT_OK;
        if (!counted) {   /* block 0 once more, its sums thrown away (in a call of its own) */
            double none[3] = {0, 0, 0};
            DT_TRY(eval_flush(t, q, sums));
            for (int64_t i = 0; i < n; i++) t->idx[i] = s0 + i;
            q->b[q->n++] = dt_trainer_batch_in(t, 0, DT_SPLIT_EVAL, n);
            return eval_flush(t, q, none);
        }
        for (int64_t i = 0; i < n; i++) t->idx[q->n * B + i] = s0 + i;
        q->b[q->n] = dt_trainer_batch_in(t, q->n, DT_SPLIT_EVAL, n);
        return ++q->n == slots ? eval_flush(t, q, sums) : DT_OK;
    }
    /* without collective forwards a rank past the end has nothing to run */
    if (!counted && !t->strat.collective_forward) return DT_OK;
    for (int64_t i = 0; i < n; i++) t->idx[i] = s0 + i;
    dt_batch b = dt_trainer_batch(t, DT_SPLIT_EVAL, n);
    double e0 = dt_trace_now_us(t->trace);   /* (loading the batch is not compute) */
    dt_graph_reset(t->graph);
    dt_tensor *logits = NULL, *loss = dt_model_forward(t->model, t->graph, &b, &logits);
    if (!loss) return dt_error_code() ? dt_error_code() : DT_EINVAL;
    int64_t correct = counted ? dt_model_count_correct(t->model, logits, b.y) : 0;   /* split logits: collective */
    dt_trace_event(t->trace, "evaluate", "compute", 0, e0, dt_trace_now_us(t->trace));
    if (!counted) return DT_OK;
    int64_t rows = n * d->sample.targets;
    sums[0] += dt_f32(loss)[0] * (double)rows;
    if (correct < 0) return dt_error_code() ? dt_error_code() : DT_EINVAL;
    sums[1] += (double)correct;
    sums[2] += (double)rows;
    return DT_OK;
}

static dt_status evaluate_impl(dt_trainer *t, double *loss_out, double *acc_out) {
    const dt_dataset *d = &t->data;
    int64_t B = t->opts.batch;
    int64_t n_items = d->size[DT_SPLIT_EVAL];
    int64_t limit = d->eval_limited && t->opts.eval_batches ? t->opts.eval_batches * B : n_items;
    if (limit > n_items) limit = n_items;
    if (loss_out) *loss_out = NAN;
    if (acc_out) *acc_out = NAN;
    dt_stop_set_stopped(0);
    if (t->strat.sync_params) DT_TRY(t->strat.sync_params(t->strat.self, &t->run));
    DT_TRY(enter_working_copy(t));   /* evaluated as trained: with the working copy */
    dt_stop_sync *stop = calloc(1, sizeof *stop);   /* heap: see dt_stop_sync_abandon */
    if (!stop) return DT_ERR(DT_ENOMEM, "out of memory");
    dt_status st = dt_stop_sync_init(stop, t->strat.world);
    if (st != DT_OK) { free(stop); return st; }
    int prev_grad = dt_graph_set_grad_enabled(t->graph, 0);
    dt_graph_set_training(t->graph, 0);
    double sums[3] = {0, 0, 0};   /* loss * rows, correct, rows */
    eval_group *q = NULL;
    int slots = dt_trainer_batch_slots(t);
    if (t->strat.forward_only && !(q = calloc(1, sizeof *q))) st = DT_ERR(DT_ENOMEM, "out of memory");
    if (slots > (int)(sizeof q->b / sizeof q->b[0])) slots = (int)(sizeof q->b / sizeof q->b[0]);
    /* replicas evaluate interleaved blocks of the fixed (unshuffled) set; with
     * collective forwards every rank runs as many (a rank past the end
     * repeats block 0 and counts nothing). Every rank goes through the same
     * rounds: a stop request is agreed over the ranks in each, as at a
     * training step (stop.c), so all of them leave after the same round. */
    int64_t stride = (int64_t)t->strat.data_world * B;
    int64_t rounds = (limit + stride - 1) / stride;
    int code = 0;
    for (int64_t k = 0, start = (int64_t)t->strat.data_rank * B; st == DT_OK && !code && k < rounds; k++, start += stride) {
        st = dt_stop_sync_begin(stop);
        if (st == DT_OK) st = eval_round(t, q, slots, start, limit, sums);
        if (st == DT_OK) st = dt_stop_sync_end(stop, &code);
    }
    if (q && st == DT_OK && !code) st = eval_flush(t, q, sums);
    free(q);
    dt_graph_reset(t->graph);
    dt_graph_set_grad_enabled(t->graph, prev_grad);
    dt_graph_set_training(t->graph, 1);
    if (st != DT_OK) {
        dt_stop_sync_abandon(stop);   /* peers may be waiting elsewhere: no collective teardown */
        return st;
    }
    dt_stop_sync_free(stop);
    free(stop);
    if (code) {   /* every rank stopped after the same round: no result */
        dt_stop_set_stopped(code);
        return DT_OK;
    }
    if (t->strat.allreduce_sum) DT_TRY(t->strat.allreduce_sum(t->strat.self, sums, 3));
    if (sums[2] <= 0) return DT_ERR(DT_EINVAL, "evaluation set is empty");
    if (loss_out) *loss_out = sums[0] / sums[2];
    if (acc_out) *acc_out = sums[1] / sums[2];
    return DT_OK;
}

dt_status dt_trainer_evaluate(dt_trainer *t, double *loss_out, double *acc_out) {
    double loss = NAN, acc = NAN;   /* unless it completes */
    if (loss_out) *loss_out = loss;
    if (acc_out) *acc_out = acc;
    DT_TRY(dt_trainer_usable(t, "dt_trainer_evaluate"));
    dt_status s = evaluate_impl(t, &loss, &acc);
    dt_working_copy_leave(&t->wcopy, t->model);
    if (loss_out) *loss_out = loss;
    if (acc_out) *acc_out = acc;
    if (s == DT_OK && t->metrics.f && !dt_train_stopped()) {   /* (a stopped evaluation has no result) */
        const char *keys[3] = {"step", "eval_loss", "eval_accuracy"};
        double vals[3] = {(double)t->step, loss, acc};
        s = dt_jsonl_write(&t->metrics, 3, keys, vals);
    }
    return s;
}
