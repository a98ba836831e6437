/* dtrain/ops.h — differentiable ops. Each takes the graph, returns a new
 * arena tensor (NULL + error message on bad shapes), and records its backward.
 * All F32, contiguous, row-major. GEMMs go through dt_sgemm; everything
 * else is an OpenMP loop. Shapes are written [dim0, dim1, ...].
 *
 * Inputs that carry data but no gradient (token ids, labels) are plain
 * int32 arrays owned by the caller; they must stay alive until backward.
 */
#ifndef DTRAIN_OPS_H
#define DTRAIN_OPS_H

#include "dtrain/autograd.h"

/* ---- floating-point mode of the compute threads ----
 * Denormal floats (|x| < 1.2e-38) take a slow path in x86 SIMD arithmetic.
 * Late in training, gradients and AdamW's second moments underflow into that
 * range and backward and the optimizer slow down several-fold
 * (docs/PERFORMANCE.md). on = 1 sets flush-to-zero and
 * denormals-are-zero on the calling thread and on every OpenMP worker (call
 * it after choosing the thread count); 0 restores IEEE behaviour. The trainer
 * turns it on unless dt_train_opts.keep_denormals. DT_EINVAL off x86. */
dt_status dt_cpu_set_flush_denormal(int on);
int dt_cpu_flush_denormal(void);   /* 1 if the calling thread flushes */

/* ---- the GEMM backend: which kernels run ----
 * GEMMs go through OpenBLAS, whose kernel family ("core") is chosen when the
 * library loads, from a table of CPU models. On a CPU newer than the table it
 * silently falls back to SSE kernels (~4x slower). dt_blas_fix_core, called
 * first thing in main() (the CLI and the benches do), re-executes the program
 * with OPENBLAS_CORETYPE set to the family the CPU supports when OpenBLAS chose
 * a lower one; it returns when nothing needs fixing, when the user set
 * OPENBLAS_CORETYPE (the user's choice always wins), after one re-exec, or if
 * exec fails. A program that does not call it gets, from the trainer, a
 * one-line warning naming the fix (dt_blas_warn_fallback). */
typedef enum dt_isa { DT_ISA_SSE = 0, DT_ISA_AVX, DT_ISA_AVX2, DT_ISA_AVX512 } dt_isa;
typedef struct dt_cpu_isa {
    dt_isa isa;   /* widest vector ISA the CPU and OS offer (AVX2 = AVX2+FMA; AVX-512 = F+BW+VL+DQ) */
    int amd;
} dt_cpu_isa;
typedef enum dt_blas_action { DT_BLAS_KEEP = 0, DT_BLAS_REEXEC } dt_blas_action;
typedef struct dt_blas_info {
    char backend[32];      /* "OpenBLAS 0.3.21" */
    char core[32];         /* kernel family in use, e.g. "SkylakeX" */
    dt_isa core_isa;       /* widest ISA that family uses */
    dt_cpu_isa cpu;
    char fix[32];          /* OPENBLAS_CORETYPE that would be faster; "" when the family fits the CPU */
    int user_set;          /* OPENBLAS_CORETYPE came from the user */
    int set_by_dtrain;     /* ... from dt_blas_fix_core's re-exec */
} dt_blas_info;

dt_cpu_isa dt_cpu_isa_detect(void);
const char *dt_isa_name(dt_isa isa);
/* The decision, pure: KEEP, or REEXEC with *fix = the OPENBLAS_CORETYPE to set
 * (SkylakeX for AVX-512, Haswell or Zen for AVX2, Sandybridge or Bulldozer for
 * AVX). *fix is also set (with KEEP) when the user's setting is the slower one.
 * Unknown family names are never judged slower. */
dt_blas_action dt_blas_core_decide(dt_cpu_isa cpu, const char *core, const char *user_coretype,
                                   const char **fix);
void dt_blas_info_get(dt_blas_info *out);
/* "OpenBLAS 0.3.21, SkylakeX kernels (AVX-512) on an AVX-512 CPU[ (OPENBLAS_CORETYPE set by ...)]" */
void dt_blas_describe(const dt_blas_info *b, char *buf, size_t n);
void dt_blas_fix_core(char **argv);
/* Logs the warning when the family is slower than the CPU allows and the
 * user did not choose it; returns 1 if it warned. */
int dt_blas_warn_fallback(void);

/* ---- which library runs the GEMMs: OpenBLAS or oneDNN ----
 * Every GEMM goes through one call (dt_sgemm), which uses OpenBLAS or
 * oneDNN's dnnl_sgemm. The default is measured, not assumed: oneDNN on AMD
 * CPUs where it runs AVX-512 kernels (faster there, docs/PERFORMANCE.md),
 * OpenBLAS elsewhere. DTRAIN_GEMM=openblas|onednn in the environment, or
 * dt_gemm_set_backend before the first GEMM, overrides it. All ranks of a job
 * must use the same library: the CLI's ranks share one environment. */
typedef enum dt_gemm_backend { DT_GEMM_OPENBLAS = 0, DT_GEMM_ONEDNN = 1 } dt_gemm_backend;
/* The decision, pure: a non-empty user (DTRAIN_GEMM's value) wins, and an
 * unknown one is DT_EINVAL naming it; otherwise oneDNN when cpu.amd and
 * oneDNN's own ISA (onednn_isa) is AVX-512. */
dt_status dt_gemm_backend_decide(dt_cpu_isa cpu, dt_isa onednn_isa, const char *user, dt_gemm_backend *out);
dt_isa dt_onednn_isa(void);                 /* what oneDNN's kernels use here (ONEDNN_MAX_CPU_ISA caps it) */
dt_gemm_backend dt_gemm_backend_in_use(void);
const char *dt_gemm_backend_name(dt_gemm_backend b);   /* "openblas" / "onednn" */
dt_status dt_gemm_set_backend(const char *name);      /* "openblas" or "onednn" */
dt_status dt_gemm_backend_check(void);      /* DT_EINVAL if DTRAIN_GEMM names no backend */
/* The start-up line's text: dt_blas_describe's for OpenBLAS, or "oneDNN 2.6.3,
 * AVX-512 kernels on an AVX-512 CPU (who chose it)". */
void dt_gemm_describe(char *buf, size_t n);
/* Row-major C[M, N] = alpha * op(A)[M, K] · op(B)[K, N] + beta * C through the
 * backend in use (ta / tb nonzero: A / B stored transposed). */
void dt_sgemm(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
              const float *B, int64_t ldb, float beta, float *C, int64_t ldc);

/* ---- the precision of the matrix products (--precision) ----
 * DT_PREC_BF16: dt_sgemm rounds its two inputs to bfloat16 and multiplies
 * them with float32 accumulation and output (oneDNN's matmul); everything
 * else stays float32 (the weights' masters, LayerNorm, softmax, the loss, the
 * optimizer). It computes in bf16 only where that is faster: oneDNN on AMX
 * (measured 1.9-6x fp32 on W1/W2's linear GEMMs, conversions included);
 * elsewhere (bf16 without AMX ran at ~0.7x fp32) the products stay fp32.
 * DTRAIN_BF16=force computes bf16 numerics on every CPU, for tests: oneDNN's
 * kernels where it has them (AVX-512), else emulated (inputs rounded to
 * bf16, the fp32 GEMM: the same products, added in another order).
 * DT_PREC_FP16: dt_sgemm rounds its two inputs to IEEE half (nearest even;
 * beyond ±65504 they become ±inf, small ones subnormal or zero) and
 * multiplies them with float32 accumulation: fp16's numerics on every CPU,
 * computed by the fp32 GEMM (oneDNN 2.6 has no fp16 matmul on CPU), so at
 * fp32's speed plus the conversions. Train it with loss scaling (strategy.h).
 * Process-wide, set before training; every rank of a job must set the same. */
typedef enum dt_precision { DT_PREC_FP32 = 0, DT_PREC_BF16 = 1, DT_PREC_FP16 = 2 } dt_precision;
dt_status dt_gemm_set_precision(dt_precision p);
dt_precision dt_gemm_precision(void);
int dt_gemm_bf16_active(void);               /* bf16 set and computed in bf16 here */
int dt_gemm_bf16_available(void);            /* bf16 would be computed in bf16 here if set */
const char *dt_gemm_precision_describe(void);   /* the start-up line's words */
float dt_bf16_round(float f);                /* f rounded to bfloat16 (nearest even), as float */
float dt_fp16_round(float f);                /* f rounded to IEEE half (nearest even, overflow -> inf), as float */

/* Weight layout of a linear layer. */
typedef enum dt_wlayout {
    DT_W_OUT_IN = 0,  /* w[out, in]  (torch.nn.Linear; also a tied lm-head over wte[V, C]) */
    DT_W_IN_OUT = 1,  /* w[in, out]  (Hugging Face GPT-2 Conv1D) */
} dt_wlayout;

/* y[..., out] = x[..., in] · W (+ b[out]); leading dims flattened into N rows. */
dt_tensor *dt_op_linear(dt_graph *g, dt_tensor *x, dt_tensor *w, dt_tensor *b, dt_wlayout layout);
/* c[M, N] = a[M, K] · b[K, N]; also batched: a[Bt, M, K] · b[Bt, K, N]. */
dt_tensor *dt_op_matmul(dt_graph *g, dt_tensor *a, dt_tensor *b);
/* y[N, C] = x[N, C] + b[C] (x may be any shape whose last dim is C). */
dt_tensor *dt_op_bias_add(dt_graph *g, dt_tensor *x, dt_tensor *b);
/* y = a + b, same shape (residual). */
dt_tensor *dt_op_add(dt_graph *g, dt_tensor *a, dt_tensor *b);
dt_tensor *dt_op_relu(dt_graph *g, dt_tensor *x);
/* GELU, tanh approximation (GPT-2). */
dt_tensor *dt_op_gelu(dt_graph *g, dt_tensor *x);
/* LayerNorm over the last dim C: w[C], b[C]. */
dt_tensor *dt_op_layernorm(dt_graph *g, dt_tensor *x, dt_tensor *w, dt_tensor *b, float eps);
/* ---- fused ops: the bits of the unfused chain, fewer passes over memory ----
 * Each gives forward values and every gradient (also with the split backward
 * deferring the weight gradients) bitwise equal to the chain it replaces:
 * the same float operations in the same order, sharing the chain's kernels. */
/* gelu(linear(x, w, b, layout)): y[..., out]. The bias rides the GEMM exactly
 * as in dt_op_linear; GELU is one pass over the GEMM's output, which is kept
 * (the pre-activation backward needs). Backward computes GELU' * dy and the
 * bias gradient in one pass, then linear's GEMMs. b may be NULL. */
dt_tensor *dt_op_linear_gelu(dt_graph *g, dt_tensor *x, dt_tensor *w, dt_tensor *b, dt_wlayout layout);
/* layernorm(x + h, w, b, eps), returning x + h through *sum (the residual
 * stream, for the next residual add): s = x + h and its LayerNorm in one pass
 * over the rows. x, h same shape, w[C], b[C] (b may be NULL), C = last dim.
 * Backward adds s's incoming gradient to LayerNorm's input gradient in the
 * same pass and accumulates the sum into x's and h's gradients; s's own
 * gradient buffer then holds only what s's other consumers gave it (read it
 * after backward and LayerNorm's part is missing). */
dt_tensor *dt_op_add_layernorm(dt_graph *g, dt_tensor *x, dt_tensor *h, dt_tensor *w, dt_tensor *b, float eps,
                               dt_tensor **sum);
/* Softmax over the last dim. */
dt_tensor *dt_op_softmax(dt_graph *g, dt_tensor *x);
/* Fused causal multi-head self-attention.
 * qkv[B, T, 3C] laid out as [q | k | v], each C = n_head * hs -> y[B, T, C].
 * Keeps 2 floats per row and head for backward, which recomputes the
 * probabilities: no [T, T] per head is held across the batch. */
dt_tensor *dt_op_attention(dt_graph *g, dt_tensor *qkv, int n_head);
/* y[n, C] = w[ids[i], :]; w[V, C]. ids out of range -> error. Output shape is
 * given by (ndim, shape) whose numel / C must equal n. */
dt_tensor *dt_op_embedding(dt_graph *g, dt_tensor *w, const int32_t *ids, int64_t n,
                           int ndim, const int64_t *shape);
/* Mean softmax cross-entropy over rows: logits[N, V], targets[N] (int32,
 * target < 0 = ignored row). Returns a scalar (ndim 0). Fused: the backward
 * is softmax - onehot, no separate probability tensor is kept beyond the arena. */
dt_tensor *dt_op_cross_entropy(dt_graph *g, dt_tensor *logits, const int32_t *targets);
/* The same loss, but backward writes d(logits) over the logits' storage
 * (no second [N, V] buffer: for a language model's head the largest tensor
 * of the step). Only for a caller that knows nothing reads the logits'
 * values after this op: after backward they hold their gradient. The
 * gradient is bitwise the one dt_op_cross_entropy gives. */
dt_tensor *dt_op_cross_entropy_consume(dt_graph *g, dt_tensor *logits, const int32_t *targets);
/* 2-D convolution, x[N, C, H, W], w[OC, C, KH, KW], b[OC] or NULL.
 * oneDNN's primitives (im2col + GEMM where oneDNN cannot). -> [N, OC, OH, OW]. */
dt_tensor *dt_op_conv2d(dt_graph *g, dt_tensor *x, dt_tensor *w, dt_tensor *b, int stride, int pad);
/* The convolution backend: "onednn" (default) or "im2col" (the environment's
 * DTRAIN_CONV=im2col sets it too; for comparisons). A geometry oneDNN cannot
 * serve falls back to im2col. dt_conv_backend names the one in use:
 * "oneDNN X.Y.Z" or "im2col + OpenBLAS". */
dt_status dt_conv_set_backend(const char *name);
const char *dt_conv_backend(void);
/* Max pool, square window k, stride s, no padding. x[N, C, H, W]. */
dt_tensor *dt_op_maxpool2d(dt_graph *g, dt_tensor *x, int k, int s);

/* BatchNorm over x[N, C, S...] (per channel C, statistics over N and S).
 * Training (dt_graph_training): normalise with batch statistics and update
 * running_mean / running_var (unbiased var) with `momentum`; eval: use the
 * running statistics. `sync` (may be NULL) all-reduces the per-channel
 * statistics across ranks (SyncBatchNorm): called with a float array of
 * length n and must replace it by its sum over ranks; it also sums *count
 * over ranks (in: local count). Called twice in a training forward (the sums
 * of x, then of (x - mean)^2 around the global mean) and once in backward. */
typedef dt_status (*dt_bn_sync_fn)(float *data, int64_t n, double *count, void *user);
typedef struct dt_bn_sync { dt_bn_sync_fn fn; void *user; } dt_bn_sync;
dt_tensor *dt_op_batchnorm(dt_graph *g, dt_tensor *x, dt_tensor *gamma, dt_tensor *beta,
                           dt_tensor *running_mean, dt_tensor *running_var,
                           float momentum, float eps, const dt_bn_sync *sync);

/* Inverted dropout keyed by position: y = x * keep / (1 - p).
 * x[R, ...] (any rank >= 1): R rows (samples), E = numel / R elements each
 * (GPT-2's [B, T, C]: element (t, c) of row b is e = t * C + c).
 * row_keys[R]: one key per row, normally dt_dropout_row_key(seed, step,
 * sample); site: which dropout of the model this is, dt_dropout_site
 * (GPT-2: (layer, 0) after attention, (layer, 1) after the MLP, (-1, 0) on
 * the embedding).
 * Element e of row b is kept iff h(row_keys[b], site, e) >= p * 2^32, where h
 * is dt_dropout_hash: the mask is a pure function of (row key, site, e) -
 * not of a generator's state, the thread count, the batch the row is in or
 * its place there - so one process, --accum, DDP, ZeRO, pipeline stages and
 * a recompute's replay all draw the same mask for the same sample.
 * Identity (returns x, nothing recorded) when !training or p == 0; then
 * row_keys may be NULL. Errors (DT_EINVAL): p outside [0, 1), x not F32,
 * row_keys NULL in training, E >= 2^32. The mask (uint8 [numel]) is saved for
 * backward: dx += dy * keep * (1 / (1 - p)), the forward's float scale. */
dt_tensor *dt_op_dropout(dt_graph *g, dt_tensor *x, float p, const uint64_t *row_keys, uint64_t site);
/* The same on a shard of each row: x's row b holds elements [offset,
 * offset + E) of the whole row b (sequence parallelism: positions [r S,
 * r S + S) of [T, C] are elements from r S C), so element e is kept iff
 * h(row_keys[b], site, offset + e) >= p * 2^32: the mask of the whole row's
 * same element. offset + E must stay below 2^32. offset 0 = dt_op_dropout. */
dt_tensor *dt_op_dropout_at(dt_graph *g, dt_tensor *x, float p, const uint64_t *row_keys, uint64_t site,
                            int64_t offset);
/* Row key of a sample: splitmix64-mixed (seed, step, sample), every input
 * bit reaching every output bit; distinct inputs collide with probability
 * ~2^-64. step: the optimizer step (0-based) the forward belongs to;
 * sample: the sample's position in the epoch's global order, offset by
 * epoch * (samples per epoch) (dtrain's trainer: see train.h). */
uint64_t dt_dropout_row_key(uint64_t seed, uint64_t step, uint64_t sample);
/* Site id of dropout k of layer l (l = -1: before the first layer). */
static inline uint64_t dt_dropout_site(int layer, int k) { return (uint64_t)(int64_t)(layer + 1) * 16u + (uint64_t)k; }
/* The per-element hash behind the mask: uniform 32-bit value of (row key,
 * site, element). The (row key, site) pair is folded by splitmix64 into a
 * 64-bit stream key; the element goes through a bijective 32-bit mixer
 * (Wellons' lowbias32) keyed by it, so within one row and site distinct
 * elements never share a draw; about 8 integer ops per element (vectorizes). */
uint32_t dt_dropout_hash(uint64_t row_key, uint64_t site, uint32_t elem);
/* Same data, new shape (numel must match). */
dt_tensor *dt_op_reshape(dt_graph *g, dt_tensor *x, int ndim, const int64_t *shape);
/* [N, ...] -> [N, rest]. */
dt_tensor *dt_op_flatten(dt_graph *g, dt_tensor *x);

/* ---- tensor parallelism (Megatron's f and g) ----
 * The collective comes through a callback the parallel layer fills from a
 * process group (src/parallel/tp/), since ops sit below dist. allreduce_sum
 * sums n floats in place over the group's `size` ranks, blocking, and must
 * give every rank the same bits; allreduce_max takes the elementwise maximum
 * (the vocabulary-parallel ops below need it). size 1: no call. */
typedef struct dt_tp_comm {
    int rank, size;
    dt_status (*allreduce_sum)(void *ctx, float *buf, int64_t n);
    void *ctx;
    dt_status (*allreduce_max)(void *ctx, float *buf, int64_t n);
    /* Sequence parallelism (the ops below need them; NULL otherwise). Both
     * see a buffer as `rows` blocks and move the middle dim of [rows, size, n]:
     * allgather: in [rows, n] (this rank's) -> out [rows, size, n], out[j][r]
     *   = rank r's in[j]; rows = 1 is a plain all-gather.
     * reduce_scatter: in [rows, size, n] -> out [rows, n], out[j] = sum over
     *   ranks r' of their in[j][rank], in rank order (the same bits as the
     *   all-reduce would give that slice on every rank).
     * in and out do not overlap; blocking, collective over the group. */
    dt_status (*allgather)(void *ctx, const float *in, float *out, int64_t n, int64_t rows);
    dt_status (*reduce_scatter)(void *ctx, const float *in, float *out, int64_t n, int64_t rows);
} dt_tp_comm;
/* f: y = x; backward dx += sum over the group of dy (before a column-parallel linear). */
dt_tensor *dt_op_tp_copy(dt_graph *g, dt_tensor *x, const dt_tp_comm *c);
/* g: y = sum over the group of x; backward dx += dy (after a row-parallel linear).
 * c must outlive the tape's backward. Both are collective over the group. */
dt_tensor *dt_op_tp_reduce(dt_graph *g, dt_tensor *x, const dt_tp_comm *c);
/* Sequence parallelism (Megatron-LM's): outside the split layers rank r
 * holds positions [r S, r S + S) of every sample, S = T / size, as a
 * contiguous x[B, S, ...]. The two boundaries that replace f and g:
 * tp_gather_seq (before a column-parallel linear, in place of tp_copy):
 *   y[B, size S, ...] = the group's shards along dim 1, in rank order;
 *   backward dx += reduce-scatter of dy along dim 1 (the sum over the
 *   group of every rank's gradient of this rank's positions).
 * tp_scatter_seq (after a row-parallel linear, in place of tp_reduce):
 *   y[B, T / size, ...] = this rank's positions of the group's sum of
 *   x[B, T, ...] (T divisible by size); backward dx += all-gather of dy.
 * x has >= 2 dims; c needs allgather and reduce_scatter (size > 1) and
 * must outlive the tape's backward. Size 1: copies, no call. */
dt_tensor *dt_op_tp_gather_seq(dt_graph *g, dt_tensor *x, const dt_tp_comm *c);
dt_tensor *dt_op_tp_scatter_seq(dt_graph *g, dt_tensor *x, const dt_tp_comm *c);

/* ---- vocabulary parallelism (src/ops/vocab_parallel.c) ----
 * A [V, C] table split by rows over a group of T ranks: rank r holds rows
 * [r n, (r + 1) n), n = ceil(V / T) (dt_vocab_part); rows past V are padding
 * (zeros, never looked up, never counted by the loss). */
static inline int64_t dt_vocab_part(int64_t V, int T) { return T > 1 ? (V + T - 1) / T : V; }
/* Embedding over rows [start, start + w rows) of a larger table: y[i] = w[ids[i] - start]
 * for ids in that range, 0 for the others (another rank's); backward adds
 * into the rows looked up only. ids < 0: error. Sum over the group with
 * dt_op_tp_reduce to get the whole table's lookup. */
dt_tensor *dt_op_embedding_rows(dt_graph *g, dt_tensor *w, int64_t start, const int32_t *ids, int64_t n, int ndim,
                                const int64_t *shape);
/* Mean cross-entropy over logits split by columns: logits[N, n] are rank
 * c->rank's columns [rank n, rank n + n) of the whole [N, V] (columns >= V:
 * padding, ignored); targets[N] global (< 0: ignored row). Max, sum of exp
 * and the target's logit are all-reduced over the group (3 N floats), so no
 * rank holds [N, V]; every rank returns the same scalar. Backward (no
 * communication): dx = s (softmax - onehot) on this rank's columns, 0 on
 * padding. _consume writes dx over the logits as dt_op_cross_entropy_consume. */
dt_tensor *dt_op_vocab_parallel_cross_entropy(dt_graph *g, dt_tensor *logits, const int32_t *targets, int64_t V,
                                              const dt_tp_comm *c);
dt_tensor *dt_op_vocab_parallel_cross_entropy_consume(dt_graph *g, dt_tensor *logits, const int32_t *targets,
                                                      int64_t V, const dt_tp_comm *c);
/* Rows of the split logits (as above) whose argmax over the whole V equals
 * labels[row]; ties go to the lowest global column, as dt_count_correct's
 * first argmax. Collective (2 N floats); -1 + error on bad input or a failed
 * collective. */
int64_t dt_count_correct_vocab_parallel(const dt_tensor *logits, const int32_t *labels, int64_t V,
                                        const dt_tp_comm *c);

/* ---- non-differentiable helpers ---- */
/* argmax over the last dim of logits[N, V]; returns number of rows equal to labels. */
int64_t dt_count_correct(const dt_tensor *logits, const int32_t *labels);

#endif
