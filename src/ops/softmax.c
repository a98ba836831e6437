/* Softmax over the last dim: x[N, C] -> y[N, C], rows sum to 1.
 * backward: dx += y (dy - sum_c dy y); uses the output y, nothing else saved. */
#include "ops_internal.h"

static void softmax_backward(dt_graph *g, dt_node *n) {
    float *dx = dt_grad_of(g, n->in[0]);
    if (!dx) return;
    const float *y = dt_f32(n->out), *dy = dt_f32(n->out->grad);
    int64_t C = n->i[0], N = n->i[1];
#pragma omp parallel for schedule(static) if (N * C >= DT_OPS_PAR_MIN)
    for (int64_t r = 0; r < N; r++) {
        const float *yr = y + r * C, *dyr = dy + r * C;
        float *dxr = dx + r * C;
        float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
        for (int64_t c = 0; c < C; c++) dot += dyr[c] * yr[c];
#pragma omp simd
        for (int64_t c = 0; c < C; c++) dxr[c] += yr[c] * (dyr[c] - dot);
    }
}

dt_tensor *dt_op_softmax(dt_graph *g, dt_tensor *x) {
    static const char *op = "softmax";
    if (dt_ops_check_graph(op, g) || dt_ops_check_tensor(op, "x", x)) return NULL;
    if (x->ndim < 1) {
        DT_ERR(DT_EINVAL, "softmax: x must have at least 1 dim, got %s", DT_OPS_SHAPE(x));
        return NULL;
    }
    int64_t C = x->shape[x->ndim - 1], N = dt_shape_numel(x->ndim - 1, x->shape);
    dt_tensor *y = dt_graph_tensor(g, x->ndim, x->shape);
    if (!y) return NULL;
    const float *xd = dt_f32(x);
    float *yd = dt_f32(y);
    if (C > 0) {
#pragma omp parallel for schedule(static) if (x->numel >= DT_OPS_PAR_MIN)
        for (int64_t r = 0; r < N; r++) dt_ops_softmax_row(yd + r * C, xd + r * C, C);
    }
    dt_node *n = dt_graph_record(g, op, softmax_backward, y, 1, &x);
    if (n) {
        n->i[0] = C;
        n->i[1] = N;
    }
    return y;
}
