/* Attention's register-blocked tiles (src/ops/att_tiles.h) against their
 * definition: every output is the fma chain over k = 0 .. K-1 in order,
 * starting from +0 -- the same bits whichever kernel the build picks. This
 * build's kernel (AVX-512 where the compiler targets it), a build's without
 * AVX-512 (AVX2 + FMA where available) and a build's without AVX (portable
 * C) -- att_tiles_variant.h -- are each compared with that chain, byte for
 * byte, over K from 1 to 300, padded strides and inputs with exact zeros (the
 * causal mask's), so a kernel that reorders the sum (split accumulators, a
 * blocked k) fails here. Plus the 8 x 8 transpose, all three ways. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "att_tiles_variant.h"
#include "ops/att_tiles.h"

typedef void (*tile_fn)(const float *, int64_t, const float *, int64_t, int64_t, float *, int64_t);

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
/* uniform in [-1, 1), a quarter of the values exactly 0 */
static float draw(void) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    uint32_t r = (uint32_t)(rng_state >> 33);
    if ((r & 3) == 0) return 0.0f;
    return (float)(r >> 8) / (float)(1u << 22) - 1.0f;
}

/* C[r][c] by definition: acc = +0, then acc = fma(a(r, k), B[k][c], acc) for k in order */
static void reference(int tn, const float *A, int64_t lda, const float *B, int64_t ldb, int64_t K, float *C,
                      int64_t ldc) {
    for (int r = 0; r < ATT_R; r++)
        for (int c = 0; c < ATT_C; c++) {
            float acc = 0.0f;
            for (int64_t k = 0; k < K; k++) acc = fmaf(tn ? A[k * lda + r] : A[r * lda + k], B[k * ldb + c], acc);
            C[r * ldc + c] = acc;
        }
}

static void check_kernel(int tn, tile_fn fn) {
    static const int64_t Ks[] = {1, 2, 3, 7, 8, 9, 31, 32, 33, 64, 65, 100, 255, 256, 300};
    for (size_t t = 0; t < sizeof Ks / sizeof Ks[0]; t++) {
        int64_t K = Ks[t];
        int64_t lda = tn ? ATT_R + 5 : K + 3, ldb = ATT_C + 7, ldc = ATT_C + 2;   /* padded, unaligned */
        int64_t na = tn ? K * lda : ATT_R * lda;
        float *A = malloc(sizeof(float) * (size_t)na), *B = malloc(sizeof(float) * (size_t)(K * ldb));
        float *got = calloc((size_t)(ATT_R * ldc), sizeof(float)), *want = calloc((size_t)(ATT_R * ldc), sizeof(float));
        assert_non_null(A);
        assert_non_null(B);
        assert_non_null(got);
        assert_non_null(want);
        for (int64_t i = 0; i < na; i++) A[i] = draw();
        for (int64_t i = 0; i < K * ldb; i++) B[i] = draw();
        reference(tn, A, lda, B, ldb, K, want, ldc);
        fn(A, lda, B, ldb, K, got, ldc);
        for (int r = 0; r < ATT_R; r++)
            if (memcmp(got + r * ldc, want + r * ldc, sizeof(float) * ATT_C) != 0) {
                for (int c = 0; c < ATT_C; c++)
                    if (memcmp(&got[r * ldc + c], &want[r * ldc + c], sizeof(float)) != 0)
                        fail_msg("%s K=%lld: C[%d][%d] = %.9g, the fma chain gives %.9g", tn ? "tn" : "nn",
                                 (long long)K, r, c, (double)got[r * ldc + c], (double)want[r * ldc + c]);
            }
        free(A);
        free(B);
        free(got);
        free(want);
    }
}

/* one kernel of one build: name, 1 for tn (else nn), the function */
typedef struct tile_case {
    const char *name;
    int tn;
    tile_fn fn;
} tile_case;

static const tile_case cases[] = {
    {"this build, nn", 0, att_tile_nn}, {"this build, tn", 1, att_tile_tn},
    {"no AVX-512, nn", 0, avx2_nn},     {"no AVX-512, tn", 1, avx2_tn},
    {"no AVX, nn", 0, scalar_nn},       {"no AVX, tn", 1, scalar_tn},
};

static void test_kernel(void **state) {
    const tile_case *c = *state;
    check_kernel(c->tn, c->fn);
}

/* every transpose: dst[c][j] == src[j][c], nothing outside the block written */
static void test_transpose8(void **state) {
    (void)state;
    enum { LDS = 13, LDD = 11 };
    void (*const fns[3])(const float *, int64_t, float *, int64_t) = {att_transpose8, avx2_transpose8,
                                                                      scalar_transpose8};
    float src[8 * LDS], dst[8 * LDD];
    for (int i = 0; i < 8 * LDS; i++) src[i] = (float)i + 0.5f;
    for (int v = 0; v < 3; v++) {
        for (int i = 0; i < 8 * LDD; i++) dst[i] = -1.0f;
        fns[v](src, LDS, dst, LDD);
        for (int c = 0; c < 8; c++)
            for (int j = 0; j < LDD; j++) assert_true(dst[c * LDD + j] == (j < 8 ? src[j * LDS + c] : -1.0f));
    }
}

int main(void) {
    print_message("kernels: this build %s, without AVX-512 %s, without AVX %s\n", ATT_KERNEL, avx2_kernel(),
                  scalar_kernel());
    enum { NK = sizeof cases / sizeof cases[0] };
    struct CMUnitTest tests[NK + 1];
    for (int i = 0; i < NK; i++)
        tests[i] = (struct CMUnitTest){
            .name = cases[i].name, .test_func = test_kernel, .initial_state = (void *)&cases[i]};
    tests[NK] = (struct CMUnitTest)cmocka_unit_test(test_transpose8);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
