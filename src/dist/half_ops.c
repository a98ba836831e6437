/* 16-bit sums for MPI (user MPI_Ops) and the local rank-ordered reductions.
 *
 * MPI has no bf16 / fp16 types: payloads travel as MPI_UINT16_T and are summed
 * by user ops that widen both operands to float32, add once, and round back
 * (nearest even). Commutative, so MPI may pick any algorithm.
 */
#include <string.h>
#include "dist/dist_internal.h"

static MPI_Op op_bf16 = MPI_OP_NULL, op_f16 = MPI_OP_NULL;

static void sum_bf16(void *in, void *inout, int *len, MPI_Datatype *dt) {
    (void)dt;
    const uint16_t *a = in;
    uint16_t *b = inout;
    for (int i = 0; i < *len; i++) b[i] = dt_f32_to_bf16(dt_bf16_to_f32(a[i]) + dt_bf16_to_f32(b[i]));
}

static void sum_f16(void *in, void *inout, int *len, MPI_Datatype *dt) {
    (void)dt;
    const uint16_t *a = in;
    uint16_t *b = inout;
    for (int i = 0; i < *len; i++) b[i] = dt_f32_to_f16(dt_f16_to_f32(a[i]) + dt_f16_to_f32(b[i]));
}

int dt__half_ops_create(void) {
    int rc = MPI_Op_create(sum_bf16, 1, &op_bf16);
    if (rc == MPI_SUCCESS) rc = MPI_Op_create(sum_f16, 1, &op_f16);
    return rc;
}

void dt__half_ops_free(void) {
    if (op_bf16 != MPI_OP_NULL) MPI_Op_free(&op_bf16);
    if (op_f16 != MPI_OP_NULL) MPI_Op_free(&op_f16);
}

MPI_Datatype dt__mpi_type(dt_dtype t) { return t == DT_F32 ? MPI_FLOAT : MPI_UINT16_T; }

MPI_Op dt__mpi_sum(dt_dtype t) {
    switch (t) {
    case DT_BF16: return op_bf16;
    case DT_F16: return op_f16;
    default: return MPI_SUM;
    }
}

static inline float h2f(uint16_t x, dt_dtype t) { return t == DT_BF16 ? dt_bf16_to_f32(x) : dt_f16_to_f32(x); }
static inline uint16_t f2h(float x, dt_dtype t) { return t == DT_BF16 ? dt_f32_to_bf16(x) : dt_f32_to_f16(x); }

/* Invariant: every element is ((src0 + src1) + src2) + ... in float32,
 * whatever n or stride is: the per-element order never depends on blocking. */
void dt__sum_ranks(void *out, const void *src, int64_t n, int64_t stride, int nranks, dt_dtype t,
                   int avg_div) {
    if (n <= 0 || nranks <= 0) return;
    if (t == DT_F32) {
        float *o = out;
        const float *s = src;
        memcpy(o, s, (size_t)n * sizeof(float));
        for (int r = 1; r < nranks; r++) {
            const float *x = s + (int64_t)r * stride;
            for (int64_t i = 0; i < n; i++) o[i] += x[i];
        }
        if (avg_div > 0) {
            const float d = (float)avg_div;
            for (int64_t i = 0; i < n; i++) o[i] = o[i] / d;
        }
        return;
    }
    uint16_t *o = out;
    const uint16_t *s = src;
    enum { B = 512 };
    float acc[B];
    for (int64_t i0 = 0; i0 < n; i0 += B) {
        int64_t m = n - i0 < B ? n - i0 : B;
        for (int64_t j = 0; j < m; j++) acc[j] = h2f(s[i0 + j], t);
        for (int r = 1; r < nranks; r++) {
            const uint16_t *x = s + (int64_t)r * stride + i0;
            for (int64_t j = 0; j < m; j++) acc[j] += h2f(x[j], t);
        }
        if (avg_div > 0) {
            const float d = (float)avg_div;
            for (int64_t j = 0; j < m; j++) acc[j] = acc[j] / d;
        }
        for (int64_t j = 0; j < m; j++) o[i0 + j] = f2h(acc[j], t);
    }
}

void dt__scale_div(void *buf, int64_t n, dt_dtype t, int div) {
    const float d = (float)div;
    if (t == DT_F32) {
        float *o = buf;
        for (int64_t i = 0; i < n; i++) o[i] = o[i] / d;
        return;
    }
    uint16_t *o = buf;
    for (int64_t i = 0; i < n; i++) o[i] = f2h(h2f(o[i], t) / d, t);
}

/* Same arithmetic as dt__sum_ranks, element by element (so the same bits),
 * blocked through a float32 accumulator: every source element of a block is
 * read before out's block is written, so out may alias one source. */
void dt__sum_ptrs(void *out, const void *const *src, int64_t n, int nranks, dt_dtype t, int avg_div) {
    if (n <= 0 || nranks <= 0) return;
    enum { B = 512 };
    float acc[B];
    const float d = (float)avg_div;
    const int es = t == DT_F32 ? 4 : 2;
    for (int64_t i0 = 0; i0 < n; i0 += B) {
        int64_t m = n - i0 < B ? n - i0 : B;
        for (int r = 0; r < nranks; r++) {
            const char *x = (const char *)src[r] + (size_t)i0 * (size_t)es;
            if (t == DT_F32) {
                const float *f = (const float *)x;
                if (r == 0) for (int64_t j = 0; j < m; j++) acc[j] = f[j];
                else for (int64_t j = 0; j < m; j++) acc[j] += f[j];
            } else {
                const uint16_t *h = (const uint16_t *)x;
                if (r == 0) for (int64_t j = 0; j < m; j++) acc[j] = h2f(h[j], t);
                else for (int64_t j = 0; j < m; j++) acc[j] += h2f(h[j], t);
            }
        }
        if (avg_div > 0)
            for (int64_t j = 0; j < m; j++) acc[j] = acc[j] / d;
        char *o = (char *)out + (size_t)i0 * (size_t)es;
        if (t == DT_F32) memcpy(o, acc, (size_t)m * sizeof(float));
        else for (int64_t j = 0; j < m; j++) ((uint16_t *)o)[j] = f2h(acc[j], t);
    }
}
