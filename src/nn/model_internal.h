/* Builder helpers shared by the model files (not public API). */
#ifndef DT_NN_MODEL_INTERNAL_H
#define DT_NN_MODEL_INTERNAL_H
#include "dtrain/nn.h"

dt_model *dt_model_new(const dt_model_cfg *cfg);
/* Register a module (name owned by the model). */
dt_module *dt_model_add_module(dt_model *m, const char *name);
/* Register a parameter "<module name>.<leaf>" belonging to mod (may be NULL). */
dt_param *dt_model_add_param(dt_model *m, dt_module *mod, const char *leaf, int ndim, const int64_t *shape);
dt_named_buffer *dt_model_add_buffer(dt_model *m, const char *name, int ndim, const int64_t *shape, float fill);
/* After all registration + init: move params into the default flat layout. */
dt_status dt_model_finalize(dt_model *m);

/* Initialisers (seeded). */
void dt_init_uniform(dt_param *p, dt_rng *r, float bound);
void dt_init_normal(dt_param *p, dt_rng *r, float std);
void dt_init_const(dt_param *p, float v);

/* Propagate NULL from an op: `DT_NN_CHECK(x = dt_op_relu(g, x));` */
#define DT_NN_CHECK(expr) do { if (!(expr)) return NULL; } while (0)
#endif
