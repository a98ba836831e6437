/* The flat layout: every parameter's value and gradient is a view into one
 * buffer each; strategies re-point them (padding, shards, shared memory). */
#include <stdlib.h>
#include <string.h>
#include "dtrain/nn.h"

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

void dt_model_zero_grad(dt_model *m) {
    if (m->grad_flat.data) memset(m->grad_flat.data, 0, m->grad_flat.numel * sizeof(float));
    for (int i = 0; i < m->n_params; i++) m->params[i]->has_grad = 0;   /* PyTorch: grad = None */
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

