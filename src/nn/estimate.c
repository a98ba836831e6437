/* A built-in's size without building it: what the trainer's memory check
 * (src/train/memcheck.c) needs before anything is allocated. Counted from the
 * same shapes the builders register (tests/unit/test_mem_estimate.c checks
 * the parameter counts against built models); the activation figure is a
 * rough floor -- the main tensors a training forward keeps for backward, in
 * float32 -- not a measurement. Under tensor parallelism (cfg.tp_size T > 1,
 * set by the strategy's prepare_model before the check) GPT-2's figures are
 * one rank's part: the split layers' T-th, the replicated ones whole. */
#include <math.h>
#include "dtrain/nn.h"

size_t dt_model_cfg_num_params(const dt_model_cfg *c) {
    if (!c) return 0;
    switch (c->kind) {
    case DT_MODEL_MLP: {
        size_t n = 0, in = (size_t)c->mlp_in;
        for (int i = 0; i <= c->mlp_n_hidden; i++) {
            size_t out = i < c->mlp_n_hidden ? (size_t)c->mlp_hidden[i] : (size_t)c->mlp_out;
            n += in * out + out;   /* weight, bias */
            in = out;
        }
        return n;
    }
    case DT_MODEL_CNN: {
        size_t c1 = (size_t)c->cnn_c1, c2 = (size_t)c->cnn_c2, fc = (size_t)c->cnn_fc;
        size_t flat = c2 * (size_t)(c->cnn_h / 4) * (size_t)(c->cnn_w / 4);
        return c1 * 25 + 2 * c1 + c2 * c1 * 25 + 2 * c2   /* convs (no bias) + batch norms */
               + flat * fc + fc + fc * (size_t)c->cnn_classes + (size_t)c->cnn_classes;
    }
    case DT_MODEL_GPT2: {
        size_t C = (size_t)c->n_embd, T = c->tp_size > 1 ? (size_t)c->tp_size : 1;
        size_t V = ((size_t)c->vocab + T - 1) / T;   /* this rank's wte rows, padding included */
        /* a block: c_attn [C, 3C] + 3C, c_fc [C, 4C] + 4C, both projections
         * [C, C] / [4C, C] split T ways; their biases (C each) and the two
         * LayerNorms (2C each) whole */
        size_t block = 12 * C * C / T + 3 * C / T + 4 * C / T + 6 * C;
        return V * C + (size_t)c->max_t * C + (size_t)c->n_layer * block + 2 * C;   /* wte, wpe, blocks, ln_f */
    }
    default: return 0;
    }
}

double dt_model_cfg_act_bytes(const dt_model_cfg *c, int64_t seq, int recompute, int saved_bytes) {
    if (!c) return 0;
    double h = saved_bytes == 2 ? 0.5 : 1.0;   /* dt_graph_pack16: what backward reads, in 16 bits */
    switch (c->kind) {
    case DT_MODEL_MLP: {
        double n = 0;
        for (int i = 0; i < c->mlp_n_hidden; i++) n += 2.0 * c->mlp_hidden[i];   /* pre-activation, ReLU */
        return 4.0 * ((h < 1 ? n * (h + 1) / 2 : n) + c->mlp_in + c->mlp_out);   /* 16 bits: ReLU output (the block's) stays fp32 */
    }
    case DT_MODEL_CNN: {
        double hw = (double)c->cnn_h * c->cnn_w;
        /* conv, BN, ReLU (16 bits when packed), pool (a block's output: fp32); fc, its ReLU; the logits */
        return 4.0 * (h * (3.0 * c->cnn_c1 * hw + 3.0 * c->cnn_c2 * hw / 4 + c->cnn_fc) + c->cnn_c1 * hw / 4 +
                      c->cnn_c2 * hw / 16 + c->cnn_fc + c->cnn_classes);
    }
    case DT_MODEL_GPT2: {
        double T = (double)(seq > 0 && seq < c->max_t ? seq : c->max_t), C = c->n_embd, H = c->n_head;
        double P = c->tp_size > 1 ? c->tp_size : 1, V = ceil(c->vocab / P);
        /* per token: 2 LayerNorm outputs, the projection's output and the
         * residual (4C, whole on every tp rank); qkv, the attention output,
         * the MLP's input and GELU output (12C) and the scores (H T) split */
        double layer = T * (4.0 * C + (12.0 * C + H * T) / P);
        double layers = recompute ? (c->n_layer - 1) * T * C + layer   /* recompute: inputs only */
                      : h < 1 ? c->n_layer * (h * layer + T * C) + layer   /* 16 bits, each output in fp32, one block widened */
                      : c->n_layer * layer;
        return 4.0 * (layers + T * C + 2.0 * T * V);   /* + embedding, logits and their gradient */
    }
    default: return 0;
    }
}
