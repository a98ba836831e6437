/* dtrain/optim.h — SGD and AdamW over ranges of flat buffers, clipping, LR schedules.
 *
 * The kernels step a contiguous element range [0, n) of a parameter buffer,
 * its gradient and its state: DDP steps the whole flat buffer, ZeRO only the
 * shard a rank owns. Weight decay is a per-range flag (callers split ranges
 * at parameter boundaries; dt_optimizer does this from a segment table).
 *
 * Semantics follow PyTorch:
 *   SGD:   g' = g + wd*p; buf = momentum*buf + g' (buf = g' on step 1);
 *          d = nesterov ? g' + momentum*buf : buf; p -= lr*d
 *   AdamW: p -= lr*wd*p; m = b1*m + (1-b1)g; v = b2*v + (1-b2)g^2;
 *          p -= lr * (m/(1-b1^t)) / (sqrt(v/(1-b2^t)) + eps)
 */
#ifndef DTRAIN_OPTIM_H
#define DTRAIN_OPTIM_H

#include <stddef.h>
#include <stdint.h>
#include "dtrain/autograd.h"
#include "dtrain/error.h"
#include "dtrain/nn.h"

typedef enum dt_optim_kind { DT_OPTIM_SGD = 0, DT_OPTIM_ADAMW = 1 } dt_optim_kind;

/* How the per-element state (AdamW's m and v, SGD's momentum) is stored.
 * BF16 halves the optimizer's memory: each step widens the stored value to
 * fp32, updates it with the fp32 arithmetic of the FP32 path and rounds the
 * result back to bfloat16 (nearest even, NaN kept) on every store; the
 * parameters (the fp32 masters) stay fp32. Round to nearest, not stochastic
 * rounding, as torchtitan and others store 16-bit moments: a run stays a
 * deterministic function of its inputs, the same in every layout.
 *   Range: bf16 keeps fp32's 8-bit exponent, so Adam's tiny second moments
 * (v ~ g^2, 1e-20 and far below) underflow no sooner than fp32 normals
 * (1.2e-38); only fp32 subnormals below bf16's smallest (9.2e-41) are lost,
 * and dtrain flushes denormals anyway unless --keep-denormals.
 *   Resolution: 8 significant bits, so a store moves a value by less than
 * half an ulp (2^-9..2^-8 relative) not at all. With beta2 = 0.999 the decay
 * 0.999 v is such a move: v does not shrink while g^2 stays below v, and grows
 * once (1 - beta2)(g^2 - v) passes half an ulp (g^2 > ~3v). v then lags high
 * after gradients shrink: smaller steps than fp32 state, never larger, never
 * a division by an underflowed v. m (beta1 = 0.9) and SGD momentum move by
 * 10% per step and are not held. Checkpoints hold the state widened to fp32
 * under the same names, so either storage resumes from either (loading into
 * BF16 rounds). */
typedef enum dt_optim_state_dtype { DT_OPTIM_STATE_FP32 = 0, DT_OPTIM_STATE_BF16 = 1 } dt_optim_state_dtype;

typedef struct dt_optim_cfg {
    dt_optim_kind kind;
    float lr;              /* base LR (the schedule scales it) */
    float weight_decay;
    float momentum;        /* SGD */
    int nesterov;          /* SGD */
    float beta1, beta2, eps;  /* AdamW */
    int state_dtype;       /* dt_optim_state_dtype: FP32 (0, default) or BF16 */
} dt_optim_cfg;
/* PyTorch-like defaults for kind: AdamW lr 1e-3, betas .9/.999, eps 1e-8, wd 0.01;
 * SGD lr 0.01, momentum 0, wd 0. */
dt_optim_cfg dt_optim_cfg_default(dt_optim_kind kind);
/* Rejects contradictions (nesterov without momentum, negative lr, betas outside [0,1)). */
dt_status dt_optim_cfg_validate(const dt_optim_cfg *c);
/* Number of state values per parameter element (SGD: 1 if momentum > 0 else 0; AdamW: 2). */
int dt_optim_state_per_elem(const dt_optim_cfg *c);
/* Bytes of optimizer state per parameter element: state_per_elem x (4 fp32, 2 bf16).
 * What every memory report and estimate counts. */
size_t dt_optim_state_bytes(const dt_optim_cfg *c);

/* Kernels on one range. `step` is 1-based (after increment). grad_scale
 * multiplies the gradient first (clipping / averaging); 1.0 = none.
 * `state` points at state_per_elem arrays of n floats each (state[0] = m or buf,
 * state[1] = v). OpenMP-parallel. */
void dt_sgd_step_range(const dt_optim_cfg *c, float lr, int decay, float *p, const float *g,
                       float *buf, size_t n, int64_t step, float grad_scale);
void dt_adamw_step_range(const dt_optim_cfg *c, float lr, int decay, float *p, const float *g,
                         float *m, float *v, size_t n, int64_t step, float grad_scale);
/* The same with bfloat16 state (dt_optim_state_dtype BF16): each element's
 * state is widened, updated by exactly the fp32 kernel's arithmetic, and
 * rounded back to bf16 (nearest even); p and g stay fp32. */
void dt_sgd_step_range_bf16(const dt_optim_cfg *c, float lr, int decay, float *p, const float *g,
                            uint16_t *buf, size_t n, int64_t step, float grad_scale);
void dt_adamw_step_range_bf16(const dt_optim_cfg *c, float lr, int decay, float *p, const float *g,
                              uint16_t *m, uint16_t *v, size_t n, int64_t step, float grad_scale);

/* Sum of squares of x[0..n) in double (for the global grad norm; the caller
 * sums partial results across ranks / shards, then takes sqrt). */
double dt_sumsq(const float *x, size_t n);
/* Scale factor for clipping: min(1, max_norm / (norm + 1e-6)); 1 if max_norm <= 0,
 * and 1 for a NaN norm (clipping cannot repair a NaN gradient). */
float dt_clip_scale(double norm, float max_norm);

/* ---- an optimizer over a flat buffer ----
 * Segments say where parameters start and whether they decay; the optimizer
 * owns state for [state_begin, state_end) of the flat buffer only (the whole
 * buffer for DDP, a shard for ZeRO).
 *
 * Skipping (PyTorch skips a parameter whose grad is None): a segment with
 * `active` set is stepped only in steps where *active != 0 when it is
 * stepped (a parameter's has_grad, autograd.h). In the other steps its values
 * and state are left untouched and the step does not count for it: its own
 * step number (AdamW's bias correction, SGD's first momentum step) is the
 * number of steps it was stepped in, as PyTorch's per-parameter state
 * `step`. active NULL: always stepped. */
typedef struct dt_optim_segment {
    size_t offset, numel;
    int decay;
    const int *active;               /* NULL: always stepped; else only while *active */
    const dt_param_hparams *hp;      /* NULL: the optimizer's settings; else its group's (NaN fields:
                                        the optimizer's). Set weight_decay applies even if !decay */
    size_t grad_gap;                 /* the gradient buffer leaves out this many elements before the
                                        segment (frozen parameters: nn.h grad_offsets), so its
                                        gradient is at grad[offset - grad_gap]; 0: same layout */
} dt_optim_segment;

typedef struct dt_optimizer {
    dt_optim_cfg cfg;
    dt_optim_segment *segs;          /* sorted by offset */
    int64_t *skipped;                /* per segment: steps it sat out (dt_optimizer_finish_step) */
    int n_segs;
    size_t state_begin, state_end;   /* owned range of the flat buffer, in elements */
    float *state[2];                 /* FP32 storage: each state_len floats, or NULL. BF16 storage: NULL,
                                        except between dt_optimizer_state_open and _close (a widened copy) */
    uint16_t *state16[2];            /* BF16 storage: each state_len bfloat16 values, or NULL */
    int state_open;                  /* BF16: nesting depth of dt_optimizer_state_open */
    size_t state_len;                /* state_end - state_begin, or (compact) the segments' elements */
    size_t *seg_state;               /* per segment: index in state[k] of its first owned element */
    int64_t step;                    /* completed steps */
} dt_optimizer;

dt_status dt_optimizer_init(dt_optimizer *o, const dt_optim_cfg *cfg, const dt_optim_segment *segs,
                            int n_segs, size_t state_begin, size_t state_end);
/* Compact state: an optimizer owning all of [0, numel) of a flat buffer but
 * holding state for the segments' elements only (segments must lie inside), so what no segment covers
 * (frozen parameters left out of the table) costs no memory. Stepping and
 * skipping as above. Find a segment's state with dt_optimizer_state_of. */
dt_status dt_optimizer_init_compact(dt_optimizer *o, const dt_optim_cfg *cfg, const dt_optim_segment *segs, int n_segs,
                                   size_t numel);
/* State k (0: exp_avg / momentum, 1: exp_avg_sq) of flat element `offset`,
 * or NULL when it has none (no segment, outside the owned range, or k not
 * kept by this optimizer). Consecutive elements of one segment are
 * consecutive in memory. With BF16 storage only inside a
 * dt_optimizer_state_open bracket (NULL outside it). */
float *dt_optimizer_state_of(const dt_optimizer *o, int k, size_t offset);
/* fp32 access to BF16 state, for what reads or writes state as fp32 tensors
 * (checkpoints, a re-partition carrying state over): open widens every state
 * array into an fp32 copy in o->state[k] (so dt_optimizer_state_of works);
 * close(store = 1) first rounds that copy back into the bf16 storage (after a
 * load wrote into it), and the outermost close frees it. Brackets nest (depth
 * count); a store at any depth writes through. With FP32 storage both do
 * nothing. While open, a save holds the state twice (bf16 + fp32 copy). */
dt_status dt_optimizer_state_open(dt_optimizer *o);
void dt_optimizer_state_close(dt_optimizer *o, int store);
/* Bytes the state occupies: state arrays x state_len x element size. */
size_t dt_optimizer_state_nbytes(const dt_optimizer *o);
void dt_optimizer_free(dt_optimizer *o);
/* Step params/grads restricted to [begin, end) ⊆ [state_begin, state_end)
 * (DT_EINVAL, nothing stepped, otherwise). Elements in no segment (padding)
 * and inactive segments are left untouched. `param` indexes the full flat
 * buffer (element 0 = flat offset 0), `grad` the same shifted down by each
 * segment's grad_gap (a model's param_flat and grad_flat). Does not increment o->step (call dt_optimizer_finish_step
 * once per step). */
dt_status dt_optimizer_step_range(dt_optimizer *o, float lr, float *param, const float *grad,
                                  size_t begin, size_t end, float grad_scale);
/* Step the whole owned range with compact buffers: param[0] and grad[0] are
 * flat offset state_begin (a ZeRO shard). Same arithmetic as step_range. */
void dt_optimizer_step_owned(dt_optimizer *o, float lr, float *param, const float *grad, float grad_scale);
/* Ends a step: o->step + 1, and every segment inactive now counts the step
 * as sat out (call it before the flags are cleared, e.g. by zero_grad). */
void dt_optimizer_finish_step(dt_optimizer *o);
/* Steps segment k (in o->segs order) has been stepped in: o->step - skipped[k]. */
int64_t dt_optimizer_segment_steps(const dt_optimizer *o, int k);
/* The segment starting at flat offset `offset`, or -1. */
int dt_optimizer_find_segment(const dt_optimizer *o, size_t offset);
/* Restores segment k's own step count (a checkpoint): needs o->step set and
 * 0 <= steps <= o->step (DT_EINVAL otherwise). */
dt_status dt_optimizer_set_segment_steps(dt_optimizer *o, int k, int64_t steps);

/* ---- parameter groups ----
 * PyTorch's param_groups, selected by name: a group names parameters by a
 * glob over their names (fnmatch without flags, so '*' crosses dots:
 * "*.bias", "h.0.*") and overrides some settings for them. Fields left NaN
 * keep the optimizer's; groups apply in order, a later one overriding an
 * earlier one field by field, so "--no-decay '*.bias' --lr-scale 'h.0.*=0.1'"
 * gives h.0's biases both. The settings land in each dt_param's hp, which
 * the strategies' optimizers read through their segments (also ZeRO's
 * shard owners and pipeline stages). */
typedef struct dt_optim_group {
    const char *pattern;
    float lr_scale;        /* multiplies the scheduled LR (>= 0) */
    float weight_decay;    /* decoupled decay coefficient (>= 0; 0: no decay) */
    float beta1, beta2;    /* AdamW, in [0, 1) */
    const char *who;       /* names the group in errors ("--no-decay"); NULL: "parameter group" */
} dt_optim_group;
/* pattern with every setting unset (NaN). */
dt_optim_group dt_optim_group_make(const char *pattern);
/* Resets every parameter's hp, then applies g[0..n) in order. A group whose
 * pattern matches no parameter, or with a setting out of range, is an error
 * naming it (who: "--lr-scale", "group 2"...); nothing is changed then. */
dt_status dt_optim_apply_groups(dt_model *m, const dt_optim_group *g, int n);

/* ---- LR schedule: linear warm-up then cosine decay to min_lr ---- */
typedef struct dt_lr_schedule {
    float lr, min_lr;
    int64_t warmup, total;  /* total <= 0: constant after warm-up */
} dt_lr_schedule;
float dt_lr_at(const dt_lr_schedule *s, int64_t step);   /* step 0-based */

#endif
