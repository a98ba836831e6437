/* LayerNorm over the last dim C of x[N, C] (N = all leading dims).
 *   mean_n = sum_c x / C, rstd_n = 1 / sqrt(var_n + eps) (biased var)
 *   xhat = (x - mean) rstd,  y = xhat w + b
 * backward with g = dy w:
 *   dx += rstd (g - mean_c(g) - xhat mean_c(g xhat))
 *   dw += sum_n dy xhat,  db += sum_n dy
 * Saved: mean[N], rstd[N]. dw/db use per-thread partial sums reduced in
 * thread order, so results are deterministic for a given thread count.
 * The row kernel and the backward are also add_layernorm.c's (one copy of
 * each loop: the fused op's bits are this op's). */
#include <omp.h>
#include "ops_internal.h"

typedef struct ln_saved { float *mean, *rstd; } ln_saved;

/* noinline: every caller runs this one compiled copy of the reductions. */
__attribute__((noinline)) void dt_ln_row_forward(const float *xr, const float *wd, const float *bd, float eps,
                                                 int64_t C, float *yr, float *mean, float *rstd) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t c = 0; c < C; c++) s += xr[c];
    float mu = s / (float)C, v = 0.0f;
#pragma omp simd reduction(+ : v)
    for (int64_t c = 0; c < C; c++) v += (xr[c] - mu) * (xr[c] - mu);
    float rs = 1.0f / sqrtf(v / (float)C + eps);
    for (int64_t c = 0; c < C; c++) yr[c] = (xr[c] - mu) * rs * wd[c] + (bd ? bd[c] : 0.0f);
    *mean = mu;
    *rstd = rs;
}

/* acc[c] += rstd (dy w - mean_c(dy w) - xhat mean_c(dy w xhat)) for one row. */
__attribute__((noinline)) static void ln_row_dx(float *acc, const float *xr, const float *wd, const float *dyr,
                                                float mu, float rs, int64_t C) {
    float sg = 0.0f, sgx = 0.0f;
#pragma omp simd reduction(+ : sg, sgx)
    for (int64_t c = 0; c < C; c++) {
        float gc = dyr[c] * wd[c];
        sg += gc;
        sgx += gc * (xr[c] - mu) * rs;
    }
    sg /= (float)C;
    sgx /= (float)C;
    for (int64_t c = 0; c < C; c++) {
        float xh = (xr[c] - mu) * rs;
        acc[c] += rs * (dyr[c] * wd[c] - sg - xh * sgx);
    }
}

int dt_ln_backward(dt_graph *g, const dt_ln_grads *a) {
    int64_t N = a->N, C = a->C;
    const float *xd = a->x, *wd = a->w, *dy = a->dy;
    float *dx = a->dx, *dw = a->dw, *db = a->db, *da = a->da, *dh = a->dh;
    int resid = !dx && (da || dh);
    int nthr = N * C >= DT_OPS_PAR_MIN ? omp_get_max_threads() : 1;
    float *part = NULL;   /* [nthr][2][C]: dw then db partials */
    if (dw || db) {
        part = dt_graph_scratch(g, (size_t)nthr * 2 * (size_t)C * sizeof(float));
        if (!part) return -1;   /* ENOMEM recorded; backward aborts */
        memset(part, 0, (size_t)nthr * 2 * (size_t)C * sizeof(float));
    }
    float *rows = resid ? dt_graph_scratch(g, (size_t)nthr * (size_t)C * sizeof(float)) : NULL;   /* [nthr][C] */
    if (resid && !rows) return -1;
#pragma omp parallel num_threads(nthr) if (nthr > 1)
    {
        int tid = omp_get_thread_num();
        float *pw = part ? part + (size_t)tid * 2 * C : NULL, *pb = pw ? pw + C : NULL;
        float *t = rows ? rows + (size_t)tid * C : NULL;
#pragma omp for schedule(static)
        for (int64_t r = 0; r < N; r++) {
            const float *xr = xd + r * C, *dyr = dy + r * C;
            float mu = a->mean[r], rs = a->rstd[r];
            if (pw)
                for (int64_t c = 0; c < C; c++) {
                    float xh = (xr[c] - mu) * rs;
                    pw[c] += dyr[c] * xh;
                    pb[c] += dyr[c];
                }
            if (dx) ln_row_dx(dx + r * C, xr, wd, dyr, mu, rs, C);
            if (resid) {   /* t = x's gradient as plain backward would hold it; then add's backward */
                if (a->ds) memcpy(t, a->ds + r * C, (size_t)C * sizeof(float));
                else memset(t, 0, (size_t)C * sizeof(float));
                ln_row_dx(t, xr, wd, dyr, mu, rs, C);
                if (da) for (int64_t c = 0; c < C; c++) da[r * C + c] += t[c];
                if (dh) for (int64_t c = 0; c < C; c++) dh[r * C + c] += t[c];
            }
        }
    }
    if (part)
        for (int t = 0; t < nthr; t++) {
            const float *pw = part + (size_t)t * 2 * C, *pb = pw + C;
            if (dw) for (int64_t c = 0; c < C; c++) dw[c] += pw[c];
            if (db) for (int64_t c = 0; c < C; c++) db[c] += pb[c];
        }
    return 0;
}

static void layernorm_backward(dt_graph *g, dt_node *n) {
    dt_tensor *x = n->in[0], *w = n->in[1], *b = n->in[2];
    const ln_saved *sv = n->saved;
    int64_t C = w->numel, N = C ? x->numel / C : 0;
    dt_ln_grads a = {.x = dt_f32(x), .w = dt_f32(w), .mean = sv->mean, .rstd = sv->rstd,
                     .dy = dt_f32(n->out->grad), .N = N, .C = C};
    a.dx = dt_grad_of(g, x);
    a.dw = dt_grad_of(g, w);
    a.db = b ? dt_grad_of(g, b) : NULL;
    if (N == 0 || C == 0) return;
    dt_ln_backward(g, &a);
}

dt_tensor *dt_op_layernorm(dt_graph *g, dt_tensor *x, dt_tensor *w, dt_tensor *b, float eps) {
    static const char *op = "layernorm";
    if (dt_ops_check_graph(op, g) || dt_ops_check_tensor(op, "x", x) || dt_ops_check_tensor(op, "w", w))
        return NULL;
    if (b && dt_ops_check_tensor(op, "b", b)) return NULL;
    if (x->ndim < 1 || w->ndim != 1 || w->shape[0] != x->shape[x->ndim - 1] ||
        (b && (b->ndim != 1 || b->shape[0] != w->shape[0]))) {
        DT_ERR(DT_EINVAL, "layernorm: x has shape %s, w %s, b %s (want w, b = [last dim of x])",
               DT_OPS_SHAPE(x), DT_OPS_SHAPE(w), b ? DT_OPS_SHAPE(b) : "NULL");
        return NULL;
    }
    if (!(eps >= 0.0f)) {
        DT_ERR(DT_EINVAL, "layernorm: eps must be >= 0, got %g", (double)eps);
        return NULL;
    }
    int64_t C = w->shape[0], N = dt_shape_numel(x->ndim - 1, x->shape);
    if (C == 0) {
        DT_ERR(DT_EINVAL, "layernorm: x %s has an empty last dim", DT_OPS_SHAPE(x));
        return NULL;
    }
    dt_tensor *y = dt_graph_tensor(g, x->ndim, x->shape);
    ln_saved *sv = dt_graph_scratch(g, sizeof *sv);
    float *stats = dt_graph_scratch(g, 2 * (size_t)N * sizeof(float) + 1);
    if (!y || !sv || !stats) return NULL;
    sv->mean = stats;
    sv->rstd = stats + N;
    dt_graph_saved_keep_exact(g, dt_f32(x), x->numel);   /* backward re-normalises x with the exact statistics */
    const float *xd = dt_f32(x), *wd = dt_f32(w), *bd = b ? dt_f32(b) : NULL;
    float *yd = dt_f32(y);
#pragma omp parallel for schedule(static) if (x->numel >= DT_OPS_PAR_MIN)
    for (int64_t r = 0; r < N; r++) dt_ln_row_forward(xd + r * C, wd, bd, eps, C, yd + r * C, &sv->mean[r], &sv->rstd[r]);
    dt_tensor *ins[3] = {x, w, b};
    dt_node *n = dt_graph_record(g, op, layernorm_backward, y, 3, ins);
    if (n) n->saved = sv;
    return y;
}
