/* The portable build of src/ops/att_tiles.h's kernels (att_tiles_portable.c). */
#ifndef DT_TEST_ATT_TILES_PORTABLE_H
#define DT_TEST_ATT_TILES_PORTABLE_H
#include <stdint.h>
void att_portable_nn(const float *A, int64_t lda, const float *B, int64_t ldb, int64_t K, float *C, int64_t ldc);
void att_portable_tn(const float *A, int64_t lda, const float *B, int64_t ldb, int64_t K, float *C, int64_t ldc);
void att_portable_transpose8(const float *src, int64_t lds, float *dst, int64_t ldd);
#endif
