/* MLP: in -> hidden... -> out, ReLU between, softmax cross-entropy.
 * Params fc1.weight [h1, in], fc1.bias [h1], ... (torch.nn.Linear layout). */
#include <stdio.h>
#include <math.h>
#include "model_internal.h"

static dt_tensor *mlp_forward(dt_model *m, dt_graph *g, const dt_batch *b, dt_tensor **logits) {
    const dt_model_cfg *c = &m->cfg;
    if (!b->x_img) { DT_ERR(DT_EINVAL, "mlp: batch has no image input"); return NULL; }
    int64_t shape[2] = {b->B, c->mlp_in};
    dt_tensor *x = dt_graph_tensor(g, 2, shape);   /* x[B, in]: view of the caller's batch */
    DT_NN_CHECK(x);
    x->data = (void *)b->x_img;
    int n_layers = c->mlp_n_hidden + 1;
    for (int i = 0; i < n_layers; i++) {
        dt_module *mod = m->modules[i];
        if (dt_module_enter(g, mod) != DT_OK) return NULL;
        DT_NN_CHECK(x = dt_op_linear(g, x, &mod->params[0]->value, &mod->params[1]->value, DT_W_OUT_IN));
        if (i + 1 < n_layers) DT_NN_CHECK(x = dt_op_relu(g, x));
        if (dt_module_leave(g, mod) != DT_OK) return NULL;
    }
    if (logits) *logits = x;
    return dt_op_cross_entropy(g, x, b->y);
}

dt_status dt_mlp_build(dt_model *m, dt_rng *r) {
    const dt_model_cfg *c = &m->cfg;
    int in = c->mlp_in;
    for (int i = 0; i <= c->mlp_n_hidden; i++) {
        int out = i < c->mlp_n_hidden ? c->mlp_hidden[i] : c->mlp_out;
        char name[32];
        snprintf(name, sizeof name, "fc%d", i + 1);
        dt_module *mod = dt_model_add_module(m, name);
        if (!mod) return DT_ENOMEM;
        int64_t ws[2] = {out, in}, bs[1] = {out};
        dt_param *w = dt_model_add_param(m, mod, "weight", 2, ws);
        dt_param *bias = dt_model_add_param(m, mod, "bias", 1, bs);
        if (!w || !bias) return DT_ENOMEM;
        float bound = 1.0f / sqrtf((float)in);   /* torch.nn.Linear default */
        dt_init_uniform(w, r, bound);
        dt_init_uniform(bias, r, bound);
        in = out;
    }
    m->forward = mlp_forward;
    return DT_OK;
}
