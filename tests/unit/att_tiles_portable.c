/* Attention's micro-kernels as a build without AVX-512 compiles them: this
 * file is built with -mno-avx512f (cmake/tests.cmake), so att_tiles.h picks
 * its portable kernel here, and test_att_tiles.c compares it with the
 * kernel its own (native) build picks. */
#include "att_tiles_portable.h"
#include "ops/att_tiles.h"

#if defined(__AVX512F__)
#error "att_tiles_portable.c must be compiled without AVX-512"
#endif

void att_portable_nn(const float *A, int64_t lda, const float *B, int64_t ldb, int64_t K, float *C, int64_t ldc) {
    att_tile_nn(A, lda, B, ldb, K, C, ldc);
}

void att_portable_tn(const float *A, int64_t lda, const float *B, int64_t ldb, int64_t K, float *C, int64_t ldc) {
    att_tile_tn(A, lda, B, ldb, K, C, ldc);
}

void att_portable_transpose8(const float *src, int64_t lds, float *dst, int64_t ldd) {
    att_transpose8(src, lds, dst, ldd);
}
