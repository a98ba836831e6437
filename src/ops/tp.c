/* Tensor-parallel boundaries (Megatron's f and g), over a dt_tp_comm that
 * the parallel layer fills (this layer sits below dist):
 *   tp_copy   f: y = x                      dx += allreduce_sum(dy)
 *   tp_reduce g: y = allreduce_sum(x)       dx += dy
 * f stands before a column-parallel linear (every rank feeds the same x to
 * its columns, so x's gradient is the sum of the ranks' contributions); g
 * after a row-parallel one (each rank holds a partial product). The
 * all-reduce is blocking and collective over the TP group: every rank of it
 * must run the same ops in the same order (they run the same model). */
#include <stdio.h>
#include "ops_internal.h"

int dt_ops_tp_check(const char *op, const dt_tp_comm *c, int need_max) {
    if (!c || c->size < 1 || c->rank < 0 || c->rank >= c->size || (c->size > 1 && !c->allreduce_sum) ||
        (c->size > 1 && need_max && !c->allreduce_max)) {
        DT_ERR(DT_EINVAL, "%s: no tensor-parallel group (comm %s, size %d, rank %d%s)", op, c ? "set" : "NULL",
               c ? c->size : 0, c ? c->rank : 0, c && need_max && !c->allreduce_max ? ", no allreduce_max" : "");
        return -1;
    }
    return 0;
}

/* buf := the group's sum (max) of buf, in place (size 1: nothing to do). */
static dt_status group_op(const dt_tp_comm *c, const char *op, float *buf, int64_t n, int max) {
    if (c->size == 1) return DT_OK;
    dt_status st = max ? c->allreduce_max(c->ctx, buf, n) : c->allreduce_sum(c->ctx, buf, n);
    if (st == DT_OK) return DT_OK;
    char prev[512];
    snprintf(prev, sizeof prev, "%s", dt_error_message());
    return DT_ERR(st, "%s: all-reduce (%s) of %lld floats over the tensor-parallel group (rank %d of %d) failed: %s", op,
                  max ? "max" : "sum", (long long)n, c->rank, c->size, prev[0] ? prev : dt_status_name(st));
}
dt_status dt_ops_tp_sum(const dt_tp_comm *c, const char *op, float *buf, int64_t n) { return group_op(c, op, buf, n, 0); }
dt_status dt_ops_tp_max(const dt_tp_comm *c, const char *op, float *buf, int64_t n) { return group_op(c, op, buf, n, 1); }

static void tp_copy_backward(dt_graph *g, dt_node *n) {
    float *dx = dt_grad_of(g, n->in[0]);
    if (!dx) return;   /* the same on every rank of the group: none reduces */
    /* the output's gradient is this node's alone: sum it in place */
    float *dy = dt_f32(n->out->grad);
    if (dt_ops_tp_sum(n->saved, "tp_copy", dy, n->out->numel) == DT_OK) dt_ops_acc(dx, dy, n->out->numel);
}

dt_tensor *dt_op_tp_copy(dt_graph *g, dt_tensor *x, const dt_tp_comm *c) {
    static const char *op = "tp_copy";
    if (dt_ops_check_graph(op, g) || dt_ops_check_tensor(op, "x", x) || dt_ops_tp_check(op, c, 0)) return NULL;
    dt_tensor *y = dt_graph_tensor(g, x->ndim, x->shape);
    if (!y) return NULL;
    memcpy(y->data, x->data, (size_t)x->numel * sizeof(float));
    dt_tensor *ins[1] = {x};
    dt_node *n = dt_graph_record(g, op, tp_copy_backward, y, 1, ins);
    if (n) n->saved = (void *)c;
    return y;
}

static void tp_reduce_backward(dt_graph *g, dt_node *n) {
    float *dx = dt_grad_of(g, n->in[0]);
    if (dx) dt_ops_acc(dx, dt_f32(n->out->grad), n->out->numel);
}

dt_tensor *dt_op_tp_reduce(dt_graph *g, dt_tensor *x, const dt_tp_comm *c) {
    static const char *op = "tp_reduce";
    if (dt_ops_check_graph(op, g) || dt_ops_check_tensor(op, "x", x) || dt_ops_tp_check(op, c, 0)) return NULL;
    dt_tensor *y = dt_graph_tensor(g, x->ndim, x->shape);
    if (!y) return NULL;
    memcpy(y->data, x->data, (size_t)x->numel * sizeof(float));
    if (dt_ops_tp_sum(c, op, dt_f32(y), y->numel) != DT_OK) return NULL;
    dt_tensor *ins[1] = {x};
    dt_graph_record(g, op, tp_reduce_backward, y, 1, ins);
    return y;
}
