/* Pointwise activations.
 *   relu: y = max(x, 0);  dx += dy * [x > 0]
 *   gelu (GPT-2 tanh approximation):
 *     y = 0.5 x (1 + tanh(u)),  u = k (x + 0.044715 x^3),  k = sqrt(2/pi)
 *   computed through the identity 0.5 (1 + tanh(u)) = sigmoid(2u), so
 *     y = x s,  s = 1 / (1 + exp(-2u))
 *     dy/dx = s + x s (1 - s) * 2k (1 + 3 * 0.044715 x^2)
 *   which is free of the 1 - tanh cancellation and vectorises (dt_ops_expf);
 *   the formulas live in ops_internal.h (linear_gelu.c uses them too). */
#include "ops_internal.h"

static void relu_backward(dt_graph *g, dt_node *n) {
    float *dx = dt_grad_of(g, n->in[0]);
    if (!dx) return;
    const float *x = dt_f32(n->in[0]), *dy = dt_f32(n->out->grad);
    int64_t len = n->out->numel;
#pragma omp parallel for schedule(static) if (len >= DT_OPS_PAR_MIN)
    for (int64_t i = 0; i < len; i++) dx[i] += x[i] > 0.0f ? dy[i] : 0.0f;
}

dt_tensor *dt_op_relu(dt_graph *g, dt_tensor *x) {
    static const char *op = "relu";
    if (dt_ops_check_graph(op, g) || dt_ops_check_tensor(op, "x", x)) return NULL;
    dt_tensor *y = dt_graph_tensor(g, x->ndim, x->shape);
    if (!y) return NULL;
    const float *xd = dt_f32(x);
    float *yd = dt_f32(y);
    int64_t len = x->numel;
#pragma omp parallel for schedule(static) if (len >= DT_OPS_PAR_MIN)
    for (int64_t i = 0; i < len; i++) yd[i] = xd[i] > 0.0f ? xd[i] : 0.0f;
    dt_graph_record(g, op, relu_backward, y, 1, &x);
    return y;
}

static void gelu_backward(dt_graph *g, dt_node *n) {
    float *dx = dt_grad_of(g, n->in[0]);
    if (!dx) return;
    const float *x = dt_f32(n->in[0]), *dy = dt_f32(n->out->grad);
    int64_t len = n->out->numel;
#pragma omp parallel for schedule(static) if (len >= DT_OPS_PAR_MIN)
    for (int64_t i = 0; i < len; i++) dx[i] += dy[i] * dt_ops_gelu_slope(x[i]);
}

dt_tensor *dt_op_gelu(dt_graph *g, dt_tensor *x) {
    static const char *op = "gelu";
    if (dt_ops_check_graph(op, g) || dt_ops_check_tensor(op, "x", x)) return NULL;
    dt_tensor *y = dt_graph_tensor(g, x->ndim, x->shape);
    if (!y) return NULL;
    const float *xd = dt_f32(x);
    float *yd = dt_f32(y);
    int64_t len = x->numel;
#pragma omp parallel for schedule(static) if (len >= DT_OPS_PAR_MIN)
    for (int64_t i = 0; i < len; i++) yd[i] = xd[i] * dt_ops_gelu_gate(xd[i]);
    dt_graph_record(g, op, gelu_backward, y, 1, &x);
    return y;
}
