/* The trainer's data: open the dataset, size the batch buffers from the
 * sample shape, check the model takes its samples, assemble batches. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "trainer_internal.h"

dt_status dt_trainer_load_data(dt_trainer *t) {
    const dt_train_opts *o = &t->opts;
    dt_dataset_opts dopts = {.path = o->data_path, .val_path = o->val_path, .seq = o->seq};
    DT_TRY(dt_dataset_open(o->data, &dopts, &t->data));
    const dt_dataset *d = &t->data;
    int64_t B = o->batch;
    t->idx = malloc((size_t)B * sizeof *t->idx);
    t->y = malloc((size_t)(B * d->sample.targets) * sizeof *t->y);
    if (!t->idx || !t->y) return DT_ERR(DT_ENOMEM, "out of memory for batch buffers (batch %lld)", (long long)B);
    for (int k = 0; k < d->sample.n_inputs; k++)
        if (!(t->x[k] = malloc((size_t)B * dt_input_bytes(&d->sample.in[k]))))
            return DT_ERR(DT_ENOMEM, "out of memory for batch input '%s' (batch %lld)", d->sample.in[k].name,
                          (long long)B);
    return DT_OK;
}

dt_status dt_trainer_check_data(dt_trainer *t) {
    const dt_dataset *d = &t->data;
    if (dt_model_check_sample(t->model, &d->sample) == DT_OK) return DT_OK;
    char want[512], have[128];
    snprintf(want, sizeof want, "%s", dt_error_message());
    return DT_ERR(DT_EINVAL, "%s (--data %s): samples are %s, but %s", d->source, d->name,
                  dt_sample_shape_str(&d->sample, have, sizeof have), want);
}

dt_batch dt_trainer_batch(dt_trainer *t, dt_split split, int64_t n) {
    return dt_dataset_batch(&t->data, split, t->idx, n, t->x, t->y);
}

void dt_trainer_free_data(dt_trainer *t) {
    dt_dataset_close(&t->data);
    for (int k = 0; k < DT_MAX_INPUTS; k++) { free(t->x[k]); t->x[k] = NULL; }
    free(t->y); free(t->idx);
    t->y = NULL; t->idx = NULL;
}
