/* Vocabulary-parallel cross-entropy and accuracy (Megatron's
 * vocab_parallel_cross_entropy): the logits stay split by columns, one part
 * per rank of a tensor-parallel group, and only per-row numbers travel.
 *   logits[N, n]: rank r's columns [r n, r n + n) of the whole [N, V]; the
 *   valid ones are the first `nv` = clamp(V - r n, 0, n), the rest padding.
 * Forward, row i with target t_i >= 0 (ignored rows: loss 0, gradient 0):
 *   M_i = allreduce_max(max_j x_ij)                          N floats
 *   Z_i, X_i = allreduce_sum(sum_j exp(x_ij - M_i), x_i,t_i or 0)   2 N floats
 *   loss = (1 / n_valid) sum_i (log Z_i + M_i - X_i)
 * Every rank gets the same M, Z, X bits, hence the same loss. Saved per row:
 * M_i and 1 / Z_i. Backward (local), s = dloss / n_valid:
 *   dx_ij += s (exp(x_ij - M_i) / Z_i - [r n + j == t_i]), 0 on padding.
 * The one-process op sums exp over V in one pass; here over each part, then
 * across ranks: the same value up to float rounding. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "ops_internal.h"

typedef struct vp_saved {
    const int32_t *targets;
    float *rmax, *rinv;   /* [N] */
    int64_t start, nv;    /* this part's first global column, valid columns */
} vp_saved;

/* The part's first global column and its valid columns. */
static void part_of(const dt_tp_comm *c, int64_t n, int64_t V, int64_t *start, int64_t *nv) {
    *start = (int64_t)c->rank * n;
    int64_t v = V - *start;
    *nv = v < 0 ? 0 : v > n ? n : v;
}

/* Shared checks: logits [.., n] with n * size >= V > n * (size - 1) (the
 * split dt_vocab_part makes), labels/targets set and < V. */
static int check_split(const char *op, const dt_tensor *x, const int32_t *t, int64_t V, const dt_tp_comm *c) {
    if (dt_ops_check_tensor(op, "logits", x) || dt_ops_tp_check(op, c, 1)) return -1;
    int64_t n = x->ndim >= 1 ? x->shape[x->ndim - 1] : 0;
    if (n <= 0 || V < 1 || n != dt_vocab_part(V, c->size)) {
        DT_ERR(DT_EINVAL, "%s: logits %s are not one of %d parts of a vocabulary of %lld (each part %lld columns)", op,
               DT_OPS_SHAPE(x), c->size, (long long)V, (long long)dt_vocab_part(V, c->size));
        return -1;
    }
    return dt_ops_ce_check_targets(op, t, x->numel / n, V, x);
}

static void vp_backward(dt_graph *g, dt_node *n) {
    dt_tensor *x = n->in[0];
    int in_place = n->i[3] && dt_grad_in_place(g, x);
    float *dx = dt_grad_of(g, x);
    if (!dx) return;
    const vp_saved *sv = n->saved;
    int64_t N = n->i[0], C = n->i[1], nvalid = n->i[2], nv = sv->nv;
    float s = nvalid ? dt_f32(n->out->grad)[0] / (float)nvalid : 0.0f;
    const float *xd = dt_f32(x);
#pragma omp parallel for schedule(static) if (N * C >= DT_OPS_PAR_MIN)
    for (int64_t r = 0; r < N; r++) {
        int32_t t = sv->targets[r];
        if (t < 0) {   /* ignored row: no gradient */
            if (in_place) memset(dx + r * C, 0, (size_t)C * sizeof *dx);
            continue;
        }
        dt_ops_ce_row_grad(dx + r * C, xd + r * C, nv, C, sv->rmax[r], s * sv->rinv[r], s, (int64_t)t - sv->start,
                           in_place);
    }
}

static dt_tensor *vp_cross_entropy(dt_graph *g, dt_tensor *x, const int32_t *targets, int64_t V, const dt_tp_comm *c,
                                   int consume) {
    static const char *op = "vocab_parallel_cross_entropy";
    if (dt_ops_check_graph(op, g) || check_split(op, x, targets, V, c)) return NULL;
    int64_t C = x->shape[x->ndim - 1], N = x->numel / C, start, nv, nvalid = 0;
    part_of(c, C, V, &start, &nv);
    for (int64_t r = 0; r < N; r++) nvalid += targets[r] >= 0;
    dt_tensor *out = dt_graph_tensor(g, 0, NULL);
    vp_saved *sv = dt_graph_scratch(g, sizeof *sv);
    float *stats = dt_graph_scratch(g, 3 * (size_t)N * sizeof(float) + 1);   /* max | sum of exp | target logit */
    if (!out || !sv || !stats) return NULL;
    *sv = (vp_saved){.targets = targets, .rmax = stats, .rinv = stats + N, .start = start, .nv = nv};
    float *zx = stats + N;   /* [Z_0, X_0, Z_1, X_1, ...]: one all-reduce; rinv overwrites Z below */
    const float *xd = dt_f32(x);
#pragma omp parallel for schedule(static) if (N * C >= DT_OPS_PAR_MIN)
    for (int64_t r = 0; r < N; r++) {
        stats[r] = dt_ops_row_max(xd + r * C, nv);   /* a part of padding only: -FLT_MAX, the others' max wins */
    }
    if (dt_ops_tp_max(c, op, stats, N) != DT_OK) return NULL;
#pragma omp parallel for schedule(static) if (N * C >= DT_OPS_PAR_MIN)
    for (int64_t r = 0; r < N; r++) {
        const float *xr = xd + r * C;
        int32_t t = targets[r];
        zx[2 * r] = dt_ops_row_sumexp(xr, nv, stats[r]);
        zx[2 * r + 1] = t >= start && t - start < nv ? xr[t - start] : 0.0f;
    }
    if (dt_ops_tp_sum(c, op, zx, 2 * N) != DT_OK) return NULL;
    double total = 0.0;   /* serial, row order: the same on every rank */
    for (int64_t r = 0; r < N; r++) {
        float z = zx[2 * r], xt = zx[2 * r + 1];
        if (targets[r] >= 0) total += (double)stats[r] + log((double)z) - (double)xt;
        sv->rinv[r] = 1.0f / z;   /* row r's pair is read before rinv[r] (= zx[r]) is written */
    }
    dt_f32(out)[0] = nvalid ? (float)(total / (double)nvalid) : 0.0f;
    dt_node *n = dt_graph_record(g, op, vp_backward, out, 1, &x);
    if (n) {
        n->saved = sv;
        n->i[0] = N;
        n->i[1] = C;
        n->i[2] = nvalid;
        n->i[3] = consume;
    }
    return out;
}

dt_tensor *dt_op_vocab_parallel_cross_entropy(dt_graph *g, dt_tensor *logits, const int32_t *targets, int64_t V,
                                              const dt_tp_comm *c) {
    return vp_cross_entropy(g, logits, targets, V, c, 0);
}

dt_tensor *dt_op_vocab_parallel_cross_entropy_consume(dt_graph *g, dt_tensor *logits, const int32_t *targets,
                                                      int64_t V, const dt_tp_comm *c) {
    return vp_cross_entropy(g, logits, targets, V, c, 1);
}

/* Argmax over the group: the row's global max (all-reduce max), then the
 * lowest global column holding it (all-reduce max of -column: exact in
 * float for V <= 2^24). */
int64_t dt_count_correct_vocab_parallel(const dt_tensor *logits, const int32_t *labels, int64_t V,
                                        const dt_tp_comm *c) {
    static const char *op = "count_correct_vocab_parallel";
    if (check_split(op, logits, labels, V, c)) return -1;
    if (V > (1 << 24)) {
        DT_ERR(DT_EINVAL, "%s: vocabulary %lld exceeds 2^24 (columns travel as floats)", op, (long long)V);
        return -1;
    }
    int64_t C = logits->shape[logits->ndim - 1], N = logits->numel / C, start, nv, correct = 0;
    part_of(c, C, V, &start, &nv);
    float *buf = malloc(2 * (size_t)N * sizeof *buf + 1);
    if (!buf) { DT_ERR(DT_ENOMEM, "%s: out of memory (%lld rows)", op, (long long)N); return -1; }
    float *mx = buf, *col = buf + N;
    const float *xd = dt_f32(logits);
    for (int64_t r = 0; r < N; r++) mx[r] = dt_ops_row_max(xd + r * C, nv);
    dt_status st = dt_ops_tp_max(c, op, mx, N);
    for (int64_t r = 0; st == DT_OK && r < N; r++) {
        col[r] = -FLT_MAX;   /* none here: another rank's column is lower than "infinity" */
        for (int64_t j = 0; j < nv; j++)
            if (xd[r * C + j] == mx[r]) { col[r] = -(float)(start + j); break; }
    }
    if (st == DT_OK) st = dt_ops_tp_max(c, op, col, N);
    for (int64_t r = 0; st == DT_OK && r < N; r++) correct += (int64_t)(-col[r]) == labels[r];
    free(buf);
    return st == DT_OK ? correct : -1;
}
