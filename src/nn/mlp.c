/* MLP: in -> hidden... -> out, ReLU between, softmax cross-entropy.
 * Input "image" flattened to [B, in]; one block per layer fc{i}
 * ([in] -> [out], weight [out, in], bias [out]: torch.nn.Linear layout). */
#include <stdio.h>
#include "model_internal.h"

/* x [B, in] (NULL for the first block: the batch's image, flattened) -> [B, out] */
static dt_tensor *mlp_layer(dt_model *m, dt_graph *g, dt_tensor *x, const dt_batch *b, void *user) {
    dt_module *mod = user;
    if (!x) {
        const dt_tensor *img = dt_batch_input(b, "image", DT_F32, "mlp");
        int64_t shape[2] = {b->B, m->cfg.mlp_in};
        DT_NN_CHECK(img && (x = dt_graph_tensor(g, 2, shape)));   /* a view of the caller's batch */
        if (img->numel != b->B * m->cfg.mlp_in) {
            DT_ERR(DT_EINVAL, "mlp: image input has %lld elements per sample, expected %d",
                   (long long)(img->numel / b->B), m->cfg.mlp_in);
            return NULL;
        }
        x->data = img->data;
    }
    DT_NN_CHECK(x = dt_nn_linear(g, mod, x));
    return mod->index + 1 < m->n_modules ? dt_op_relu(g, x) : x;
}

dt_status dt_mlp_build(dt_model *m) {
    const dt_model_cfg *c = &m->cfg;
    dt_input_spec in = {.name = "image", .dtype = DT_F32, .ndim = 1, .dims = {c->mlp_in}, .flat = 1};
    DT_TRY(dt_model_add_input(m, &in));
    int64_t width = c->mlp_in;
    for (int i = 0; i <= c->mlp_n_hidden; i++) {
        int64_t out = i < c->mlp_n_hidden ? c->mlp_hidden[i] : c->mlp_out;
        char name[32];
        snprintf(name, sizeof name, "fc%d", i + 1);
        dt_module *mod = dt_nn_add_linear(m, name, width, out);
        DT_TRY(dt_model_add_block(m, name, mlp_layer, mod, i ? 1 : 0, &width, 1, &out));
        width = out;
    }
    return dt_model_set_loss(m, DT_LOSS_CROSS_ENTROPY, c->mlp_out);
}
