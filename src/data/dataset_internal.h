/* Dataset implementations behind dt_dataset_open (one file each). */
#ifndef DT_DATASET_INTERNAL_H
#define DT_DATASET_INTERNAL_H
#include "dtrain/data.h"

typedef dt_status (*dt_dataset_open_fn)(const dt_dataset_opts *o, dt_dataset *out);
dt_status dt_dataset_open_fashion_mnist(const dt_dataset_opts *o, dt_dataset *out);
dt_status dt_dataset_open_text(const dt_dataset_opts *o, dt_dataset *out);
dt_status dt_dataset_open_shard(const dt_dataset_opts *o, dt_dataset *out);

/* Token-window datasets (text, shard): reads path (and o->val_path) with
 * load, holds out the last 10% when there is no val_path, and checks there is
 * at least one training window of o->seq + 1 tokens. */
typedef dt_status (*dt_token_load_fn)(const char *path, dt_token_dataset *out);
dt_status dt_dataset_open_tokens(const char *path, const dt_dataset_opts *o, dt_token_load_fn load,
                                 dt_dataset *out);
#endif
