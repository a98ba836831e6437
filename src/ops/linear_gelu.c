/* Linear layer with GELU after it (GPT-2's c_fc -> gelu):
 *   p[N, out] = x[N, in] · W (+ b)   (dt_linear_gemm: dt_op_linear's GEMM)
 *   y[N, out] = gelu(p)              (one pass over p; p is kept for backward)
 * backward, from dy[N, out]:
 *   dp = dy * gelu'(p), and db += column sums of dp, in one pass
 *   dx += dp · W^T, dw += x^T · dp  (dt_linear_grad_gemm)
 * Unfused, gelu's backward zero-fills p's gradient and read-modify-writes
 * it, and linear's backward reads it again for db.
 *
 * Bits: the bias goes into the GEMM's output before the GEMM (beta = 1) as
 * dt_op_linear does (adding it after the GEMM would round differently);
 * GELU and its slope are the functions dt_op_gelu uses (ops_internal.h); dp
 * is 0 + dy * gelu'(p), the value gelu's backward leaves in a fresh zeroed
 * gradient (0 + -0 = +0); db sums each column of dp in row order from 0 and
 * then adds to db, as dt_ops_colsum_acc does.
 *
 * Split backward: when W or b is deferred, B computes dp and dx; dp stays in
 * the arena (like p's gradient unfused) and W reads it for dw and db. */
#include <omp.h>
#include "ops_internal.h"

typedef struct lg_saved {
    const float *pre;   /* p[N, out] */
    float *dpre;        /* dp, computed by the first backward run that needs it */
} lg_saved;

/* Column block of the fused pass: dt_ops_colsum_acc's. */
#define LG_BLOCK 64

/* dp[r, c] = 0 + dy * gelu'(p); db[c] += sum_r dp[r, c] (db NULL: no sums).
 * With db, threads own column blocks and walk the rows (each column summed in
 * row order by one thread: dt_ops_colsum_acc's order); with too few blocks to
 * share, the plain pass then dt_ops_colsum_acc. */
static void gelu_slope_pass(float *restrict dp, const float *restrict p, const float *restrict dy, int64_t rows,
                            int64_t cols, float *restrict db) {
    int64_t len = rows * cols, nblk = (cols + LG_BLOCK - 1) / LG_BLOCK;
    int par = len >= DT_OPS_PAR_MIN;
    if (!db || (par && nblk < omp_get_max_threads())) {
#pragma omp parallel for schedule(static) if (par)
        for (int64_t i = 0; i < len; i++) dp[i] = 0.0f + dy[i] * dt_ops_gelu_slope(p[i]);
        if (db) dt_ops_colsum_acc(db, dp, rows, cols);
        return;
    }
#pragma omp parallel for schedule(static) if (par && nblk > 1)
    for (int64_t blk = 0; blk < nblk; blk++) {
        int64_t c0 = blk * LG_BLOCK;
        int64_t w = cols - c0 < LG_BLOCK ? cols - c0 : LG_BLOCK;
        float acc[LG_BLOCK] = {0};
        for (int64_t r = 0; r < rows; r++) {
            const float *pr = p + r * cols + c0, *dyr = dy + r * cols + c0;
            float *dpr = dp + r * cols + c0;
            for (int64_t j = 0; j < w; j++) {
                float v = 0.0f + dyr[j] * dt_ops_gelu_slope(pr[j]);
                dpr[j] = v;
                acc[j] += v;
            }
        }
        for (int64_t j = 0; j < w; j++) db[c0 + j] += acc[j];
    }
}

static void linear_gelu_backward(dt_graph *g, dt_node *n) {
    dt_tensor *x = n->in[0], *w = n->in[1], *b = n->in[2];
    const int64_t dims[3] = {n->i[0], n->i[1], n->i[2]};
    lg_saved *sv = n->saved;
    float *dx = dt_grad_of(g, x), *dw = dt_grad_of(g, w), *db = b ? dt_grad_of(g, b) : NULL;
    if (!dx && !dw && !db) return;
    if (!sv->dpre) {   /* first run (B, or W when B needed nothing) */
        sv->dpre = dt_graph_scratch(g, (size_t)dims[0] * (size_t)dims[2] * sizeof(float));
        if (!sv->dpre) return;   /* ENOMEM recorded; backward aborts */
        gelu_slope_pass(sv->dpre, sv->pre, dt_f32(n->out->grad), dims[0], dims[2], db);
    } else if (db) {   /* W after B: dp is B's */
        dt_ops_colsum_acc(db, sv->dpre, dims[0], dims[2]);
    }
    dt_linear_grad_gemm(sv->dpre, x, w, (dt_wlayout)n->i[3], dims, dx, dw);
}

dt_tensor *dt_op_linear_gelu(dt_graph *g, dt_tensor *x, dt_tensor *w, dt_tensor *b, dt_wlayout layout) {
    static const char *op = "linear_gelu";
    int64_t dims[3];
    if (dt_linear_check(op, g, x, w, b, layout, dims)) return NULL;
    int64_t shape[DT_MAX_DIMS];
    memcpy(shape, x->shape, sizeof shape);
    shape[x->ndim - 1] = dims[2];
    dt_tensor *pre = dt_graph_tensor(g, x->ndim, shape), *y = dt_graph_tensor(g, x->ndim, shape);
    lg_saved *sv = dt_graph_scratch(g, sizeof *sv);
    if (!pre || !y || !sv) return NULL;
    float *pd = dt_f32(pre), *yd = dt_f32(y);
    dt_linear_gemm(pd, x, w, b, layout, dims);   /* [N, out] */
    int64_t len = y->numel;
#pragma omp parallel for schedule(static) if (len >= DT_OPS_PAR_MIN)
    for (int64_t i = 0; i < len; i++) yd[i] = pd[i] * dt_ops_gelu_gate(pd[i]);
    sv->pre = pd;
    sv->dpre = NULL;
    dt_tensor *ins[3] = {x, w, b};
    dt_node *n = dt_graph_record(g, op, linear_gelu_backward, y, 3, ins);
    if (n) {
        n->saved = sv;
        n->i[0] = dims[0];
        n->i[1] = dims[1];
        n->i[2] = dims[2];
        n->i[3] = layout;
    }
    return y;
}
