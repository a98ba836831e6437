/* dtrain/strategy.h — the contract between the training loop and a parallel
 * strategy (DDP, ZeRO, pipeline stages).
 *
 * The trainer (train.h) defines this interface and strategies (parallel.h,
 * zero.h) implement it; both include this header and neither includes the
 * other, so the layers stay ordered: ... io -> dist -> strategy -> parallel
 * -> train -> cli.
 *
 * A strategy sees the run only through dt_run: the model and its tape, the
 * trace, the few options it needs and the run's position (step, data order,
 * RNG) that a checkpoint records. The trainer fills dt_run when it is created
 * and keeps it current; a strategy reads it and, in load(), restores the
 * position through dt_checkpoint_apply_meta.
 *
 * One step as the trainer drives it (hooks are optional; NULL = nothing):
 *
 *   setup(run)                                   once, after the model exists (and before load)
 *   for each of K micro-batches:
 *       before_forward(run, last)                last = 1 on the micro-step that reduces
 *       forward + backward on run->graph
 *       after_backward(run, last)
 *   owns_optimizer ? step(run, lr) : the trainer clips, steps, zeroes grads
 *   allreduce_sum(loss)                          metrics agreed over ranks
 *
 * A strategy that schedules the micro-batches itself (pipeline stages) sets
 * forward_backward instead: the trainer then draws all K micro-batches first
 * and hands them over in one call (before_forward / after_backward are not
 * called). forward_only does the same for evaluation.
 */
#ifndef DTRAIN_STRATEGY_H
#define DTRAIN_STRATEGY_H

#include "dtrain/data.h"
#include "dtrain/dist.h"
#include "dtrain/io.h"
#include "dtrain/nn.h"
#include "dtrain/optim.h"

/* ---- loss scaling (train.loss_scale; fp16 products overflow and underflow) ----
 * As PyTorch's GradScaler. The trainer seeds backward with scale / accum in
 * place of 1 / accum (a pipeline's last stage likewise), so every gradient
 * arrives multiplied by S = scale. The step, the trainer's or a strategy's
 * that owns it, then takes the squared norm of the scaled gradients summed
 * over every rank's part (the same number on every rank: the verdict is
 * global even when each rank holds only its shards or stage):
 *   - not finite: some gradient overflowed on some rank; every rank skips the
 *     step (the optimizer's state and step counts stay; gradients are
 *     zeroed) and sets dt_run.skipped;
 *   - finite: the optimizer steps with gradients times
 *     dt_loss_scaler_step_scale (the clip factor of the unscaled norm,
 *     divided by S: unscaling costs no pass of its own).
 * Then the trainer calls dt_loss_scaler_update: dynamic, an overflow halves
 * S and `window` clean steps in a row double it; fixed, S stays. A skipped
 * step still counts as a step of the run (train.steps counts iterations, as
 * PyTorch's loop does: the data and the LR schedule go on). S and the clean
 * steps counted are run state: checkpoints record them (loss_scale,
 * loss_scale_good), so a resume goes on bitwise. */
typedef struct dt_loss_scaler {
    float scale;        /* S */
    int dynamic;        /* 1: halve on overflow, double after window clean steps */
    int window;
    int64_t good;       /* clean steps since S last changed */
    int64_t skipped;    /* steps this run skipped */
} dt_loss_scaler;
#define DT_LOSS_SCALE_INIT 65536.0f    /* 2^16, as GradScaler */
/* The largest scale: 1 / S (times a clip factor) must stay a normal float,
 * which the flush-to-zero threads (ops.h) would otherwise turn into 0 and
 * with it every gradient (seen past 2^126). fp16 needs far less (~2^24). */
#define DT_LOSS_SCALE_MAX 18446744073709551616.0f   /* 2^64 */
#define DT_LOSS_SCALE_WINDOW 2000
dt_status dt_loss_scaler_init(dt_loss_scaler *ls, float scale, int dynamic, int window);
/* sumsq: the global squared norm of the scaled gradients (< 0: not taken,
 * no clip). Returns 1 when the step must be skipped (sumsq not finite), else
 * 0 with *scale the factor to step with. */
int dt_loss_scaler_verdict(const dt_loss_scaler *ls, double sumsq, float clip, float *scale);
/* after a step: skipped 1 backs off (dynamic), 0 counts a clean step */
void dt_loss_scaler_update(dt_loss_scaler *ls, int skipped);

/* What the trainer shares with its strategy. Pointers are owned by the
 * trainer and valid from setup() to destroy(). */
typedef struct dt_run {
    dt_model *model;
    dt_graph *graph;              /* the tape every micro-step records on */
    dt_trace *trace;              /* NULL: tracing off */
    const dt_optim_cfg *optim;    /* hyper-parameters (a strategy may own the state) */
    dt_optimizer *optimizer;      /* the trainer's optimizer when the strategy owns none (else NULL):
                                     a strategy that ends with another rank's model (DDP join)
                                     hands its optimizer state over too */
    float clip;                   /* max global gradient norm; 0 = off */
    float lr;                     /* learning rate of the step being run */
    dt_loss_scaler *scaler;       /* NULL: no loss scaling. Else a strategy with step() or
                                     forward_backward follows it (above) */
    int skipped;                  /* step() sets it: 1 when it skipped (a gradient not finite) */
    int quiet;                    /* 1: strategies print nothing */
    /* position: what a checkpoint records besides tensors */
    int64_t *step;                /* completed optimizer steps */
    dt_sampler *sampler;          /* epoch + cursor of the data order */
    uint64_t seed;
    int rank, world;              /* this rank's data replica and their number (strategy.data_*) */
    int accum;                    /* micro-batches per optimizer step */
    const char *data;             /* train.data, the dataset trained on (NULL: not said); a checkpoint
                                     records it, so generate knows text (bytes) from token ids */
    /* During setup() only: one micro-batch of real training data (the first
     * `batch` samples, not drawn from the sampler), for strategies that probe
     * the model (a pipeline measures and partitions its blocks). */
    dt_batch example;
    size_t param_copy_bytes;      /* the trainer's float32 masters beside a 16-bit working copy of
                                     the parameters (train.param_dtype; 0: none): a memory report
                                     of a strategy without its own optimizer counts them */
} dt_run;

typedef struct dt_strategy {
    const char *name;
    int rank, world;
    void *self;
    /* after model creation/load, before the first step (e.g. broadcast from rank 0) */
    dt_status (*setup)(void *self, dt_run *run);
    /* before a micro-step's forward; last = 1 on the micro-step that reduces */
    dt_status (*before_forward)(void *self, dt_run *run, int last);
    /* after the micro-step's backward */
    dt_status (*after_backward)(void *self, dt_run *run, int last);
    /* sum a few doubles across ranks (metrics, norms, eval counts) */
    dt_status (*allreduce_sum)(void *self, double *x, int n);
    /* Optional, collective over every rank of the job: DT_OK when every
     * rank's `mine` is; a failing rank keeps its own error, the others get
     * DT_ECOMM naming it (what: the operation). The trainer calls it where a
     * rank can fail on its own parameters alone -- the fp16 working copy of
     * parts that differ between ranks (tensor parallelism) -- so that no rank
     * goes on into a collective the failed one never joins. NULL: every rank
     * holds the same parameters and fails alike. */
    dt_status (*agree_status)(void *self, dt_status mine, const char *what);
    void (*destroy)(void *self);
    /* Strategies that shard the optimizer (ZeRO) set owns_optimizer and the
     * three hooks below: the trainer then allocates no optimizer state, calls
     * step() instead of its own clip + step + zero_grad, and routes
     * checkpoints through save()/load() (load runs after setup()). */
    int owns_optimizer;
    /* forward passes are collective (ZeRO-3 gathers): evaluation then runs
     * the same number of forwards on every rank */
    int collective_forward;
    dt_status (*step)(void *self, dt_run *run, float lr);
    dt_status (*save)(void *self, dt_run *run, const char *path);
    dt_status (*load)(void *self, dt_run *run, const char *path);
    /* save() writes a directory of per-rank files (a sharded set) that rank 0
     * creates and every rank writes into; 0: one file that rank 0 writes. The
     * trainer checks the path accordingly at start-up. */
    int save_is_dir;
    /* before evaluation / final use of the parameters (e.g. wait for gathers) */
    dt_status (*sync_params)(void *self, dt_run *run);
    /* Optional: run forward + backward of the step's n micro-batches (in
     * order; gradients as if accumulated one after another, each loss scaled
     * by 1/n). *loss_sum = the sum of the n micro-batch losses on ranks that
     * compute the loss, 0 on the others (the trainer sums it over ranks with
     * allreduce_sum and divides by n * data_world). */
    dt_status (*forward_backward)(void *self, dt_run *run, const dt_batch *mb, int n, double *loss_sum);
    /* Optional, with forward_backward: evaluate n batches (no gradients), adding
     * loss * rows, correct predictions and rows of each into sums[0..2] on the
     * ranks that compute the loss (as above); logits argmax = accuracy. */
    dt_status (*forward_only)(void *self, dt_run *run, const dt_batch *b, int n, double sums[3]);
    /* Data parallelism: the sampler splits the data over data_world replicas
     * and this rank reads replica data_rank's share. 0/0: rank/world (every
     * rank a replica). A pipeline's stages of one replica read the same data. */
    int data_rank, data_world;
    /* Optional: one rank holds 1/mem_div[k] of the whole model's parameters
     * (k = 0), gradients (1), optimizer state (2) and of a step's activations
     * (3); 0 counts as 1 (all of it, DDP). The trainer's memory check before
     * the model exists (train.no_memory_check). */
    int mem_div[4];
    /* Optional (every multi-rank strategy sets it): the configuration
     * agreement (dist.h section 8). The trainer lists what must match on
     * every rank -- "strategy" (the name) first, then model, data, batch,
     * steps, optimizer, checkpoints -- and calls this before setup() and
     * before any other collective of the run; the strategy adds its options
     * and runs dt_pg_agree on its group. A strategy whose constructor already
     * runs collectives (pipeline: its groups) agrees on "strategy" and its
     * options there first, with the same first fields. */
    dt_status (*agree)(void *self, dt_agree *a);
    /* Optional: the caller changed requires_grad on some parameters between
     * steps (unfreezing or freezing a layer); re-partition for the new
     * trainable set. Collective: call it at the same step on every rank,
     * with the same set. DDP re-cuts its buckets, ZeRO its shards (optimizer
     * state carried over by parameter name). NULL: not supported. */
    dt_status (*refresh_trainable)(void *self, dt_run *run);
    /* Optional: uneven inputs (the trainer's opts.uneven). This rank's data
     * ran out after its last step: shadow the other ranks' steps (their
     * collectives, zero gradients) until every rank has called it. Set by
     * DDP and ZeRO stages 1/2 created with their join option. */
    dt_status (*join)(void *self, dt_run *run);
    /* Optional: adjust the built-in model's configuration before the trainer
     * builds it (tensor parallelism: cfg->tp_size / tp_rank, this rank's part). */
    dt_status (*prepare_model)(void *self, dt_model_cfg *cfg);
    /* Optional: the squared global gradient norm train.clip clips by, when
     * parameters are split over ranks (tensor parallelism: a split
     * parameter's squares summed over its group, a replicated one's counted
     * once). Collective; every rank gets the same value. NULL: the local flat
     * gradient's (every rank holds whole, reduced gradients). */
    dt_status (*grad_sumsq)(void *self, dt_run *run, double *ss);
    /* With owns_optimizer: the weights its forward computes with (dt_dtype;
     * DT_F32 = 0: the masters themselves, else a 16-bit working copy of float32
     * masters, nn.h). The trainer refuses a strategy whose type is not
     * train.param_dtype's; without owns_optimizer the trainer keeps the copy. */
    int param_dtype;
} dt_strategy;

/* An optimizer over m's flat layout, one segment per trainable parameter,
 * active while the parameter has_grad (the trainer's; a pipeline stage's):
 * clear the flags with dt_model_zero_grad after each step. Compact state
 * (optim.h): frozen parameters (requires_grad 0 when it is built) have none;
 * find a parameter's with dt_optimizer_state_of. */
dt_status dt_optimizer_init_model(dt_optimizer *o, const dt_optim_cfg *cfg, const dt_model *m);
/* After requires_grad changed: the optimizer over the new trainable set.
 * Parameters trainable before and now keep their state and own step count;
 * newly trainable ones start from zero state at 0 own steps; newly frozen
 * ones drop theirs. On failure o is unchanged. */
dt_status dt_optimizer_refresh_model(dt_optimizer *o, const dt_model *m);

/* ---- checkpoint metadata ----
 * Every checkpoint, whoever writes it, carries: format, model kind, optimizer,
 * step, optim_step, data position (epoch, cursor), seed, world size and the
 * dropout seed (dt_model.dropout_seed: loading sets it, so the masks go on
 * as the saved run drew them; older checkpoints' rng0 / rng1 are ignored); what it is: the strategy that wrote it ("single", "ddp",
 * "zero-2", "pipeline"; informational: resuming under another is allowed
 * where the loader supports it), a built-in model's config fields
 * ("arch.<field>", dt_model_arch_fields) and every model's parameter
 * fingerprint ("arch.params" = "<count>:<crc32 hex>", dt_model.arch_crc).
 * Values point into *out. */
#define DT_CKPT_META_MAX 32
typedef struct dt_ckpt_meta {
    dt_st_meta m[DT_CKPT_META_MAX];
    char v[DT_CKPT_META_MAX][192];
    dt_arch_field arch[DT_ARCH_FIELDS_MAX];
    char steps[4096];   /* "optim_steps" (dt_checkpoint_meta_steps) */
    int n;
} dt_ckpt_meta;
void dt_checkpoint_meta(const dt_run *run, const char *strategy, int64_t optim_step, dt_ckpt_meta *out);
/* Checks format/model/optimizer and restores step, data position (converted
 * when the checkpoint's world size differs) and RNG from a key -> value
 * lookup; *optim_step gets the optimizer's step count. `what` names the file
 * in errors. */
typedef const char *(*dt_ckpt_meta_get)(const void *src, const char *key);
/* Only the identity part (format, model kind, optimizer, architecture: each
 * arch.* key present must equal this run's, "checkpoint X was saved with
 * arch.layers 3, this run has 2"; checkpoints without them are not checked):
 * call it before reading tensors so a wrong checkpoint is named, not a shape
 * mismatch. */
dt_status dt_checkpoint_check_identity(const dt_run *run, dt_ckpt_meta_get get, const void *src, const char *what);
dt_status dt_checkpoint_apply_meta(dt_run *run, dt_ckpt_meta_get get, const void *src,
                                   const char *what, int64_t *optim_step);
/* Per-parameter step counts (optim.h: a parameter without a gradient sits
 * the step out, so AdamW's bias correction and SGD's first momentum step
 * are its own). Key "optim_steps": the parameters whose own count differs
 * from optim_step, as comma-separated runs "FIRST-LAST:STEPS" of params[]
 * indices ("" when every parameter took every step). A parameter's segment
 * is looked up by its offset in whichever of opts[0..n) has it (a ZeRO
 * bucket's optimizer, a stage's); one in none (frozen, no state) is recorded
 * with 0 steps.
 * meta_steps appends the key to mb (DT_EINVAL if it does not fit: naming
 * the count); apply_steps restores every segment (all-stepped when the key
 * is absent: an older checkpoint). Call apply after the optimizers' step
 * is restored. */
/* Every "optim.<state>.<param>" of o's parameters from c (after
 * apply_steps): parameters frozen now are skipped; a state the checkpoint
 * lacks is allowed only for a parameter that took no step (saved frozen).
 * The file holds fp32; bf16 state (optim.h) is rounded as it is stored. */
dt_status dt_checkpoint_read_states(const dt_ckpt *c, const char *what, const dt_model *m, dt_optimizer *o);
dt_status dt_checkpoint_meta_steps(dt_ckpt_meta *mb, const dt_model *m, dt_optimizer *const *opts, int n);
dt_status dt_checkpoint_apply_steps(dt_ckpt_meta_get get, const void *src, const char *what, const dt_model *m,
                                    dt_optimizer *const *opts, int n);
/* For a writer that holds only some of the parameters (a pipeline stage):
 * param_steps is parameter i's own count, -1 when no optimizer of opts has
 * it (frozen here); meta_steps_list records own[0..n) of the whole model's
 * parameters (own[g] < 0: took every step), `what` naming it in errors;
 * apply_steps_of reads indices below n_listed (the whole model's), g being
 * m's parameter local_of[g] (< 0: not held here; local_of NULL: g itself). */
int64_t dt_checkpoint_param_steps(const dt_model *m, int i, dt_optimizer *const *opts, int n);
/* Every loader's rule for a state the checkpoint lacks (after the step
 * counts are restored): DT_OK when parameter i took no step (saved frozen:
 * it starts from zero state) or is frozen here, else DT_EFORMAT naming
 * `what`, the state and the steps it took. */
dt_status dt_checkpoint_state_missing(const char *what, const dt_model *m, int i, dt_optimizer *const *opts, int n,
                                      const char *state);
dt_status dt_checkpoint_meta_steps_list(dt_ckpt_meta *mb, const int64_t *own, int n, const char *what);
dt_status dt_checkpoint_apply_steps_of(dt_ckpt_meta_get get, const void *src, const char *what, const dt_model *m,
                                       dt_optimizer *const *opts, int n, const int *local_of, int n_listed);
/* Tensor `name` of a checkpoint, shaped as p's whole tensor, into dst: the
 * whole of it, or this rank's part when p is split (tensor parallelism:
 * checkpoints hold whole tensors, so any split reads any checkpoint). */
dt_status dt_checkpoint_read_param(const dt_ckpt *c, const char *name, const dt_param *p, float *dst);
/* Checkpoint names of optimizer state k: "exp_avg"/"exp_avg_sq" (AdamW), "momentum" (SGD). */
const char *dt_checkpoint_state_name(const dt_optim_cfg *c, int k);

#endif
