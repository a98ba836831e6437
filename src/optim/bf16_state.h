/* bfloat16 optimizer state (optim.h, dt_optim_state_dtype): the widening and
 * the rounding every state store goes through, inline because the kernels
 * call them per element. The same conversion as tensor.h's dt_f32_to_bf16 /
 * dt_bf16_to_f32 (round to nearest even on the upper 16 bits, NaN kept
 * quiet), which are out-of-line calls. */
#ifndef DTRAIN_OPTIM_BF16_STATE_H
#define DTRAIN_OPTIM_BF16_STATE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Kernels widen and round this many elements at a time into fp32 scratch on
 * the stack (a multiple of the AdamW vector width). */
#define DT_BF16_STATE_CHUNK 256

static inline float dt_bf16s_widen(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint16_t dt_bf16s_round(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);   /* NaN stays NaN */
    u += 0x7fffu + ((u >> 16) & 1u);   /* nearest, ties to even; the carry may reach inf (correct) */
    return (uint16_t)(u >> 16);
}

static inline void dt_bf16s_widen_n(float *restrict dst, const uint16_t *restrict src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = dt_bf16s_widen(src[i]);
}

static inline void dt_bf16s_round_n(uint16_t *restrict dst, const float *restrict src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = dt_bf16s_round(src[i]);
}

#endif
