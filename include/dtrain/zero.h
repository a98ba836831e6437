/* dtrain/zero.h — ZeRO stages 1/2/3: a distributed optimizer over flat buffers.
 *
 * The model's parameters are re-laid out (same order as DDP: reverse
 * registration ≈ backward order) into buckets; each bucket is padded so its
 * length divides by the world size N, and rank r owns the contiguous shard
 * [begin + r*S, begin + (r+1)*S) of every bucket (S = bucket length / N).
 *
 *   stage 1: optimizer state only for the owned shards (1/N). Full parameters
 *            and full gradients stay on every rank.
 *   stage 2: + gradients sharded: a bucket's full gradient buffer exists from
 *            the first gradient written into it until its reduce-scatter has
 *            finished; then only the owned shard is kept. Gradient
 *            accumulation (no_sync micro-steps) keeps the full buffers of the
 *            buckets touched until the synchronising micro-step reduces them
 *            once (memory during accumulation = stage 1's).
 *   stage 3: + parameters sharded: between uses only the owned shard of each
 *            bucket exists. A module's buckets are all-gathered just before
 *            its forward and again before its backward; the buckets of the
 *            next modules (in the order of the previous step) are prefetched;
 *            buckets no module in the window needs are freed. A module
 *            re-run by an activation checkpoint during backward
 *            (dt_graph_checkpoint, hook PRE_RECOMPUTE) is gathered there
 *            and stays gathered through its backward (once per backward).
 *            Every rank
 *            must run the same modules in the same order (the gathers are
 *            collectives issued from module hooks); finish_backward compares
 *            the orders and fails on every rank if they differ (when the
 *            gather sizes differ MPI itself may fail first). Stages 1/2 have
 *            no such constraint.
 *
 * Per step (the trainer does this through dt_zero_strategy):
 *   dt_zero_set_lr(z, lr);
 *   for k in micro-steps: dt_zero_before_forward(z, g, k == K-1); forward; backward;
 *   dt_zero_finish_backward(z);     // reduce-scatter (average) of every bucket done
 *   dt_zero_step(z, &norm);         // owned shards stepped, parameter all-gathers issued
 *
 * Step overlap (dt_zero_overlap):
 *   OFF            after backward: step every shard, then all-gather (blocking).
 *   AFTER_BACKWARD after the last reduction: step every shard; the all-gathers
 *                  run during the next forward, queued in the order it needs
 *                  them (two in flight), each module waits only for the
 *                  buckets it uses (overlap_param_gather).
 *   INTERLEAVED    during backward, as soon as a bucket's reduce-scatter
 *                  completes its shard is stepped and (stages 1/2) its
 *                  all-gather launched.
 * Gradient clipping needs the global norm, i.e. every bucket reduced, before
 * any shard is stepped: clip > 0 with INTERLEAVED is rejected at creation.
 *
 * Results equal DDP with the same reduction: bitwise for N = 2 and in
 * deterministic mode (rank-order sums), since the optimizer kernels are
 * split-invariant; clipping adds a norm summed in another order (≈1e-7).
 *
 * 16-bit wire (opts.dp.wire = DT_BF16 or DT_F16; zero/wire.c). Optimizer state
 * and the owned shards' parameters (the master values) stay float32; only the
 * payload of the training step's collectives is 16-bit:
 *   gradients  each rank rounds its float32 bucket gradient to 16 bits (nearest
 *              even), the owner sums the N rounded chunks in rank order in
 *              float32, divides by (float)N, rounds once to 16 bits, and steps
 *              with that value widened back to float32:
 *                g = f32(round16((f32(round16(g_0)) + ... + f32(round16(g_N-1))) / N))
 *              No 1/N pre-scaling, as DDP's compression: the sum is formed in
 *              float32, so only a single rank's element beyond ±65504 (fp16's
 *              range) overflows, to ±inf, and the update with it; bf16 has
 *              float32's range. Values below 2^-24 flush to 0 in fp16.
 *              Across machines (dist.h section 10) each machine's float32
 *              sum of its ranks is rounded to 16 bits once more before the
 *              machines' partial sums are added (the bytes between machines
 *              stay 16-bit).
 *   parameters after a shard step the owner sends round16(its float32 shard).
 *              Afterwards every rank holds, for each bucket: its OWN shard
 *              exactly (float32, never rounded: stages 1/2 step it in place,
 *              stage 3's gathered copy takes it from the master shard), every
 *              OTHER rank's shard as f32(round16(owner's value)). Ranks hold
 *              different full parameters (each exact in its own shard); their
 *              forwards differ accordingly. dt_zero_load gathers the same
 *              way (a resumed run goes on bit for bit; a pipeline's replicas,
 *              which load through the pipeline, do not yet); stage 3 at free
 *              and a change of the trainable set (which re-shards) gather
 *              float32, the exact masters.
 * Bytes per collective halve (dt_zero_stats.bytes_reduced / bytes_gathered).
 * Gradient clipping's norm is over the float32 reduced shards.
 *
 * Node-shared memory (opts.dp.shm AUTO, every rank on one machine, the
 * windows fit /dev/shm; dist.h section 6): stage 1 keeps its gradients in
 * node-shared memory (float32 wire: the flat gradient buffer itself, as DDP;
 * 16-bit: a 16-bit copy of the layout) and stages 1/2 gather parameters
 * through a node-shared buffer of the layout in the wire dtype, so the
 * reduce-scatters and all-gathers run without messages, bitwise as through
 * MPI. Stage 2 gradients and stage 3 are not moved: full-size shared buffers
 * would cost the memory those stages exist to save. A model with nothing to
 * train (every parameter frozen, e.g. for evaluation) gets no window: no
 * gradient to reduce, no step to gather. dt_zero_memory.shm_bytes reports
 * the node-shared bytes per rank.
 *
 * Node-shared parameters (opts.node_params; any number of machines; dist.h
 * section 10): the model's parameters live once per machine in memory its
 * ranks share. A rank steps its shard in place there (nobody else writes it:
 * each element has one owner) and the post-step all-gather sends it to one
 * rank of every other machine, which writes it into that machine's copy;
 * nothing is copied inside a machine. Safe without more locking because a
 * rank steps bucket b only after b's reduce-scatter, which each rank joins
 * after its last read of b in the step, and reads b in the next forward only
 * after b's all-gather, which ends with a barrier of its machine. Stage 3
 * keeps its parameters whole like this too (no gathers per module):
 * per machine one copy, per rank 1/R of it, where stage 3 privately holds
 * 1/N plus the buckets in use on every rank. Results are bitwise those of
 * private parameters.
 */
#ifndef DTRAIN_ZERO_H
#define DTRAIN_ZERO_H

#include "dtrain/dist.h"
#include "dtrain/nn.h"
#include "dtrain/optim.h"
#include "dtrain/parallel.h"
#include "dtrain/strategy.h"

typedef struct dt_zero dt_zero;

typedef enum dt_zero_overlap {
    DT_ZERO_OVERLAP_OFF = 0,
    DT_ZERO_OVERLAP_AFTER_BACKWARD = 1,
    DT_ZERO_OVERLAP_INTERLEAVED = 2,
} dt_zero_overlap;

typedef struct dt_zero_opts {
    dt_dp_opts dp;               /* buckets (default 4 MiB), wire (the 16-bit wire above), shared memory
                                    (AUTO or OFF), find_unused_params (the shard owners step only the
                                    parameters some rank used: frozen and unused ones keep their values
                                    and optimizer state, as PyTorch with grad None), join (stages 1/2),
                                    sync_bn (any stage; buffers are then not broadcast) ... (parallel.h) */
    int stage;                   /* 1, 2 or 3 (default 1) */
    dt_zero_overlap overlap_step;   /* default AFTER_BACKWARD */
    float clip;                  /* max global grad norm; 0 = off */
    int prefetch;                /* stage 3: modules gathered ahead (default 2; 0 = none) */
    int node_params;             /* 1: the parameters live once per machine, in memory its ranks share
                                    (dt_pg_alloc_machine, dist.h section 10): each rank steps its shard
                                    in place and the post-step all-gather brings every other shard into
                                    each machine once, copying nothing inside it. Stage 3 then keeps
                                    its parameters as stage 2 does (one whole copy per machine,
                                    gathered once per step instead of per module): per rank 1/R of
                                    the parameters on a machine of R ranks. Where the machines cannot
                                    share (DTRAIN_COLLECTIVES=flat, a full /dev/shm) the parameters
                                    stay private, at the requested stage: dt_zero_node_params says.
                                    float32 wire only; not with dp.join. Default 0. */
    dt_dtype param_dtype;        /* DT_F32 (default): forward reads the float32 values the shards hold.
                                    DT_BF16 / DT_F16: mixed precision's working copy (nn.h,
                                    dt_working_copy): the owned shards are float32 masters, in a
                                    buffer of their own at every stage (stages 1/2: +4 bytes per
                                    owned element), and every gathered parameter, a rank's own chunk
                                    included, is the master rounded to 16 bits. The parameter
                                    all-gathers carry 16 bits (half the bytes, whatever dp.wire says
                                    of gradients) and lose nothing: layouts agree bit for bit with
                                    DDP under the same param_dtype. fp16: a master beyond 65504 is
                                    gathered as inf (the loss says so; the trainer's own copy
                                    refuses it by name). Not with node_params. */
} dt_zero_opts;

typedef struct dt_zero_bucket {
    int index;
    size_t begin, numel;         /* padded element range of the layout; numel % N == 0 */
    size_t used;                 /* [begin, begin + used) holds parameters, the rest is padding */
    size_t shard;                /* numel / N: elements each rank owns */
    size_t own_begin;            /* begin + rank * shard */
    size_t shard_offset;         /* this bucket's place in the rank's compact shard buffers */
    int first_param, n_params;   /* params in layout order: order[first_param ..] */
    int trainable;               /* 1: its parameters have requires_grad, its shard has optimizer
                                    state; 0: frozen ones only (no state: dt_zero_shard_state reads
                                    zeros, loads skip it) */
} dt_zero_bucket;

void dt_zero_opts_default(dt_zero_opts *o);
/* node_params in effect: 1 with the machine's shared copy, 0 otherwise;
 * why (may be NULL) gets the reason it was refused ("" when not asked). */
int dt_zero_node_params(const dt_zero *z, const char **why);
/* Re-lays out the model, creates the sharded optimizer for cfg, broadcasts
 * rank 0's parameters and buffers, installs hooks. Contradictory options
 * (clip with INTERLEAVED, stage outside 1..3, ...) fail with a message. */
dt_status dt_zero_create(dt_model *m, dt_pg *pg, const dt_optim_cfg *cfg, const dt_zero_opts *o,
                         dt_zero **out);
/* Waits for in-flight work, removes hooks. Stage 3: parameters are gathered
 * back into the model's flat buffer first, so the model is whole again. */
void dt_zero_free(dt_zero *z);

void dt_zero_set_lr(dt_zero *z, float lr);   /* LR of the coming step (INTERLEAVED steps during backward) */
/* Before each micro-step's forward; sync = 0 accumulates locally (no_sync).
 * Installs the progress tick on g and marks g final = sync (autograd.h);
 * g must stay alive until finish_backward, which asks it which parameters
 * the forward used. */
dt_status dt_zero_before_forward(dt_zero *z, dt_graph *g, int sync);
/* After the synchronising micro-step's backward: unused parameters (error or
 * zeros), remaining reduce-scatters launched and waited. */
dt_status dt_zero_finish_backward(dt_zero *z);
/* Clip (if enabled), step the shards not yet stepped, issue the parameter
 * all-gathers (OFF: and wait for them). *grad_norm (may be NULL) gets the
 * global norm when clipping, else -1. */
dt_status dt_zero_step(dt_zero *z, double *grad_norm);
/* Uneven inputs (opts.join, stages 1/2; src/parallel/zero/join.c): a rank
 * whose data ran out calls this instead of training. Like dt_ddp_join, it
 * shadows the other ranks' collectives with zero gradients (activity
 * agreement, buffer broadcasts, the used-parameter sum, every
 * reduce-scatter, the clip norm) until no rank is active; the average still
 * divides by the world size (as DDP's join), so results equal DDP + join.
 * Unlike a joined DDP rank, a joined ZeRO rank still owns its shards: it
 * steps them with the reduced gradients, at the learning rate the active
 * ranks set (carried by the agreement), and all-gathers them, or the active
 * ranks' parameters would never move there. Active ranks must also call it
 * once their own data runs out. Under join only synchronising micro-steps
 * communicate (the agreement waits for last step's parameter all-gathers
 * first), and buffers come from the highest rank still active. On return
 * every rank holds the same parameters and the buffers of the highest rank
 * that ran the most steps. */
dt_status dt_zero_join(dt_zero *z);
/* Waits for parameter all-gathers in flight; afterwards (stages 1/2) every
 * parameter value in the model is current. Stage 3: frees every gathered
 * bucket except those holding parameters no module owns (then a forward, e.g.
 * evaluation, can run; modules gather their own). */
dt_status dt_zero_sync_params(dt_zero *z);

/* Collective, between steps: after requires_grad changed on some parameters
 * (unfreezing or freezing a layer), re-partition for the new trainable set
 * (zero/refresh.c). Every rank must have the same trainable set (else
 * DT_EINVAL on every rank naming a parameter and the ranks). Optimizer state
 * moves by parameter name and element range to wherever its shard now
 * lives: a parameter that stays trainable keeps its moments and its own
 * step count exactly; a newly trainable one starts with zero state and step
 * 0; a newly frozen one loses its state (frozen parameters have none, so
 * dt_zero_get_memory's optim_bytes shrink). Costs a transient full-size copy
 * of the optimizer state on every rank. On failure after the re-partition
 * began, z is only fit for dt_zero_free. */
dt_status dt_zero_refresh_trainable(dt_zero *z);

/* ---- introspection (checkpoints, benchmarks, tests) ---- */
int dt_zero_stage(const dt_zero *z);
/* 1 when the parameters' float32 values live only as owned shards (stage 3,
 * or a 16-bit param_dtype: the flat copy then holds rounded values), so a
 * checkpoint writes and reads them as owned ranges (dt_zero_value_pieces,
 * dt_zero_read_states), never from the model's tensors. */
int dt_zero_values_sharded(const dt_zero *z);
int dt_zero_num_buckets(const dt_zero *z);
const dt_zero_bucket *dt_zero_bucket_at(const dt_zero *z, int i);
/* params in layout order (bucket b holds order[b.first_param .. +n_params)) */
dt_param *const *dt_zero_param_order(const dt_zero *z);
/* The rank's owned shard of bucket i: parameter values (S floats) and
 * optimizer state k (S floats, NULL if the optimizer has no such state). */
float *dt_zero_shard_params(dt_zero *z, int bucket);
float *dt_zero_shard_state(dt_zero *z, int bucket, int k);
int64_t dt_zero_optim_step(const dt_zero *z);         /* completed optimizer steps */
void dt_zero_set_optim_step(dt_zero *z, int64_t step);
const dt_optim_cfg *dt_zero_optim_cfg(const dt_zero *z);
dt_pg *dt_zero_pg(const dt_zero *z);

/* Per-rank memory: bytes held persistently for parameters, gradients and
 * optimizer state, and the high-water mark of the temporary full-size
 * bucket buffers (stage 2 gradients, stage 3 gathered parameters). */
typedef struct dt_zero_memory {
    size_t param_bytes, grad_bytes, optim_bytes;
    size_t grad_window_peak, param_window_peak;
    size_t shm_bytes;            /* node-shared buffers (stage 1 gradients moved there are counted in
                                    grad_bytes, not here) */
} dt_zero_memory;
dt_zero_memory dt_zero_get_memory(const dt_zero *z);

typedef struct dt_zero_stats {
    int64_t steps;
    double wait_us;              /* blocked waiting for reductions after backward */
    double gather_wait_us;       /* blocked waiting for parameter all-gathers */
    double step_us;              /* optimizer time outside backward */
    int64_t interleaved_steps;   /* bucket shards stepped during backward */
    int64_t deferred_gathers;    /* AFTER_BACKWARD: parameter all-gathers issued after dt_zero_step
                                    returned (queued in forward order, a few in flight at a time) */
    int64_t backward_gathers;    /* stage 3: bucket all-gathers issued during backward (recompute included) */
    int64_t backward_regathers;  /* of those, of a bucket already gathered earlier in the same backward
                                    (0 when every module's window holds: recompute pins its modules) */
    size_t bytes_reduced;        /* payload bytes this rank handed to its gradient reduce-scatters
                                    (bucket length x wire element size each: 2 per element on a 16-bit wire) */
    size_t bytes_gathered;       /* the same for the training steps' parameter all-gathers */
} dt_zero_stats;
dt_zero_stats dt_zero_get_stats(const dt_zero *z);

/* ---- checkpoints (zero/checkpoint.c) ----
 * Sharded: path is a directory; each rank writes its pieces of every
 * parameter and optimizer state into its own safetensors file, rank 0 writes
 * index.json last (the commit point). Consolidated: one ordinary dtrain
 * checkpoint file streamed to rank 0 bucket by bucket. Both load at any world
 * size and any stage (and with DDP / one process). */
typedef enum dt_zero_ckpt_format { DT_ZERO_CKPT_SHARDED = 0, DT_ZERO_CKPT_CONSOLIDATED = 1 } dt_zero_ckpt_format;
/* Collective. Parameters, buffers, optimizer state and the trainer's metadata
 * (dt_checkpoint_meta). */
dt_status dt_zero_save(dt_zero *z, dt_run *run, const char *path, dt_zero_ckpt_format fmt);
/* Collective. Either format, written at any world size / stage (or by DDP /
 * one process: a plain dtrain checkpoint is the consolidated format). */
dt_status dt_zero_load(dt_zero *z, dt_run *run, const char *path);
/* For a caller that writes and reads its own sharded set (a pipeline stage
 * over part of a model; r->model is the model z covers). state_pieces: the
 * pieces of the optimizer states this rank owns ("optim.<state>.<param>",
 * element ranges), for parameters with !skip[index] (skip may be NULL);
 * pc has room for states x n_params pieces, names for as many 192-byte
 * names (filled in piece order). Returns the count, -1 on error.
 * read_states: this rank's owned ranges of every state (values sharded,
 * dt_zero_values_sharded: and of the parameter values; then call
 * dt_zero_gather_params, collectively, once every rank has read), and the
 * step counts: the optimizer's, and each parameter's from the checkpoint's
 * "optim_steps" (strategy.h: dt_checkpoint_apply_steps_of, whose local_of
 * and n_listed map the indices it lists to r->model's; NULL, 0: its own). A
 * state the checkpoint lacks is allowed for a parameter that took no step. */
int dt_zero_state_pieces(dt_zero *z, dt_run *r, const unsigned char *skip, dt_ckpt_piece *pc, char (*names)[192]);
/* bf16 optimizer state (optim.h): the pieces above point at fp32 copies that
 * exist only between state_open and state_close (every bucket's optimizer's
 * dt_optimizer_state_open / _close; store = 1 rounds what was written back).
 * Nothing to do with fp32 state. save, load and read_states open their own. */
dt_status dt_zero_state_open(dt_zero *z);
void dt_zero_state_close(dt_zero *z, int store);
dt_status dt_zero_read_states(dt_zero *z, dt_run *r, const dt_ckpt *ck, int64_t optim_step, const int *local_of,
                             int n_listed);
/* Values sharded (stage 3, or a 16-bit param_dtype): the pieces of this
 * rank's owned ranges of the parameter values (the float32 masters), for
 * parameters with !skip[index]; pc has room for n_params pieces (names: the
 * parameters'). Returns the count (0 when the model's tensors hold the
 * values), -1 on error. */
int dt_zero_value_pieces(dt_zero *z, dt_run *r, const unsigned char *skip, dt_ckpt_piece *pc);
/* After the owned shards' parameter values were overwritten (load): stages
 * 1/2 all-gather every bucket so the full parameters match (a 16-bit
 * param_dtype: then rounded, the working copy); stage 3 only the buckets no
 * module owns. Collective. */
dt_status dt_zero_gather_params(dt_zero *z);

/* A dt_strategy for the trainer (replaces its optimizer step and
 * checkpointing). The group must outlive the trainer. */
dt_status dt_zero_strategy(dt_pg *pg, const dt_zero_opts *o, dt_zero_ckpt_format fmt, dt_strategy *out);

/* Tensor parallelism (parallel.h dt_tp_strategy) with ZeRO stage zero->stage
 * (1, 2 or 3) over each tensor-parallel rank's replicas in place of DDP:
 * every rank keeps its share of its tensor-parallel parts and of the
 * replicated parameters. The strategy owns the step (the global norm counts
 * each split part and each replicated parameter once) and saves one file of
 * whole tensors under their global names, as dt_tp_strategy does (so
 * zero.save_format does not apply); it loads any checkpoint dtrain writes.
 * zero->clip is ignored (the trainer's clip applies). World must outlive it. */
dt_status dt_tp_zero_strategy(dt_pg *world, const dt_tp_opts *tp, const dt_zero_opts *zero, dt_strategy *out);

#endif
