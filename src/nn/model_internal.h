/* Shared by the nn files (not public API). */
#ifndef DT_NN_MODEL_INTERNAL_H
#define DT_NN_MODEL_INTERNAL_H
#include "dtrain/nn.h"

/* The built-ins: register into an empty model whose cfg is set (model.c). */
dt_status dt_mlp_build(dt_model *m);
dt_status dt_cnn_build(dt_model *m);
dt_status dt_gpt2_build(dt_model *m);
/* Blocks chain, inputs and loss head are consistent (blocks.c). */
dt_status dt_model_check_blocks(const dt_model *m);

/* Propagate NULL from an op: `DT_NN_CHECK(x = dt_op_relu(g, x));` */
#define DT_NN_CHECK(expr) do { if (!(expr)) return NULL; } while (0)
#endif
