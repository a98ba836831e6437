/* bf16 matrix products with fp32 accumulation (--precision bf16).
 *
 * dt_sgemm's contract stays float32 in and out; with the precision set to
 * bf16 the two inputs are rounded to bfloat16 (round to nearest even, NaN
 * kept) into scratch buffers and multiplied by oneDNN's matmul, which adds in
 * float32 and writes C = alpha * A·B + beta * C in float32. The weights stay
 * float32 masters everywhere else (the optimizer steps them); only the
 * product sees 16 bits, as autocast does.
 *
 * When it runs: only where oneDNN computes bf16 on AMX tiles. Measured on
 * Intel family 6 model 167 (docs/perf/bf16_gemm_model167.md): every W1 and
 * W2 linear GEMM 1.9-6x faster than fp32 including both conversions; without
 * AMX (avx512_core_bf16, as on model 207 or AMD Zen 4) bf16 ran at 0.65-0.7x
 * fp32, so there the products stay float32 and the start-up line says so.
 * DTRAIN_BF16=force computes bf16 numerics on every CPU, for tests and for
 * comparing with autocast: by oneDNN where it has bf16 kernels (AVX-512),
 * else emulated (gemm_rounded.c). Small products (M·N·K < 2^18) stay fp32:
 * the conversions and the primitive's set-up outweigh them.
 *
 * Emulated: both inputs rounded to bf16 and widened back to float32, then
 * the fp32 GEMM. A product of two bf16 values is exact in float32 (8 + 8
 * significant bits), so this is a bf16 product with fp32 accumulation, as
 * oneDNN's kernels compute; only the order of the additions may differ.
 *
 * Every rank of a job decides alike (the CPU model and the environment), so
 * DDP and ZeRO stay bitwise equal to one process at the same precision. */
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <oneapi/dnnl/dnnl.h>
#include "dtrain/error.h"
#include "ops_internal.h"

#define BF16_MIN_WORK (1 << 18)

static _Atomic int g_precision = DT_PREC_FP32;

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static dnnl_engine_t g_engine;
static dnnl_stream_t g_stream;
static int g_ready;       /* engine and stream made */
static int g_amx;         /* oneDNN's effective ISA has AMX bf16 */
static int g_possible;    /* oneDNN can run a bf16 matmul here (avx512_core at least) */
static int g_forced;      /* DTRAIN_BF16=force: bf16 numerics here, by oneDNN or emulated */

static void init_once(void) {
    unsigned isa = (unsigned)dnnl_get_effective_cpu_isa();
    g_amx = (isa & dnnl_cpu_isa_avx512_core_amx) == dnnl_cpu_isa_avx512_core_amx;
    g_possible = (isa & dnnl_cpu_isa_avx512_core) == dnnl_cpu_isa_avx512_core;
    const char *f = getenv("DTRAIN_BF16");
    g_forced = f && !strcmp(f, "force");
    if (dnnl_engine_create(&g_engine, dnnl_cpu, 0) != dnnl_success) return;
    if (dnnl_stream_create(&g_stream, g_engine, dnnl_stream_default_flags) != dnnl_success) {
        dnnl_engine_destroy(g_engine);
        return;
    }
    g_ready = 1;
}

dt_status dt_gemm_set_precision(dt_precision p) {
    if (p != DT_PREC_FP32 && p != DT_PREC_BF16 && p != DT_PREC_FP16)
        return DT_ERR(DT_EINVAL, "GEMM precision %d: expected fp32, bf16 or fp16", (int)p);
    atomic_store(&g_precision, (int)p);
    return DT_OK;
}

dt_precision dt_gemm_precision(void) { return (dt_precision)atomic_load(&g_precision); }

int dt_gemm_bf16_available(void) {
    pthread_once(&g_once, init_once);
    return (g_ready && g_possible && g_amx) || g_forced;
}

static int kernels(void) { return g_ready && g_possible; }   /* oneDNN computes bf16 here */

int dt_gemm_bf16_active(void) { return atomic_load(&g_precision) == DT_PREC_BF16 && dt_gemm_bf16_available(); }

const char *dt_gemm_precision_describe(void) {
    int p = atomic_load(&g_precision);
    if (p == DT_PREC_FP16)   /* gemm_fp16.c */
        return "fp16 matrix products with fp32 accumulation, computed by the fp32 GEMM (inputs rounded to fp16: "
               "fp16's numerics; oneDNN 2.6 has no fp16 matmul on CPU, so no speed-up)";
    if (p != DT_PREC_BF16) return "fp32 matrix products";
    pthread_once(&g_once, init_once);
    if (kernels() && g_amx) return "bf16 matrix products with fp32 accumulation (oneDNN on AMX)";
    if (kernels() && g_forced)
        return "bf16 matrix products with fp32 accumulation (DTRAIN_BF16=force: slower than fp32 without AMX)";
    if (g_forced)
        return "bf16 matrix products with fp32 accumulation (DTRAIN_BF16=force, emulated: inputs rounded to bf16, "
               "the fp32 GEMM; oneDNN has no bf16 kernels for this CPU)";
    if (!kernels()) return "--precision bf16: fp32 matrix products (oneDNN has no bf16 kernels for this CPU)";
    return "--precision bf16: fp32 matrix products (without AMX this CPU computes bf16 at ~0.7x fp32; "
           "DTRAIN_BF16=force overrides)";
}

/* Round to nearest even; NaN stays a (quiet) NaN. */
static inline uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float dt_bf16_round(float f) {
    uint32_t u = (uint32_t)to_bf16(f) << 16;
    float r;
    memcpy(&r, &u, sizeof r);
    return r;
}

/* rows x cols of src (leading dimension ld) into dst, compact */
static void convert(uint16_t *dst, const float *src, int64_t rows, int64_t cols, int64_t ld) {
#pragma omp parallel for schedule(static) if (rows * cols >= DT_OPS_PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        const float *s = src + r * ld;
        uint16_t *d = dst + r * cols;
        for (int64_t c = 0; c < cols; c++) d[c] = to_bf16(s[c]);
    }
}

/* per-thread scratch for the converted operands */
static _Thread_local uint16_t *tl_buf;
static _Thread_local size_t tl_cap;

static uint16_t *scratch(size_t n) {
    if (n > tl_cap) {
        uint16_t *b = realloc(tl_buf, n * sizeof *b);
        if (!b) return NULL;
        tl_buf = b;
        tl_cap = n;
    }
    return tl_buf;
}

int dt_ops_sgemm_bf16_applies(int64_t M, int64_t N, int64_t K) {
    return (double)M * (double)N * (double)K >= BF16_MIN_WORK && dt_gemm_bf16_active();
}

int dt_ops_sgemm_bf16(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                      const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    pthread_once(&g_once, init_once);
    if (!kernels()) return dt_ops_sgemm_rounded(DT_BF16, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    int64_t ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
    uint16_t *buf = scratch((size_t)(ar * ac + br * bc));
    if (!buf) return 0;
    uint16_t *a = buf, *b = buf + ar * ac;
    convert(a, A, ar, ac, lda);
    convert(b, B, br, bc, ldb);
    /* the operands as stored, compact: op(A)[m][k] and op(B)[k][n] by strides */
    dnnl_dims_t ad = {M, K}, bd = {K, N}, cd = {M, N};
    dnnl_dims_t as = {ta ? 1 : K, ta ? M : 1}, bs = {tb ? 1 : N, tb ? K : 1}, cs = {ldc, 1};
    dnnl_memory_desc_t amd, bmd, cmd;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t po = NULL;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_primitive_t prim = NULL;
    dnnl_memory_t am = NULL, bm = NULL, cm = NULL;
    int ok = dnnl_memory_desc_init_by_strides(&amd, 2, ad, dnnl_bf16, as) == dnnl_success &&
             dnnl_memory_desc_init_by_strides(&bmd, 2, bd, dnnl_bf16, bs) == dnnl_success &&
             dnnl_memory_desc_init_by_strides(&cmd, 2, cd, dnnl_f32, cs) == dnnl_success &&
             dnnl_primitive_attr_create(&attr) == dnnl_success;
    if (ok && alpha != 1.0f) ok = dnnl_primitive_attr_set_output_scales(attr, 1, 0, &alpha) == dnnl_success;
    if (ok && beta != 0.0f) {
        ok = dnnl_post_ops_create(&po) == dnnl_success && dnnl_post_ops_append_sum(po, beta) == dnnl_success &&
             dnnl_primitive_attr_set_post_ops(attr, po) == dnnl_success;
    }
    dnnl_matmul_desc_t md;
    ok = ok && dnnl_matmul_desc_init(&md, &amd, &bmd, NULL, &cmd) == dnnl_success &&
         dnnl_primitive_desc_create(&pd, &md, attr, g_engine, NULL) == dnnl_success &&
         dnnl_primitive_create(&prim, pd) == dnnl_success &&
         dnnl_memory_create(&am, &amd, g_engine, a) == dnnl_success &&
         dnnl_memory_create(&bm, &bmd, g_engine, b) == dnnl_success &&
         dnnl_memory_create(&cm, &cmd, g_engine, C) == dnnl_success;
    if (ok) {
        dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}};
        sigset_t old;
        dt_ops_hold_signals(&old);   /* gemm_backend.c: oneDNN's kernels and signal frames */
        ok = dnnl_primitive_execute(prim, g_stream, 3, args) == dnnl_success &&
             dnnl_stream_wait(g_stream) == dnnl_success;
        pthread_sigmask(SIG_SETMASK, &old, NULL);
    }
    if (am) dnnl_memory_destroy(am);
    if (bm) dnnl_memory_destroy(bm);
    if (cm) dnnl_memory_destroy(cm);
    if (prim) dnnl_primitive_destroy(prim);
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (po) dnnl_post_ops_destroy(po);
    if (attr) dnnl_primitive_attr_destroy(attr);
    return ok;
}
