/* The trainer's data: open the dataset, size the batch buffers from the
 * sample shape, check the model takes its samples, assemble batches. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include "trainer_internal.h"

dt_status dt_trainer_load_data(dt_trainer *t) {
    const dt_train_opts *o = &t->opts;
    dt_dataset_opts dopts = {.path = o->data_path, .val_path = o->val_path, .seq = o->seq, .eval_only = o->eval_only};
    if (o->uneven) {   /* this data rank's files only (data.h) */
        dopts.part_rank = t->strat.data_rank;
        dopts.part_world = t->strat.data_world;
    }
    DT_TRY(dt_dataset_open(o->data, &dopts, &t->data));
    const dt_dataset *d = &t->data;
    /* a batch no epoch can fill is refused before its buffers are sized
     * (dt_trainer_check_sizes refines this per data rank, after the
     * strategy; here "out of memory" came first) */
    if (!o->uneven && !o->eval_only && o->batch > d->size[DT_SPLIT_TRAIN])
        return DT_ERR(DT_EINVAL, "train.batch %lld is more than the %lld training samples of %s", (long long)o->batch,
                      (long long)d->size[DT_SPLIT_TRAIN], d->source);
    /* a strategy that schedules micro-batches itself gets all K at once */
    int64_t B = o->batch * dt_trainer_batch_slots(t);   /* <= 2^40: dt_train_opts_validate */
    /* sizes in bytes must not wrap (a wrapped size allocates too little) */
    int too_big = d->sample.targets > 0 && (size_t)B > SIZE_MAX / sizeof *t->y / (size_t)d->sample.targets;
    for (int k = 0; k < d->sample.n_inputs; k++)
        too_big |= dt_input_bytes(&d->sample.in[k]) > 0 && (size_t)B > SIZE_MAX / dt_input_bytes(&d->sample.in[k]);
    if (too_big)
        return DT_ERR(DT_EINVAL, "train.batch %lld: the batch buffers for samples of %s (train.data %s) exceed the address space",
                      (long long)o->batch, d->source, d->name);
    t->idx = malloc((size_t)B * sizeof *t->idx);
    t->row_keys = malloc((size_t)B * sizeof *t->row_keys);
    t->y = malloc((size_t)B * (size_t)d->sample.targets * sizeof *t->y);
    if (!t->idx || !t->row_keys || !t->y) return DT_ERR(DT_ENOMEM, "out of memory for batch buffers (batch %lld)", (long long)B);
    for (int k = 0; k < d->sample.n_inputs; k++)
        if (!(t->x[k] = malloc((size_t)B * dt_input_bytes(&d->sample.in[k]))))
            return DT_ERR(DT_ENOMEM, "out of memory for batch input '%s' (batch %lld)", d->sample.in[k].name,
                          (long long)B);
    return DT_OK;
}

/* the data a message about the samples' shape names: the split that sets
 * the classes (a vocabulary's largest id), else the training data */
static const char *classes_source(const dt_dataset *d) { return d->classes_source[0] ? d->classes_source : d->source; }

/* A built-in model takes the data's sample size where its registry entry
 * says how (nn.h dt_model_cfg_fit: the MLP's input width is the image's
 * element count, the CNN's H x W the image's sides). A size the model cannot
 * take fails here naming the data. */
dt_status dt_trainer_fit_model(dt_trainer *t) {
    dt_model_cfg *c = &t->opts.model;
    const dt_dataset *d = &t->data;
    if (t->opts.build_model || dt_model_cfg_fit(c, &d->sample) == DT_OK) return DT_OK;
    char why[512], have[128];
    snprintf(why, sizeof why, "%s", dt_error_message());
    return DT_ERR(DT_EINVAL, "%s (train.data %s): samples are %s, but model %s cannot take them: %s", classes_source(d),
                  d->name, dt_sample_shape_str(&d->sample, have, sizeof have), dt_model_kind_name(c->kind), why);
}

dt_status dt_trainer_check_data(dt_trainer *t) {
    const dt_dataset *d = &t->data;
    if (dt_model_check_sample(t->model, &d->sample) == DT_OK) return DT_OK;
    char want[512], have[128];
    snprintf(want, sizeof want, "%s", dt_error_message());
    return DT_ERR(DT_EINVAL, "%s (train.data %s): samples are %s, but %s", classes_source(d), d->name,
                  dt_sample_shape_str(&d->sample, have, sizeof have), want);
}

int dt_trainer_batch_slots(const dt_trainer *t) { return t->strat.forward_backward ? t->opts.accum : 1; }

dt_batch dt_trainer_batch_in(dt_trainer *t, int slot, dt_split split, int64_t n) {
    const dt_dataset *d = &t->data;
    int64_t B = t->opts.batch;
    void *x[DT_MAX_INPUTS] = {0};
    for (int k = 0; k < d->sample.n_inputs; k++)
        x[k] = (char *)t->x[k] + (size_t)(slot * B) * dt_input_bytes(&d->sample.in[k]);
    dt_batch b = dt_dataset_batch(d, split, t->idx + slot * B, n, x, t->y + slot * B * d->sample.targets);
    if (split == DT_SPLIT_TRAIN) b.row_keys = t->row_keys + slot * B;
    return b;
}

dt_batch dt_trainer_batch(dt_trainer *t, dt_split split, int64_t n) { return dt_trainer_batch_in(t, 0, split, n); }

void dt_trainer_free_data(dt_trainer *t) {
    dt_dataset_close(&t->data);
    for (int k = 0; k < DT_MAX_INPUTS; k++) { free(t->x[k]); t->x[k] = NULL; }
    free(t->y); free(t->idx); free(t->row_keys);
    t->y = NULL; t->idx = NULL; t->row_keys = NULL;
}

/* Known once the data is open, refused before step 1 rather than at it (a
 * batch no epoch can fill) or after the last one (the final evaluation). */
dt_status dt_trainer_check_sizes(const dt_trainer *t) {
    const dt_train_opts *o = &t->opts;
    const dt_dataset *d = &t->data;
    if (d->size[DT_SPLIT_EVAL] <= 0 && o->val_path)
        return DT_ERR(DT_EINVAL, "the %s split, train.val_path %s, holds no sample (token data: none of train.seq %lld "
                      "+ 1 tokens); a run ends by evaluating on it", d->eval_name, o->val_path, (long long)o->seq);
    if (d->size[DT_SPLIT_EVAL] <= 0)
        return DT_ERR(DT_EINVAL, "the %s split of %s (train.data %s) holds no sample (token data: none of train.seq %lld "
                      "+ 1 tokens); a run ends by evaluating on it", d->eval_name, d->source, d->name, (long long)o->seq);
    /* (uneven: a rank with less than a batch joins; eval_only draws no training batch) */
    if (!o->uneven && !o->eval_only && t->sampler.per_rank < o->batch)
        return t->strat.data_world > 1
            ? DT_ERR(DT_EINVAL, "train.batch %lld is more than the %lld training samples of %s per data rank (%d ranks "
                     "share them)", (long long)o->batch, (long long)t->sampler.per_rank, d->source, t->strat.data_world)
            : DT_ERR(DT_EINVAL, "train.batch %lld is more than the %lld training samples of %s", (long long)o->batch,
                     (long long)t->sampler.per_rank, d->source);
    return DT_OK;
}
