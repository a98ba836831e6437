/* Fused softmax + cross-entropy, mean over rows whose target is >= 0.
 *   logits[N, V] (leading dims flattened), targets[N] int32 (caller-owned)
 *   loss = (1 / n_valid) sum_{i valid} (log sum_j exp x_ij - x_i,t_i)
 * backward, s = dloss / n_valid, valid rows only:
 *   dx_ij += s (p_ij - [j == t_i]),  p_ij = exp(x_ij - m_i) / z_i
 * Saved per row: max m_i and 1 / z_i; probabilities are recomputed.
 * n_valid == 0 gives loss 0 and zero gradient. */
#include <string.h>
#include "ops_internal.h"

typedef struct ce_saved {
    const int32_t *targets;
    float *rmax, *rinv;   /* [N] */
} ce_saved;

/* n->i[3] = 1 (the _consume form): dx is written over the logits themselves
 * when nothing else gave them a gradient yet; else dx += as usual. In place,
 * rows with an ignored target become 0, the value dx would have. */
static void cross_entropy_backward(dt_graph *g, dt_node *n) {
    dt_tensor *x = n->in[0];
    int in_place = n->i[3] && dt_grad_in_place(g, x);
    float *dx = dt_grad_of(g, x);
    if (!dx) return;
    const ce_saved *sv = n->saved;
    if (in_place)
        for (int64_t r = 0; r < n->i[0]; r++)
            if (sv->targets[r] < 0) memset(dx + r * n->i[1], 0, (size_t)n->i[1] * sizeof(float));
    int64_t N = n->i[0], V = n->i[1], nvalid = n->i[2];
    if (nvalid == 0) return;
    float s = dt_f32(n->out->grad)[0] / (float)nvalid;
    const float *xd = dt_f32(x);
#pragma omp parallel for schedule(static) if (N * V >= DT_OPS_PAR_MIN)
    for (int64_t r = 0; r < N; r++) {
        int32_t t = sv->targets[r];
        if (t >= 0) dt_ops_ce_row_grad(dx + r * V, xd + r * V, V, V, sv->rmax[r], s * sv->rinv[r], s, t, in_place);
    }
}

int dt_ops_ce_check_targets(const char *op, const int32_t *t, int64_t N, int64_t V, const dt_tensor *logits) {
    if (N > 0 && !t) {
        DT_ERR(DT_EINVAL, "%s: targets is NULL for logits %s", op, DT_OPS_SHAPE(logits));
        return -1;
    }
    for (int64_t r = 0; r < N; r++)
        if (t[r] >= V) {
            DT_ERR(DT_EINVAL, "%s: target %d at row %lld out of range [0, %lld) for logits %s", op,
                   (int)t[r], (long long)r, (long long)V, DT_OPS_SHAPE(logits));
            return -1;
        }
    return 0;
}

static dt_tensor *cross_entropy(dt_graph *g, dt_tensor *logits, const int32_t *targets, int consume) {
    static const char *op = "cross_entropy";
    if (dt_ops_check_graph(op, g) || dt_ops_check_tensor(op, "logits", logits)) return NULL;
    if (logits->ndim < 1 || logits->shape[logits->ndim - 1] == 0) {
        DT_ERR(DT_EINVAL, "cross_entropy: logits must be [N, V] with V > 0, got %s", DT_OPS_SHAPE(logits));
        return NULL;
    }
    int64_t V = logits->shape[logits->ndim - 1], N = logits->numel / V;
    if (dt_ops_ce_check_targets(op, targets, N, V, logits)) return NULL;
    int64_t nvalid = 0;
    for (int64_t r = 0; r < N; r++) nvalid += targets[r] >= 0;
    dt_tensor *out = dt_graph_tensor(g, 0, NULL);
    ce_saved *sv = dt_graph_scratch(g, sizeof *sv);
    float *stats = dt_graph_scratch(g, 2 * (size_t)N * sizeof(float) + 1);
    double *rloss = dt_graph_scratch(g, (size_t)N * sizeof(double) + 1);
    if (!out || !sv || !stats || !rloss) return NULL;
    sv->targets = targets;
    sv->rmax = stats;
    sv->rinv = stats + N;
    const float *xd = dt_f32(logits);
#pragma omp parallel for schedule(static) if (N * V >= DT_OPS_PAR_MIN)
    for (int64_t r = 0; r < N; r++) {
        int32_t t = targets[r];
        if (t < 0) {
            rloss[r] = 0.0;
            continue;
        }
        const float *xr = xd + r * V;
        float m = dt_ops_row_max(xr, V), z = dt_ops_row_sumexp(xr, V, m);
        sv->rmax[r] = m;
        sv->rinv[r] = 1.0f / z;
        rloss[r] = (double)m + log((double)z) - (double)xr[t];
    }
    double total = 0.0;   /* serial sum in row order: deterministic */
    for (int64_t r = 0; r < N; r++) total += rloss[r];
    dt_f32(out)[0] = nvalid ? (float)(total / (double)nvalid) : 0.0f;
    dt_node *n = dt_graph_record(g, op, cross_entropy_backward, out, 1, &logits);
    if (n) {
        n->saved = sv;
        n->i[0] = N;
        n->i[1] = V;
        n->i[2] = nvalid;
        n->i[3] = consume;
    }
    return out;
}

dt_tensor *dt_op_cross_entropy(dt_graph *g, dt_tensor *logits, const int32_t *targets) {
    return cross_entropy(g, logits, targets, 0);
}

dt_tensor *dt_op_cross_entropy_consume(dt_graph *g, dt_tensor *logits, const int32_t *targets) {
    return cross_entropy(g, logits, targets, 1);
}
