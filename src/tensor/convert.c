/* float32 <-> bf16 / fp16 conversions (round to nearest even). */
#include <math.h>
#include <string.h>
#include "dtrain/tensor.h"

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

void dt_convert(void *dst, dt_dtype dst_t, const void *src, dt_dtype src_t, size_t n) {
    if (dst_t == src_t) { memmove(dst, src, n * dt_dtype_size(src_t)); return; }
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
