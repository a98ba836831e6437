/* Optimizer config (defaults, validation) and dt_optimizer over a flat
 * buffer described by a segment table, owning state for one range of it. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "dtrain/optim.h"
#include "dtrain/tensor.h"
#include "bf16_state.h"

dt_optim_cfg dt_optim_cfg_default(dt_optim_kind kind) {
    /* Both field groups get sane values so switching kind keeps a valid cfg. */
    dt_optim_cfg c = {
        .kind = kind, .lr = 1e-3f, .weight_decay = 0.01f, .momentum = 0.0f, .nesterov = 0,
        .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
    };
    if (kind == DT_OPTIM_SGD) {
        c.lr = 0.01f;
        c.weight_decay = 0.0f;
    }
    return c;
}

/* x in [0, 1); also rejects NaN. */
static int in_unit(float x) { return x >= 0.0f && x < 1.0f; }

/* Only the fields the chosen kind uses are checked. */
dt_status dt_optim_cfg_validate(const dt_optim_cfg *c) {
    if (c->kind != DT_OPTIM_SGD && c->kind != DT_OPTIM_ADAMW)
        return DT_ERR(DT_EINVAL, "optimizer kind %d unknown (sgd or adamw)", (int)c->kind);
    if (!(c->lr >= 0.0f) || !isfinite(c->lr))
        return DT_ERR(DT_EINVAL, "optim.lr must be finite and >= 0 (got %g)", (double)c->lr);
    if (!(c->weight_decay >= 0.0f) || !isfinite(c->weight_decay))
        return DT_ERR(DT_EINVAL, "optim.weight_decay must be finite and >= 0 (got %g)",
                      (double)c->weight_decay);
    if (c->kind == DT_OPTIM_SGD) {
        if (!in_unit(c->momentum))
            return DT_ERR(DT_EINVAL, "optim.momentum must be in [0, 1) (got %g)", (double)c->momentum);
        if (c->nesterov && !(c->momentum > 0.0f))
            return DT_ERR(DT_EINVAL, "optim.nesterov requires optim.momentum > 0");
    } else {
        if (!in_unit(c->beta1))
            return DT_ERR(DT_EINVAL, "optim.beta1 must be in [0, 1) (got %g)", (double)c->beta1);
        if (!in_unit(c->beta2))
            return DT_ERR(DT_EINVAL, "optim.beta2 must be in [0, 1) (got %g)", (double)c->beta2);
        if (!(c->eps > 0.0f) || !isfinite(c->eps))
            return DT_ERR(DT_EINVAL, "optim.eps must be finite and > 0 (got %g)", (double)c->eps);
    }
    if (c->state_dtype != DT_OPTIM_STATE_FP32 && c->state_dtype != DT_OPTIM_STATE_BF16)
        return DT_ERR(DT_EINVAL, "train.optim.state_dtype: unknown optimizer state dtype %d (fp32 or bf16)", c->state_dtype);
    return DT_OK;
}

int dt_optim_state_per_elem(const dt_optim_cfg *c) {
    if (c->kind == DT_OPTIM_ADAMW) return 2;
    return c->momentum > 0.0f ? 1 : 0;
}

size_t dt_optim_state_bytes(const dt_optim_cfg *c) {
    return (size_t)dt_optim_state_per_elem(c) * (c->state_dtype == DT_OPTIM_STATE_BF16 ? sizeof(uint16_t) : sizeof(float));
}

static int is_bf16(const dt_optimizer *o) { return o->cfg.state_dtype == DT_OPTIM_STATE_BF16; }

static int seg_cmp(const void *a, const void *b) {
    size_t x = ((const dt_optim_segment *)a)->offset, y = ((const dt_optim_segment *)b)->offset;
    return (x > y) - (x < y);
}

/* compact: state for segment elements only (state_begin 0, state_end the end
 * of the last segment); else for all of [state_begin, state_end). */
static dt_status init_impl(dt_optimizer *o, const dt_optim_cfg *cfg, const dt_optim_segment *segs, int n_segs,
                           size_t state_begin, size_t state_end, int compact) {
    memset(o, 0, sizeof *o);
    DT_TRY(dt_optim_cfg_validate(cfg));
    if (n_segs < 0 || (n_segs > 0 && !segs))
        return DT_ERR(DT_EINVAL, "optimizer: bad segment table (%d segments)", n_segs);
    if (state_begin > state_end)
        return DT_ERR(DT_EINVAL, "optimizer: state range [%zu, %zu) is reversed", state_begin,
                      state_end);
    for (int i = 0; i < n_segs; i++)
        if (segs[i].numel > SIZE_MAX - segs[i].offset)
            return DT_ERR(DT_EINVAL, "optimizer: segment %d overflows size_t", i);
        else if (segs[i].grad_gap > segs[i].offset)
            return DT_ERR(DT_EINVAL, "optimizer: segment %d at offset %zu has a gradient gap of %zu elements", i,
                          segs[i].offset, segs[i].grad_gap);
    size_t len = state_end - state_begin;
    if (len > SIZE_MAX / sizeof(float))
        return DT_ERR(DT_EINVAL, "optimizer: state range of %zu elements too large", len);

    dt_optim_segment *copy = NULL;
    if (n_segs > 0) {
        copy = malloc((size_t)n_segs * sizeof *copy);
        if (!copy) return DT_ERR(DT_ENOMEM, "optimizer: out of memory for %d segments", n_segs);
        memcpy(copy, segs, (size_t)n_segs * sizeof *copy);
        qsort(copy, (size_t)n_segs, sizeof *copy, seg_cmp);
        for (int i = 1; i < n_segs; i++)
            if (copy[i].offset < copy[i - 1].offset + copy[i - 1].numel) {
                dt_status s = DT_ERR(DT_EINVAL,
                                     "optimizer: segments at offsets %zu and %zu overlap",
                                     copy[i - 1].offset, copy[i].offset);
                free(copy);
                return s;
            }
    }
    o->skipped = calloc((size_t)(n_segs ? n_segs : 1), sizeof *o->skipped);
    o->seg_state = calloc((size_t)(n_segs ? n_segs : 1), sizeof *o->seg_state);
    if (!o->skipped || !o->seg_state) {
        free(copy);
        free(o->skipped);
        free(o->seg_state);
        o->skipped = NULL;
        o->seg_state = NULL;
        return DT_ERR(DT_ENOMEM, "optimizer: out of memory for %d segments", n_segs);
    }
    /* where each segment's owned elements start in the state arrays */
    if (compact) {
        len = 0;
        for (int i = 0; i < n_segs; i++) {
            o->seg_state[i] = len;
            len += copy[i].numel;
        }
        if (n_segs && copy[n_segs - 1].offset + copy[n_segs - 1].numel > state_end) {
            dt_status st = DT_ERR(DT_EINVAL, "optimizer: segment at offset %zu ends past the buffer's %zu elements",
                                  copy[n_segs - 1].offset, state_end);
            free(copy);
            free(o->skipped);
            free(o->seg_state);
            memset(o, 0, sizeof *o);
            return st;
        }
    } else {
        for (int i = 0; i < n_segs; i++) o->seg_state[i] = copy[i].offset > state_begin ? copy[i].offset - state_begin : 0;
    }
    o->cfg = *cfg;
    o->segs = copy;
    o->n_segs = n_segs;
    o->state_begin = state_begin;
    o->state_end = state_end;
    o->state_len = len;
    for (int k = 0; k < dt_optim_state_per_elem(cfg); k++) {
        void *a = dt_calloc(len * (is_bf16(o) ? sizeof(uint16_t) : sizeof(float)));   /* bf16 0x0000 = +0 */
        if (is_bf16(o)) o->state16[k] = a;
        else o->state[k] = a;
        if (!a) {
            dt_optimizer_free(o);
            return DT_ERR(DT_ENOMEM, "optimizer: out of memory for %zu state floats", len);
        }
    }
    return DT_OK;
}

dt_status dt_optimizer_init(dt_optimizer *o, const dt_optim_cfg *cfg, const dt_optim_segment *segs,
                            int n_segs, size_t state_begin, size_t state_end) {
    return init_impl(o, cfg, segs, n_segs, state_begin, state_end, 0);
}

dt_status dt_optimizer_init_compact(dt_optimizer *o, const dt_optim_cfg *cfg, const dt_optim_segment *segs, int n_segs,
                                   size_t numel) {
    return init_impl(o, cfg, segs, n_segs, 0, numel, 1);
}

float *dt_optimizer_state_of(const dt_optimizer *o, int k, size_t offset) {
    if (k < 0 || k > 1 || !o->state[k] || offset < o->state_begin || offset >= o->state_end) return NULL;
    int lo = 0, hi = o->n_segs - 1, at = -1;   /* the last segment starting at or before offset */
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        if (o->segs[mid].offset <= offset) { at = mid; lo = mid + 1; }
        else hi = mid - 1;
    }
    if (at < 0 || offset >= o->segs[at].offset + o->segs[at].numel) return NULL;
    size_t first = o->segs[at].offset > o->state_begin ? o->segs[at].offset : o->state_begin;
    return o->state[k] + o->seg_state[at] + (offset - first);
}

void dt_optimizer_free(dt_optimizer *o) {
    if (!o) return;
    free(o->segs);
    free(o->skipped);
    free(o->seg_state);
    dt_free(o->state[0]);   /* bf16: an open bracket's fp32 copy */
    dt_free(o->state[1]);
    dt_free(o->state16[0]);
    dt_free(o->state16[1]);
    memset(o, 0, sizeof *o);
}

size_t dt_optimizer_state_nbytes(const dt_optimizer *o) {
    return o->state_len * dt_optim_state_bytes(&o->cfg);
}

dt_status dt_optimizer_state_open(dt_optimizer *o) {
    if (!is_bf16(o)) return DT_OK;
    if (o->state_open++ > 0) return DT_OK;
    for (int k = 0; k < 2; k++) {
        if (!o->state16[k]) continue;
        o->state[k] = dt_calloc((o->state_len ? o->state_len : 1) * sizeof(float));
        if (!o->state[k]) {
            dt_optimizer_state_close(o, 0);
            return DT_ERR(DT_ENOMEM, "optimizer: out of memory widening %zu bf16 state values to fp32", o->state_len);
        }
        dt_bf16s_widen_n(o->state[k], o->state16[k], o->state_len);
    }
    return DT_OK;
}

void dt_optimizer_state_close(dt_optimizer *o, int store) {
    if (!is_bf16(o) || o->state_open <= 0) return;
    for (int k = 0; k < 2 && store; k++)
        if (o->state[k] && o->state16[k]) dt_bf16s_round_n(o->state16[k], o->state[k], o->state_len);
    if (--o->state_open > 0) return;
    for (int k = 0; k < 2; k++) {
        dt_free(o->state[k]);
        o->state[k] = NULL;
    }
}

/* param/grad element i sits at flat offset origin + i (grad: minus the
 * segment's grad_gap). Segment i's own step
 * number is t = o->step + 1 - skipped[i] (PyTorch's per-parameter step). */
static void step_impl(dt_optimizer *o, float lr, float *param, const float *grad, size_t origin,
                      size_t begin, size_t end, float grad_scale) {
    for (int i = 0; i < o->n_segs; i++) {
        const dt_optim_segment *s = &o->segs[i];
        if (s->offset >= end) break;  /* sorted by offset */
        size_t lo = s->offset > begin ? s->offset : begin;
        size_t hi = s->offset + s->numel < end ? s->offset + s->numel : end;
        if (lo >= hi || (s->active && !*s->active)) continue;
        int64_t t = o->step + 1 - o->skipped[i];
        size_t first = s->offset > o->state_begin ? s->offset : o->state_begin;
        size_t at = o->seg_state[i] + (lo - first), n = hi - lo, pi = lo - origin, gi = pi - s->grad_gap;
        /* the segment's group: its settings over the optimizer's (lr untouched when unset: bitwise) */
        const dt_optim_cfg *c = &o->cfg;
        dt_optim_cfg gc;
        float slr = lr;
        int decay = s->decay;
        if (s->hp) {
            gc = o->cfg;
            if (!isnan(s->hp->lr_scale)) slr = lr * s->hp->lr_scale;
            if (!isnan(s->hp->weight_decay)) { gc.weight_decay = s->hp->weight_decay; decay = 1; }
            if (!isnan(s->hp->beta1)) gc.beta1 = s->hp->beta1;
            if (!isnan(s->hp->beta2)) gc.beta2 = s->hp->beta2;
            c = &gc;
        }
        if (is_bf16(o) && c->kind == DT_OPTIM_ADAMW)
            dt_adamw_step_range_bf16(c, slr, decay, param + pi, grad + gi, o->state16[0] + at, o->state16[1] + at, n,
                                     t, grad_scale);
        else if (is_bf16(o))
            dt_sgd_step_range_bf16(c, slr, decay, param + pi, grad + gi, o->state16[0] ? o->state16[0] + at : NULL, n,
                                   t, grad_scale);
        else if (c->kind == DT_OPTIM_ADAMW)
            dt_adamw_step_range(c, slr, decay, param + pi, grad + gi, o->state[0] + at,
                                o->state[1] + at, n, t, grad_scale);
        else
            dt_sgd_step_range(c, slr, decay, param + pi, grad + gi,
                              o->state[0] ? o->state[0] + at : NULL, n, t, grad_scale);
    }
}

dt_status dt_optimizer_step_range(dt_optimizer *o, float lr, float *param, const float *grad,
                                  size_t begin, size_t end, float grad_scale) {
    if (begin > end || begin < o->state_begin || end > o->state_end)
        return DT_ERR(DT_EINVAL, "optimizer: step range [%zu, %zu) not inside owned [%zu, %zu)",
                      begin, end, o->state_begin, o->state_end);
    step_impl(o, lr, param, grad, 0, begin, end, grad_scale);
    return DT_OK;
}

void dt_optimizer_step_owned(dt_optimizer *o, float lr, float *param, const float *grad, float grad_scale) {
    step_impl(o, lr, param, grad, o->state_begin, o->state_begin, o->state_end, grad_scale);
}

void dt_optimizer_finish_step(dt_optimizer *o) {
    o->step++;
    for (int i = 0; i < o->n_segs; i++)
        if (o->segs[i].active && !*o->segs[i].active) o->skipped[i]++;
}

int64_t dt_optimizer_segment_steps(const dt_optimizer *o, int k) {
    return k >= 0 && k < o->n_segs ? o->step - o->skipped[k] : 0;
}

int dt_optimizer_find_segment(const dt_optimizer *o, size_t offset) {
    int lo = 0, hi = o->n_segs - 1;   /* segs sorted by offset */
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        if (o->segs[mid].offset == offset) return mid;
        if (o->segs[mid].offset < offset) lo = mid + 1;
        else hi = mid - 1;
    }
    return -1;
}

dt_status dt_optimizer_set_segment_steps(dt_optimizer *o, int k, int64_t steps) {
    if (k < 0 || k >= o->n_segs) return DT_ERR(DT_EINVAL, "optimizer: no segment %d (%d segments)", k, o->n_segs);
    if (steps < 0 || steps > o->step)
        return DT_ERR(DT_EINVAL, "optimizer: segment at offset %zu: %lld own steps is outside 0..%lld (the optimizer's)",
                      o->segs[k].offset, (long long)steps, (long long)o->step);
    o->skipped[k] = o->step - steps;
    return DT_OK;
}
