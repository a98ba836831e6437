/* Model registry: parameters, buffers, modules and the flat layout they live in. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "model_internal.h"

static void *grow(void *arr, int n, size_t elem) {
    /* capacity doubles at powers of two: n is the current count */
    if (n && (n & (n - 1))) return arr;
    return realloc(arr, (size_t)(n ? 2 * n : 1) * elem);
}

dt_model *dt_model_new(const dt_model_cfg *cfg) {
    dt_model *m = calloc(1, sizeof *m);
    if (!m) { DT_ERR(DT_ENOMEM, "out of memory creating model"); return NULL; }
    m->cfg = *cfg;
    return m;
}

dt_module *dt_model_add_module(dt_model *m, const char *name) {
    dt_module *mod = calloc(1, sizeof *mod);
    dt_module **arr = grow(m->modules, m->n_modules, sizeof *arr);
    if (!mod || !arr) { free(mod); DT_ERR(DT_ENOMEM, "out of memory adding module %s", name); return NULL; }
    m->modules = arr;
    snprintf(mod->name, sizeof mod->name, "%s", name);
    mod->index = m->n_modules;
    m->modules[m->n_modules++] = mod;
    return mod;
}

dt_param *dt_model_add_param(dt_model *m, dt_module *mod, const char *leaf, int ndim, const int64_t *shape) {
    char name[160];
    snprintf(name, sizeof name, "%s%s%s", mod ? mod->name : "", mod ? "." : "", leaf);
    dt_param *p = calloc(1, sizeof *p);
    dt_param **arr = grow(m->params, m->n_params, sizeof *arr);
    if (!p || !arr) { free(p); DT_ERR(DT_ENOMEM, "out of memory adding parameter %s", name); return NULL; }
    m->params = arr;
    if (dt_param_init(p, name, ndim, shape) != DT_OK) { free(p); return NULL; }
    p->index = m->n_params;
    m->params[m->n_params++] = p;
    if (mod) {
        dt_param **mp = grow(mod->params, mod->n_params, sizeof *mp);
        if (!mp) { DT_ERR(DT_ENOMEM, "out of memory"); return NULL; }
        mod->params = mp;
        mod->params[mod->n_params++] = p;
    }
    return p;
}

dt_named_buffer *dt_model_add_buffer(dt_model *m, const char *name, int ndim, const int64_t *shape, float fill) {
    dt_named_buffer *b = calloc(1, sizeof *b);
    dt_named_buffer **arr = grow(m->buffers, m->n_buffers, sizeof *arr);
    if (!b || !arr) { free(b); DT_ERR(DT_ENOMEM, "out of memory adding buffer %s", name); return NULL; }
    m->buffers = arr;
    snprintf(b->name, sizeof b->name, "%s", name);
    if (dt_tensor_alloc(&b->value, DT_F32, ndim, shape) != DT_OK) { free(b); return NULL; }
    for (int64_t i = 0; i < b->value.numel; i++) dt_f32(&b->value)[i] = fill;
    m->buffers[m->n_buffers++] = b;
    return b;
}

dt_status dt_model_finalize(dt_model *m) {
    size_t *off = malloc((size_t)(m->n_params ? m->n_params : 1) * sizeof *off);
    if (!off) return DT_ERR(DT_ENOMEM, "out of memory");
    size_t pos = 0;
    for (int i = m->n_params - 1; i >= 0; i--) {   /* reverse registration order */
        off[i] = pos;
        pos += (size_t)m->params[i]->value.numel;
    }
    m->n_elems = pos;
    dt_status s = dt_model_set_layout(m, off, pos);
    free(off);
    return s;
}

dt_status dt_model_set_layout(dt_model *m, const size_t *offsets, size_t total) {
    for (int i = 0; i < m->n_params; i++) {
        size_t end = offsets[i] + (size_t)m->params[i]->value.numel;
        if (end > total)
            return DT_ERR(DT_EINVAL, "layout: parameter %s [%zu, %zu) exceeds buffer of %zu",
                          m->params[i]->name, offsets[i], end, total);
        for (int j = 0; j < i; j++) {
            size_t b = offsets[j], e = b + (size_t)m->params[j]->value.numel;
            if (offsets[i] < e && b < end)
                return DT_ERR(DT_EINVAL, "layout: parameters %s and %s overlap",
                              m->params[j]->name, m->params[i]->name);
        }
    }
    size_t np = m->n_params > 0 ? (size_t)m->n_params : 0;
    size_t *own = malloc((np ? np : 1) * sizeof *own);
    if (!own) return DT_ERR(DT_ENOMEM, "out of memory");
    if (np) memcpy(own, offsets, np * sizeof *own);
    int has_grads = 0;
    for (int i = 0; i < m->n_params; i++) has_grads |= m->params[i]->grad.data != NULL;
    /* values first, then gradients: one new buffer alive next to the old ones
     * at a time (peak 3 model sizes, not 4) */
    dt_flat pf = {0}, gf = {0};
    if (dt_flat_alloc(&pf, total) != DT_OK) {
        free(own);
        return DT_ERR(DT_ENOMEM, "out of memory allocating a %zu-element parameter buffer", total);
    }
    for (int i = 0; i < m->n_params; i++) {
        dt_param *p = m->params[i];
        float *v = pf.data + offsets[i];
        memcpy(v, p->value.data, (size_t)p->value.numel * sizeof(float));
        if (p->value.owns_data) dt_free(p->value.data);
        p->value.data = v; p->value.owns_data = 0;
    }
    dt_flat_free(&m->param_flat);
    m->param_flat = pf;
    dt_status s = DT_OK;
    if (has_grads && dt_flat_alloc(&gf, total) != DT_OK)
        s = DT_ERR(DT_ENOMEM, "out of memory allocating a %zu-element gradient buffer (the model is left "
                   "without gradients)", total);
    for (int i = 0; i < m->n_params; i++) {
        dt_param *p = m->params[i];
        float *g = gf.data ? gf.data + offsets[i] : NULL;
        if (g && p->grad.data) memcpy(g, p->grad.data, (size_t)p->grad.numel * sizeof(float));
        if (p->grad.owns_data) dt_free(p->grad.data);
        p->grad.data = g; p->grad.owns_data = 0;
    }
    dt_flat_free(&m->grad_flat);
    m->grad_flat = gf;
    free(m->offsets);
    m->offsets = own;
    return s;
}

dt_status dt_model_create(const dt_model_cfg *cfg, uint64_t seed, dt_model **out) {
    extern dt_status dt_mlp_build(dt_model *m, dt_rng *r);
    extern dt_status dt_cnn_build(dt_model *m, dt_rng *r);
    extern dt_status dt_gpt2_build(dt_model *m, dt_rng *r);
    *out = NULL;
    DT_TRY(dt_model_cfg_validate(cfg));
    dt_model *m = dt_model_new(cfg);
    if (!m) return DT_ENOMEM;
    dt_rng r;
    dt_rng_seed(&r, seed);
    dt_rng_seed(&m->dropout_rng, seed ^ 0xd20b0u);
    dt_status s = cfg->kind == DT_MODEL_MLP ? dt_mlp_build(m, &r)
                : cfg->kind == DT_MODEL_CNN ? dt_cnn_build(m, &r) : dt_gpt2_build(m, &r);
    if (s == DT_OK) s = dt_model_finalize(m);
    if (s != DT_OK) { dt_model_free(m); return s; }
    *out = m;
    return DT_OK;
}

void dt_model_free(dt_model *m) {
    if (!m) return;
    if (m->destroy) m->destroy(m);
    for (int i = 0; i < m->n_params; i++) { dt_param_free(m->params[i]); free(m->params[i]); }
    for (int i = 0; i < m->n_buffers; i++) { dt_tensor_free(&m->buffers[i]->value); free(m->buffers[i]); }
    for (int i = 0; i < m->n_modules; i++) { free(m->modules[i]->params); free(m->modules[i]); }
    free(m->params); free(m->buffers); free(m->modules); free(m->offsets);
    dt_flat_free(&m->param_flat);
    dt_flat_free(&m->grad_flat);
    free(m);
}

dt_tensor *dt_model_forward(dt_model *m, dt_graph *g, const dt_batch *b, dt_tensor **logits) {
    if (!b || b->B <= 0 || !b->y) { DT_ERR(DT_EINVAL, "forward: empty batch or missing targets"); return NULL; }
    return m->forward(m, g, b, logits);
}

size_t dt_model_num_params(const dt_model *m) { return m->n_elems; }

void dt_model_zero_grad(dt_model *m) {
    if (m->grad_flat.data) memset(m->grad_flat.data, 0, m->grad_flat.numel * sizeof(float));
}

void dt_model_drop_grads(dt_model *m) {
    for (int i = 0; i < m->n_params; i++) {
        dt_param *p = m->params[i];
        if (p->grad.owns_data) dt_free(p->grad.data);
        p->grad.data = NULL;
        p->grad.owns_data = 0;
    }
    dt_flat_free(&m->grad_flat);
}

/* gf (zeroed, at param_flat's layout) becomes the gradient buffer: present
 * gradients are copied in if keep, every grad is re-pointed, the old buffer
 * freed. */
static void adopt_grads(dt_model *m, dt_flat gf, int keep) {
    for (int i = 0; i < m->n_params; i++) {
        dt_param *p = m->params[i];
        float *g = gf.data + m->offsets[i];
        if (keep && p->grad.data) memcpy(g, p->grad.data, (size_t)p->value.numel * sizeof(float));
        if (p->grad.owns_data) dt_free(p->grad.data);
        p->grad.data = g;
        p->grad.owns_data = 0;
    }
    dt_flat_free(&m->grad_flat);
    m->grad_flat = gf;
}

static dt_status alloc_private_grads(dt_model *m, int keep) {
    dt_flat gf = {0};
    if (dt_flat_alloc(&gf, m->param_flat.numel) != DT_OK)
        return DT_ERR(DT_ENOMEM, "out of memory allocating a %zu-element gradient buffer", m->param_flat.numel);
    adopt_grads(m, gf, keep);
    return DT_OK;
}

dt_status dt_model_alloc_grads(dt_model *m) {   /* zeros: whatever grads point at is not ours */
    return m->grad_flat.data ? DT_OK : alloc_private_grads(m, 0);
}

dt_status dt_model_set_grad_buffer(dt_model *m, float *buf) {
    if (!buf) return alloc_private_grads(m, 1);
    memset(buf, 0, m->param_flat.numel * sizeof(float));
    adopt_grads(m, (dt_flat){buf, m->param_flat.numel, 1}, 1);
    return DT_OK;
}

dt_param *dt_model_find_param(const dt_model *m, const char *name) {
    for (int i = 0; i < m->n_params; i++)
        if (!strcmp(m->params[i]->name, name)) return m->params[i];
    return NULL;
}

int dt_model_kind_parse(const char *s, dt_model_kind *out) {
    if (!strcmp(s, "mlp")) { *out = DT_MODEL_MLP; return 0; }
    if (!strcmp(s, "cnn")) { *out = DT_MODEL_CNN; return 0; }
    if (!strcmp(s, "gpt2")) { *out = DT_MODEL_GPT2; return 0; }
    return -1;
}

const char *dt_model_kind_name(dt_model_kind k) {
    return k == DT_MODEL_MLP ? "mlp" : k == DT_MODEL_CNN ? "cnn" : "gpt2";
}
