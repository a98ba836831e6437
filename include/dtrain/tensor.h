/* dtrain/tensor.h — dense tensors, flat buffers and the RNG.
 *
 * A dt_tensor is a contiguous, row-major array of up to 4 dimensions. It either
 * owns its storage (dt_tensor_alloc) or is a *view* into memory owned by
 * someone else (dt_tensor_view): a parameter's value is a view into a flat
 * parameter buffer, its gradient a view into a flat gradient buffer, and DDP
 * buckets / ZeRO shards are ranges of those same flat buffers.
 *
 * Compute is float32. bf16 / fp16 exist as storage types for communication
 * (compressed gradient reduction) and checkpoints.
 */
#ifndef DTRAIN_TENSOR_H
#define DTRAIN_TENSOR_H

#include <stddef.h>
#include <stdint.h>
#include "dtrain/error.h"

/* DT_I32 holds integer model inputs (token ids) only: no conversion, not a
 * checkpoint or communication type. */
typedef enum dt_dtype { DT_F32 = 0, DT_BF16 = 1, DT_F16 = 2, DT_I32 = 3 } dt_dtype;
#define DT_MAX_DIMS 4

size_t dt_dtype_size(dt_dtype t);          /* bytes per element */
const char *dt_dtype_name(dt_dtype t);     /* safetensors spelling: "F32", "BF16", "F16", "I32" */
int dt_dtype_parse(const char *s, dt_dtype *out);   /* float types only: 0 ok, -1 unknown */

struct dt_node;
struct dt_param;

typedef struct dt_tensor {
    void *data;                    /* numel * dt_dtype_size(dtype) bytes */
    dt_dtype dtype;
    int ndim;                      /* 0 (scalar) .. DT_MAX_DIMS */
    int64_t shape[DT_MAX_DIMS];    /* unused trailing entries are 1 */
    int64_t numel;
    int owns_data;                 /* 1: free(data) in dt_tensor_free */
    /* ---- autograd (see autograd.h); zero for plain tensors ---- */
    int requires_grad;
    struct dt_tensor *grad;        /* same shape, F32; NULL until needed */
    struct dt_node *grad_fn;       /* producing node on the tape; NULL for leaves */
    struct dt_param *param;        /* set when this tensor is a parameter's value */
} dt_tensor;

/* Float32 data pointer (no check; use on F32 tensors). */
static inline float *dt_f32(const dt_tensor *t) { return (float *)t->data; }

int64_t dt_shape_numel(int ndim, const int64_t *shape);
/* The most elements a tensor may have (2^56: its bytes fit a size_t with room). */
#define DT_TENSOR_MAX_NUMEL ((int64_t)1 << 56)
/* Fill t's shape fields (no storage). Fails on ndim > 4, negative dims or
 * more than DT_TENSOR_MAX_NUMEL elements. */
dt_status dt_tensor_set_shape(dt_tensor *t, int ndim, const int64_t *shape);
/* Owned, zero-filled, 64-byte aligned. */
dt_status dt_tensor_alloc(dt_tensor *t, dt_dtype dtype, int ndim, const int64_t *shape);
/* Non-owning view of `data` (which must hold numel elements of dtype). */
void dt_tensor_view(dt_tensor *t, void *data, dt_dtype dtype, int ndim, const int64_t *shape);
void dt_tensor_free(dt_tensor *t);          /* frees owned data; resets fields */
int dt_tensor_same_shape(const dt_tensor *a, const dt_tensor *b);
/* "[8, 256, 384]" into buf. */
const char *dt_shape_str(const dt_tensor *t, char *buf, size_t n);

/* 64-byte aligned allocation helpers (NULL + message on failure). */
void *dt_alloc(size_t bytes);
void *dt_calloc(size_t bytes);
void dt_free(void *p);

/* ---- conversions for communication / storage ---- */
uint16_t dt_f32_to_bf16(float x);   /* round to nearest even; NaN preserved */
float dt_bf16_to_f32(uint16_t x);
uint16_t dt_f32_to_f16(float x);    /* IEEE half, round to nearest even, overflow -> inf */
float dt_f16_to_f32(uint16_t x);
void dt_convert(void *dst, dt_dtype dst_t, const void *src, dt_dtype src_t, size_t n);
/* dst[i] = src[i] rounded to dt (DT_BF16 or DT_F16, nearest even, as
 * dt_convert) and widened back to float32: the value a 16-bit copy holds,
 * in float32 storage. dst may be src. Any other dt copies. */
void dt_round_to(float *dst, const float *src, dt_dtype dt, size_t n);
/* The first of n finite floats that fp16 rounds to inf (|x| >= 65520,
 * halfway between its largest value 65504 and 2^16), or -1: where an fp16
 * copy or payload of them would stop being a number. */
int64_t dt_f16_first_overflow(const float *x, size_t n);

/* ---- flat buffers ----
 * A flat buffer is one allocation holding many tensors back to back.
 * Offsets are in elements. Layout decisions (order, padding) belong to the
 * caller (nn layout, DDP buckets, ZeRO shards). */
typedef struct dt_flat {
    float *data;
    size_t numel;
    int borrowed;   /* data belongs to someone else (e.g. node-shared memory): not freed here */
} dt_flat;
dt_status dt_flat_alloc(dt_flat *f, size_t numel);   /* zero-filled */
void dt_flat_free(dt_flat *f);                        /* then {NULL, 0, 0} */

/* ---- RNG: splitmix64 seeding + xoroshiro128** generator ----
 * Deterministic across platforms; state fits in a checkpoint. */
typedef struct dt_rng { uint64_t s[2]; } dt_rng;
void dt_rng_seed(dt_rng *r, uint64_t seed);
uint32_t dt_rng_u32(dt_rng *r);
float dt_rng_uniform(dt_rng *r);          /* [0, 1) */
float dt_rng_normal(dt_rng *r);           /* N(0, 1), Box-Muller */
uint64_t dt_rng_below(dt_rng *r, uint64_t n);  /* uniform in [0, n), n > 0 */

#endif
