/* LayerNorm over the last dim C of x[N, C] (N = all leading dims).
 *   mean_n = sum_c x / C, rstd_n = 1 / sqrt(var_n + eps) (biased var)
 *   xhat = (x - mean) rstd,  y = xhat w + b
 * backward with g = dy w:
 *   dx += rstd (g - mean_c(g) - xhat mean_c(g xhat))
 *   dw += sum_n dy xhat,  db += sum_n dy
 * Saved: mean[N], rstd[N]. dw/db use per-thread partial sums reduced in
 * thread order, so results are deterministic for a given thread count. */
#include <omp.h>
#include "ops_internal.h"

typedef struct ln_saved { float *mean, *rstd; } ln_saved;

static void layernorm_backward(dt_graph *g, dt_node *n) {
    dt_tensor *x = n->in[0], *w = n->in[1], *b = n->in[2];
    const ln_saved *sv = n->saved;
    int64_t C = w->numel, N = C ? x->numel / C : 0;
    const float *xd = dt_f32(x), *wd = dt_f32(w), *dy = dt_f32(n->out->grad);
    float *dx = dt_grad_of(g, x), *dw = dt_grad_of(g, w), *db = b ? dt_grad_of(g, b) : NULL;
    if (N == 0 || C == 0) return;
    int nthr = N * C >= DT_OPS_PAR_MIN ? omp_get_max_threads() : 1;
    float *part = NULL;   /* [nthr][2][C]: dw then db partials */
    if (dw || db) {
        part = dt_graph_scratch(g, (size_t)nthr * 2 * (size_t)C * sizeof(float));
        if (!part) return;   /* ENOMEM recorded; backward aborts */
        memset(part, 0, (size_t)nthr * 2 * (size_t)C * sizeof(float));
    }
#pragma omp parallel num_threads(nthr) if (nthr > 1)
    {
        int tid = omp_get_thread_num();
        float *pw = part ? part + (size_t)tid * 2 * C : NULL, *pb = pw ? pw + C : NULL;
#pragma omp for schedule(static)
        for (int64_t r = 0; r < N; r++) {
            const float *xr = xd + r * C, *dyr = dy + r * C;
            float mu = sv->mean[r], rs = sv->rstd[r];
            if (pw)
                for (int64_t c = 0; c < C; c++) {
                    float xh = (xr[c] - mu) * rs;
                    pw[c] += dyr[c] * xh;
                    pb[c] += dyr[c];
                }
            if (dx) {
                float sg = 0.0f, sgx = 0.0f;
#pragma omp simd reduction(+ : sg, sgx)
                for (int64_t c = 0; c < C; c++) {
                    float gc = dyr[c] * wd[c];
                    sg += gc;
                    sgx += gc * (xr[c] - mu) * rs;
                }
                sg /= (float)C;
                sgx /= (float)C;
                float *dxr = dx + r * C;
                for (int64_t c = 0; c < C; c++) {
                    float xh = (xr[c] - mu) * rs;
                    dxr[c] += rs * (dyr[c] * wd[c] - sg - xh * sgx);
                }
            }
        }
    }
    if (part)
        for (int t = 0; t < nthr; t++) {
            const float *pw = part + (size_t)t * 2 * C, *pb = pw + C;
            if (dw) for (int64_t c = 0; c < C; c++) dw[c] += pw[c];
            if (db) for (int64_t c = 0; c < C; c++) db[c] += pb[c];
        }
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
    const float *xd = dt_f32(x), *wd = dt_f32(w), *bd = b ? dt_f32(b) : NULL;
    float *yd = dt_f32(y);
#pragma omp parallel for schedule(static) if (x->numel >= DT_OPS_PAR_MIN)
    for (int64_t r = 0; r < N; r++) {
        const float *xr = xd + r * C;
        float *yr = yd + r * C;
        float s = 0.0f;
#pragma omp simd reduction(+ : s)
        for (int64_t c = 0; c < C; c++) s += xr[c];
        float mu = s / (float)C, v = 0.0f;
#pragma omp simd reduction(+ : v)
        for (int64_t c = 0; c < C; c++) v += (xr[c] - mu) * (xr[c] - mu);
        float rs = 1.0f / sqrtf(v / (float)C + eps);
        for (int64_t c = 0; c < C; c++) yr[c] = (xr[c] - mu) * rs * wd[c] + (bd ? bd[c] : 0.0f);
        sv->mean[r] = mu;
        sv->rstd[r] = rs;
    }
    dt_tensor *ins[3] = {x, w, b};
    dt_node *n = dt_graph_record(g, op, layernorm_backward, y, 3, ins);
    if (n) n->saved = sv;
    return y;
}
