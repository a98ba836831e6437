/* What every rank of a run must agree on (dist.h section 8), listed for the
 * strategy's agreement before any collective of the run: the strategy, the
 * model (built-in config, or a user model's name, parameter and buffer
 * names, dtypes and shapes), the data, the loop's sizes, the optimizer, the
 * checkpoints read and written. Not listed: what only changes this rank's
 * speed or output (threads, metrics, trace, log interval, quiet). */
#include <stdio.h>
#include "trainer_internal.h"

static void shape(char *o, size_t n, const dt_tensor *t) {
    size_t at = (size_t)snprintf(o, n, "%s [", dt_dtype_name(t->dtype));
    for (int d = 0; d < t->ndim && at < n; d++)
        at += (size_t)snprintf(o + at, n - at, d ? ", %lld" : "%lld", (long long)t->shape[d]);
    if (at < n) snprintf(o + at, n - at, "]");
}

static void describe_model(const dt_trainer *t, dt_agree *a) {
    const dt_model_cfg *c = &t->opts.model;
    if (t->opts.build_model) {
        dt_agree_add(a, "model (build_model)", "%s", t->model->name);
    } else {   /* a built-in: its registry entry's settings (nn.h section 4b) */
        dt_agree_add(a, "train.model.kind", "%s", dt_model_kind_name(c->kind));
        dt_arch_field f[DT_ARCH_FIELDS_MAX];
        int n = dt_model_settings(c, f);
        for (int i = 0; i < n; i++) dt_agree_add(a, f[i].key, "%s", f[i].value);
    }
    /* the built model itself: catches what a config does not say (a user's
     * builder, a library difference between ranks) */
    const dt_model *m = t->model;
    dt_agree_add(a, "model parameters, buffers, blocks", "%d, %d, %d", m->n_params, m->n_buffers, m->n_blocks);
    char s[160], key[160];
    for (int i = 0; i < m->n_params; i++) {
        shape(s, sizeof s, &m->params[i]->value);
        snprintf(key, sizeof key, "parameter %s", m->params[i]->name);
        const dt_param_hparams *h = &m->params[i]->hp;   /* group settings (NaN: unset) */
        dt_agree_add(a, key, "%s%s, lr x %g, wd %g, betas %g %g", s, m->params[i]->requires_grad ? "" : " frozen",
                     (double)h->lr_scale, (double)h->weight_decay, (double)h->beta1, (double)h->beta2);
    }
    for (int i = 0; i < m->n_buffers; i++) {
        shape(s, sizeof s, &m->buffers[i]->value);
        snprintf(key, sizeof key, "buffer %s", m->buffers[i]->name);
        dt_agree_add(a, key, "%s", s);
    }
}

static void describe_run(const dt_trainer *t, dt_agree *a) {
    const dt_train_opts *o = &t->opts;
    const dt_optim_cfg *q = &o->optim;
    dt_agree_add(a, "train.unfreeze_at", "%lld", (long long)o->unfreeze_at);
    dt_agree_add(a, "train.recompute", "%s", o->recompute == DT_RECOMPUTE_BLOCKS ? "blocks" : "none");
    dt_agree_add(a, "train.data", "%s", o->data);
    dt_agree_add(a, "train.data_path", "%s", o->data_path ? o->data_path : "(default)");
    dt_agree_add(a, "train.val_path", "%s", o->val_path ? o->val_path : "(none)");
    dt_agree_add(a, "train.uneven", "%d", o->uneven != 0);
    if (o->uneven)   /* each rank trains on its own files: only the eval split is shared */
        dt_agree_add(a, "data set size (eval samples)", "%lld", (long long)t->data.size[DT_SPLIT_EVAL]);
    else
        dt_agree_add(a, "data set size (train, eval samples)", "%lld, %lld", (long long)t->data.size[DT_SPLIT_TRAIN],
                     (long long)t->data.size[DT_SPLIT_EVAL]);
    dt_agree_add(a, "train.batch", "%lld", (long long)o->batch);
    dt_agree_add(a, "train.seq", "%lld", (long long)o->seq);
    dt_agree_add(a, "train.steps", "%lld", (long long)o->steps);
    dt_agree_add(a, "train.epochs", "%d", o->epochs);
    dt_agree_add(a, "train.accum", "%d", o->accum);
    dt_agree_add(a, "train.optim.kind", "%s", q->kind == DT_OPTIM_SGD ? "sgd" : "adamw");
    dt_agree_add(a, "train.optim.lr", "%.9g", q->lr);
    dt_agree_add(a, "train.optim.weight_decay", "%.9g", q->weight_decay);
    if (q->kind == DT_OPTIM_SGD) {
        dt_agree_add(a, "train.optim.momentum", "%.9g", q->momentum);
        dt_agree_add(a, "train.optim.nesterov", "%d", q->nesterov != 0);
    } else {
        dt_agree_add(a, "train.optim.beta1", "%.9g", q->beta1);
        dt_agree_add(a, "train.optim.beta2", "%.9g", q->beta2);
        dt_agree_add(a, "train.optim.eps", "%.9g", q->eps);
    }
    dt_agree_add(a, "train.optim.state_dtype", "%s", q->state_dtype == DT_OPTIM_STATE_BF16 ? "bf16" : "fp32");
    dt_agree_add(a, "train.min_lr", "%.9g", o->min_lr);
    dt_agree_add(a, "train.warmup", "%lld", (long long)o->warmup);
    dt_agree_add(a, "train.clip", "%.9g", o->clip);
    dt_agree_add(a, "train.seed", "%llu", (unsigned long long)o->seed);
    dt_agree_add(a, "train.keep_denormals", "%d", o->keep_denormals != 0);
    /* what runs, not only what was asked: a rank on a CPU without AMX would compute fp32 */
    dt_agree_add(a, "train.precision", "%s", dt_gemm_bf16_active() ? "bf16" : o->precision == DT_PREC_BF16
                                                  ? "bf16 asked, fp32 computed" : o->precision == DT_PREC_FP16
                                                  ? "fp16 (rounded inputs, fp32 compute)" : "fp32");
    dt_dtype sd = dt_train_saved_dtype(o);
    dt_agree_add(a, "train.saved_activations", "%s", sd == DT_BF16 ? "bf16" : sd == DT_F16 ? "fp16" : "fp32");
    dt_dtype pd = dt_train_param_dtype(o);
    dt_agree_add(a, "train.param_dtype", "%s", pd == DT_BF16 ? "bf16" : pd == DT_F16 ? "fp16" : "fp32");
    if (!dt_train_loss_scaling(o)) dt_agree_add(a, "train.loss_scale", "off");
    else if (o->loss_scale == DT_LOSS_SCALE_FIXED) dt_agree_add(a, "train.loss_scale", "fixed %.9g", (double)o->loss_scale_init);
    else dt_agree_add(a, "train.loss_scale", "dynamic from %.9g, window %d",
                      (double)(o->loss_scale_init > 0 ? o->loss_scale_init : DT_LOSS_SCALE_INIT),
                      o->loss_scale_window > 0 ? o->loss_scale_window : DT_LOSS_SCALE_WINDOW);
    dt_agree_add(a, "train.init", "%s", o->init ? o->init : "(none)");
    dt_agree_add(a, "train.resume", "%s", o->resume ? o->resume : "(none)");
    dt_agree_add(a, "train.save", "%s", o->save ? o->save : "(none)");
    dt_agree_add(a, "train.save_every", "%lld", (long long)o->save_every);
    dt_agree_add(a, "train.save_sync", "%d", o->save_sync);
    dt_agree_add(a, "train.eval_batches", "%lld", (long long)o->eval_batches);
    dt_agree_add(a, "train.stop_after", "%lld", (long long)o->stop_after);
}

dt_status dt_trainer_agree(dt_trainer *t) {
    if (!t->strat.agree) return DT_OK;
    dt_agree a;
    dt_agree_init(&a);
    dt_agree_add(&a, "strategy", "%s", t->strat.name ? t->strat.name : "?");
    describe_model(t, &a);
    describe_run(t, &a);
    dt_status s = t->strat.agree(t->strat.self, &a);
    dt_agree_free(&a);
    return s;
}
