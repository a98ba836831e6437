/* Fused causal multi-head self-attention.
 *
 * qkv[B, T, 3C] holds [q | k | v] per token, each C = H * hs wide; head h of
 * q is columns h*hs .. (h+1)*hs of the q part (row stride 3C). Per (b, h):
 *   S = q k^T / sqrt(hs)   [T, T], causal: only j <= i
 *   P = softmax_rows(S),   y = P v -> y[b, :, h*hs : (h+1)*hs]  (row stride C)
 * backward (a = 1 / sqrt(hs)):
 *   dP = dy v^T,  dv += P^T dy,  dS = P (dP - rowsum(dP P)),
 *   dq += a dS k,  dk += a dS^T q
 *
 * Rows are processed in tiles of ATT_TILE: tile [i0, i1) only needs columns
 * [0, i1), so the GEMMs skip most of the masked upper triangle.
 * Saved: P[B, H, T, T]. Invariant: in row i of tile [i0, i1), P[i, j] is the
 * probability for j <= i, 0 for i < j < i1, and never read for j >= i1.
 *
 * (b, h) pairs are independent (they touch disjoint columns of y and dqkv), so
 * they run in an OpenMP loop; the small SGEMMs inside run single-threaded
 * because OpenBLAS's OpenMP build detects the active parallel region. */
#include <omp.h>
#include "ops_internal.h"

#ifndef ATT_TILE
#define ATT_TILE 64   /* rows per tile */
#endif

/* One (b, h): q/k/v point at the head's first column in qkv, y likewise.
 * keep: P is the head's [T, T] block (saved for backward); else P is one
 * ATT_TILE x T scratch tile reused for every row tile. */
static void att_head_forward(const float *q, float *y, float *P, int keep, int64_t T, int64_t C,
                             int64_t hs, float scale) {
    const int64_t C3 = 3 * C;
    const float *k = q + C, *v = q + 2 * C;
    for (int64_t i0 = 0; i0 < T; i0 += ATT_TILE) {
        int64_t i1 = i0 + ATT_TILE < T ? i0 + ATT_TILE : T, m = i1 - i0;
        float *Pt = keep ? P + i0 * T : P;
        /* S[i0:i1, 0:i1] = scale * q[i0:i1, hs] · k[0:i1, hs]^T */
        dt_ops_sgemm(0, 1, m, i1, hs, scale, q + i0 * C3, C3, k, C3, 0.0f, Pt, T);
        for (int64_t r = 0; r < m; r++) {
            float *row = Pt + r * T;
            int64_t i = i0 + r;
            dt_ops_softmax_row(row, row, i + 1);
            for (int64_t j = i + 1; j < i1; j++) row[j] = 0.0f;
        }
        /* y[i0:i1, hs] = P[i0:i1, 0:i1] · v[0:i1, hs] */
        dt_ops_sgemm(0, 0, m, hs, i1, 1.0f, Pt, T, v, C3, 0.0f, y + i0 * C, C);
    }
}

/* One (b, h) backward; dq points at the head's q columns in dqkv, W is
 * ATT_TILE x T scratch for dP / dS of one row tile. */
static void att_head_backward(const float *q, float *dq, const float *dy, const float *P, float *W,
                              int64_t T, int64_t C, int64_t hs, float scale) {
    const int64_t C3 = 3 * C;
    const float *k = q + C, *v = q + 2 * C;
    float *dk = dq + C, *dv = dq + 2 * C;
    for (int64_t i0 = 0; i0 < T; i0 += ATT_TILE) {
        int64_t i1 = i0 + ATT_TILE < T ? i0 + ATT_TILE : T, m = i1 - i0;
        const float *Pt = P + i0 * T;
        /* dP[m, i1] = dy[i0:i1, hs] · v[0:i1, hs]^T */
        dt_ops_sgemm(0, 1, m, i1, hs, 1.0f, dy + i0 * C, C, v, C3, 0.0f, W, T);
        /* dv[0:i1, hs] += P[i0:i1, 0:i1]^T · dy[i0:i1, hs] */
        dt_ops_sgemm(1, 0, i1, hs, m, 1.0f, Pt, T, dy + i0 * C, C, 1.0f, dv, C3);
        /* dS = P (dP - sum_j dP P) for j <= i; 0 for i < j < i1 */
        for (int64_t r = 0; r < m; r++) {
            const float *pr = Pt + r * T;
            float *wr = W + r * T;
            int64_t len = i0 + r + 1;
            float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
            for (int64_t j = 0; j < len; j++) dot += pr[j] * wr[j];
#pragma omp simd
            for (int64_t j = 0; j < len; j++) wr[j] = pr[j] * (wr[j] - dot);
            for (int64_t j = len; j < i1; j++) wr[j] = 0.0f;
        }
        /* dq[i0:i1, hs] += scale * dS[m, i1] · k[0:i1, hs] */
        dt_ops_sgemm(0, 0, m, hs, i1, scale, W, T, k, C3, 1.0f, dq + i0 * C3, C3);
        /* dk[0:i1, hs] += scale * dS[m, i1]^T · q[i0:i1, hs] */
        dt_ops_sgemm(1, 0, i1, hs, m, scale, W, T, q + i0 * C3, C3, 1.0f, dk, C3);
    }
}

static void attention_backward(dt_graph *g, dt_node *n) {
    dt_tensor *qkv = n->in[0];
    float *dqkv = dt_grad_of(g, qkv);
    if (!dqkv) return;
    int64_t B = n->i[0], T = n->i[1], C = n->i[2], H = n->i[3], hs = C / H;
    float scale = n->f[0];
    const float *P = n->saved, *x = dt_f32(qkv), *dy = dt_f32(n->out->grad);
    int64_t tasks = B * H;
    int nthr = tasks > 1 ? omp_get_max_threads() : 1;
    if (nthr > tasks) nthr = (int)tasks;
    if (nthr < 1) nthr = 1;
    float *W = dt_graph_scratch(g, (size_t)nthr * ATT_TILE * (size_t)T * sizeof(float) + 1);
    if (!W) return;   /* ENOMEM recorded; backward aborts */
#pragma omp parallel num_threads(nthr) if (nthr > 1)
    {
        float *Wt = W + (size_t)omp_get_thread_num() * ATT_TILE * (size_t)T;
#pragma omp for schedule(static)
        for (int64_t t = 0; t < tasks; t++) {
            int64_t b = t / H, h = t % H;
            int64_t qo = b * T * 3 * C + h * hs;
            att_head_backward(x + qo, dqkv + qo, dy + b * T * C + h * hs, P + t * T * T, Wt, T, C, hs,
                              scale);
        }
    }
}

dt_tensor *dt_op_attention(dt_graph *g, dt_tensor *qkv, int n_head) {
    static const char *op = "attention";
    if (dt_ops_check_graph(op, g) || dt_ops_check_tensor(op, "qkv", qkv)) return NULL;
    if (qkv->ndim != 3 || qkv->shape[2] % 3 != 0 || qkv->shape[2] == 0) {
        DT_ERR(DT_EINVAL, "attention: qkv must be [B, T, 3C] with C > 0, got %s", DT_OPS_SHAPE(qkv));
        return NULL;
    }
    int64_t B = qkv->shape[0], T = qkv->shape[1], C = qkv->shape[2] / 3, H = n_head;
    if (H <= 0 || C % H != 0) {
        DT_ERR(DT_EINVAL, "attention: n_head=%d does not divide C=%lld (qkv %s)", n_head, (long long)C,
               DT_OPS_SHAPE(qkv));
        return NULL;
    }
    int64_t dims[2] = {T, 3 * C};
    if (dt_ops_check_blas(op, 2, dims)) return NULL;
    int64_t hs = C / H, shape[3] = {B, T, C};
    float scale = 1.0f / sqrtf((float)hs);
    int64_t tasks = B * H;
    int nthr = tasks > 1 ? omp_get_max_threads() : 1;
    if (nthr > tasks) nthr = (int)tasks;
    if (nthr < 1) nthr = 1;
    /* keep P only when backward will need it; else one tile per thread */
    int keep = dt_graph_grad_enabled(g) && qkv->requires_grad;
    size_t pfloats = keep ? (size_t)(tasks * T * T) : (size_t)nthr * ATT_TILE * (size_t)T;
    dt_tensor *y = dt_graph_tensor(g, 3, shape);
    float *P = dt_graph_scratch(g, pfloats * sizeof(float) + 1);
    if (!y || !P) return NULL;
    const float *x = dt_f32(qkv);
    float *yd = dt_f32(y);
#pragma omp parallel num_threads(nthr) if (nthr > 1)
    {
        float *Pthr = keep ? P : P + (size_t)omp_get_thread_num() * ATT_TILE * (size_t)T;
#pragma omp for schedule(static)
        for (int64_t t = 0; t < tasks; t++) {
            int64_t b = t / H, h = t % H;
            att_head_forward(x + b * T * 3 * C + h * hs, yd + b * T * C + h * hs,
                             keep ? Pthr + t * T * T : Pthr, keep, T, C, hs, scale);
        }
    }
    dt_node *n = dt_graph_record(g, op, attention_backward, y, 1, &qkv);
    if (n) {
        n->saved = P;
        n->i[0] = B;
        n->i[1] = T;
        n->i[2] = C;
        n->i[3] = H;
        n->f[0] = scale;
    }
    return y;
}
