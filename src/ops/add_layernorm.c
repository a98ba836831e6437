/* Residual add fused with the LayerNorm after it (GPT-2's x + h -> ln_2):
 *   s = x + h,  y = LayerNorm(s) over the last dim C   (x, h, s, y: [N, C])
 * forward, one pass over memory: per row s = x + h is written, then the
 * row, still in L1, goes through layernorm.c's row kernel (mean, var,
 * normalise). Unfused, dt_op_layernorm reads s back from memory.
 * backward: s's gradient ds (from s's other consumers: the next residual
 * add) and LayerNorm's input gradient are summed row by row and added
 * straight to dx and dh (dt_ln_backward), so ds is read once and s's full
 * gradient is never written. Unfused, LayerNorm adds into ds and the add's
 * backward reads it twice.
 *
 * Bits: every float operation of dt_op_add + dt_op_layernorm, in the same
 * order: s = x + h in float; the LayerNorm kernels are the very functions
 * dt_op_layernorm runs; the input gradient term is added to ds (or to 0 when
 * no gradient reached s, as to a fresh zeroed buffer) before dx += and
 * dh += (dx first: x == h adds twice, as add does).
 *
 * Tape: two nodes, like the unfused pair. "add_layernorm.add" (s from x, h)
 * and "add_layernorm" (y from s, w, b; x and h listed too, as it writes
 * their gradients). The second runs first in backward and does the add's
 * part; the first then only acts when the second did not run (no gradient
 * reached y): then it is a plain add's backward. */
#include "ops_internal.h"

typedef struct aln_saved {
    float *mean, *rstd;
    int passed;   /* the LayerNorm node's backward ran: x and h have s's gradient */
} aln_saved;

static void aln_add_backward(dt_graph *g, dt_node *n) {
    const aln_saved *sv = n->saved;
    if (sv->passed) return;
    const float *ds = dt_f32(n->out->grad);
    int64_t len = n->out->numel;
    float *dx = dt_grad_of(g, n->in[0]);
    if (dx) dt_ops_acc(dx, ds, len);
    float *dh = dt_grad_of(g, n->in[1]);   /* same buffer as dx if x == h: adds twice */
    if (dh) dt_ops_acc(dh, ds, len);
}

static void aln_backward(dt_graph *g, dt_node *n) {
    dt_tensor *s = n->in[0], *w = n->in[1], *b = n->in[2], *x = n->in[3], *h = n->in[4];
    aln_saved *sv = n->saved;
    int64_t C = w->numel, N = C ? s->numel / C : 0;
    dt_ln_grads a = {.x = dt_f32(s), .w = dt_f32(w), .mean = sv->mean, .rstd = sv->rstd,
                     .dy = dt_f32(n->out->grad), .N = N, .C = C};
    a.dw = dt_grad_of(g, w);
    a.db = b ? dt_grad_of(g, b) : NULL;
    a.da = dt_grad_of(g, x);
    a.dh = dt_grad_of(g, h);
    /* read, not dt_grad_of: no buffer is made when nothing reached s */
    a.ds = s->grad ? dt_f32(s->grad) : NULL;
    sv->passed = 1;
    if (N == 0) return;
    dt_ln_backward(g, &a);
}

dt_tensor *dt_op_add_layernorm(dt_graph *g, dt_tensor *x, dt_tensor *h, dt_tensor *w, dt_tensor *b, float eps,
                               dt_tensor **sum) {
    static const char *op = "add_layernorm";
    if (sum) *sum = NULL;
    if (dt_ops_check_graph(op, g) || dt_ops_check_tensor(op, "x", x) || dt_ops_check_tensor(op, "h", h) ||
        dt_ops_check_tensor(op, "w", w))
        return NULL;
    if (b && dt_ops_check_tensor(op, "b", b)) return NULL;
    if (!sum) {
        DT_ERR(DT_EINVAL, "add_layernorm: sum is NULL (the op returns x + h through it)");
        return NULL;
    }
    if (!dt_tensor_same_shape(x, h)) {
        DT_ERR(DT_EINVAL, "add_layernorm: x has shape %s but h has shape %s", DT_OPS_SHAPE(x), DT_OPS_SHAPE(h));
        return NULL;
    }
    if (x->ndim < 1 || w->ndim != 1 || w->shape[0] != x->shape[x->ndim - 1]) {
        DT_ERR(DT_EINVAL, "add_layernorm: w has shape %s but x %s (want w = [last dim of x])", DT_OPS_SHAPE(w),
               DT_OPS_SHAPE(x));
        return NULL;
    }
    if (b && (b->ndim != 1 || b->shape[0] != w->shape[0])) {
        DT_ERR(DT_EINVAL, "add_layernorm: b has shape %s but w %s (want b = w's shape)", DT_OPS_SHAPE(b),
               DT_OPS_SHAPE(w));
        return NULL;
    }
    if (!(eps >= 0.0f)) {
        DT_ERR(DT_EINVAL, "add_layernorm: eps must be >= 0, got %g", (double)eps);
        return NULL;
    }
    int64_t C = w->shape[0], N = dt_shape_numel(x->ndim - 1, x->shape);
    if (C == 0) {
        DT_ERR(DT_EINVAL, "add_layernorm: x %s has an empty last dim", DT_OPS_SHAPE(x));
        return NULL;
    }
    dt_tensor *s = dt_graph_tensor(g, x->ndim, x->shape);
    dt_tensor *y = dt_graph_tensor(g, x->ndim, x->shape);
    aln_saved *sv = dt_graph_scratch(g, sizeof *sv);
    float *stats = dt_graph_scratch(g, 2 * (size_t)N * sizeof(float) + 1);
    if (!s || !y || !sv || !stats) return NULL;
    dt_graph_saved_keep_exact(g, dt_f32(s), s->numel);   /* the LayerNorm's input, against exact statistics */
    sv->mean = stats;
    sv->rstd = stats + N;
    sv->passed = 0;
    const float *xd = dt_f32(x), *hd = dt_f32(h), *wd = dt_f32(w), *bd = b ? dt_f32(b) : NULL;
    float *sd = dt_f32(s), *yd = dt_f32(y);
#pragma omp parallel for schedule(static) if (x->numel >= DT_OPS_PAR_MIN)
    for (int64_t r = 0; r < N; r++) {   /* [N, C]: s row, then its LayerNorm while in cache */
        const float *xr = xd + r * C, *hr = hd + r * C;
        float *sr = sd + r * C;
        for (int64_t c = 0; c < C; c++) sr[c] = xr[c] + hr[c];
        dt_ln_row_forward(sr, wd, bd, eps, C, yd + r * C, &sv->mean[r], &sv->rstd[r]);
    }
    dt_tensor *ins_add[2] = {x, h};
    dt_node *na = dt_graph_record(g, "add_layernorm.add", aln_add_backward, s, 2, ins_add);
    if (na) na->saved = sv;
    dt_tensor *ins[5] = {s, w, b, x, h};
    dt_node *n = dt_graph_record(g, op, aln_backward, y, 5, ins);
    if (n) n->saved = sv;
    *sum = s;
    return y;
}
