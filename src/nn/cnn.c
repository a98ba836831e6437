/* Small CNN for H x W images (default 28x28, each side >= 4), four blocks:
 *   conv1 (1->c1, 5x5, pad 2) + bn1 + ReLU + maxpool 2   [1, H, W] -> [c1, H/2, W/2]
 *   conv2 (c1->c2, 5x5, pad 2) + bn2 + ReLU + maxpool 2  -> [c2, H/4, W/4] (/: floor, twice)
 *   fc1 (flatten, c2*(H/4)*(W/4) -> fc) + ReLU           -> [fc]
 *   fc2 (fc -> classes)                                  -> [classes]
 * Convolutions have no bias (BatchNorm's beta plays that role).
 * Its registry entry (nn.h section 4b) is at the end. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include "model_internal.h"

typedef struct cnn_impl { dt_module *conv[2], *bn[2], *fc[2]; dt_named_buffer *rm[2], *rv[2]; } cnn_impl;

static dt_tensor *image(const dt_model *m, dt_graph *g, const dt_batch *b) {
    const dt_tensor *img = dt_batch_input(b, "image", DT_F32, "cnn");
    int64_t shape[4] = {b->B, 1, m->cfg.cnn_h, m->cfg.cnn_w};
    if (img && img->numel != b->B * m->cfg.cnn_h * m->cfg.cnn_w) {   /* (the convolution would read past it) */
        DT_ERR(DT_EINVAL, "cnn: image input has %lld elements per sample, expected %d x %d",
               (long long)(b->B > 0 ? img->numel / b->B : img->numel), m->cfg.cnn_h, m->cfg.cnn_w);
        return NULL;
    }
    dt_tensor *x = img ? dt_graph_tensor(g, 4, shape) : NULL;   /* a view of the caller's batch */
    if (x) x->data = img->data;
    return x;
}

/* block k = 0, 1: x [B, Cin, H, W] -> [B, Cout, H/2, W/2] (block 0 reads the batch) */
static dt_tensor *conv_bn_block(dt_model *m, dt_graph *g, dt_tensor *x, const dt_batch *b, void *user) {
    cnn_impl *im = m->impl;
    int k = (int)(intptr_t)user;
    dt_module *conv = im->conv[k], *bn = im->bn[k];
    if (!x) DT_NN_CHECK(x = image(m, g, b));
    if (dt_module_enter(g, conv) != DT_OK) return NULL;
    DT_NN_CHECK(x = dt_op_conv2d(g, x, &conv->params[0]->value, NULL, 1, 2));
    if (dt_module_leave(g, conv) != DT_OK || dt_module_enter(g, bn) != DT_OK) return NULL;
    DT_NN_CHECK(x = dt_op_batchnorm(g, x, &bn->params[0]->value, &bn->params[1]->value,
                                    &im->rm[k]->value, &im->rv[k]->value, 0.1f, 1e-5f,
                                    m->bn_sync.fn ? &m->bn_sync : NULL));
    if (dt_module_leave(g, bn) != DT_OK) return NULL;
    DT_NN_CHECK(x = dt_op_relu(g, x));
    return dt_op_maxpool2d(g, x, 2, 2);
}

/* fc1: [B, c2, H/4, W/4] -> [B, fc] (flatten, ReLU); fc2: [B, fc] -> [B, classes] */
static dt_tensor *fc_block(dt_model *m, dt_graph *g, dt_tensor *x, const dt_batch *b, void *user) {
    (void)b;
    cnn_impl *im = m->impl;
    int k = (int)(intptr_t)user;
    if (k == 0) DT_NN_CHECK(x = dt_op_flatten(g, x));
    DT_NN_CHECK(x = dt_nn_linear(g, im->fc[k], x));
    return k == 0 ? dt_op_relu(g, x) : x;
}

static void cnn_destroy(dt_model *m) { free(m->impl); m->impl = NULL; }

static dt_status cnn_build(dt_model *m) {
    const dt_model_cfg *c = &m->cfg;
    cnn_impl *im = calloc(1, sizeof *im);
    if (!im) return DT_ERR(DT_ENOMEM, "out of memory");
    m->impl = im;
    m->destroy = cnn_destroy;
    dt_input_spec in = {.name = "image", .dtype = DT_F32, .ndim = 3, .dims = {1, c->cnn_h, c->cnn_w}};
    DT_TRY(dt_model_add_input(m, &in));
    int64_t chans[3] = {1, c->cnn_c1, c->cnn_c2};
    int64_t rows[3] = {c->cnn_h, c->cnn_h / 2, c->cnn_h / 4}, cols[3] = {c->cnn_w, c->cnn_w / 2, c->cnn_w / 4};
    for (int k = 0; k < 2; k++) {
        char name[16], bname[64];
        snprintf(name, sizeof name, "conv%d", k + 1);
        im->conv[k] = dt_model_add_module(m, name);
        int64_t ws[4] = {chans[k + 1], chans[k], 5, 5}, cs[1] = {chans[k + 1]};
        dt_model_add_param(m, im->conv[k], "weight", 4, ws, DT_INIT_UNIF(1.0f / sqrtf((float)(chans[k] * 25))));
        snprintf(name, sizeof name, "bn%d", k + 1);
        im->bn[k] = dt_model_add_module(m, name);
        dt_param *gamma = dt_model_add_param(m, im->bn[k], "weight", 1, cs, DT_INIT_FILL(1.0f));
        dt_param *beta = dt_model_add_param(m, im->bn[k], "bias", 1, cs, DT_INIT_ZERO);
        if (!gamma || !beta) return m->build_err;
        gamma->weight_decay = beta->weight_decay = 0;
        snprintf(bname, sizeof bname, "%s.running_mean", name);
        im->rm[k] = dt_model_add_buffer(m, bname, 1, cs, 0.0f);
        snprintf(bname, sizeof bname, "%s.running_var", name);
        im->rv[k] = dt_model_add_buffer(m, bname, 1, cs, 1.0f);
        int64_t din[3] = {chans[k], rows[k], cols[k]}, dout[3] = {chans[k + 1], rows[k + 1], cols[k + 1]};
        snprintf(name, sizeof name, "conv%d", k + 1);
        DT_TRY(dt_model_add_block(m, name, conv_bn_block, (void *)(intptr_t)k, k ? 3 : 0, din, 3, dout));
    }
    int64_t fin[2] = {c->cnn_c2 * rows[2] * cols[2], c->cnn_fc}, fout[2] = {c->cnn_fc, c->cnn_classes};
    int64_t flat_in[3] = {c->cnn_c2, rows[2], cols[2]};
    for (int k = 0; k < 2; k++) {
        char name[16];
        snprintf(name, sizeof name, "fc%d", k + 1);
        im->fc[k] = dt_nn_add_linear(m, name, fin[k], fout[k]);
        DT_TRY(dt_model_add_block(m, name, fc_block, (void *)(intptr_t)k, k ? 1 : 3, k ? &fin[1] : flat_in, 1, &fout[k]));
    }
    return dt_model_set_loss(m, DT_LOSS_CROSS_ENTROPY, c->cnn_classes);
}

static void cnn_defaults(dt_model_cfg *c) {
    c->cnn_c1 = 32; c->cnn_c2 = 64; c->cnn_fc = 128; c->cnn_classes = 10; c->cnn_h = c->cnn_w = 28;
}

static dt_status cnn_validate(const dt_model_cfg *c) {
    /* messages name the settings (arch.*), which the CLI shows as flags */
    if (c->cnn_c1 <= 0 || c->cnn_c2 <= 0)
        return DT_ERR(DT_EINVAL, "cnn: arch.channels %d,%d must be positive", c->cnn_c1, c->cnn_c2);
    if (c->cnn_fc <= 0) return DT_ERR(DT_EINVAL, "cnn: arch.fc %d must be positive", c->cnn_fc);
    if (c->cnn_classes <= 1) return DT_ERR(DT_EINVAL, "cnn: arch.classes %d: at least 2 are needed", c->cnn_classes);
    if (c->cnn_h < DT_CNN_MIN_SIDE || c->cnn_w < DT_CNN_MIN_SIDE || c->cnn_h > DT_CNN_MAX_SIDE || c->cnn_w > DT_CNN_MAX_SIDE)
        return DT_ERR(DT_EINVAL, "cnn: images of %dx%d: each side must be in %d..%d (two 2x2 max-pools)", c->cnn_h,
                      c->cnn_w, DT_CNN_MIN_SIDE, DT_CNN_MAX_SIDE);
    if ((int64_t)c->cnn_c2 * (c->cnn_h / 4) * (c->cnn_w / 4) > INT32_MAX)
        return DT_ERR(DT_EINVAL, "cnn: arch.channels' second count %d over %dx%d images makes fc1's input too wide",
                      c->cnn_c2, c->cnn_h / 4, c->cnn_w / 4);
    return DT_OK;
}

/* H x W are the sides of the data's one-channel images */
static void cnn_fit(dt_model_cfg *c, const dt_sample_shape *s) {
    const dt_input_spec *img = dt_sample_input(s, "image", DT_F32);
    if (img && img->ndim == 3 && img->dims[0] == 1 && img->dims[1] <= INT32_MAX && img->dims[2] <= INT32_MAX) {
        c->cnn_h = (int)img->dims[1];
        c->cnn_w = (int)img->dims[2];
    }
}

/* training: 3 x the forward (backward: input and weight gradients), 2 flops per multiply-add */
static double cnn_flops(const dt_model *m, int64_t T) {
    (void)T;
    const dt_model_cfg *c = &m->cfg;
    double h = c->cnn_h, w = c->cnn_w, h2 = c->cnn_h / 2, w2 = c->cnn_w / 2, h4 = c->cnn_h / 4, w4 = c->cnn_w / 4;
    double conv1 = 2.0 * c->cnn_c1 * 1 * 25 * h * w, conv2 = 2.0 * c->cnn_c2 * c->cnn_c1 * 25 * h2 * w2;
    double fc = 2.0 * (c->cnn_c2 * h4 * w4 * c->cnn_fc + (double)c->cnn_fc * c->cnn_classes);
    return 3.0 * (conv1 + conv2 + fc);
}

/* arch.channels (C1,C2) is one list over two adjacent fields */
_Static_assert(offsetof(dt_model_cfg, cnn_c2) == offsetof(dt_model_cfg, cnn_c1) + sizeof(int), "cnn_c1, cnn_c2 adjacent");
static const dt_model_setting cnn_settings[] = {
    {.key = "arch.channels", .type = DT_SETTING_INTS, .at = offsetof(dt_model_cfg, cnn_c1),
     .n_min = 2, .n_max = 2, .meta = "C1,C2", .help = "CNN conv channels (default 32,64)"},
    {.key = "arch.fc", .type = DT_SETTING_INT, .at = offsetof(dt_model_cfg, cnn_fc), .meta = "N",
     .help = "CNN hidden fully-connected size (default 128)"},
    {.key = "arch.classes", .type = DT_SETTING_INT, .at = offsetof(dt_model_cfg, cnn_classes), .help = "CNN classes"},
};

const dt_model_builtin dt_builtin_cnn = {
    .name = "cnn", .data = "fashion-mnist",
    .defaults = cnn_defaults, .validate = cnn_validate, .build = cnn_build, .fit = cnn_fit, .flops = cnn_flops,
    .settings = cnn_settings, .n_settings = (int)(sizeof cnn_settings / sizeof cnn_settings[0]),
};
