/* Additions: residual add and bias add.
 *   add:      y = a + b (same shape);     da += dy, db += dy
 *   bias_add: y[N, C] = x[N, C] + b[C];   dx += dy, db[c] += sum_n dy[n, c] */
#include "ops_internal.h"

static void add_backward(dt_graph *g, dt_node *n) {
    const float *dy = dt_f32(n->out->grad);
    int64_t len = n->out->numel;
    float *da = dt_grad_of(g, n->in[0]);
    if (da) dt_ops_acc(da, dy, len);
    float *db = dt_grad_of(g, n->in[1]);   /* same buffer as da if a == b: adds twice */
    if (db) dt_ops_acc(db, dy, len);
}

dt_tensor *dt_op_add(dt_graph *g, dt_tensor *a, dt_tensor *b) {
    static const char *op = "add";
    if (dt_ops_check_graph(op, g) || dt_ops_check_tensor(op, "a", a) || dt_ops_check_tensor(op, "b", b))
        return NULL;
    if (!dt_tensor_same_shape(a, b)) {
        DT_ERR(DT_EINVAL, "add: a has shape %s but b has shape %s", DT_OPS_SHAPE(a), DT_OPS_SHAPE(b));
        return NULL;
    }
    dt_tensor *y = dt_graph_tensor(g, a->ndim, a->shape);
    if (!y) return NULL;
    const float *ad = dt_f32(a), *bd = dt_f32(b);
    float *yd = dt_f32(y);
    int64_t len = a->numel;
#pragma omp parallel for schedule(static) if (len >= DT_OPS_PAR_MIN)
    for (int64_t i = 0; i < len; i++) yd[i] = ad[i] + bd[i];
    dt_tensor *ins[2] = {a, b};
    dt_graph_record(g, op, add_backward, y, 2, ins);
    return y;
}

static void bias_add_backward(dt_graph *g, dt_node *n) {
    const float *dy = dt_f32(n->out->grad);
    int64_t C = n->in[1]->numel, rows = C ? n->out->numel / C : 0;
    float *dx = dt_grad_of(g, n->in[0]);
    if (dx) dt_ops_acc(dx, dy, n->out->numel);
    float *db = dt_grad_of(g, n->in[1]);
    if (db) dt_ops_colsum_acc(db, dy, rows, C);
}

dt_tensor *dt_op_bias_add(dt_graph *g, dt_tensor *x, dt_tensor *b) {
    static const char *op = "bias_add";
    if (dt_ops_check_graph(op, g) || dt_ops_check_tensor(op, "x", x) || dt_ops_check_tensor(op, "b", b))
        return NULL;
    if (x->ndim < 1 || b->ndim != 1 || b->shape[0] != x->shape[x->ndim - 1]) {
        DT_ERR(DT_EINVAL, "bias_add: x has shape %s but b has shape %s (want [last dim of x])",
               DT_OPS_SHAPE(x), DT_OPS_SHAPE(b));
        return NULL;
    }
    dt_tensor *y = dt_graph_tensor(g, x->ndim, x->shape);
    if (!y) return NULL;
    int64_t C = b->shape[0], rows = dt_shape_numel(x->ndim - 1, x->shape);
    const float *xd = dt_f32(x), *bd = dt_f32(b);
    float *yd = dt_f32(y);
#pragma omp parallel for schedule(static) if (x->numel >= DT_OPS_PAR_MIN)
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < C; c++) yd[r * C + c] = xd[r * C + c] + bd[c];
    dt_tensor *ins[2] = {x, b};
    dt_graph_record(g, op, bias_add_backward, y, 2, ins);
    return y;
}
