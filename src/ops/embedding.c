/* Embedding lookup: y[i, :] = w[ids[i], :], w[V, C], i < n; y has the
 * caller's shape (numel n * C).
 * backward: for each distinct id, the rows dy[i] of the positions holding it
 * are summed first, in position order (s = dy[i0]; s += dy[i1]; ...), then
 * added once: dw[id, :] += s. So computing the gradient into a zeroed buffer
 * E and adding E to G later gives G + (0 + s) = G + s bitwise, as backward
 * straight into G does (a tied embedding whose two uses sit on different
 * pipeline stages), and the order is PyTorch's (index_add into zeros, then
 * accumulate). Positions are grouped by id with a stable counting sort (a
 * V-sized map, otherwise O(n + touched rows)); threads split the C columns
 * into blocks, so no two write the same element and the order is fixed. */
#include <stdlib.h>
#include "ops_internal.h"

#define EMB_COL_BLOCK 64

/* The positions of ids[0..n) grouped by id: group k holds id uid[k] (groups in
 * first-occurrence order) at positions pos[off[k] .. off[k+1]), ascending. */
typedef struct emb_groups { int64_t n_ids, *uid, *off, *pos; } emb_groups;

/* buf: 3n + 1 int64s; map: V zeroed int64s (left dirty). Negative ids
 * (embedding_rows: another rank's row) belong to no group. */
static void group_ids(const int32_t *ids, int64_t n, int64_t *map, int64_t *buf, emb_groups *gr) {
    int64_t *uid = buf, *off = buf + n, *pos = off + n + 1, nt = 0, used = 0;
    for (int64_t i = 0; i < n; i++) {   /* map[id] = group + 1; off[k] = group size */
        if (ids[i] < 0) continue;
        used++;
        int64_t *m = &map[ids[i]];
        if (!*m) {
            uid[nt] = ids[i];
            off[nt] = 0;
            *m = ++nt;
        }
        off[*m - 1]++;
    }
    for (int64_t k = 0, start = 0; k < nt; k++) {   /* off[k] = group start; map[id] = its cursor */
        int64_t size = off[k];
        off[k] = map[uid[k]] = start;
        start += size;
    }
    off[nt] = used;
    for (int64_t i = 0; i < n; i++)
        if (ids[i] >= 0) pos[map[ids[i]]++] = i;
    *gr = (emb_groups){nt, uid, off, pos};
}

static void embedding_backward(dt_graph *g, dt_node *n) {
    dt_tensor *w = n->in[0];
    float *dw = dt_grad_of(g, w);
    if (!dw) return;
    const int32_t *ids = n->saved;
    int64_t cnt = n->i[0], V = w->shape[0], C = w->shape[1];
    if (cnt == 0 || C == 0) return;
    int64_t *map = calloc((size_t)V, sizeof *map), *buf = malloc((size_t)(3 * cnt + 1) * sizeof *buf);
    if (!map || !buf) {
        free(map);
        free(buf);
        DT_ERR(DT_ENOMEM, "embedding backward: out of memory grouping %lld ids over the %lld rows of w %s",
               (long long)cnt, (long long)V, DT_OPS_SHAPE(w));
        return;
    }
    emb_groups gr;
    group_ids(ids, cnt, map, buf, &gr);
    free(map);
    const float *dy = dt_f32(n->out->grad);
    int64_t nblk = (C + EMB_COL_BLOCK - 1) / EMB_COL_BLOCK;
#pragma omp parallel for schedule(static) if (cnt * C >= DT_OPS_PAR_MIN && nblk > 1)
    for (int64_t blk = 0; blk < nblk; blk++) {
        int64_t c0 = blk * EMB_COL_BLOCK, nc = C - c0 < EMB_COL_BLOCK ? C - c0 : EMB_COL_BLOCK;
        float s[EMB_COL_BLOCK];
        for (int64_t k = 0; k < gr.n_ids; k++) {
            const int64_t *p = gr.pos + gr.off[k], np = gr.off[k + 1] - gr.off[k];
            const float *src = dy + p[0] * C + c0;
            for (int64_t c = 0; c < nc; c++) s[c] = src[c];
            for (int64_t j = 1; j < np; j++) {
                src = dy + p[j] * C + c0;
                for (int64_t c = 0; c < nc; c++) s[c] += src[c];
            }
            float *dst = dw + gr.uid[k] * C + c0;
            for (int64_t c = 0; c < nc; c++) dst[c] += s[c];
        }
    }
    free(buf);
}

/* The checks both forms share: w [rows, C], ids, the output's shape. */
static int check_args(const char *op, dt_graph *g, dt_tensor *w, const int32_t *ids, int64_t n, int ndim,
                      const int64_t *shape) {
    if (dt_ops_check_graph(op, g) || dt_ops_check_tensor(op, "w", w)) return -1;
    if (w->ndim != 2) {
        DT_ERR(DT_EINVAL, "%s: w must be [V, C], got %s", op, DT_OPS_SHAPE(w));
        return -1;
    }
    if (n < 0 || (n > 0 && !ids)) {
        DT_ERR(DT_EINVAL, "%s: bad ids (n=%lld, ids=%s)", op, (long long)n, ids ? "set" : "NULL");
        return -1;
    }
    if (ndim < 0 || ndim > DT_MAX_DIMS || (ndim > 0 && !shape)) {
        DT_ERR(DT_EINVAL, "%s: bad output rank %d", op, ndim);
        return -1;
    }
    int64_t C = w->shape[1];
    for (int d = 0; d < ndim; d++)
        if (shape[d] < 0) {
            DT_ERR(DT_EINVAL, "%s: negative output dim %lld", op, (long long)shape[d]);
            return -1;
        }
    if (dt_shape_numel(ndim, shape) != n * C) {
        DT_ERR(DT_EINVAL, "%s: output shape has %lld elements but n=%lld ids x C=%lld = %lld", op,
               (long long)dt_shape_numel(ndim, shape), (long long)n, (long long)C, (long long)(n * C));
        return -1;
    }
    return 0;
}

dt_tensor *dt_op_embedding(dt_graph *g, dt_tensor *w, const int32_t *ids, int64_t n, int ndim,
                           const int64_t *shape) {
    static const char *op = "embedding";
    if (check_args(op, g, w, ids, n, ndim, shape)) return NULL;
    int64_t V = w->shape[0], C = w->shape[1];
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

/* Rows [start, start + R) of a larger table (a vocabulary-parallel part):
 * ids are remapped to local rows, -1 for another rank's (a zero row here,
 * no gradient), and the local ids saved for embedding_backward. */
dt_tensor *dt_op_embedding_rows(dt_graph *g, dt_tensor *w, int64_t start, const int32_t *ids, int64_t n, int ndim,
                                const int64_t *shape) {
    static const char *op = "embedding_rows";
    if (check_args(op, g, w, ids, n, ndim, shape)) return NULL;
    int64_t R = w->shape[0], C = w->shape[1];
    if (start < 0) {
        DT_ERR(DT_EINVAL, "%s: negative start row %lld for w %s", op, (long long)start, DT_OPS_SHAPE(w));
        return NULL;
    }
    int32_t *loc = dt_graph_scratch(g, (size_t)n * sizeof *loc + 1);
    if (!loc) return NULL;
    for (int64_t i = 0; i < n; i++) {
        if (ids[i] < 0) {
            DT_ERR(DT_EINVAL, "%s: id %d at position %lld is negative", op, (int)ids[i], (long long)i);
            return NULL;
        }
        loc[i] = ids[i] >= start && ids[i] - start < R ? (int32_t)(ids[i] - start) : -1;
    }
    dt_tensor *y = dt_graph_tensor(g, ndim, shape);
    if (!y) return NULL;
    const float *wd = dt_f32(w);
    float *yd = dt_f32(y);
#pragma omp parallel for schedule(static) if (n * C >= DT_OPS_PAR_MIN)
    for (int64_t i = 0; i < n; i++) {
        if (loc[i] >= 0) memcpy(yd + i * C, wd + (int64_t)loc[i] * C, (size_t)C * sizeof(float));
        else memset(yd + i * C, 0, (size_t)C * sizeof(float));
    }
    dt_node *nd = dt_graph_record(g, op, embedding_backward, y, 1, &w);
    if (nd) {
        nd->saved = loc;   /* the tape's scratch: alive until backward */
        nd->i[0] = n;
    }
    return y;
}
