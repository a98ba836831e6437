/* Tensor-parallel linear layers for a user's model (Megatron's), built for
 * rank `rank` of `parts` and run over the model's group (m->tp):
 *   column-parallel: weight [out, in] split by output rows -> [out/T, in],
 *     bias [out/T]; y_r = tp_copy(x) W_r^T + b_r: [.., in] -> [.., out/T]
 *   row-parallel:    weight split by input columns -> [out, in/T], bias
 *     [out] whole; y = tp_reduce(x_r W_r^T) + b: [.., in/T] -> [.., out]
 * A column- then a row-parallel layer is one MLP with two all-reduces (the
 * tp_reduce forward, the tp_copy backward) and whole activations outside.
 * Parameters are drawn whole in dt_nn_add_linear's order and sliced
 * (dt_model_add_param_split), so T ranks hold exactly the slices of the
 * layer one process builds from the same seed; parts <= 1: dt_nn_add_linear
 * and dt_nn_linear. */
#include <math.h>
#include "model_internal.h"

static dt_module *add_split_linear(dt_model *m, const char *name, int64_t in, int64_t out, int parts, int rank,
                                   int row) {
    if (parts <= 1) return dt_nn_add_linear(m, name, in, out);
    dt_module *mod = dt_model_add_module(m, name);
    if (!mod) return NULL;
    float bound = 1.0f / sqrtf((float)in);   /* dt_nn_add_linear's */
    int64_t ws[2] = {out, in}, bs[1] = {out};
    dt_param_split w = {.dim = row ? 1 : 0, .groups = 1, .parts = parts, .index = rank};
    dt_param_split b = {.dim = 0, .groups = 1, .parts = row ? 1 : parts, .index = row ? 0 : rank};
    if (!dt_model_add_param_split(m, mod, "weight", 2, ws, DT_INIT_UNIF(bound), w) ||
        !dt_model_add_param_split(m, mod, "bias", 1, bs, DT_INIT_UNIF(bound), b))
        return NULL;
    return mod;
}

dt_module *dt_nn_add_linear_col(dt_model *m, const char *name, int64_t in, int64_t out, int parts, int rank) {
    return add_split_linear(m, name, in, out, parts, rank, 0);
}

dt_module *dt_nn_add_linear_row(dt_model *m, const char *name, int64_t in, int64_t out, int parts, int rank) {
    return add_split_linear(m, name, in, out, parts, rank, 1);
}

/* mod is a linear module (2 parameters) split `dim`-wise, or whole; a split
 * one needs a group of its parts. 1 = split, 0 = whole, -1 = error. */
static int split_of(const char *what, const dt_module *mod, const dt_tensor *x, const dt_tp_comm *c, int dim) {
    if (!x || !mod || mod->n_params != 2) {
        DT_ERR(DT_EINVAL, "%s: module %s is not a linear layer, or no input", what, mod ? mod->name : "(null)");
        return -1;
    }
    const dt_param_split *s = &mod->params[0]->split;
    if (s->parts <= 1) return 0;
    if (s->dim != dim || !c || c->size != s->parts || c->rank != s->index) {
        DT_ERR(DT_EINVAL, "%s: module %s holds part %d of %d along dimension %d, but the group is %s (rank %d of %d)",
               what, mod->name, s->index, s->parts, s->dim, c ? "this" : "not set", c ? c->rank : -1,
               c ? c->size : 0);
        return -1;
    }
    return 1;
}

dt_tensor *dt_nn_linear_col(dt_graph *g, dt_module *mod, dt_tensor *x, const dt_tp_comm *c) {
    int split = split_of("linear_col", mod, x, c, 0);
    if (split < 0) return NULL;
    if (!split) return dt_nn_linear(g, mod, x);
    DT_NN_CHECK(x = dt_op_tp_copy(g, x, c));   /* x's gradient: the sum of every rank's */
    if (dt_module_enter(g, mod) != DT_OK) return NULL;
    DT_NN_CHECK(x = dt_op_linear(g, x, &mod->params[0]->value, &mod->params[1]->value, DT_W_OUT_IN));
    return dt_module_leave(g, mod) == DT_OK ? x : NULL;
}

dt_tensor *dt_nn_linear_row(dt_graph *g, dt_module *mod, dt_tensor *x, const dt_tp_comm *c) {
    int split = split_of("linear_row", mod, x, c, 1);
    if (split < 0) return NULL;
    if (!split) return dt_nn_linear(g, mod, x);
    if (dt_module_enter(g, mod) != DT_OK) return NULL;
    DT_NN_CHECK(x = dt_op_linear(g, x, &mod->params[0]->value, NULL, DT_W_OUT_IN));   /* partial product */
    DT_NN_CHECK(x = dt_op_tp_reduce(g, x, c));
    DT_NN_CHECK(x = dt_op_bias_add(g, x, &mod->params[1]->value));   /* once, after the sum */
    return dt_module_leave(g, mod) == DT_OK ? x : NULL;
}
