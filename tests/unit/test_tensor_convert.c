/* dt_convert between float32 and bf16 / fp16: the array paths (vectorised
 * bf16, F16C fp16 where the CPU has it, split over threads) give the bits of
 * the scalar conversions for every number -- all 65536 16-bit patterns
 * widened, float32 patterns across the whole range rounded, lengths that are
 * not a multiple of the vector width -- and a few values checked by hand:
 * ties to even, fp16's overflow and subnormals. NaN stays NaN (F16C keeps a
 * payload the scalar code replaces). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "dtrain/tensor.h"

static float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

static void check_widen(dt_dtype t) {
    enum { N = 3 * 65536 + 5 };   /* every pattern, more than once: > 65536 takes the threaded split */
    uint16_t *h = malloc(N * sizeof *h);
    float *f = malloc(N * sizeof *f);
    for (uint32_t i = 0; i < N; i++) h[i] = (uint16_t)(i * 40503u);   /* odd multiplier: all 65536 per 65536 */
    dt_convert(f, DT_F32, h, t, N);
    for (uint32_t i = 0; i < N; i++) {
        float want = t == DT_BF16 ? dt_bf16_to_f32(h[i]) : dt_f16_to_f32(h[i]);
        if (isnan(want)) assert_true(isnan(f[i]));
        else assert_memory_equal(&want, &f[i], 4);
    }
    free(h);
    free(f);
}

static void check_round(dt_dtype t) {
    size_t n = 1 << 20;   /* > 65536: the threaded split; stride through all 2^32 patterns */
    float *f = malloc((n + 5) * sizeof *f);
    uint16_t *h = malloc((n + 5) * sizeof *h);
    for (size_t i = 0; i < n + 5; i++) f[i] = u2f((uint32_t)(i * 4093u + (i >> 7)) * 1021u);
    for (size_t len = n + 5; len >= n - 3; len--) {   /* tails of 1..7 after the vector loop */
        memset(h, 0, (n + 5) * sizeof *h);
        dt_convert(h, t, f, DT_F32, len);
        for (size_t i = 0; i < len; i++) {
            uint16_t want = t == DT_BF16 ? dt_f32_to_bf16(f[i]) : dt_f32_to_f16(f[i]);
            if (isnan(f[i])) assert_true(t == DT_BF16 ? isnan(dt_bf16_to_f32(h[i])) : isnan(dt_f16_to_f32(h[i])));
            else assert_int_equal(h[i], want);
        }
        if (len == n - 3) break;
    }
    free(f);
    free(h);
}

static void test_bf16_widen(void **s) { (void)s; check_widen(DT_BF16); }
static void test_f16_widen(void **s) { (void)s; check_widen(DT_F16); }
static void test_bf16_round(void **s) { (void)s; check_round(DT_BF16); }
static void test_f16_round(void **s) { (void)s; check_round(DT_F16); }

/* dt_round_to: the bits of the scalar conversion there and back, in place
 * and into another buffer, across the threaded split and odd tails */
static void check_round_to(dt_dtype t) {
    size_t n = (1 << 20) + 3;
    float *f = malloc(n * sizeof *f), *out = malloc(n * sizeof *out), *in = malloc(n * sizeof *in);
    for (size_t i = 0; i < n; i++) f[i] = u2f((uint32_t)(i * 4093u + (i >> 7)) * 1021u);
    memcpy(in, f, n * sizeof *f);
    dt_round_to(out, f, t, n);
    dt_round_to(in, in, t, n);
    assert_memory_equal(in, out, n * sizeof *out);
    for (size_t i = 0; i < n; i++) {
        float want = t == DT_BF16 ? dt_bf16_to_f32(dt_f32_to_bf16(f[i])) : dt_f16_to_f32(dt_f32_to_f16(f[i]));
        if (isnan(want)) assert_true(isnan(out[i]));
        else assert_memory_equal(&want, &out[i], 4);
    }
    dt_round_to(out, f, DT_F32, 5);   /* any other type copies */
    assert_memory_equal(out, f, 5 * sizeof *f);
    free(f);
    free(out);
    free(in);
}
static void test_round_to(void **s) { (void)s; check_round_to(DT_BF16); check_round_to(DT_F16); }

/* dt_f16_first_overflow: the first finite float whose fp16 conversion is
 * inf (the converter is the reference, on values around the boundary and
 * non-finite ones, which are skipped) */
static void test_f16_first_overflow(void **s) {
    (void)s;
    const float edge = 65520.0f;
    float x[] = {1.0f, 65504.0f, nextafterf(edge, 0.0f), -nextafterf(edge, 0.0f), INFINITY, NAN, -INFINITY,
                 -edge, edge, 1e30f};
    size_t n = sizeof x / sizeof *x;
    for (size_t from = 0; from < n; from++) {
        int64_t want = -1;
        for (size_t k = from; k < n && want < 0; k++)
            if (isfinite(x[k]) && (dt_f32_to_f16(x[k]) & 0x7fffu) == 0x7c00u) want = (int64_t)(k - from);
        assert_int_equal(dt_f16_first_overflow(x + from, n - from), want);
    }
    assert_int_equal(dt_f16_first_overflow(x, 7), -1);   /* up to the non-finite ones: none */
    assert_int_equal(dt_f16_first_overflow(x, 8), 7);     /* -65520 */
}

static void test_by_hand(void **s) {
    (void)s;
    /* bf16 keeps 7 fraction bits: 1 + 2^-8 is a tie (to 1), 1 + 3 * 2^-8 too (to 1 + 2^-6) */
    float in[8] = {1.0f + 1.0f / 256, 1.0f + 3.0f / 256, 1.0f + 1.0f / 128 + 1.0f / 1024, -2.5f,
                   65504.0f, 65520.0f, 1.0f / 16777216, 3.0f / 33554432};
    uint16_t b[8], h[8];
    dt_convert(b, DT_BF16, in, DT_F32, 8);
    dt_convert(h, DT_F16, in, DT_F32, 8);
    assert_int_equal(b[0], 0x3f80);   /* 1.0 */
    assert_int_equal(b[1], 0x3f82);   /* 1 + 2^-6 */
    assert_int_equal(b[2], 0x3f81);   /* 1 + 2^-7 (above the tie) */
    assert_int_equal(b[3], 0xc020);   /* -2.5 exact */
    assert_int_equal(h[3], 0xc100);   /* -2.5 */
    assert_int_equal(h[4], 0x7bff);   /* 65504: the largest half */
    assert_int_equal(h[5], 0x7c00);   /* 65520 rounds up to inf */
    assert_int_equal(h[6], 0x0001);   /* 2^-24: the smallest subnormal */
    assert_int_equal(h[7], 0x0002);   /* 1.5 * 2^-24: a tie, to even (2 units) */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bf16_widen), cmocka_unit_test(test_f16_widen), cmocka_unit_test(test_bf16_round),
        cmocka_unit_test(test_f16_round), cmocka_unit_test(test_by_hand), cmocka_unit_test(test_round_to),
        cmocka_unit_test(test_f16_first_overflow),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
