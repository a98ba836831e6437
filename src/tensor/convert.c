/* float32 <-> bf16 / fp16 conversions (round to nearest even). dt_convert
 * runs the float32 <-> 16-bit arrays through loops the compiler vectorises
 * (bf16) or F16C (fp16, where the CPU has it: the same bits as the scalar
 * code for every number; a NaN stays a quiet NaN, its payload may differ). */
#include <cpuid.h>
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <string.h>
#include "dtrain/tensor.h"
#include "convert_internal.h"

static uint32_t f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

uint16_t dt_f32_to_bf16(float x) {
    uint32_t u = f2u(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);  /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float dt_bf16_to_f32(uint16_t x) { return u2f((uint32_t)x << 16); }

uint16_t dt_f32_to_f16(float x) {
    uint32_t u = f2u(x);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | 0x7e00u;                 /* NaN */
    if (a >= 0x477ff000u) return sign | 0x7c00u;                /* overflow (>= 65520) -> inf */
    if (a < 0x38800000u) {                                      /* subnormal or zero in half */
        /* value = a as float; half subnormal unit = 2^-24 */
        float f = u2f(a) * 16777216.0f;                         /* in units of 2^-24 */
        float r = nearbyintf(f);                                /* default rounding: nearest even */
        return sign | (uint16_t)r;
    }
    uint32_t mant = a & 0x7fffffu;
    int32_t exp = (int32_t)(a >> 23) - 127 + 15;
    uint32_t h = ((uint32_t)exp << 10) | (mant >> 13);
    uint32_t rem = mant & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;    /* carries into exponent correctly */
    return sign | (uint16_t)h;
}

float dt_f16_to_f32(uint16_t x) {
    uint32_t sign = (uint32_t)(x & 0x8000u) << 16;
    uint32_t exp = (x >> 10) & 0x1fu, mant = x & 0x3ffu;
    if (exp == 0) {
        float f = (float)mant / 16777216.0f;                    /* mant * 2^-24 */
        return sign ? -f : f;
    }
    if (exp == 31) return u2f(sign | 0x7f800000u | (mant << 13));
    return u2f(sign | ((exp - 15 + 127) << 23) | (mant << 13));
}

/* F16C from CPUID leaf 1 (ECX bit 29); "avx" also says the OS saves the YMM state. */
int dt_cpu_f16c(void) {
    static int hw = -1;   /* a race writes the same value */
    if (hw < 0) {
        unsigned a = 0, b = 0, c = 0, d = 0;
        int f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
        hw = f16c && __builtin_cpu_supports("avx");
    }
    return hw;
}

static void to_bf16_n(uint16_t *d, const float *s, size_t n) {
    for (size_t i = 0; i < n; i++) {   /* dt_f32_to_bf16, branch-free so that it vectorises */
        uint32_t u = f2u(s[i]);
        uint32_t r = (u & 0x7fffffffu) > 0x7f800000u ? (u | 0x00400000u) : u + 0x7fffu + ((u >> 16) & 1u);
        d[i] = (uint16_t)(r >> 16);
    }
}

static void from_bf16_n(float *d, const uint16_t *s, size_t n) {
    for (size_t i = 0; i < n; i++) d[i] = u2f((uint32_t)s[i] << 16);
}

__attribute__((target("avx,f16c"))) static void to_f16_hw(uint16_t *d, const float *s, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(void *)(d + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    for (; i < n; i++) d[i] = dt_f32_to_f16(s[i]);
}

__attribute__((target("avx,f16c"))) static void from_f16_hw(float *d, const uint16_t *s, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(s + i))));
    for (; i < n; i++) d[i] = dt_f16_to_f32(s[i]);
}

static void to_f16_n(uint16_t *d, const float *s, size_t n) {
    if (dt_cpu_f16c()) { to_f16_hw(d, s, n); return; }
    for (size_t i = 0; i < n; i++) d[i] = dt_f32_to_f16(s[i]);
}

static void from_f16_n(float *d, const uint16_t *s, size_t n) {
    if (dt_cpu_f16c()) { from_f16_hw(d, s, n); return; }
    for (size_t i = 0; i < n; i++) d[i] = dt_f16_to_f32(s[i]);
}

/* float32 <-> 16 bits, split in contiguous runs over the threads. */
static void convert_fast(void *dst, dt_dtype dst_t, const void *src, dt_dtype src_t, size_t n) {
#pragma omp parallel if (n > 65536)
    {
        size_t nt = (size_t)omp_get_num_threads(), t = (size_t)omp_get_thread_num();
        size_t lo = n * t / nt, m = n * (t + 1) / nt - lo;
        if (src_t == DT_F32) {
            if (dst_t == DT_BF16) to_bf16_n((uint16_t *)dst + lo, (const float *)src + lo, m);
            else to_f16_n((uint16_t *)dst + lo, (const float *)src + lo, m);
        } else {
            if (src_t == DT_BF16) from_bf16_n((float *)dst + lo, (const uint16_t *)src + lo, m);
            else from_f16_n((float *)dst + lo, (const uint16_t *)src + lo, m);
        }
    }
}

void dt_convert(void *dst, dt_dtype dst_t, const void *src, dt_dtype src_t, size_t n) {
    if (dst_t == src_t) { memmove(dst, src, n * dt_dtype_size(src_t)); return; }
    int half_src = src_t == DT_BF16 || src_t == DT_F16, half_dst = dst_t == DT_BF16 || dst_t == DT_F16;
    if ((src_t == DT_F32 && half_dst) || (half_src && dst_t == DT_F32)) { convert_fast(dst, dst_t, src, src_t, n); return; }
    #pragma omp parallel for schedule(static) if (n > 65536)
    for (size_t i = 0; i < n; i++) {
        float v;
        switch (src_t) {
        case DT_F32: v = ((const float *)src)[i]; break;
        case DT_BF16: v = dt_bf16_to_f32(((const uint16_t *)src)[i]); break;
        default: v = dt_f16_to_f32(((const uint16_t *)src)[i]); break;
        }
        switch (dst_t) {
        case DT_F32: ((float *)dst)[i] = v; break;
        case DT_BF16: ((uint16_t *)dst)[i] = dt_f32_to_bf16(v); break;
        default: ((uint16_t *)dst)[i] = dt_f32_to_f16(v); break;
        }
    }
}

/* 65520: halfway between fp16's largest value 65504 and 2^16, rounds to inf */
int64_t dt_f16_first_overflow(const float *x, size_t n) {
    for (size_t k = 0; k < n; k++)
        if (isfinite(x[k]) && fabsf(x[k]) >= 65520.0f) return (int64_t)k;
    return -1;
}

/* x rounded to dt and widened back, in chunks through a small 16-bit buffer;
 * contiguous runs over the threads, as convert_fast. */
void dt_round_to(float *dst, const float *src, dt_dtype dt, size_t n) {
    if (dt != DT_BF16 && dt != DT_F16) {
        if (dst != src) memmove(dst, src, n * sizeof(float));
        return;
    }
#pragma omp parallel if (n > 65536)
    {
        size_t nt = (size_t)omp_get_num_threads(), t = (size_t)omp_get_thread_num();
        size_t lo = n * t / nt, hi = n * (t + 1) / nt;
        uint16_t half[1024];
        for (size_t i = lo; i < hi; i += 1024) {
            size_t m = hi - i < 1024 ? hi - i : 1024;
            if (dt == DT_BF16) {
                to_bf16_n(half, src + i, m);
                from_bf16_n(dst + i, half, m);
            } else {
                to_f16_n(half, src + i, m);
                from_f16_n(dst + i, half, m);
            }
        }
    }
}
