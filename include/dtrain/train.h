/* dtrain/train.h — the training loop and checkpoints.
 *
 * One loop for every strategy: per step it draws K micro-batches from the
 * sampler, runs forward + backward on each (gradients accumulate), lets the
 * parallel strategy synchronise gradients, clips, and steps the optimizer.
 * Strategies (DDP, ZeRO) plug in through dt_strategy (strategy.h) without their
 * own loop; the trainer shares its state with them through `run`.
 */
#ifndef DTRAIN_TRAIN_H
#define DTRAIN_TRAIN_H

#include "dtrain/nn.h"
#include "dtrain/optim.h"
#include "dtrain/data.h"
#include "dtrain/io.h"
#include "dtrain/strategy.h"

/* Builds the model to train (every rank calls it with the same seed); see
 * nn.h section 2 and examples/. */
typedef dt_status (*dt_model_build_fn)(void *user, uint64_t seed, dt_model **out);

/* train.loss_scale (strategy.h, "loss scaling") */
typedef enum dt_loss_scale_mode {
    DT_LOSS_SCALE_AUTO = 0,      /* DYNAMIC with --precision fp16, else OFF */
    DT_LOSS_SCALE_OFF = 1,
    DT_LOSS_SCALE_FIXED = 2,     /* loss_scale_init, skip a step with inf/nan gradients */
    DT_LOSS_SCALE_DYNAMIC = 3,   /* GradScaler: halve on overflow, double after a window of clean steps */
} dt_loss_scale_mode;

/* train.saved_activations: what backward reads between forward and backward */
typedef enum dt_saved_acts {
    DT_SAVED_AUTO = 0,   /* fp16 with --precision fp16 and loss scaling; bf16 with bf16 where its products run in
                            bf16 (dt_gemm_bf16_available: AMX), else fp32 (the packing costs time
                            the products do not win back); fp32 with fp32 */
    DT_SAVED_FP32 = 1,
    DT_SAVED_BF16 = 2,
    DT_SAVED_FP16 = 3,   /* needs loss scaling: beyond 65504 is inf, and the step must be skipped */
} dt_saved_acts;

/* train.param_dtype: the weights forward and backward compute with (nn.h,
 * dt_working_copy). The optimizer always steps float32 masters, and
 * checkpoints hold them; a 16-bit run resumes in fp32 and back. */
typedef enum dt_param_dtype {
    DT_PARAMS_AUTO = 0,   /* fp32 whatever the precision, as autocast: the products round their own
                             inputs, so a 16-bit copy buys one process and DDP nothing and costs them
                             +4 bytes per parameter; it also rounds the embeddings' lookups
                             (docs/PERFORMANCE.md, "bf16 against PyTorch's autocast") */
    DT_PARAMS_FP32 = 1,
    DT_PARAMS_BF16 = 2,   /* a bf16 working copy, 1-D parameters (biases, LayerNorm's) exact: ZeRO
                             gathers it in 16 bits (about half the bytes) */
    DT_PARAMS_FP16 = 3,
} dt_param_dtype;

typedef struct dt_train_opts {
    dt_model_cfg model;            /* the built-in to train, unless build_model is set */
    dt_model_build_fn build_model; /* a user's model (NULL: the built-in from `model`) */
    void *build_user;
    dt_recompute recompute;        /* activation recompute: blocks = mark every block but the last;
                                    * none (default) leaves the model's own marks */
    const char *data;              /* dataset name (data.h): DT_DATA_FASHION_MNIST (default), _TEXT, _SHARD */
    const char *data_path;         /* NULL: the dataset's default (Debian package path) */
    const char *val_path;          /* token data only: held-out file; NULL = last 10% of data */
    int64_t batch;                 /* per rank, per micro-step */
    int64_t seq;                   /* LM sequence length T */
    int64_t steps;                 /* optimizer steps; 0 = derive from epochs */
    int epochs;                    /* used when steps == 0 */
    int accum;                     /* micro-steps per optimizer step (>= 1) */
    dt_optim_cfg optim;
    float min_lr;
    int64_t warmup;
    float clip;                    /* max global grad norm, 0 = off */
    uint64_t seed;
    int threads;                   /* 0 = leave OpenMP default */
    int keep_denormals;            /* 0 (default): flush denormals to zero (dt_cpu_set_flush_denormal) */
    int precision;                 /* dt_precision of the matrix products (ops.h): DT_PREC_FP32 (default),
                                      DT_PREC_BF16 (bf16 inputs, fp32 accumulation, where faster) or
                                      DT_PREC_FP16 (fp16 inputs, fp32 accumulation; with loss scaling) */
    int saved_activations;         /* dt_saved_acts: the activations backward reads, kept in 16 bits
                                      (dt_model_set_saved_dtype); AUTO (0) follows precision */
    int param_dtype;               /* dt_param_dtype: the working copy of the weights; AUTO (0) is
                                      fp32. A strategy that owns the optimizer must keep the same
                                      (dt_strategy.param_dtype) */
    int loss_scale;                /* dt_loss_scale_mode (strategy.h, "loss scaling"): AUTO (0) is
                                      DYNAMIC with fp16, OFF otherwise */
    float loss_scale_init;         /* FIXED: the scale; DYNAMIC: the first one (0: 2^16) */
    int loss_scale_window;         /* DYNAMIC: clean steps before the scale doubles (0: 2000) */
    const char *init;              /* safetensors with parameters to start from */
    const char *save;              /* checkpoint path written at the end (and every save_every) */
    int64_t save_every;
    int save_sync;                 /* 1: every save is written before training goes on. 0 (default):
                                      the state is copied into host memory and written by a background
                                      thread (io.h, background writes) while training (or the final
                                      evaluation) goes on; the next save first waits for it */
    const char *resume;            /* checkpoint to continue from */
    const char *metrics;           /* JSONL path (a resumed run drops the lines of steps after its
                                      checkpoint, then appends: no step twice) */
    const char *progress_file;     /* rank 0 rewrites it with the completed step count after every
                                      step (a launcher that restarts jobs reads it); NULL: none */
    const char *trace;             /* Chrome trace path (per rank: suffix .rankN) */
    int64_t log_every;             /* non-terminal progress interval (0 = auto) */
    int64_t eval_batches;          /* LM eval: number of batches (0 = auto) */
    int quiet;                     /* no start-up or progress lines; the final result still prints */
    int64_t stop_after;            /* testing aid: stop (as if killed) after this many steps; 0 = off */
    int eval_only;                 /* the trainer is created to evaluate (dt_trainer_evaluate), not to
                                      train: a train.resume checkpoint's step is not compared with
                                      train.steps / train.epochs, nor with train.unfreeze_at; every
                                      parameter is frozen (no gradients, no optimizer state, in any
                                      strategy) and dt_trainer_step is refused */
    const char *const *freeze;     /* --freeze: n_freeze glob patterns (fnmatch) over parameter names;
                                      matches get requires_grad = 0 before the strategy's setup, so
                                      they keep their values exactly; a pattern matching nothing fails */
    int n_freeze;
    int64_t unfreeze_at;           /* --unfreeze-at: from this step on the --freeze parameters train
                                      (the strategy re-partitions, they start with fresh optimizer
                                      state); 0 = never */
    const dt_optim_group *groups;  /* parameter groups (optim.h), applied in order before the
                                      strategy's setup: --no-decay, --lr-scale */
    int n_groups;
    int uneven;                    /* --uneven (needs a strategy with join when there are several data
                                      ranks): data rank r trains on its own part of the training split
                                      (data.h, dt_dataset_opts.part_rank: from a directory the files k with
                                      k % ranks == r, from one file or Fashion-MNIST a contiguous range
                                      sized in proportion to r + 1), for --epochs passes over it (at most
                                      --steps steps), so ranks run different numbers of steps; a rank
                                      whose data ran out joins (dt_strategy.join) until every rank has,
                                      and every rank ends at the same final step (the largest count).
                                      Exclusive with --resume, --save-every and --stop-after. */
    int no_memory_check;           /* 1: skip the memory check before allocating (dt_train_memory_estimate
                                      against dt_memory_available: a run that would not fit is refused
                                      before its model exists, naming both figures) */
    int64_t sample_every;          /* --sample-every K: every K steps the reporting rank logs a sample from
                                      the model (GPT-2; one process or DDP): sample_tokens tokens after the
                                      validation split's first 8, temperature 0.8, top-k 40; 0 = off */
    int sample_tokens;             /* --sample-tokens N (0: 64) */
} dt_train_opts;

void dt_train_opts_default(dt_train_opts *o);
/* 1 when o trains with loss scaling (train.loss_scale, resolved: AUTO is on with fp16) */
int dt_train_loss_scaling(const dt_train_opts *o);
/* The dtype train.saved_activations resolves to (AUTO: from precision):
 * DT_F32, DT_BF16 or DT_F16. */
dt_dtype dt_train_saved_dtype(const dt_train_opts *o);
/* The dtype train.param_dtype resolves to (AUTO: fp32). */
dt_dtype dt_train_param_dtype(const dt_train_opts *o);
dt_status dt_train_opts_validate(const dt_train_opts *o);

typedef struct dt_trainer dt_trainer;
struct dt_trainer {
    dt_train_opts opts;
    dt_model *model;
    dt_graph *graph;
    dt_optimizer optim;
    dt_working_copy wcopy;         /* train.param_dtype's 16-bit weights (when the strategy owns no optimizer) */
    dt_lr_schedule sched;
    dt_strategy strat;
    dt_run run;                    /* what strat sees: model, graph, trace, position (strategy.h) */
    /* data: one dataset (train + eval split); the model accepted its sample
     * shape at creation. Batch buffers: x[k] = batch samples of input k,
     * y = batch * targets, idx = batch sample indices, row_keys = each
     * training row's dropout key (dt_batch.row_keys): dt_dropout_row_key(
     * model->dropout_seed, step, epoch * n + g), g the sample's global
     * position in the epoch's order (the sampler's r + p * world), n the
     * training set's size - so the same sample of the same step gets the
     * same key at any world size, --accum or pipeline layout. */
    dt_dataset data;
    dt_sampler sampler;
    void *x[DT_MAX_INPUTS]; int32_t *y; int64_t *idx; uint64_t *row_keys;
    /* progress */
    int64_t step;                  /* completed optimizer steps */
    int64_t total_steps;
    int unfrozen;                  /* opts.unfreeze_at happened */
    double last_loss;
    dt_loss_scaler scaler;         /* train.loss_scale: run.scaler points here when it is on */
    float last_scale;              /* the scale the last step ran with */
    dt_jsonl metrics;
    dt_trace *trace;
    size_t model_params;           /* the whole model's, counted before the strategy's setup
                                      (a pipeline stage then holds only its part) */
    /* opts.uneven (uneven.c): this rank's steps on its own data, the steps every rank runs
     * (loss averaged and stop requests agreed over ranks only in those), and the rank that
     * prints progress (0; with uneven the lowest of the ranks running the most steps) */
    int64_t own_steps, common_steps;
    int lead_rank;
    /* background checkpoints (save_bg.c): the writer (NULL: saves are synchronous) and the
     * save it is writing: its step (-1: none), when it was queued, how long the copy took */
    dt_bg_writer *bg;
    int64_t bg_step;
    double bg_t0, bg_copy_s, bg_wait_s;   /* the save in flight: started, copy, wait for the one before */
    int save_lock;                 /* rank 0: descriptor holding a sharded train.save directory's
                                      lock for the trainer's life (io.h dt_ckpt_lock_dir); -1: none */
    size_t model_params_whole;     /* the whole model's with tensor-parallel parts counted once,
                                      also before the strategy's setup (model_params: this rank's
                                      parts when they are split) */
    int finished;                  /* dt_trainer_finish ran: every call but dt_trainer_free is refused */
};

/* The memory check dt_trainer_create runs before the model exists (unless
 * train.no_memory_check): a rank's bytes, estimated from the configuration
 * (dt_model_cfg_num_params, dt_model_cfg_act_bytes) and the strategy's
 * shares (dt_strategy.mem_div): float32 parameters, gradients (none when
 * evaluating, nor with train.freeze: a floor), optimizer state, one
 * micro-batch's activations and, with background saves, the checkpoint copy.
 * total 0: no estimate (a user's build_model, a registered built-in). */
typedef struct dt_mem_estimate { double params, grads, optim, acts, copy, total; } dt_mem_estimate;
void dt_train_memory_estimate(const dt_train_opts *o, const dt_strategy *strat, dt_mem_estimate *out);
/* What this process may still allocate: the smallest of its memory cgroup's
 * limit minus usage (v2 memory.max - memory.current, over its cgroup and each
 * ancestor; v1 memory.limit_in_bytes - memory.usage_in_bytes) and
 * MemAvailable; source says which and its figures. root prefixes /proc and
 * /sys/fs/cgroup (tests; NULL: the system's). DT_EIO when none is readable. */
typedef struct dt_mem_avail { double bytes; char source[320]; } dt_mem_avail;
dt_status dt_memory_available(const char *root, dt_mem_avail *out);

dt_status dt_trainer_create(const dt_train_opts *o, const dt_strategy *strat, dt_trainer **out);
void dt_trainer_free(dt_trainer *t);
/* Ends a run: releases the strategy (so nothing records into the trace any
 * more; collective when it is), writes the trace file and closes the metrics
 * file, returning the first failure (a full disk, an I/O error). Only
 * dt_trainer_free may follow (another finish returns DT_OK; step, evaluate,
 * save and run return DT_ESTATE). dt_trainer_free alone does the same but
 * cannot report a failure: call this first when the run succeeded. */
dt_status dt_trainer_finish(dt_trainer *t);
/* One optimizer step; *loss = mean loss over the micro-batches (and ranks). */
dt_status dt_trainer_step(dt_trainer *t, double *loss);
/* The caller changed requires_grad on some of the model's parameters between
 * steps: collective. DDP re-cuts its buckets, ZeRO re-partitions (optimizer
 * state carried over by name), one process rebuilds its optimizer; every
 * parameter that stays trainable keeps its state and step count, a newly
 * trainable one starts fresh. Pipelines refuse it. */
dt_status dt_trainer_refresh_trainable(dt_trainer *t);
/* Runs to total_steps with progress output, checkpoints and metrics. */
dt_status dt_trainer_run(dt_trainer *t);
/* Checkpoint through the strategy's save() if it has one, else dt_checkpoint_save. */
dt_status dt_trainer_save(dt_trainer *t, const char *path);
/* The same, in the background unless opts.save_sync: collective; first
 * settles the save still in flight, then copies this step's state and
 * returns while a thread writes it (same files, same bytes). */
dt_status dt_trainer_save_background(dt_trainer *t, const char *path);
/* Waits for the background save in flight, if any (collective): every rank's
 * files written, agreed over ranks, the set committed; one line on the lead
 * rank unless quiet. An error names the step, the path and the failing rank. */
dt_status dt_trainer_save_settle(dt_trainer *t);
/* Loss and accuracy (fraction of targets predicted right) on the dataset's
 * eval split: all of it, or --eval-batches batches where the dataset allows.
 * Collective; stops between batches on an agreed stop request (see below).
 * With opts.metrics, appends {"step", "eval_loss", "eval_accuracy"} there
 * (the lead rank; not when stopped): training's final evaluation, and
 * `dtrain eval`'s, which appends to a training run's file without
 * dropping anything. */
dt_status dt_trainer_evaluate(dt_trainer *t, double *loss, double *accuracy);

/* ---- stopping at a step boundary (preemption: SIGTERM, SIGINT) ----
 * dt_train_request_stop(code) only stores `code` (1..31, e.g. the signal
 * number; others are stored as 31) in a sig_atomic_t: it is async-signal-safe,
 * for a signal handler (the CLI installs them, cli/signals.c). dt_trainer_run
 * agrees on it over all ranks at every step boundary — each rank starts a
 * small non-blocking allreduce of its request when a step starts and
 * completes it when the step ends, so a request that reached only some ranks
 * stops all of them after the same step — then writes the checkpoint to
 * opts.save if set, logs "interrupted at step N, saved to PATH" (rank 0) and
 * returns DT_OK without the final evaluation. Several codes: the highest wins.
 * dt_trainer_evaluate agrees the same way between its batches: a request
 * during evaluation (or the final save before it) ends it with DT_OK, NaN
 * loss and accuracy and dt_train_stopped() set; dt_trainer_run then logs
 * "interrupted at step N during evaluation, saved to PATH". */
void dt_train_request_stop(int code);
int dt_train_stop_requested(void);   /* this process's pending request (0: none) */
/* After dt_trainer_run or dt_trainer_evaluate: the agreed code that stopped
 * it early; 0 = it ran to the end. Both clear it when they start; a stop
 * consumes the request (a request made before dt_trainer_run stops it before
 * its first step, at step 0, saving as any stop does). */
int dt_train_stopped(void);

/* ---- checkpoints (safetensors) ----
 * Parameters by name, buffers by name, optimizer state as
 * "optim.exp_avg.<param>" / "optim.exp_avg_sq.<param>" (AdamW) or
 * "optim.momentum.<param>" (SGD), metadata: step, epoch, cursor, seeds, RNG. */
dt_status dt_checkpoint_save(dt_trainer *t, const char *path);
dt_status dt_checkpoint_load(dt_trainer *t, const char *path);

/* Parameters only (e.g. Hugging Face GPT-2 weights); extra tensors are ignored,
 * missing or mis-shaped ones are errors. */
dt_status dt_model_load_params(dt_model *m, const char *path);

/* The model a checkpoint (a file or a sharded set) records, so that it can be
 * built again without being described: the built-in's name ("model") and the
 * settings it was saved with (arch.*, nn.h section 4b) laid over that model's
 * defaults, and the optimizer. A file that names no built-in (a Hugging Face
 * file, a user's model) gives builtin = 0 and nothing else. Errors: the file
 * cannot be read, or a recorded setting is malformed (naming file, key and
 * text). */
typedef struct dt_ckpt_model {
    int builtin;                   /* 1: kind, cfg and fields are set */
    char name[32];                 /* "model" as recorded ("" when absent) */
    dt_model_kind kind;
    dt_model_cfg cfg;              /* the defaults of kind with every recorded setting */
    int n_fields;                  /* the settings the file records, as recorded */
    dt_arch_field fields[DT_ARCH_FIELDS_MAX];
    char optimizer[16];            /* "adamw" | "sgd"; "" when not recorded */
    int has_optim;                 /* 1: optim is the saved run's optimizer settings ("optimizer_settings":
                                      lr, weight_decay, and momentum / nesterov or beta1 / beta2 / eps) */
    dt_optim_cfg optim;
    char data[32];                 /* "data": the train.data it was trained on ("" when not recorded) */
    int has_seed;                  /* 1: seed is the saved run's train.seed (its data order and init) */
    uint64_t seed;
} dt_ckpt_model;
dt_status dt_checkpoint_read_model(const char *path, dt_ckpt_model *out);
dt_status dt_model_save_params(const dt_model *m, const char *path);

#endif
