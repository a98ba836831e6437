/* Embedding lookup: y[i, :] = w[ids[i], :], w[V, C], i < n; y has the
 * caller's shape (numel n * C).
 * backward: dw[ids[i], :] += dy[i, :]. Rows may repeat, so threads split the
 * C columns (not the rows): no races, deterministic order. */
#include "ops_internal.h"

#define EMB_COL_BLOCK 64

static void embedding_backward(dt_graph *g, dt_node *n) {
    dt_tensor *w = n->in[0];
    float *dw = dt_grad_of(g, w);
    if (!dw) return;
    const int32_t *ids = n->saved;
    int64_t cnt = n->i[0], C = w->shape[1];
    const float *dy = dt_f32(n->out->grad);
    int64_t nblk = (C + EMB_COL_BLOCK - 1) / EMB_COL_BLOCK;
#pragma omp parallel for schedule(static) if (cnt * C >= DT_OPS_PAR_MIN && nblk > 1)
    for (int64_t blk = 0; blk < nblk; blk++) {
        int64_t c0 = blk * EMB_COL_BLOCK, c1 = c0 + EMB_COL_BLOCK < C ? c0 + EMB_COL_BLOCK : C;
        for (int64_t i = 0; i < cnt; i++) {
            float *dst = dw + (int64_t)ids[i] * C;
            const float *src = dy + i * C;
            for (int64_t c = c0; c < c1; c++) dst[c] += src[c];
        }
    }
}

dt_tensor *dt_op_embedding(dt_graph *g, dt_tensor *w, const int32_t *ids, int64_t n, int ndim,
                           const int64_t *shape) {
    static const char *op = "embedding";
    if (dt_ops_check_graph(op, g) || dt_ops_check_tensor(op, "w", w)) return NULL;
    if (w->ndim != 2) {
        DT_ERR(DT_EINVAL, "embedding: w must be [V, C], got %s", DT_OPS_SHAPE(w));
        return NULL;
    }
    if (n < 0 || (n > 0 && !ids)) {
        DT_ERR(DT_EINVAL, "embedding: bad ids (n=%lld, ids=%s)", (long long)n, ids ? "set" : "NULL");
        return NULL;
    }
    if (ndim < 0 || ndim > DT_MAX_DIMS || (ndim > 0 && !shape)) {
        DT_ERR(DT_EINVAL, "embedding: bad output rank %d", ndim);
        return NULL;
    }
    int64_t V = w->shape[0], C = w->shape[1];
    for (int d = 0; d < ndim; d++)
        if (shape[d] < 0) {
            DT_ERR(DT_EINVAL, "embedding: negative output dim %lld", (long long)shape[d]);
            return NULL;
        }
    if (dt_shape_numel(ndim, shape) != n * C) {
        DT_ERR(DT_EINVAL, "embedding: output shape has %lld elements but n=%lld ids x C=%lld = %lld",
               (long long)dt_shape_numel(ndim, shape), (long long)n, (long long)C, (long long)(n * C));
        return NULL;
    }
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= V) {
            DT_ERR(DT_EINVAL, "embedding: id %d at position %lld out of range [0, %lld) for w %s",
                   (int)ids[i], (long long)i, (long long)V, DT_OPS_SHAPE(w));
            return NULL;
        }
    dt_tensor *y = dt_graph_tensor(g, ndim, shape);
    if (!y) return NULL;
    const float *wd = dt_f32(w);
    float *yd = dt_f32(y);
#pragma omp parallel for schedule(static) if (n * C >= DT_OPS_PAR_MIN)
    for (int64_t i = 0; i < n; i++) memcpy(yd + i * C, wd + (int64_t)ids[i] * C, (size_t)C * sizeof(float));
    dt_node *nd = dt_graph_record(g, op, embedding_backward, y, 1, &w);
    if (nd) {
        nd->saved = (void *)ids;   /* caller-owned, alive until backward */
        nd->i[0] = n;
    }
    return y;
}
