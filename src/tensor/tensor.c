/* Tensor shapes, owned/view storage, aligned allocation. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dtrain/tensor.h"

size_t dt_dtype_size(dt_dtype t) { return t == DT_F32 || t == DT_I32 ? 4 : 2; }

const char *dt_dtype_name(dt_dtype t) {
    switch (t) {
    case DT_F32: return "F32";
    case DT_BF16: return "BF16";
    case DT_F16: return "F16";
    case DT_I32: return "I32";
    }
    return "?";
}

int dt_dtype_parse(const char *s, dt_dtype *out) {
    if (!strcmp(s, "F32")) { *out = DT_F32; return 0; }
    if (!strcmp(s, "BF16")) { *out = DT_BF16; return 0; }
    if (!strcmp(s, "F16")) { *out = DT_F16; return 0; }
    return -1;
}

void *dt_alloc(size_t bytes) {
    size_t n = (bytes + 63) & ~(size_t)63;
    void *p = aligned_alloc(64, n ? n : 64);
    if (!p) DT_ERR(DT_ENOMEM, "out of memory allocating %zu bytes", bytes);
    return p;
}

void *dt_calloc(size_t bytes) {
    void *p = dt_alloc(bytes);
    if (p) memset(p, 0, bytes);
    return p;
}

void dt_free(void *p) { free(p); }

int64_t dt_shape_numel(int ndim, const int64_t *shape) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    return n;
}

dt_status dt_tensor_set_shape(dt_tensor *t, int ndim, const int64_t *shape) {
    if (ndim < 0 || ndim > DT_MAX_DIMS)
        return DT_ERR(DT_EINVAL, "tensor rank %d not supported (0..%d)", ndim, DT_MAX_DIMS);
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) return DT_ERR(DT_EINVAL, "negative dimension %lld (dimension %d)", (long long)shape[i], i);
        if (shape[i] && n > DT_TENSOR_MAX_NUMEL / shape[i])   /* the element count, and its bytes, must fit */
            return DT_ERR(DT_EINVAL, "tensor shape: %d dimensions up to %lld x %lld are more than %lld elements",
                          ndim, (long long)n, (long long)shape[i], (long long)DT_TENSOR_MAX_NUMEL);
        n *= shape[i];
    }
    t->ndim = ndim;
    for (int i = 0; i < DT_MAX_DIMS; i++) t->shape[i] = i < ndim ? shape[i] : 1;
    t->numel = dt_shape_numel(ndim, shape);
    return DT_OK;
}

dt_status dt_tensor_alloc(dt_tensor *t, dt_dtype dtype, int ndim, const int64_t *shape) {
    memset(t, 0, sizeof *t);
    DT_TRY(dt_tensor_set_shape(t, ndim, shape));
    t->dtype = dtype;
    t->data = dt_calloc((size_t)t->numel * dt_dtype_size(dtype));
    if (!t->data)
        return DT_ERR(DT_ENOMEM, "out of memory for a tensor of %lld elements (%.1f MiB)", (long long)t->numel,
                      (double)t->numel * (double)dt_dtype_size(dtype) / (1 << 20));
    t->owns_data = 1;
    return DT_OK;
}

void dt_tensor_view(dt_tensor *t, void *data, dt_dtype dtype, int ndim, const int64_t *shape) {
    memset(t, 0, sizeof *t);
    if (dt_tensor_set_shape(t, ndim, shape) != DT_OK) return;
    t->dtype = dtype;
    t->data = data;
}

void dt_tensor_free(dt_tensor *t) {
    if (t->owns_data) dt_free(t->data);
    memset(t, 0, sizeof *t);
}

int dt_tensor_same_shape(const dt_tensor *a, const dt_tensor *b) {
    if (a->ndim != b->ndim) return 0;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i]) return 0;
    return 1;
}

const char *dt_shape_str(const dt_tensor *t, char *buf, size_t n) {
    size_t k = 0;
    k += (size_t)snprintf(buf + k, n - k, "[");
    for (int i = 0; i < t->ndim && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    if (k < n) snprintf(buf + k, n - k, "]");
    return buf;
}

dt_status dt_flat_alloc(dt_flat *f, size_t numel) {
    f->data = dt_calloc(numel * sizeof(float));
    f->numel = f->data ? numel : 0;
    return f->data ? DT_OK : DT_ENOMEM;
}

void dt_flat_free(dt_flat *f) {
    if (!f->borrowed) dt_free(f->data);
    f->data = NULL;
    f->numel = 0;
    f->borrowed = 0;
}
