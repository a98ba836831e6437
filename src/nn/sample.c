/* Sample shapes: what a dataset feeds a model, and whether the model takes it. */
#include <stdio.h>
#include "dtrain/nn.h"

int64_t dt_sample_numel(const dt_sample_shape *s) {
    int64_t n = 1;
    for (int i = 0; i < s->ndim; i++) n *= s->dims[i];
    return n;
}

size_t dt_sample_bytes(const dt_sample_shape *s) {
    size_t elem = s->input == DT_INPUT_IMAGE ? sizeof(float) : sizeof(int32_t);
    return (size_t)dt_sample_numel(s) * elem;
}

const char *dt_sample_shape_str(const dt_sample_shape *s, char *buf, size_t n) {
    int k = snprintf(buf, n, "%s [", s->input == DT_INPUT_IMAGE ? "float" : "int32");
    for (int i = 0; i < s->ndim && k >= 0 && (size_t)k < n; i++)
        k += snprintf(buf + k, n - (size_t)k, "%s%lld", i ? ", " : "", (long long)s->dims[i]);
    if (k >= 0 && (size_t)k < n) {
        if (s->input == DT_INPUT_IMAGE) snprintf(buf + k, n - (size_t)k, "] (%lld classes)", (long long)s->classes);
        else snprintf(buf + k, n - (size_t)k, "] (vocab %lld)", (long long)s->classes);
    }
    return buf;
}

static dt_status check_classes(const char *model, int64_t have, int64_t outputs) {
    if (have > outputs)
        return DT_ERR(DT_EINVAL, "--model %s has %lld outputs, fewer than the data's %lld classes", model,
                      (long long)outputs, (long long)have);
    return DT_OK;
}

dt_status dt_model_check_sample(const dt_model_cfg *c, const dt_sample_shape *s) {
    const char *m = dt_model_kind_name(c->kind);
    switch (c->kind) {
    case DT_MODEL_MLP:   /* flattens the image: any [C, H, W] with C*H*W = mlp_in */
        if (s->input != DT_INPUT_IMAGE) return DT_ERR(DT_EINVAL, "--model %s needs image data, float [C, H, W]", m);
        if (dt_sample_numel(s) != c->mlp_in)
            return DT_ERR(DT_EINVAL, "--model mlp expects float [%d] (C*H*W = its input size)", c->mlp_in);
        return check_classes(m, s->classes, c->mlp_out);
    case DT_MODEL_CNN:   /* two 2x2 poolings down to 7x7 (cnn.c) */
        if (s->input != DT_INPUT_IMAGE) return DT_ERR(DT_EINVAL, "--model %s needs image data, float [C, H, W]", m);
        if (s->ndim != 3 || s->dims[0] != 1 || s->dims[1] != 28 || s->dims[2] != 28)
            return DT_ERR(DT_EINVAL, "--model cnn expects float [1, 28, 28]");
        return check_classes(m, s->classes, c->cnn_classes);
    case DT_MODEL_GPT2:
        if (s->input != DT_INPUT_TOKENS) return DT_ERR(DT_EINVAL, "--model gpt2 needs token data, int32 ids [T]");
        if (s->dims[0] > c->max_t)
            return DT_ERR(DT_EINVAL, "--model gpt2 takes at most %d tokens per sample (--max-t)", c->max_t);
        if (s->classes > c->vocab)
            return DT_ERR(DT_EINVAL, "--model gpt2 has vocab %d (--vocab), too small for token ids up to %lld",
                          c->vocab, (long long)s->classes - 1);
        return DT_OK;
    }
    return DT_ERR(DT_EINVAL, "unknown model kind %d", (int)c->kind);
}

dt_batch dt_batch_of(const dt_sample_shape *s, int64_t B, const void *x, const int32_t *y) {
    dt_batch b = {.B = B, .T = s->targets, .y = y};
    if (s->input == DT_INPUT_IMAGE) b.x_img = x;
    else b.x_ids = x;
    return b;
}
