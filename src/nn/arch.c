/* A model's architecture as checkpoints record it: a built-in's config
 * fields (with the flag that sets each, for messages) and, for every model,
 * a fingerprint of its parameter and buffer names and shapes. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <zlib.h>
#include "model_internal.h"

static void field(dt_arch_field *f, int *n, const char *key, const char *flag, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

static void field(dt_arch_field *f, int *n, const char *key, const char *flag, const char *fmt, ...) {
    dt_arch_field *x = &f[(*n)++];
    x->key = key;
    x->flag = flag;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(x->value, sizeof x->value, fmt, ap);
    va_end(ap);
}

int dt_model_arch_fields(const dt_model_cfg *c, dt_arch_field *out) {
    int n = 0;
    switch (c->kind) {
    case DT_MODEL_MLP: {
        char h[sizeof out->value] = "";
        size_t k = 0;
        for (int i = 0; i < c->mlp_n_hidden && i < DT_MLP_MAX_LAYERS && k < sizeof h; i++)
            k += (size_t)snprintf(h + k, sizeof h - k, "%s%d", i ? "," : "", c->mlp_hidden[i]);
        field(out, &n, "arch.mlp_in", "MLP input size", "%d", c->mlp_in);
        field(out, &n, "arch.hidden", "--hidden", "%s", c->mlp_n_hidden ? h : "none");
        field(out, &n, "arch.mlp_out", "MLP output size", "%d", c->mlp_out);
        break;
    }
    case DT_MODEL_CNN:
        field(out, &n, "arch.channels", "--channels", "%d,%d", c->cnn_c1, c->cnn_c2);
        field(out, &n, "arch.fc", "--fc", "%d", c->cnn_fc);
        field(out, &n, "arch.classes", "CNN classes", "%d", c->cnn_classes);
        break;
    case DT_MODEL_GPT2:
        field(out, &n, "arch.layers", "--layers", "%d", c->n_layer);
        field(out, &n, "arch.embd", "--embd", "%d", c->n_embd);
        field(out, &n, "arch.heads", "--heads", "%d", c->n_head);
        field(out, &n, "arch.vocab", "--vocab", "%d", c->vocab);
        field(out, &n, "arch.max_t", "--max-t", "%d", c->max_t);
        field(out, &n, "arch.dropout", "--dropout", "%.9g", (double)c->dropout);
        break;
    case DT_MODEL_CUSTOM:
        break;
    }
    return n;
}

static uLong add_tensor(uLong crc, const char *name, const dt_tensor *v) {
    char buf[320];
    int k = snprintf(buf, sizeof buf, "%s[", name);
    for (int d = 0; d < v->ndim && k < (int)sizeof buf; d++)
        k += snprintf(buf + k, sizeof buf - (size_t)k, "%s%lld", d ? "," : "", (long long)v->shape[d]);
    if (k < (int)sizeof buf) k += snprintf(buf + k, sizeof buf - (size_t)k, "];");
    if (k > (int)sizeof buf - 1) k = (int)sizeof buf - 1;
    return crc32(crc, (const Bytef *)buf, (uInt)k);
}

void dt_model_arch_fingerprint(dt_model *m) {
    uLong crc = crc32(0L, Z_NULL, 0);
    for (int i = 0; i < m->n_params; i++) crc = add_tensor(crc, m->params[i]->name, &m->params[i]->value);
    for (int i = 0; i < m->n_buffers; i++) crc = add_tensor(crc, m->buffers[i]->name, &m->buffers[i]->value);
    m->arch_crc = (uint32_t)crc;
    m->arch_n = m->n_params + m->n_buffers;
}
