/* Small CNN for 28x28 images:
 *   conv1 (1->c1, 5x5, pad 2) + bn1 + ReLU + maxpool 2 -> [B, c1, 14, 14]
 *   conv2 (c1->c2, 5x5, pad 2) + bn2 + ReLU + maxpool 2 -> [B, c2, 7, 7]
 *   fc1 (c2*49 -> fc) + ReLU, fc2 (fc -> classes)
 * Convolutions have no bias (BatchNorm's beta plays that role). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include "model_internal.h"

typedef struct cnn_impl { dt_named_buffer *rm[2], *rv[2]; } cnn_impl;

static dt_tensor *conv_bn_block(dt_model *m, dt_graph *g, dt_tensor *x, int k) {
    cnn_impl *im = m->impl;
    dt_module *conv = m->modules[2 * k], *bn = m->modules[2 * k + 1];
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

static dt_tensor *cnn_forward(dt_model *m, dt_graph *g, const dt_batch *b, dt_tensor **logits) {
    if (!b->x_img) { DT_ERR(DT_EINVAL, "cnn: batch has no image input"); return NULL; }
    int64_t shape[4] = {b->B, 1, 28, 28};
    dt_tensor *x = dt_graph_tensor(g, 4, shape);   /* view of the caller's batch */
    DT_NN_CHECK(x);
    x->data = (void *)b->x_img;
    DT_NN_CHECK(x = conv_bn_block(m, g, x, 0));
    DT_NN_CHECK(x = conv_bn_block(m, g, x, 1));
    DT_NN_CHECK(x = dt_op_flatten(g, x));
    for (int i = 4; i < 6; i++) {
        dt_module *fc = m->modules[i];
        if (dt_module_enter(g, fc) != DT_OK) return NULL;
        DT_NN_CHECK(x = dt_op_linear(g, x, &fc->params[0]->value, &fc->params[1]->value, DT_W_OUT_IN));
        if (i == 4) DT_NN_CHECK(x = dt_op_relu(g, x));
        if (dt_module_leave(g, fc) != DT_OK) return NULL;
    }
    if (logits) *logits = x;
    return dt_op_cross_entropy(g, x, b->y);
}

static void cnn_destroy(dt_model *m) { free(m->impl); m->impl = NULL; }

dt_status dt_cnn_build(dt_model *m, dt_rng *r) {
    const dt_model_cfg *c = &m->cfg;
    cnn_impl *im = calloc(1, sizeof *im);
    if (!im) return DT_ERR(DT_ENOMEM, "out of memory");
    m->impl = im;
    m->destroy = cnn_destroy;
    int chans[3] = {1, c->cnn_c1, c->cnn_c2};
    for (int k = 0; k < 2; k++) {
        char name[16];
        snprintf(name, sizeof name, "conv%d", k + 1);
        dt_module *conv = dt_model_add_module(m, name);
        if (!conv) return DT_ENOMEM;
        int64_t ws[4] = {chans[k + 1], chans[k], 5, 5}, cs[1] = {chans[k + 1]};
        dt_param *w = dt_model_add_param(m, conv, "weight", 4, ws);
        if (!w) return DT_ENOMEM;
        dt_init_uniform(w, r, 1.0f / sqrtf((float)(chans[k] * 25)));
        snprintf(name, sizeof name, "bn%d", k + 1);
        dt_module *bn = dt_model_add_module(m, name);
        if (!bn) return DT_ENOMEM;
        dt_param *gamma = dt_model_add_param(m, bn, "weight", 1, cs);
        dt_param *beta = dt_model_add_param(m, bn, "bias", 1, cs);
        if (!gamma || !beta) return DT_ENOMEM;
        dt_init_const(gamma, 1.0f);
        gamma->weight_decay = beta->weight_decay = 0;
        char bname[64];
        snprintf(bname, sizeof bname, "%s.running_mean", name);
        im->rm[k] = dt_model_add_buffer(m, bname, 1, cs, 0.0f);
        snprintf(bname, sizeof bname, "%s.running_var", name);
        im->rv[k] = dt_model_add_buffer(m, bname, 1, cs, 1.0f);
        if (!im->rm[k] || !im->rv[k]) return DT_ENOMEM;
    }
    int fin[2] = {c->cnn_c2 * 49, c->cnn_fc}, fout[2] = {c->cnn_fc, c->cnn_classes};
    for (int k = 0; k < 2; k++) {
        char name[16];
        snprintf(name, sizeof name, "fc%d", k + 1);
        dt_module *fc = dt_model_add_module(m, name);
        if (!fc) return DT_ENOMEM;
        int64_t ws[2] = {fout[k], fin[k]}, bs[1] = {fout[k]};
        dt_param *w = dt_model_add_param(m, fc, "weight", 2, ws);
        dt_param *bias = dt_model_add_param(m, fc, "bias", 1, bs);
        if (!w || !bias) return DT_ENOMEM;
        float bound = 1.0f / sqrtf((float)fin[k]);
        dt_init_uniform(w, r, bound);
        dt_init_uniform(bias, r, bound);
    }
    m->forward = cnn_forward;
    return DT_OK;
}
