#ifndef DT_TRAIN_INTERNAL_H
#define DT_TRAIN_INTERNAL_H
#include "dtrain/train.h"
dt_status dt_trainer_load_data(dt_trainer *t);
int64_t dt_trainer_train_size(const dt_trainer *t);
void dt_trainer_fill_batch(dt_trainer *t, int eval, const int64_t *idx, int64_t n, dt_batch *b);
void dt_trainer_free_data(dt_trainer *t);
/* optimizer segments from the model's parameter layout */
dt_status dt_trainer_init_optimizer(dt_trainer *t);
#endif
