/* The usual layers as modules: registration with torch.nn's default
 * initialisation, and running them bracketed by module enter/leave (so
 * ZeRO-3 gathers their parameters). */
#include <math.h>
#include "model_internal.h"

dt_module *dt_nn_add_linear(dt_model *m, const char *name, int64_t in, int64_t out) {
    dt_module *mod = dt_model_add_module(m, name);
    if (!mod) return NULL;
    float bound = 1.0f / sqrtf((float)in);   /* torch.nn.Linear: kaiming-uniform(a=sqrt 5) = U(+-1/sqrt(in)) */
    int64_t ws[2] = {out, in}, bs[1] = {out};
    if (!dt_model_add_param(m, mod, "weight", 2, ws, DT_INIT_UNIF(bound)) ||
        !dt_model_add_param(m, mod, "bias", 1, bs, DT_INIT_UNIF(bound)))
        return NULL;
    return mod;
}

dt_module *dt_nn_add_layernorm(dt_model *m, const char *name, int64_t n) {
    dt_module *mod = dt_model_add_module(m, name);
    if (!mod) return NULL;
    int64_t s[1] = {n};
    dt_param *w = dt_model_add_param(m, mod, "weight", 1, s, DT_INIT_FILL(1.0f));
    dt_param *b = dt_model_add_param(m, mod, "bias", 1, s, DT_INIT_ZERO);
    return w && b ? mod : NULL;
}

static int has_params(dt_module *mod, int n, const char *what, const dt_tensor *x) {
    if (!x) { DT_ERR(DT_EINVAL, "%s: module %s got no input", what, mod ? mod->name : "(null)"); return 0; }
    if (mod && mod->n_params == n) return 1;
    DT_ERR(DT_EINVAL, "%s: module %s is not one (it has %d parameters)", what, mod ? mod->name : "(null)",
           mod ? mod->n_params : 0);
    return 0;
}

dt_tensor *dt_nn_linear(dt_graph *g, dt_module *mod, dt_tensor *x) {
    if (!has_params(mod, 2, "linear", x) || dt_module_enter(g, mod) != DT_OK) return NULL;
    DT_NN_CHECK(x = dt_op_linear(g, x, &mod->params[0]->value, &mod->params[1]->value, DT_W_OUT_IN));
    return dt_module_leave(g, mod) == DT_OK ? x : NULL;
}

dt_tensor *dt_nn_layernorm(dt_graph *g, dt_module *mod, dt_tensor *x) {
    if (!has_params(mod, 2, "layernorm", x) || dt_module_enter(g, mod) != DT_OK) return NULL;
    DT_NN_CHECK(x = dt_op_layernorm(g, x, &mod->params[0]->value, &mod->params[1]->value, 1e-5f));
    return dt_module_leave(g, mod) == DT_OK ? x : NULL;
}
