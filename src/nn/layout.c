/* The flat layouts. Every parameter's value is a view into param_flat at
 * offsets[i]; every trainable parameter's gradient is a view into grad_flat
 * at grad_offsets[i]. The gradient layout is the value layout with the
 * elements of the parameters that were frozen (requires_grad = 0) when it was
 * made left out:
 *
 *   grad_offsets[i] = offsets[i] - (elements of frozen parameters below offsets[i])
 *
 * so a frozen parameter costs no gradient memory (its grad.data is NULL), and
 * a range of param_flat holding no frozen parameter (a DDP or ZeRO bucket) is
 * one contiguous range of grad_flat starting at dt_model_grad_offset. Padding
 * between parameters stays in both. Strategies re-point the buffers (padding,
 * shards, node-shared memory). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "dtrain/nn.h"

/* goff[i] for offsets[] and the current requires_grad; returns the
 * gradient buffer's size. */
static size_t grad_layout(const dt_model *m, const size_t *offsets, size_t total, size_t *goff) {
    size_t frozen_total = 0;
    for (int i = 0; i < m->n_params; i++) {
        if (!m->params[i]->requires_grad) {
            goff[i] = SIZE_MAX;
            frozen_total += (size_t)m->params[i]->value.numel;
            continue;
        }
        size_t below = 0;
        for (int j = 0; j < m->n_params; j++)
            if (!m->params[j]->requires_grad && offsets[j] < offsets[i]) below += (size_t)m->params[j]->value.numel;
        goff[i] = offsets[i] - below;
    }
    return total - frozen_total;
}

/* New gradient storage at the current trainable set: a private buffer, or
 * (buf) the caller's buffer of at least dt_model_grad_numel floats. keep:
 * present gradients of parameters that keep one are carried over (others
 * zero). Consumes nothing on failure. */
static dt_status relayout_grads(dt_model *m, float *buf, int keep) {
    size_t np = (size_t)(m->n_params > 0 ? m->n_params : 1);
    size_t *goff = malloc(np * sizeof *goff);
    if (!goff) return DT_ERR(DT_ENOMEM, "out of memory");
    size_t gtotal = grad_layout(m, m->offsets, m->param_flat.numel, goff);
    dt_flat gf = {dt_calloc((gtotal ? gtotal : 1) * sizeof(float)), gtotal, 0};
    if (!gf.data) {
        free(goff);
        return DT_ERR(DT_ENOMEM, "out of memory allocating a %zu-element gradient buffer", gtotal);
    }
    for (int i = 0; i < m->n_params; i++) {
        dt_param *p = m->params[i];
        if (keep && p->grad.data && goff[i] != SIZE_MAX)
            memcpy(gf.data + goff[i], p->grad.data, (size_t)p->value.numel * sizeof(float));
    }
    if (buf) {   /* (buf may be the current buffer: the private copy above is complete first) */
        memcpy(buf, gf.data, gtotal * sizeof(float));
        dt_flat_free(&gf);
        gf = (dt_flat){buf, gtotal, 1};
    }
    for (int i = 0; i < m->n_params; i++) {
        dt_param *p = m->params[i];
        if (p->grad.owns_data) dt_free(p->grad.data);
        p->grad.data = goff[i] != SIZE_MAX ? gf.data + goff[i] : NULL;
        p->grad.owns_data = 0;
    }
    dt_flat_free(&m->grad_flat);
    m->grad_flat = gf;
    free(m->grad_offsets);
    m->grad_offsets = goff;
    return DT_OK;
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
    int has_grads = m->grad_flat.data != NULL;
    for (int i = 0; i < m->n_params; i++) has_grads |= m->params[i]->grad.data != NULL;
    /* values first, then gradients: one new buffer alive next to the old ones
     * at a time (peak 3 model sizes, not 4) */
    dt_flat pf = {0};
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
    free(m->offsets);
    m->offsets = own;
    if (!has_grads) return DT_OK;
    if (relayout_grads(m, NULL, 1) == DT_OK) return DT_OK;
    dt_model_drop_grads(m);
    return DT_ERR(DT_ENOMEM, "out of memory allocating the gradient buffer (the model is left without gradients)");
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
    free(m->grad_offsets);
    m->grad_offsets = NULL;
}

dt_status dt_model_alloc_grads(dt_model *m) {   /* zeros: whatever grads point at is not ours */
    return m->grad_flat.data ? DT_OK : relayout_grads(m, NULL, 0);
}

dt_status dt_model_set_param_buffer(dt_model *m, float *buf, int filled) {
    dt_flat pf = {buf, m->param_flat.numel, buf != NULL};   /* borrowed: the caller's */
    if (!buf && dt_flat_alloc(&pf, m->param_flat.numel) != DT_OK)
        return DT_ERR(DT_ENOMEM, "out of memory allocating a %zu-element parameter buffer", m->param_flat.numel);
    if (!buf || !filled) memcpy(pf.data, m->param_flat.data, m->param_flat.numel * sizeof(float));
    for (int i = 0; i < m->n_params; i++) m->params[i]->value.data = pf.data + m->offsets[i];
    dt_flat_free(&m->param_flat);   /* (a borrowed buffer stays its owner's) */
    m->param_flat = pf;
    return DT_OK;
}

dt_status dt_model_set_grad_buffer(dt_model *m, float *buf) {
    return relayout_grads(m, buf, 1);
}

dt_status dt_model_refresh_grads(dt_model *m) {
    if (!m->grad_flat.data) return DT_OK;   /* no gradient buffer (ZeRO-2/3 keep theirs per bucket) */
    int stale = !m->grad_offsets;
    for (int i = 0; i < m->n_params && !stale; i++)
        stale = (m->grad_offsets[i] == SIZE_MAX) != !m->params[i]->requires_grad;
    if (!stale) return DT_OK;
    /* in the caller's buffer while the new layout fits in what it gave */
    int in_place = m->grad_flat.borrowed && dt_model_grad_numel(m) <= m->grad_flat.numel;
    return relayout_grads(m, in_place ? m->grad_flat.data : NULL, 1);
}

size_t dt_model_grad_numel(const dt_model *m) {   /* (padding stays) */
    return m->param_flat.numel - (m->n_elems - dt_model_num_trainable(m));
}

size_t dt_model_grad_offset(const dt_model *m, size_t offset) {
    size_t below = 0;
    for (int i = 0; m->grad_offsets && i < m->n_params; i++)
        if (m->grad_offsets[i] == SIZE_MAX && m->offsets[i] < offset) below += (size_t)m->params[i]->value.numel;
    return offset - below;
}
