/* Model configuration defaults and validation. */
#include <stdint.h>
#include <string.h>
#include "dtrain/nn.h"

dt_model_cfg dt_model_cfg_default(dt_model_kind kind) {
    dt_model_cfg c;
    memset(&c, 0, sizeof c);
    c.kind = kind;
    c.mlp_in = 28 * 28; c.mlp_out = 10;   /* in: one flattened Fashion-MNIST image */
    c.mlp_n_hidden = 2; c.mlp_hidden[0] = 256; c.mlp_hidden[1] = 256;
    c.cnn_c1 = 32; c.cnn_c2 = 64; c.cnn_fc = 128; c.cnn_classes = 10; c.cnn_h = c.cnn_w = 28;
    c.n_layer = 4; c.n_embd = 128; c.n_head = 4; c.vocab = 256; c.max_t = 128;
    return c;
}

dt_status dt_model_cfg_validate(const dt_model_cfg *c) {
    switch (c->kind) {
    case DT_MODEL_MLP:
        if (c->mlp_in <= 0 || c->mlp_out <= 0)
            return DT_ERR(DT_EINVAL, "mlp: input and output sizes must be positive");
        if (c->mlp_n_hidden < 0 || c->mlp_n_hidden > DT_MLP_MAX_LAYERS)
            return DT_ERR(DT_EINVAL, "mlp: 0..%d hidden layers supported, got %d", DT_MLP_MAX_LAYERS, c->mlp_n_hidden);
        for (int i = 0; i < c->mlp_n_hidden; i++)
            if (c->mlp_hidden[i] <= 0) return DT_ERR(DT_EINVAL, "mlp: hidden layer %d has size %d", i, c->mlp_hidden[i]);
        return DT_OK;
    case DT_MODEL_CNN:
        if (c->cnn_c1 <= 0 || c->cnn_c2 <= 0 || c->cnn_fc <= 0 || c->cnn_classes <= 1)
            return DT_ERR(DT_EINVAL, "cnn: channel, fc and class counts must be positive");
        if (c->cnn_h < DT_CNN_MIN_SIDE || c->cnn_w < DT_CNN_MIN_SIDE || c->cnn_h > DT_CNN_MAX_SIDE || c->cnn_w > DT_CNN_MAX_SIDE)
            return DT_ERR(DT_EINVAL, "cnn: images of %dx%d: each side must be in %d..%d (two 2x2 max-pools)", c->cnn_h,
                          c->cnn_w, DT_CNN_MIN_SIDE, DT_CNN_MAX_SIDE);
        if ((int64_t)c->cnn_c2 * (c->cnn_h / 4) * (c->cnn_w / 4) > INT32_MAX)
            return DT_ERR(DT_EINVAL, "cnn: %d channels of %dx%d images make fc1's input too wide", c->cnn_c2,
                          c->cnn_h / 4, c->cnn_w / 4);
        return DT_OK;
    case DT_MODEL_GPT2:
        if (c->n_layer <= 0 || c->n_embd <= 0 || c->n_head <= 0 || c->vocab <= 0 || c->max_t <= 0)
            return DT_ERR(DT_EINVAL, "gpt2: L, C, H, V and maxT must be positive");
        if (c->n_embd % c->n_head)
            return DT_ERR(DT_EINVAL, "gpt2: n_embd %d is not divisible by n_head %d", c->n_embd, c->n_head);
        if (c->vocab > 65536)
            return DT_ERR(DT_EINVAL, "gpt2: vocab %d exceeds 65536 (tokens are uint16)", c->vocab);
        if (c->dropout < 0 || c->dropout >= 1)
            return DT_ERR(DT_EINVAL, "gpt2: dropout %g outside [0, 1)", c->dropout);
        return DT_OK;
    case DT_MODEL_CUSTOM:
        break;
    }
    return DT_ERR(DT_EINVAL, "unknown model kind %d (the built-ins are mlp, cnn, gpt2)", (int)c->kind);
}

double dt_model_flops_per_item(const dt_model *m, int64_t T) {
    const dt_model_cfg *c = &m->cfg;
    if (c->kind == DT_MODEL_GPT2) {
        /* 6 flops per weight per token (fwd 2 + bwd 4); positional table is a lookup;
         * attention scores and mixing: 12 * L * T * C (PaLM convention). */
        double n = (double)m->n_elems - (double)c->max_t * c->n_embd;
        return 6.0 * n + 12.0 * c->n_layer * (double)T * c->n_embd;
    }
    if (c->kind == DT_MODEL_CNN) {
        double h = c->cnn_h, w = c->cnn_w, h2 = c->cnn_h / 2, w2 = c->cnn_w / 2, h4 = c->cnn_h / 4, w4 = c->cnn_w / 4;
        double conv1 = 2.0 * c->cnn_c1 * 1 * 25 * h * w, conv2 = 2.0 * c->cnn_c2 * c->cnn_c1 * 25 * h2 * w2;
        double fc = 2.0 * (c->cnn_c2 * h4 * w4 * c->cnn_fc + (double)c->cnn_fc * c->cnn_classes);
        return 3.0 * (conv1 + conv2 + fc);
    }
    return 6.0 * (double)m->n_elems;
}
