/* Linear layer: one SGEMM over all N = numel(x) / in rows.
 *
 *   DT_W_OUT_IN: y[N, out] = x[N, in] · w[out, in]^T (+ b)
 *   DT_W_IN_OUT: y[N, out] = x[N, in] · w[in, out]   (+ b)
 * backward (all accumulate, beta = 1):
 *   dx[N, in]  += dy · w^T (IN_OUT)  or  dy · w (OUT_IN)
 *   dw[out,in] += dy^T · x (OUT_IN)  or  dw[in, out] += x^T · dy (IN_OUT)
 *   db[out]    += column sums of dy
 * The checks and GEMMs are dt_linear_* (ops_internal.h), which linear_gelu.c
 * calls too. */
#include "ops_internal.h"

int dt_linear_check(const char *op, const dt_graph *g, const dt_tensor *x, const dt_tensor *w,
                    const dt_tensor *b, dt_wlayout layout, int64_t dims[3]) {
    if (dt_ops_check_graph(op, g) || dt_ops_check_tensor(op, "x", x) || dt_ops_check_tensor(op, "w", w))
        return -1;
    if (b && dt_ops_check_tensor(op, "b", b)) return -1;
    if (layout != DT_W_OUT_IN && layout != DT_W_IN_OUT) {
        DT_ERR(DT_EINVAL, "%s: unknown weight layout %d", op, (int)layout);
        return -1;
    }
    if (w->ndim != 2) {
        DT_ERR(DT_EINVAL, "%s: w must be 2-D, got %s", op, DT_OPS_SHAPE(w));
        return -1;
    }
    int64_t in = layout == DT_W_OUT_IN ? w->shape[1] : w->shape[0];
    int64_t out = layout == DT_W_OUT_IN ? w->shape[0] : w->shape[1];
    if (x->ndim < 1 || x->shape[x->ndim - 1] != in) {
        DT_ERR(DT_EINVAL, "%s: x has shape %s but w %s (%s) expects in=%lld", op, DT_OPS_SHAPE(x),
               DT_OPS_SHAPE(w), layout == DT_W_OUT_IN ? "[out, in]" : "[in, out]", (long long)in);
        return -1;
    }
    if (b && (b->ndim != 1 || b->shape[0] != out)) {
        DT_ERR(DT_EINVAL, "%s: b has shape %s, expected [%lld]", op, DT_OPS_SHAPE(b), (long long)out);
        return -1;
    }
    dims[0] = dt_shape_numel(x->ndim - 1, x->shape);   /* leading dims -> rows */
    dims[1] = in;
    dims[2] = out;
    return dt_ops_check_blas(op, 3, dims);
}

void dt_linear_gemm(float *y, const dt_tensor *x, const dt_tensor *w, const dt_tensor *b, dt_wlayout layout,
                    const int64_t dims[3]) {
    int64_t N = dims[0], in = dims[1], out = dims[2];
    float beta = 0.0f;
    if (b) {   /* y rows start as b; the GEMM adds on top (beta = 1) */
        const float *bd = dt_f32(b);
#pragma omp parallel for schedule(static) if (N * out >= DT_OPS_PAR_MIN)
        for (int64_t r = 0; r < N; r++) memcpy(y + r * out, bd, (size_t)out * sizeof(float));
        beta = 1.0f;
    }
    if (layout == DT_W_OUT_IN)
        dt_ops_sgemm(0, 1, N, out, in, 1.0f, dt_f32(x), in, dt_f32(w), in, beta, y, out);
    else
        dt_ops_sgemm(0, 0, N, out, in, 1.0f, dt_f32(x), in, dt_f32(w), out, beta, y, out);
}

void dt_linear_grad_gemm(const float *dy, const dt_tensor *x, const dt_tensor *w, dt_wlayout layout,
                         const int64_t dims[3], float *dx, float *dw) {
    int64_t N = dims[0], in = dims[1], out = dims[2];
    if (dx) {
        if (layout == DT_W_OUT_IN)   /* dy[N, out] · w[out, in] */
            dt_ops_sgemm(0, 0, N, in, out, 1.0f, dy, out, dt_f32(w), in, 1.0f, dx, in);
        else                         /* dy[N, out] · w[in, out]^T */
            dt_ops_sgemm(0, 1, N, in, out, 1.0f, dy, out, dt_f32(w), out, 1.0f, dx, in);
    }
    if (dw) {
        if (layout == DT_W_OUT_IN)   /* dy^T[out, N] · x[N, in] */
            dt_ops_sgemm(1, 0, out, in, N, 1.0f, dy, out, dt_f32(x), in, 1.0f, dw, in);
        else                         /* x^T[in, N] · dy[N, out] */
            dt_ops_sgemm(1, 0, in, out, N, 1.0f, dt_f32(x), in, dy, out, 1.0f, dw, out);
    }
}

static void linear_backward(dt_graph *g, dt_node *n) {
    dt_tensor *x = n->in[0], *w = n->in[1], *b = n->in[2];
    const int64_t dims[3] = {n->i[0], n->i[1], n->i[2]};
    const float *dy = dt_f32(n->out->grad);
    float *dx = dt_grad_of(g, x), *dw = dt_grad_of(g, w), *db = b ? dt_grad_of(g, b) : NULL;
    dt_linear_grad_gemm(dy, x, w, (dt_wlayout)n->i[3], dims, dx, dw);
    if (db) dt_ops_colsum_acc(db, dy, dims[0], dims[2]);
}

dt_tensor *dt_op_linear(dt_graph *g, dt_tensor *x, dt_tensor *w, dt_tensor *b, dt_wlayout layout) {
    static const char *op = "linear";
    int64_t dims[3];
    if (dt_linear_check(op, g, x, w, b, layout, dims)) return NULL;
    int64_t shape[DT_MAX_DIMS];
    memcpy(shape, x->shape, sizeof shape);
    shape[x->ndim - 1] = dims[2];
    dt_tensor *y = dt_graph_tensor(g, x->ndim, shape);
    if (!y) return NULL;
    dt_linear_gemm(dt_f32(y), x, w, b, layout, dims);

    dt_tensor *ins[3] = {x, w, b};
    dt_node *n = dt_graph_record(g, op, linear_backward, y, 3, ins);
    if (n) {
        n->i[0] = dims[0];
        n->i[1] = dims[1];
        n->i[2] = dims[2];
        n->i[3] = layout;
    }
    return y;
}
