/* Tensor-parallel boundaries (Megatron's f and g), over a dt_tp_comm that
 * the parallel layer fills (this layer sits below dist):
 *   tp_copy   f: y = x                      dx += allreduce_sum(dy)
 *   tp_reduce g: y = allreduce_sum(x)       dx += dy
 * and their sequence-parallel forms (below: layout and collectives):
 *   tp_gather_seq:  y = allgather_seq(x)    dx += reduce_scatter_seq(dy)
 *   tp_scatter_seq: y = reduce_scatter_seq(x)   dx += allgather_seq(dy)
 * f stands before a column-parallel linear (every rank feeds the same x to
 * its columns, so x's gradient is the sum of the ranks' contributions); g
 * after a row-parallel one (each rank holds a partial product). The
 * all-reduce is blocking and collective over the TP group: every rank of it
 * must run the same ops in the same order (they run the same model). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

/* ---- sequence parallelism: the all-gather / reduce-scatter boundaries ----
 * The layout. Outside the split layers a rank holds x[B, S, ...], positions
 * [r S, r S + S) of each of the B samples (S = T / size), contiguous in its
 * own memory. The whole tensor [B, T, ...] is [B, size, S x rest]: rank r's
 * shard is its dim-1 slice, so every collective here moves that middle dim
 * with rows = B blocks of n = S x rest floats (the dt_tp_comm callbacks'
 * [rows, size, n] view). With B = 1 the shards are plain contiguous pieces
 * of the whole tensor; for B > 1 the group's implementation reorders
 * through a staging buffer of its own (MPI's collectives concatenate by
 * rank), so neither the ops nor the arena hold a second whole tensor. We
 * keep the batch-major [B, T, C] of every other op (attention, the loss,
 * checkpoints of activations in a pipeline) rather than Megatron's
 * sequence-major [T, B, C], which would make the shards contiguous without
 * a reorder but change every op's layout. */

typedef struct seq_dims { int64_t rows, n, T; } seq_dims;

/* x's rows (dim 0) and floats per row per shard; whole: x is [B, size S, ..]. */
static int seq_check(const char *op, const dt_tensor *x, const dt_tp_comm *c, int whole, seq_dims *d) {
    if (c && c->size > 1 && (!c->allgather || !c->reduce_scatter)) {
        DT_ERR(DT_EINVAL, "%s: the tensor-parallel group (size %d) has no all-gather / reduce-scatter (sequence "
               "parallelism needs both)", op, c->size);
        return -1;
    }
    char sx[64];
    if (x->ndim < 2 || x->shape[0] <= 0 || x->shape[1] <= 0) {
        DT_ERR(DT_EINVAL, "%s: x%s needs [B, T, ...] (>= 2 dims)", op, dt_shape_str(x, sx, sizeof sx));
        return -1;
    }
    if (whole && x->shape[1] % c->size) {
        DT_ERR(DT_EINVAL, "%s: x%s: the sequence length %lld is not divisible by the tensor-parallel size %d", op,
               dt_shape_str(x, sx, sizeof sx), (long long)x->shape[1], c->size);
        return -1;
    }
    d->rows = x->shape[0];
    d->n = x->numel / d->rows / (whole ? c->size : 1);
    d->T = whole ? x->shape[1] : x->shape[1] * c->size;
    return 0;
}

static dt_status seq_fail(const dt_tp_comm *c, const char *op, const char *what, int64_t n, dt_status st) {
    char prev[512];
    snprintf(prev, sizeof prev, "%s", dt_error_message());
    return DT_ERR(st, "%s: %s of %lld floats over the tensor-parallel group (rank %d of %d) failed: %s", op, what,
                  (long long)n, c->rank, c->size, prev[0] ? prev : dt_status_name(st));
}

/* out := the group's shards gathered ([rows, size, n]); size 1: a copy. */
static dt_status seq_gather(const dt_tp_comm *c, const char *op, const float *in, float *out, int64_t n, int64_t rows) {
    if (c->size == 1) { memcpy(out, in, (size_t)(n * rows) * sizeof(float)); return DT_OK; }
    dt_status st = c->allgather(c->ctx, in, out, n, rows);
    return st == DT_OK ? DT_OK : seq_fail(c, op, "all-gather", n * rows * c->size, st);
}

/* out := this rank's slice of the group's sum ([rows, n]); size 1: a copy. */
static dt_status seq_scatter(const dt_tp_comm *c, const char *op, const float *in, float *out, int64_t n, int64_t rows) {
    if (c->size == 1) { memcpy(out, in, (size_t)(n * rows) * sizeof(float)); return DT_OK; }
    dt_status st = c->reduce_scatter(c->ctx, in, out, n, rows);
    return st == DT_OK ? DT_OK : seq_fail(c, op, "reduce-scatter", n * rows * c->size, st);
}

/* Backward of either op: dx += the other collective of dy, through a
 * temporary of x's size (outside the arena: freed before the next node). */
static void seq_backward(dt_graph *g, dt_node *n, int gather) {
    float *dx = dt_grad_of(g, n->in[0]);
    if (!dx) return;
    const dt_tp_comm *c = n->saved;
    const dt_tensor *x = n->in[0];
    int64_t rows = x->shape[0], per = x->numel / rows / (gather ? 1 : c->size);
    float *tmp = malloc((size_t)x->numel * sizeof *tmp + 1);
    if (!tmp) { DT_ERR(DT_ENOMEM, "%s backward: out of memory for %lld floats", n->op, (long long)x->numel); return; }
    const float *dy = dt_f32(n->out->grad);
    dt_status st = gather ? seq_scatter(c, n->op, dy, tmp, per, rows) : seq_gather(c, n->op, dy, tmp, per, rows);
    if (st == DT_OK) dt_ops_acc(dx, tmp, x->numel);
    free(tmp);
}
static void gather_seq_backward(dt_graph *g, dt_node *n) { seq_backward(g, n, 1); }
static void scatter_seq_backward(dt_graph *g, dt_node *n) { seq_backward(g, n, 0); }

/* gather: x [B, S, ..] -> y [B, size S, ..]; else x [B, T, ..] -> y [B, T / size, ..]. */
static dt_tensor *seq_op(dt_graph *g, dt_tensor *x, const dt_tp_comm *c, int gather) {
    const char *op = gather ? "tp_gather_seq" : "tp_scatter_seq";
    seq_dims d;
    if (dt_ops_check_graph(op, g) || dt_ops_check_tensor(op, "x", x) || dt_ops_tp_check(op, c, 0) ||
        seq_check(op, x, c, !gather, &d))
        return NULL;
    int64_t shape[DT_MAX_DIMS];
    for (int i = 0; i < x->ndim; i++) shape[i] = x->shape[i];
    shape[1] = gather ? d.T : d.T / c->size;
    dt_tensor *y = dt_graph_tensor(g, x->ndim, shape);
    if (!y) return NULL;
    dt_status st = gather ? seq_gather(c, op, dt_f32(x), dt_f32(y), d.n, d.rows)
                          : seq_scatter(c, op, dt_f32(x), dt_f32(y), d.n, d.rows);
    if (st != DT_OK) return NULL;
    dt_tensor *ins[1] = {x};
    dt_node *n = dt_graph_record(g, op, gather ? gather_seq_backward : scatter_seq_backward, y, 1, ins);
    if (n) n->saved = (void *)c;
    return y;
}

dt_tensor *dt_op_tp_gather_seq(dt_graph *g, dt_tensor *x, const dt_tp_comm *c) { return seq_op(g, x, c, 1); }
dt_tensor *dt_op_tp_scatter_seq(dt_graph *g, dt_tensor *x, const dt_tp_comm *c) { return seq_op(g, x, c, 0); }
