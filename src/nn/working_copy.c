/* The 16-bit working copy of a model's parameters (nn.h): what forward and
 * backward read while the float32 masters stay in param_flat for the
 * optimizer, checkpoints and everything else between steps.
 *
 * Invariant: while active, params[i]->value.data == buf + offsets[i] and
 * buf[k] == round16(param_flat[k]) for every k of a parameter with two or
 * more dimensions, == param_flat[k] for the others (dt_param_copy_exact);
 * while not, the views are param_flat's. Entering rounds the whole flat
 * buffer once (one read, one write per element) and copies the 1-D ones
 * back; leaving only moves pointers. */
#include <math.h>
#include <stdint.h>
#include <string.h>
#include "dtrain/nn.h"

/* some rounded value is inf or NaN where its master is finite (branch-free: vectorises) */
static int overflowed(const float *r, const float *x, size_t n) {
    unsigned bad = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t a, b;
        memcpy(&a, &r[i], 4);
        memcpy(&b, &x[i], 4);
        bad |= ((a & 0x7f800000u) == 0x7f800000u) & ((b & 0x7f800000u) != 0x7f800000u);
    }
    return bad != 0;
}

int dt_param_copy_exact(const dt_param *p) { return p->value.ndim < 2; }

void dt_model_round_params(const dt_model *m, float *dst, const float *src, dt_dtype to) {
    if (dst != src) {   /* one pass over everything, then the exact ones back */
        dt_round_to(dst, src, to, m->param_flat.numel);
        for (int i = 0; i < m->n_params; i++)
            if (dt_param_copy_exact(m->params[i]))
                memcpy(dst + m->offsets[i], src + m->offsets[i], (size_t)m->params[i]->value.numel * sizeof(float));
        return;
    }
    for (int i = 0; i < m->n_params; i++)   /* in place: only the rounded ones (the gaps hold zeros) */
        if (!dt_param_copy_exact(m->params[i]))
            dt_round_to(dst + m->offsets[i], src + m->offsets[i], to, (size_t)m->params[i]->value.numel);
}

dt_status dt_model_check_f16_range(const dt_model *m, const float *src) {
    for (int i = 0; i < m->n_params; i++) {
        if (dt_param_copy_exact(m->params[i])) continue;
        const float *x = src + m->offsets[i];
        int64_t k = dt_f16_first_overflow(x, (size_t)m->params[i]->value.numel);
        if (k >= 0)
            return DT_ERR(DT_EINVAL, "parameter %s: element %lld (%g) is beyond fp16's range (65504): "
                          "use train.param_dtype bf16 or fp32", m->params[i]->name, (long long)k, (double)x[k]);
    }
    return DT_OK;
}

static void point(dt_model *m, float *base) {
    for (int i = 0; i < m->n_params; i++) m->params[i]->value.data = base + m->offsets[i];
}

dt_status dt_working_copy_enter(dt_working_copy *w, dt_model *m) {
    if (w->dtype != DT_BF16 && w->dtype != DT_F16) return DT_OK;   /* fp32: the masters themselves */
    if (w->active) return DT_OK;
    size_t n = m->param_flat.numel;
    if (!m->param_flat.data) return DT_ERR(DT_ESTATE, "model %s: no parameter buffer for a working copy", m->name);
    if (w->n != n) {
        dt_free(w->buf);
        w->n = 0;
        if (!(w->buf = dt_alloc((n ? n : 1) * sizeof(float))))
            return DT_ERR(DT_ENOMEM, "model %s: out of memory for a %zu-element %s working copy of the parameters",
                          m->name, n, dt_dtype_name(w->dtype));
        w->n = n;
    }
    dt_model_round_params(m, w->buf, m->param_flat.data, w->dtype);
    if (w->dtype == DT_F16 && overflowed(w->buf, m->param_flat.data, n))   /* beyond 65504: inf */
        return dt_model_check_f16_range(m, m->param_flat.data);   /* (names it) */
    point(m, w->buf);
    w->active = 1;
    return DT_OK;
}

void dt_working_copy_leave(dt_working_copy *w, dt_model *m) {
    if (!w->active) return;
    point(m, m->param_flat.data);
    w->active = 0;
}

void dt_working_copy_free(dt_working_copy *w) {
    dt_free(w->buf);
    w->buf = NULL;
    w->n = 0;
    w->active = 0;
}
