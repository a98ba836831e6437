/* Samples and batches: named input tensors a dataset fills, and whether a
 * model takes them. */
#include <stdio.h>
#include <string.h>
#include "model_internal.h"

int64_t dt_input_numel(const dt_input_spec *s) {
    int64_t n = 1;
    for (int i = 0; i < s->ndim; i++) n *= s->dims[i];
    return n;
}

size_t dt_input_bytes(const dt_input_spec *s) { return (size_t)dt_input_numel(s) * dt_dtype_size(s->dtype); }

const dt_input_spec *dt_sample_input(const dt_sample_shape *s, const char *name, dt_dtype dtype) {
    for (int k = 0; k < s->n_inputs; k++)
        if (!strcmp(s->in[k].name, name) && s->in[k].dtype == dtype) return &s->in[k];
    return NULL;
}

static const char *type_name(dt_dtype t) { return t == DT_I32 ? "int32" : "float"; }

/* "float [1, 28, 28]"; model-side dims: 0 -> "*", -n -> "<=n" */
static int spec_str(const dt_input_spec *s, char *buf, size_t n) {
    int k = snprintf(buf, n, "%s [", type_name(s->dtype));
    for (int i = 0; i < s->ndim && k >= 0 && (size_t)k < n; i++) {
        int64_t d = s->dims[i];
        const char *sep = i ? ", " : "";
        k += d > 0 ? snprintf(buf + k, n - (size_t)k, "%s%lld", sep, (long long)d)
           : d == 0 ? snprintf(buf + k, n - (size_t)k, "%s*", sep)
                    : snprintf(buf + k, n - (size_t)k, "%s<=%lld", sep, (long long)-d);
    }
    if (k >= 0 && (size_t)k < n) k += snprintf(buf + k, n - (size_t)k, "]");
    return k;
}

const char *dt_sample_shape_str(const dt_sample_shape *s, char *buf, size_t n) {
    if (n) buf[0] = 0;
    int k = 0, ints = 0;
    for (int i = 0; i < s->n_inputs && k >= 0 && (size_t)k < n; i++) {
        if (s->n_inputs > 1) k += snprintf(buf + k, n - (size_t)k, "%s'%s' ", i ? ", " : "", s->in[i].name);
        if (k >= 0 && (size_t)k < n) k += spec_str(&s->in[i], buf + k, n - (size_t)k);
        ints |= s->in[i].dtype == DT_I32;
    }
    if (k >= 0 && (size_t)k < n)
        snprintf(buf + k, n - (size_t)k, ints ? " (vocab %lld)" : " (%lld classes)", (long long)s->classes);
    return buf;
}

dt_batch dt_batch_of(const dt_sample_shape *s, int64_t B, void *const *x, const int32_t *y) {
    dt_batch b = {.B = B, .T = s->targets, .y = y, .n_inputs = s->n_inputs};
    for (int k = 0; k < s->n_inputs; k++) {
        int64_t shape[DT_MAX_DIMS] = {B};
        for (int i = 0; i < s->in[k].ndim; i++) shape[i + 1] = s->in[k].dims[i];
        b.names[k] = s->in[k].name;
        dt_tensor_view(&b.in[k], x[k], s->in[k].dtype, s->in[k].ndim + 1, shape);
    }
    return b;
}

dt_status dt_batch_add_input(dt_batch *b, const char *name, dt_dtype dtype, int ndim, const int64_t *shape,
                             const void *data) {
    if (b->n_inputs == DT_MAX_INPUTS)
        return DT_ERR(DT_EINVAL, "batch input '%s': a batch holds at most %d inputs", name, DT_MAX_INPUTS);
    if (ndim < 1 || ndim > DT_MAX_DIMS || shape[0] != b->B || (dtype != DT_F32 && dtype != DT_I32))
        return DT_ERR(DT_EINVAL, "batch input '%s' must be F32 or I32 [B = %lld, ...] with 1..%d dims", name,
                      (long long)b->B, DT_MAX_DIMS);
    b->names[b->n_inputs] = name;
    dt_tensor_view(&b->in[b->n_inputs++], (void *)data, dtype, ndim, shape);
    return DT_OK;
}

const dt_tensor *dt_batch_input(const dt_batch *b, const char *name, dt_dtype dtype, const char *who) {
    for (int k = 0; k < b->n_inputs; k++) {
        if (strcmp(b->names[k], name)) continue;
        if (!b->in[k].data) { DT_ERR(DT_EINVAL, "%s: batch input '%s' has no data", who, name); return NULL; }
        if (b->in[k].dtype != dtype) {
            DT_ERR(DT_EINVAL, "%s: batch input '%s' is %s, expected %s", who, name, type_name(b->in[k].dtype),
                   type_name(dtype));
            return NULL;
        }
        return &b->in[k];
    }
    char have[128] = "";
    for (int k = 0, n = 0; k < b->n_inputs && n >= 0 && (size_t)n < sizeof have; k++)
        n += snprintf(have + n, sizeof have - (size_t)n, "%s'%s'", k ? ", " : "", b->names[k]);
    DT_ERR(DT_EINVAL, "%s: the batch has no input '%s' (it has %s)", who, name, b->n_inputs ? have : "none");
    return NULL;
}

static int dims_match(const dt_input_spec *want, const dt_input_spec *have) {
    if (want->dtype != have->dtype) return 0;
    if (want->flat) return dt_input_numel(want) == dt_input_numel(have);
    if (want->ndim != have->ndim) return 0;
    for (int i = 0; i < want->ndim; i++) {
        int64_t w = want->dims[i], h = have->dims[i];
        if (w > 0 ? h != w : w < 0 ? h > -w : 0) return 0;
    }
    return 1;
}

/* Rows the loss head sees per sample: the last block's output without its
 * class dim, DT_DIM_SEQ taken as `targets`. */
static int64_t rows_per_sample(const dt_model *m, int64_t targets) {
    const dt_block *b = &m->blocks[m->n_blocks - 1];
    int64_t r = 1;
    for (int i = 0; i + 1 < b->out_ndim; i++) r *= b->out_dims[i] == DT_DIM_SEQ ? targets : b->out_dims[i];
    return r;
}

dt_status dt_model_check_sample(const dt_model *m, const dt_sample_shape *s) {
    for (int k = 0; k < m->n_inputs; k++) {
        const dt_input_spec *w = &m->inputs[k], *h = NULL;
        for (int j = 0; j < s->n_inputs && !h; j++)
            if (!strcmp(s->in[j].name, w->name)) h = &s->in[j];
        char want[96];
        spec_str(w, want, sizeof want);
        if (!h || !dims_match(w, h))
            return DT_ERR(DT_EINVAL, "model %s takes '%s' %s%s%s", m->name, w->name, want,
                          w->flat ? " (any shape of that many elements)" : "", h ? "" : ", which the data lacks");
        if (w->dtype == DT_I32 && w->int_limit > 0 && s->classes > w->int_limit)
            return DT_ERR(DT_EINVAL, "model %s takes '%s' values below %lld, too few for the data's ids up to %lld",
                          m->name, w->name, (long long)w->int_limit, (long long)s->classes - 1);
    }
    if (m->forward) return DT_OK;   /* not a list of blocks: nothing more is declared */
    if (s->classes > m->classes)
        return DT_ERR(DT_EINVAL, "model %s has %lld outputs, fewer than the data's %lld classes", m->name,
                      (long long)m->classes, (long long)s->classes);
    if (rows_per_sample(m, s->targets) != s->targets)
        return DT_ERR(DT_EINVAL, "model %s predicts %lld targets per sample, the data has %lld", m->name,
                      (long long)rows_per_sample(m, s->targets), (long long)s->targets);
    return DT_OK;
}
