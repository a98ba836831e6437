/* dtrain/pipeline.h — pipeline parallelism: a model's blocks cut into stages
 * on different ranks, micro-batches streamed through them by a static
 * schedule, with data-parallel replicas of every stage.
 *
 * Ranks. world = P stages x D replicas x T tensor-parallel ranks (T = 1
 * without tp_size). Ranks are ordered by (machine, rank); place i is
 * tensor-parallel rank i % T, replica (i / T) % D, stage i / (D T) (on one
 * machine, rank r = (stage D + replica) T + tp: tp innermost, then dp, then
 * pp). A stage's ranks with equal tensor-parallel rank form its data-parallel
 * group — on one machine whenever each machine runs a multiple of D T ranks,
 * whatever order the launcher used — the P ranks of one replica with equal
 * tensor-parallel rank a pipeline (activations go between equal tp ranks of
 * adjacent stages), and the T ranks of one stage of one replica its
 * tensor-parallel group.
 *
 * Stages. The model's blocks (nn.h section 3) are cut into S = P * V
 * contiguous virtual stages: balanced by cost measured on one micro-batch
 * (rank 0's timing, so every rank cuts alike) or split explicitly. Rank s
 * holds virtual stages s, P + s, ... (its V chunks) and only their parameters,
 * gradients and optimizer state (dt_model_keep_params): memory about 1/P. The
 * loss head runs on the last virtual stage. Which block uses which parameter
 * is found by running the blocks once (the probe); a parameter used on two
 * ranks (GPT-2's wte: embedding on the first stage, lm-head on the last) is
 * *tied*: both hold it, the last one is its authority (below).
 *
 * A step. The trainer hands over the step's M micro-batches (its --accum):
 *
 *   for each action of this rank's schedule (F, B, W of micro-batch j, chunk c):
 *     F: receive the activation (all receives are posted at the start of the
 *        step), run the chunk's blocks on its own tape, send the output on
 *        (or compute the loss on the last virtual stage)
 *     B: receive the output gradient, backward from it (dt_graph_backward_from;
 *        the loss scaled by 1/M), send the input gradient back
 *     W: the weight gradients B deferred (ZB-H1, dt_graph_backward_weights)
 *   tied gradients completed on their authority, copied to the other holders
 *   data parallel: each stage's gradients averaged over its D replicas (DDP
 *   buckets, or ZeRO's reduce-scatter, launched during the last backward)
 *   global gradient norm over all stages (clipping), optimizer step per stage
 *   (ZeRO: each replica steps its shard, then all-gathers)
 *
 * Exactness. Every parameter's gradient accumulates its micro-batches in the
 * order one process accumulating them would (every schedule runs a chunk's B
 * and W in micro-batch order), so training with --pp P --microbatches M equals
 * one process with --accum M bit for bit. A tied parameter needs more: one
 * process adds, per micro-batch, the lm-head's contribution and then the
 * embedding's. So the authority defers its own contribution's weight
 * gradient (split backward) until the other holder's contribution to the
 * previous micro-batch has arrived — computed there into a zeroed buffer and
 * sent as its non-zero rows — and folds them in that order. Dropout is exact
 * too: its masks are keyed by the micro-batch rows' sample positions
 * (dt_batch.row_keys), which every stage is given. Not exact: a parameter
 * used by two chunks of the same rank.
 *
 * Messages: activations and gradients are point-to-point (dist.h dt_send /
 * dt_recv) on the pipeline group, their shapes fixed by the blocks'
 * declarations and checked between neighbours at set-up; the progress engine
 * moves them while the stage computes (the tape's tick). They travel as
 * float32, or in 16 bits on request (dt_pipe_opts.wire).
 */
#ifndef DTRAIN_PIPELINE_H
#define DTRAIN_PIPELINE_H

#include "dtrain/dist.h"
#include "dtrain/nn.h"
#include "dtrain/parallel.h"
#include "dtrain/strategy.h"
#include "dtrain/zero.h"

typedef enum dt_pipe_kind {
    DT_PIPE_GPIPE = 0,        /* fill-drain: all forwards, then all backwards */
    DT_PIPE_1F1B = 1,         /* warm-up forwards, then one forward / one backward (PipeDream-Flush) */
    DT_PIPE_INTERLEAVED = 2,  /* 1F1B over V chunks per rank (Megatron virtual pipeline) */
    DT_PIPE_ZBH1 = 3,         /* 1F1B with backward split: input gradients now, weight gradients fill the bubble */
} dt_pipe_kind;

#define DT_PIPE_MAX_STAGES 64       /* P (the simulator's and the report's tables) */
#define DT_PIPE_MAX_VSTAGES 256     /* P * V */

typedef struct dt_pipe_opts {
    int stages;               /* P >= 1; the world size must be a multiple of it */
    dt_pipe_kind schedule;    /* default 1F1B */
    int virtual_stages;       /* V: chunks per rank; > 1 only with the interleaved schedule (default 1) */
    int max_outstanding;      /* GPipe: micro-batches forwarded but not yet back per stage (0 = all) */
    int n_split;              /* > 0: split[v] blocks in virtual stage v (sums to the block count); 0: balanced */
    int split[DT_PIPE_MAX_VSTAGES];
    /* Data parallel across a stage's D replicas: DDP (zero_stage 0, used when
     * D > 1) or ZeRO stage 1/2 (also at D = 1). Buckets fill from the grad-ready
     * hooks of each chunk's last micro-batch, so reductions overlap that
     * backward (and the rest of the schedule) as in DDP / ZeRO; tied
     * parameters join after their total is known. The pipeline clips over
     * all stages itself: zero.clip is ignored, and clipping with zero's
     * interleaved step overlap is refused. */
    int zero_stage;           /* 0, 1, 2 or 3 (with tp_size > 1 too: each tensor-parallel
                                 rank's parts of the stage sharded over its replicas) */
    /* Tensor parallelism inside every stage (tp.size T, GPT-2 only): each
     * stage is built split T ways (cfg.tp_size / tp_rank, as dt_tp_strategy
     * does) over T ranks; world = D replicas x P stages x T. 0 or 1: none. */
    int tp_size;
    /* Sequence parallelism inside the tensor-parallel stages (tp_size > 1;
     * parallel.h dt_tp_opts.sequence_parallel): the activations between
     * blocks, and so the pipeline's sends, are this tp rank's positions
     * [B, T / tp_size, C]; each stage sums its replicated gradients over its
     * tensor-parallel group before the clip norm and the step. */
    int sequence_parallel;
    dt_ddp_opts ddp;          /* dt_ddp_opts_default by dt_pipe_opts_default */
    dt_zero_opts zero;        /* dt_zero_opts_default by dt_pipe_opts_default */
    /* The weights a stage computes with (train.param_dtype): DT_F32 (default)
     * or a 16-bit working copy of float32 masters (nn.h dt_working_copy;
     * with ZeRO, zero.param_dtype is set from it). */
    dt_dtype param_dtype;
    /* What activations and their gradients travel between stages as: DT_F32
     * (default; the pipeline then equals one process bit for bit, above) or
     * DT_BF16 / DT_F16: half the bytes on every pipeline link, rounded to
     * nearest even by the sender and widened to float32 by the receiver, which
     * computes in float32 as before (Megatron-LM sends its pipeline dtype).
     * The rounding makes a run differ from one process; it is the same for
     * every schedule and replica count with the same cut. fp16 overflows to
     * inf from 65520 (an activation: the step's loss is not finite) and
     * rounds gradients below about 3e-8 to zero unless the loss is scaled
     * (--precision fp16). Tied-parameter rows always travel as float32; the
     * data-parallel reductions have their own wire (ddp / zero's dp.wire). */
    dt_dtype wire;
} dt_pipe_opts;

void dt_pipe_opts_default(dt_pipe_opts *o);
/* "gpipe" | "1f1b" | "interleaved" | "zb-h1"; 0 ok. */
int dt_pipe_kind_parse(const char *name, dt_pipe_kind *out);
const char *dt_pipe_kind_name(dt_pipe_kind k);
/* Theoretical bubble (idle / step per rank): gpipe and 1f1b (P-1)/(M+P-1),
 * interleaved that / V, zb-h1 (P-1)/(3M+P-1) (the paper's idle at equal F, B,
 * W costs). src/parallel/pipe/pipe_internal.h says when each is exact. */
double dt_pipe_bubble_formula(dt_pipe_kind kind, int P, int M, int V);

/* The pipeline as a dt_strategy (strategy.h): owns the optimizer (one per
 * stage), schedules the trainer's micro-batches, evaluates through the
 * pipeline. Groups are split from world in setup (collective). */
dt_status dt_pipe_strategy(dt_pg *world, const dt_pipe_opts *o, dt_strategy *out);

/* Timers of the last step (bench/bench_pipeline), this rank. */
typedef struct dt_pipe_stats {
    double step_us;           /* forward_backward + optimizer step */
    double schedule_us;       /* the schedule's actions, first to last (forward_backward) */
    double compute_us;        /* inside F, B, W (the schedule's own timers) */
    double wait_us;           /* blocked on a message (pipeline bubble + exposed communication) */
    double bubble;            /* idle inside the schedule: 1 - compute / schedule */
    size_t param_bytes;       /* this rank's parameters */
    size_t arena_bytes;       /* activation memory: the tapes' high-water marks */
    int graphs;               /* tapes alive at the peak (micro-batches in flight x chunks) */
    size_t sent_bytes;        /* activations and gradients this rank sent to other stages (payload) */
} dt_pipe_stats;
dt_status dt_pipe_strategy_stats(const dt_strategy *s, dt_pipe_stats *out);

#endif
