/* dtrain/nn.h — models: named parameters, buffers, modules, flat layout.
 *
 * A model registers parameters in a fixed order (PyTorch's named_parameters
 * order; GPT-2 uses Hugging Face names and layouts so checkpoints are
 * interchangeable). By default parameters and gradients live in two flat
 * buffers, laid out in *reverse* registration order (≈ the order backward
 * produces gradients), so a DDP bucket or ZeRO shard is a contiguous range.
 * Parallel strategies may impose another layout (padding, alignment) with
 * dt_model_set_layout.
 */
#ifndef DTRAIN_NN_H
#define DTRAIN_NN_H

#include "dtrain/ops.h"

typedef struct dt_named_buffer {
    char name[128];          /* "bn1.running_mean" */
    dt_tensor value;         /* F32, owned */
} dt_named_buffer;

typedef enum dt_model_kind { DT_MODEL_MLP = 0, DT_MODEL_CNN = 1, DT_MODEL_GPT2 = 2 } dt_model_kind;

#define DT_MLP_MAX_LAYERS 16
typedef struct dt_model_cfg {
    dt_model_kind kind;
    /* MLP: in -> hidden[0] -> ... -> out, ReLU between */
    int mlp_in, mlp_out, mlp_n_hidden, mlp_hidden[DT_MLP_MAX_LAYERS];
    /* CNN (Fashion-MNIST): conv(1->c1,5x5,pad 2)+BN+ReLU+pool2, conv(c1->c2)+BN+ReLU+pool2, fc(c2*7*7 -> fc) + ReLU, fc(->10) */
    int cnn_c1, cnn_c2, cnn_fc, cnn_classes;
    /* GPT-2 */
    int n_layer, n_embd, n_head, vocab, max_t;
    float dropout;           /* residual / attention-output dropout (0 = off) */
} dt_model_cfg;

/* Defaults: MLP 784-[256,256]-10; CNN c1=32 c2=64 fc=128 classes 10;
 * GPT-2 tiny L=4 C=128 H=4 V=256 maxT=128. */
dt_model_cfg dt_model_cfg_default(dt_model_kind kind);
dt_status dt_model_cfg_validate(const dt_model_cfg *c);

/* What one sample looks like. Datasets (data.h) describe their samples with
 * it; dt_model_check_sample says whether a model accepts them.
 *   image:  input float [C, H, W], 1 target  (its class, < classes)
 *   tokens: input int32 ids [T],    T targets (the next ids, < classes = vocab) */
typedef enum dt_sample_input { DT_INPUT_IMAGE = 0, DT_INPUT_TOKENS = 1 } dt_sample_input;
typedef struct dt_sample_shape {
    dt_sample_input input;
    int ndim;                /* 3 (C, H, W) or 1 (T) */
    int64_t dims[3];
    int64_t targets;         /* int32 targets per sample */
    int64_t classes;         /* every target (and token id) is < classes */
} dt_sample_shape;
int64_t dt_sample_numel(const dt_sample_shape *s);   /* input elements per sample */
size_t dt_sample_bytes(const dt_sample_shape *s);    /* input bytes per sample (float or int32) */
/* "float [1, 28, 28] (10 classes)" / "int32 [64] (vocab 256)"; returns buf. */
const char *dt_sample_shape_str(const dt_sample_shape *s, char *buf, size_t n);
/* DT_OK if a model of cfg c takes samples of shape s, else DT_EINVAL with
 * what the model expects ("--model cnn expects float [1, 28, 28]"). */
dt_status dt_model_check_sample(const dt_model_cfg *c, const dt_sample_shape *s);

/* A batch. Image models: x_img[B, C, H, W] and y[B]. Language models:
 * x_ids[B, T], y[B, T]. Targets < 0 are ignored. */
typedef struct dt_batch {
    int64_t B, T;            /* T: targets per sample (1 for images) */
    const float *x_img;
    const int32_t *x_ids;
    const int32_t *y;
} dt_batch;
/* B samples of shape s in x (B * dt_sample_bytes) and y (B * s->targets). */
dt_batch dt_batch_of(const dt_sample_shape *s, int64_t B, const void *x, const int32_t *y);

typedef struct dt_model dt_model;
struct dt_model {
    dt_model_cfg cfg;
    dt_param **params; int n_params;
    dt_named_buffer **buffers; int n_buffers;
    dt_module **modules; int n_modules;
    dt_flat param_flat, grad_flat;   /* every param's value / grad is a view into these */
    size_t *offsets;                 /* offsets[i]: element offset of params[i] in the flats */
    size_t n_elems;                  /* sum of param numel (no padding) */
    dt_rng dropout_rng;
    dt_bn_sync bn_sync;              /* SyncBatchNorm reducer; fn NULL = local stats */
    /* forward: returns the scalar loss; *logits (optional) gets [B*T or B, classes] */
    dt_tensor *(*forward)(dt_model *m, dt_graph *g, const dt_batch *b, dt_tensor **logits);
    void (*destroy)(dt_model *m);
    void *impl;
};

/* Build and initialise (seeded: same seed -> same weights). */
dt_status dt_model_create(const dt_model_cfg *cfg, uint64_t seed, dt_model **out);
void dt_model_free(dt_model *m);
dt_tensor *dt_model_forward(dt_model *m, dt_graph *g, const dt_batch *b, dt_tensor **logits);
size_t dt_model_num_params(const dt_model *m);
void dt_model_zero_grad(dt_model *m);
/* Gradient storage: drop it (every grad NULL, no buffer; ZeRO-2/3 keep
 * gradients per bucket instead), or allocate it back (zeros, at the current
 * layout of param_flat; no-op if present). */
void dt_model_drop_grads(dt_model *m);
dt_status dt_model_alloc_grads(dt_model *m);
/* Move the gradients (values kept) into buf: param_flat.numel floats at the
 * layout of param_flat, owned by the caller, who must move them out again
 * (buf = NULL: back into a private allocation) before freeing buf. DDP uses
 * it for node-shared memory (dist.h section 6). */
dt_status dt_model_set_grad_buffer(dt_model *m, float *buf);
dt_param *dt_model_find_param(const dt_model *m, const char *name);
/* Re-point values and grads into new flat buffers of `total` elements where
 * params[i] starts at offsets[i] (values and grads copied, gaps zero). A model
 * whose parameters have no gradient storage (dt_model_drop_grads) gets no
 * gradient buffer. Values move before gradients, so at most
 * one new buffer exists beside the old ones. */
dt_status dt_model_set_layout(dt_model *m, const size_t *offsets, size_t total);
/* Training FLOPs per sample (image) or per token (LM): 6*N (+ attention). */
double dt_model_flops_per_item(const dt_model *m, int64_t T);
/* Parse "mlp" | "cnn" | "gpt2". */
int dt_model_kind_parse(const char *s, dt_model_kind *out);
const char *dt_model_kind_name(dt_model_kind k);

#endif
