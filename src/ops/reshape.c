/* Shape changes without copies: the output shares x's storage.
 *   reshape: any shape with the same numel (one dim may be -1: inferred)
 *   flatten: [N, d1, ...] -> [N, d1 * ...]
 * backward: dx += dy, or (the usual case: dx not yet allocated) dx simply
 * becomes dy's buffer (dt_grad_alias), so a view costs no gradient memory. */
#include "ops_internal.h"

static void reshape_backward(dt_graph *g, dt_node *n) {
    if (dt_grad_alias(g, n->in[0], n->out)) return;   /* dx = dy: share the buffer */
    float *dx = dt_grad_of(g, n->in[0]);
    if (dx) dt_ops_acc(dx, dt_f32(n->out->grad), n->out->numel);
}

static dt_tensor *reshape_to(dt_graph *g, dt_tensor *x, int ndim, const int64_t *shape, const char *op) {
    dt_tensor *y = dt_ops_view(g, x, ndim, shape);
    if (!y) return NULL;
    dt_graph_record(g, op, reshape_backward, y, 1, &x);
    return y;
}

dt_tensor *dt_op_reshape(dt_graph *g, dt_tensor *x, int ndim, const int64_t *shape) {
    static const char *op = "reshape";
    if (dt_ops_check_graph(op, g) || dt_ops_check_tensor(op, "x", x)) return NULL;
    if (ndim < 0 || ndim > DT_MAX_DIMS || (ndim > 0 && !shape)) {
        DT_ERR(DT_EINVAL, "reshape: bad target rank %d for x %s", ndim, DT_OPS_SHAPE(x));
        return NULL;
    }
    int64_t s[DT_MAX_DIMS], known = 1;
    int infer = -1;
    for (int d = 0; d < ndim; d++) {
        s[d] = shape[d];
        if (s[d] == -1 && infer < 0) {
            infer = d;
        } else if (s[d] < 0) {
            DT_ERR(DT_EINVAL, "reshape: bad target dim %lld at %d for x %s", (long long)s[d], d,
                   DT_OPS_SHAPE(x));
            return NULL;
        } else {
            known *= s[d];
        }
    }
    if (infer >= 0) {
        if (known == 0 || x->numel % known != 0) {
            DT_ERR(DT_EINVAL, "reshape: cannot infer dim %d: x %s has %lld elements, others multiply to %lld",
                   infer, DT_OPS_SHAPE(x), (long long)x->numel, (long long)known);
            return NULL;
        }
        s[infer] = x->numel / known;
        known *= s[infer];
    }
    if (known != x->numel) {
        DT_ERR(DT_EINVAL, "reshape: x %s has %lld elements but the target shape has %lld", DT_OPS_SHAPE(x),
               (long long)x->numel, (long long)known);
        return NULL;
    }
    return reshape_to(g, x, ndim, s, op);
}

dt_tensor *dt_op_flatten(dt_graph *g, dt_tensor *x) {
    static const char *op = "flatten";
    if (dt_ops_check_graph(op, g) || dt_ops_check_tensor(op, "x", x)) return NULL;
    if (x->ndim < 1) {
        DT_ERR(DT_EINVAL, "flatten: x must have a leading dim, got %s", DT_OPS_SHAPE(x));
        return NULL;
    }
    int64_t s[2] = {x->shape[0], dt_shape_numel(x->ndim - 1, x->shape + 1)};
    return reshape_to(g, x, 2, s, op);
}
