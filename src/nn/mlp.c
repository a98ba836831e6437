/* MLP: in -> hidden... -> out, ReLU between, softmax cross-entropy.
 * Input "image" flattened to [B, in]; one block per layer fc{i}
 * ([in] -> [out], weight [out, in], bias [out]: torch.nn.Linear layout).
 * Its registry entry (nn.h section 4b) is at the end. */
#include <stddef.h>
#include <stdint.h>
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

static dt_status mlp_build(dt_model *m) {
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

static void mlp_defaults(dt_model_cfg *c) {
    c->mlp_in = 28 * 28; c->mlp_out = 10;   /* in: one flattened Fashion-MNIST image */
    c->mlp_n_hidden = 2; c->mlp_hidden[0] = 256; c->mlp_hidden[1] = 256;
}

static dt_status mlp_validate(const dt_model_cfg *c) {
    /* messages name the settings (arch.*), which the CLI shows as flags */
    if (c->mlp_in <= 0 || c->mlp_out <= 0)
        return DT_ERR(DT_EINVAL, "mlp: arch.mlp_in %d and arch.mlp_out %d must be positive", c->mlp_in, c->mlp_out);
    if (c->mlp_out < 2)   /* a cross-entropy over one class is no loss */
        return DT_ERR(DT_EINVAL, "mlp: arch.mlp_out %d: the model predicts one of at least 2 classes", c->mlp_out);
    if (c->mlp_n_hidden < 0 || c->mlp_n_hidden > DT_MLP_MAX_LAYERS)
        return DT_ERR(DT_EINVAL, "mlp: arch.hidden lists %d layers; 0..%d are supported", c->mlp_n_hidden,
                      DT_MLP_MAX_LAYERS);
    for (int i = 0; i < c->mlp_n_hidden; i++)
        if (c->mlp_hidden[i] <= 0)
            return DT_ERR(DT_EINVAL, "mlp: arch.hidden layer %d has size %d; sizes must be positive", i + 1,
                          c->mlp_hidden[i]);
    return DT_OK;
}

/* the input width is the data's image's element count */
static void mlp_fit(dt_model_cfg *c, const dt_sample_shape *s) {
    const dt_input_spec *img = dt_sample_input(s, "image", DT_F32);
    int64_t numel = img ? dt_input_numel(img) : 0;
    if (numel > 0 && numel <= INT32_MAX) c->mlp_in = (int)numel;
}

static const dt_model_setting mlp_settings[] = {
    {.key = "arch.mlp_in", .type = DT_SETTING_INT, .at = offsetof(dt_model_cfg, mlp_in), .help = "MLP input size"},
    {.key = "arch.hidden", .type = DT_SETTING_INTS, .at = offsetof(dt_model_cfg, mlp_hidden),
     .count_at = offsetof(dt_model_cfg, mlp_n_hidden), .n_min = 0, .n_max = DT_MLP_MAX_LAYERS, .none = "none",
     .meta = "N,N,..", .help = "MLP hidden sizes (default 256,256)"},
    {.key = "arch.mlp_out", .type = DT_SETTING_INT, .at = offsetof(dt_model_cfg, mlp_out), .help = "MLP output size"},
};

const dt_model_builtin dt_builtin_mlp = {
    .name = "mlp", .data = "fashion-mnist",
    .defaults = mlp_defaults, .validate = mlp_validate, .build = mlp_build, .fit = mlp_fit,
    .settings = mlp_settings, .n_settings = (int)(sizeof mlp_settings / sizeof mlp_settings[0]),
};
