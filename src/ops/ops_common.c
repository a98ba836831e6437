/* Shared op helpers: argument checks, SGEMM wrapper, OpenMP accumulations. */
#include <cblas.h>
#include <limits.h>
#include "ops_internal.h"

int dt_ops_check_graph(const char *op, const dt_graph *g) {
    if (g) return 0;
    DT_ERR(DT_EINVAL, "%s: graph is NULL", op);
    return -1;
}

int dt_ops_check_tensor(const char *op, const char *name, const dt_tensor *t) {
    if (!t) {
        DT_ERR(DT_EINVAL, "%s: %s is NULL", op, name);
        return -1;
    }
    if (t->dtype != DT_F32) {
        DT_ERR(DT_EINVAL, "%s: %s must be F32, got %s", op, name, dt_dtype_name(t->dtype));
        return -1;
    }
    if (t->ndim < 0 || t->ndim > DT_MAX_DIMS || t->numel < 0) {
        DT_ERR(DT_EINVAL, "%s: %s has invalid rank %d", op, name, t->ndim);
        return -1;
    }
    if (t->numel > 0 && !t->data) {
        DT_ERR(DT_EINVAL, "%s: %s %s has no storage", op, name, DT_OPS_SHAPE(t));
        return -1;
    }
    return 0;
}

int dt_ops_check_blas(const char *op, int n, const int64_t *dims) {
    for (int i = 0; i < n; i++)
        if (dims[i] > INT_MAX) {
            DT_ERR(DT_EINVAL, "%s: dimension %lld exceeds the BLAS int range", op, (long long)dims[i]);
            return -1;
        }
    return 0;
}

void dt_ops_sgemm(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha,
                  const float *A, int64_t lda, const float *B, int64_t ldb,
                  float beta, float *C, int64_t ldc) {
    if (M <= 0 || N <= 0) return;
    if (K <= 0) {   /* C = beta * C */
        if (beta == 1.0f) return;
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) C[i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[i * ldc + j];
        return;
    }
    if (dt_ops_sgemm_bf16_applies(M, N, K) && dt_ops_sgemm_bf16(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc))
        return;
    if (dt_gemm_precision() == DT_PREC_FP16 && dt_ops_sgemm_rounded(DT_F16, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc))
        return;
    dt_ops_sgemm_f32(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

/* the float32 product, whatever the precision (M, N, K > 0) */
void dt_ops_sgemm_f32(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                      const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    if (dt_ops_sgemm_small_m_applies(ta, tb, M, N, K, alpha, beta) &&
        dt_ops_sgemm_small_m(M, N, K, A, lda, B, ldb, beta, C, ldc))
        return;
    /* oneDNN refuses only arguments that are wrong for OpenBLAS too */
    if (dt_gemm_backend_in_use() == DT_GEMM_ONEDNN && dt_ops_sgemm_onednn(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc))
        return;
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                (int)M, (int)N, (int)K, alpha, A, (int)lda, B, (int)ldb, beta, C, (int)ldc);
}

void dt_sgemm(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
              const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    dt_ops_sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void dt_ops_acc(float *restrict dst, const float *restrict src, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= DT_OPS_PAR_MIN)
    for (int64_t i = 0; i < n; i++) dst[i] += src[i];
}

/* Column block width: 64 floats = four cache lines per row segment. */
#define COLSUM_BLOCK 64

void dt_ops_colsum_acc(float *restrict db, const float *restrict dy, int64_t rows, int64_t cols) {
    int64_t nblk = (cols + COLSUM_BLOCK - 1) / COLSUM_BLOCK;
#pragma omp parallel for schedule(static) if (rows * cols >= DT_OPS_PAR_MIN && nblk > 1)
    for (int64_t blk = 0; blk < nblk; blk++) {
        int64_t c0 = blk * COLSUM_BLOCK;
        int64_t w = cols - c0 < COLSUM_BLOCK ? cols - c0 : COLSUM_BLOCK;
        float acc[COLSUM_BLOCK] = {0};
        for (int64_t r = 0; r < rows; r++) {
            const float *row = dy + r * cols + c0;
            for (int64_t j = 0; j < w; j++) acc[j] += row[j];
        }
        for (int64_t j = 0; j < w; j++) db[c0 + j] += acc[j];
    }
}

dt_tensor *dt_ops_view(dt_graph *g, dt_tensor *x, int ndim, const int64_t *shape) {
    dt_tensor *t = dt_graph_scratch(g, sizeof *t);
    if (!t) return NULL;
    memset(t, 0, sizeof *t);
    if (dt_tensor_set_shape(t, ndim, shape) != DT_OK) return NULL;
    t->dtype = DT_F32;
    t->data = x->data;
    return t;
}
