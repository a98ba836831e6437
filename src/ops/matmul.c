/* Matrix product, plain or batched.
 *   c[M, N] = a[M, K] · b[K, N]            (2-D)
 *   c[i] = a[i] · b[i], i < Bt             (3-D, a[Bt, M, K], b[Bt, K, N])
 * backward: da[i] += dc[i] · b[i]^T, db[i] += a[i]^T · dc[i].
 * Large slices: one multi-threaded SGEMM each; many small slices: OpenMP over
 * the batch with single-threaded SGEMMs. */
#include "ops_internal.h"

/* Below this many flops per slice, parallelise over the batch instead. */
#define MATMUL_SMALL_FLOPS ((int64_t)1 << 22)

static int matmul_batch_parallel(int64_t Bt, int64_t M, int64_t N, int64_t K) {
    return Bt > 1 && 2 * M * N * K < MATMUL_SMALL_FLOPS;
}

static void matmul_backward(dt_graph *g, dt_node *n) {
    dt_tensor *a = n->in[0], *b = n->in[1];
    int64_t Bt = n->i[0], M = n->i[1], K = n->i[2], N = n->i[3];
    const float *dc = dt_f32(n->out->grad), *ad = dt_f32(a), *bd = dt_f32(b);
    float *da = dt_grad_of(g, a), *db = dt_grad_of(g, b);
    int par = matmul_batch_parallel(Bt, M, N, K);
#pragma omp parallel for schedule(static) if (par)
    for (int64_t i = 0; i < Bt; i++) {
        const float *dci = dc + i * M * N;
        if (da) /* dc[M, N] · b[K, N]^T -> [M, K] */
            dt_ops_sgemm(0, 1, M, K, N, 1.0f, dci, N, bd + i * K * N, N, 1.0f, da + i * M * K, K);
        if (db) /* a[M, K]^T · dc[M, N] -> [K, N] */
            dt_ops_sgemm(1, 0, K, N, M, 1.0f, ad + i * M * K, K, dci, N, 1.0f, db + i * K * N, N);
    }
}

dt_tensor *dt_op_matmul(dt_graph *g, dt_tensor *a, dt_tensor *b) {
    static const char *op = "matmul";
    if (dt_ops_check_graph(op, g) || dt_ops_check_tensor(op, "a", a) || dt_ops_check_tensor(op, "b", b))
        return NULL;
    if (a->ndim != b->ndim || (a->ndim != 2 && a->ndim != 3)) {
        DT_ERR(DT_EINVAL, "matmul: a %s and b %s must both be 2-D or both 3-D", DT_OPS_SHAPE(a),
               DT_OPS_SHAPE(b));
        return NULL;
    }
    int o = a->ndim - 2;   /* offset of the matrix dims */
    int64_t Bt = o ? a->shape[0] : 1, M = a->shape[o], K = a->shape[o + 1], N = b->shape[o + 1];
    if (b->shape[o] != K || (o && b->shape[0] != Bt)) {
        DT_ERR(DT_EINVAL, "matmul: a has shape %s but b has shape %s (inner or batch dims differ)",
               DT_OPS_SHAPE(a), DT_OPS_SHAPE(b));
        return NULL;
    }
    int64_t dims[3] = {M, N, K};
    if (dt_ops_check_blas(op, 3, dims)) return NULL;
    int64_t shape[3] = {Bt, M, N};
    dt_tensor *c = dt_graph_tensor(g, a->ndim, shape + (o ? 0 : 1));
    if (!c) return NULL;
    const float *ad = dt_f32(a), *bd = dt_f32(b);
    float *cd = dt_f32(c);
    int par = matmul_batch_parallel(Bt, M, N, K);
#pragma omp parallel for schedule(static) if (par)
    for (int64_t i = 0; i < Bt; i++)
        dt_ops_sgemm(0, 0, M, N, K, 1.0f, ad + i * M * K, K, bd + i * K * N, N, 0.0f, cd + i * M * N, N);

    dt_tensor *ins[2] = {a, b};
    dt_node *n = dt_graph_record(g, op, matmul_backward, c, 2, ins);
    if (n) {
        n->i[0] = Bt;
        n->i[1] = M;
        n->i[2] = K;
        n->i[3] = N;
    }
    return c;
}
