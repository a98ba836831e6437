/* Attention's tiles (src/ops/att_tiles.h) as other builds compile them:
 * att_tiles_avx2.c is compiled without AVX-512 and att_tiles_scalar.c
 * without AVX at all (cmake/tests.cmake), so each holds the kernel that
 * such a build picks. Every includer gets both files' declarations; a file
 * that defines ATT_VARIANT(name) first also gets its definitions. */
#ifndef DT_TEST_ATT_TILES_VARIANT_H
#define DT_TEST_ATT_TILES_VARIANT_H
#include <stdint.h>
#define ATT_DECLARE(p)                                                                                          \
    void p##_nn(const float *A, int64_t lda, const float *B, int64_t ldb, int64_t K, float *C, int64_t ldc);    \
    void p##_tn(const float *A, int64_t lda, const float *B, int64_t ldb, int64_t K, float *C, int64_t ldc);    \
    void p##_transpose8(const float *src, int64_t lds, float *dst, int64_t ldd);                              \
    const char *p##_kernel(void);
ATT_DECLARE(avx2)
ATT_DECLARE(scalar)
#endif

#ifdef ATT_VARIANT
#include "ops/att_tiles.h"

void ATT_VARIANT(nn)(const float *A, int64_t lda, const float *B, int64_t ldb, int64_t K, float *C, int64_t ldc) {
    att_tile_nn(A, lda, B, ldb, K, C, ldc);
}
void ATT_VARIANT(tn)(const float *A, int64_t lda, const float *B, int64_t ldb, int64_t K, float *C, int64_t ldc) {
    att_tile_tn(A, lda, B, ldb, K, C, ldc);
}
void ATT_VARIANT(transpose8)(const float *src, int64_t lds, float *dst, int64_t ldd) {
    att_transpose8(src, lds, dst, ldd);
}
const char *ATT_VARIANT(kernel)(void) { return ATT_KERNEL; }
#endif
