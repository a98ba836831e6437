/* Shared by the nn files (not public API). */
#ifndef DT_NN_MODEL_INTERNAL_H
#define DT_NN_MODEL_INTERNAL_H
#include <stdlib.h>
#include "dtrain/nn.h"

/* Sets m->arch_crc / arch_n from the parameters and buffers (arch.c). */
void dt_model_arch_fingerprint(dt_model *m);
/* n values of initialiser `in`, drawn from r (model.c: every parameter's). */
void dt_nn_init_values(float *x, int64_t n, dt_rng *r, dt_init in);
/* Records a builder failure s (its message already set): the first one and
 * its message stay in m, every later add_* does nothing and dt_model_build
 * returns it (model.c). Returns NULL, for `return dt_nn_build_failed(...)`. */
void *dt_nn_build_failed(dt_model *m, dt_status s);
/* Blocks chain, inputs and loss head are consistent (blocks.c). */
dt_status dt_model_check_blocks(const dt_model *m);

/* Room for element n of arr (elem bytes each; n = the current count):
 * capacity doubles at powers of two. The new array, or NULL (arr untouched). */
static inline void *dt_nn_grow(void *arr, int n, size_t elem) {
    if (n && (n & (n - 1))) return arr;
    return realloc(arr, (size_t)(n ? 2 * n : 1) * elem);
}

/* Propagate NULL from an op: `DT_NN_CHECK(x = dt_op_relu(g, x));` */
#define DT_NN_CHECK(expr) do { if (!(expr)) return NULL; } while (0)
#endif
