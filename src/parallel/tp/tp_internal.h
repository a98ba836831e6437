/* Tensor parallelism (Megatron-LM's layout), read in one sitting.
 *
 * The mesh. world = dp x tp, tp innermost: world rank w is tensor-parallel
 * rank w % T of replica w / T. The ranks of a replica (consecutive, so on
 * one machine when a machine holds whole replicas) form the TP group and
 * read the same batch (the sampler's replica is w / T); the ranks with equal
 * w % T form a DP group, on which an ordinary DDP averages the gradients of
 * the parameter parts they share. Groups are made in setup(), after the
 * configuration agreement, so a mismatch fails before any split.
 *
 * The split (src/nn/gpt2.c builds it from cfg.tp_size / tp_rank, which
 * prepare_model sets). A column-parallel linear y = x W splits W's output
 * columns: rank r computes y_r = x W_r, no communication, but x's gradient
 * is the sum of every rank's x-gradient -- so its input passes through
 * tp_copy (forward identity, backward all-reduce). A row-parallel linear
 * splits W's input rows and takes the column-parallel output y_r as its
 * input: each rank holds a partial product, summed by tp_reduce (forward
 * all-reduce, backward identity), then the bias is added once. Per layer
 * and micro-batch: 2 all-reduces of [B, T, C] forward (attention, MLP), 2
 * backward (the tp_copy's).
 *
 *   x -- ln_1 -- f -- c_attn[C, 3C/T] -- attention(H/T heads) -- c_proj[C/T, C] -- g -- +b --
 *   x -- ln_2 -- f -- c_fc[C, 4C/T] -- gelu -- c_proj[4C/T, C] -- g -- +b --
 *
 * The vocabulary: wte [V, C] split by rows (n = ceil(V / T) each, the last
 * part padded with zero rows); the embedding sums the ranks' lookups
 * (tp_reduce), the tied lm-head reads ln_f through tp_copy and gives this
 * rank's [B, T, n] logits, and the loss is vocab_parallel_cross_entropy
 * (per-row max, then sum of exp and target logit all-reduced: 3 N floats),
 * so no rank holds [B*T, V]. comm.c's allreduce_max serves it.
 *
 * Sequence parallelism (opts.sequence_parallel, cfg.tp_seq; Megatron-LM's).
 * Outside the split layers (LayerNorms, dropout, residual adds, the
 * embedding sum + wpe, ln_f) rank r holds only positions [r S, r S + S) of
 * every sample, S = T / T_tp, as x[B, S, C]. f becomes an all-gather along
 * the sequence (backward: reduce-scatter) and g a reduce-scatter (backward:
 * all-gather); the embedding's partial lookups are reduce-scattered and
 * the lm-head reads the all-gathered ln_f output:
 *
 *   x[B,S,C] -- ln_1 -- AG -- c_attn -- attention -- c_proj -- RS -- +b --
 *   x[B,S,C] -- ln_2 -- AG -- c_fc -- gelu -- c_proj -- RS -- +b --
 *
 * The same bytes move as with the two all-reduces (an all-reduce is a
 * reduce-scatter + an all-gather), but the [B, T, C] tensors outside the
 * split layers are 1/T_tp per rank. The shards are [B, S, C] (batch-major
 * like every op; ops/tp.c explains the layout): MPI concatenates by rank,
 * so comm.c reorders through a staging buffer (s->stage, outside the arena)
 * when B > 1. Dropout keys its masks by the global element (ops.h
 * dt_op_dropout_at), so the masks are one process's.
 *
 * The invariant. Outside the split layers every rank of a group computes
 * the same bits (same batch, same replicated parameters, an all-reduce
 * whose result is the same on every rank), so replicated parameters (wpe,
 * LayerNorms, row-parallel biases) receive identical gradients on every
 * rank and are never reduced over the group: DDP over the DP group keeps
 * them equal across replicas, and the identical optimizer step keeps them
 * equal inside the replica. A split parameter's gradient is its own part's.
 * With sequence parallelism the first half no longer holds: each rank
 * computes the replicated parameters' gradients from its own positions
 * only, a partial sum. So after the last micro-batch's backward (after DDP,
 * before clipping and the optimizer: s_after_backward) the replicated
 * gradients are summed over the TP group (seq.c, one all-reduce), which
 * makes them whole and equal on every rank of the group again; from there
 * on the invariant holds as stated (clipping counts them once, the
 * optimizer steps agree, DDP's average is linear so its order is free).
 *
 * Clipping (norm.c): the global norm squares each split parameter's parts
 * once (summed over the group) and each replicated parameter once.
 * Checkpoints (ckpt.c) hold whole tensors under their global names: save
 * all-gathers every split parameter and optimizer state; load is local
 * (every rank reads the whole tensor and keeps its part:
 * dt_checkpoint_read_param), so any tp size, DDP or one process resumes any.
 * Models: gpt2 builds its part from cfg (prepare_model); a user's model
 * built for its rank (nn.h dt_nn_add_linear_col / _row) is accepted when
 * every split parameter is part rank % T of T (setup checks).
 * With --pp each stage is split this way (pipe/tp.c: the mesh), sequence
 * parallelism included (the sends carry the shards; the pipeline's step
 * sums the replicated gradients, seq.c).
 *
 * ZeRO over the replicas (dt_tp_zero_strategy, zero.c): in place of DDP,
 * ZeRO stage 1/2/3 runs on the DP group (made also when dp == 1, a group of
 * one), so each replica of tensor-parallel rank t keeps 1/dp of rank t's
 * parts and replicated parameters: optimizer state (1), gradients (2),
 * parameters (3, gathered per module in ZeRO's hooks; the TP group's
 * all-reduces run between them on their own communicator, in the same order
 * on every rank). The layouts of a DP group's ranks are alike (equal parts,
 * padded), so the DP group shards like plain ZeRO. The strategy owns the
 * step: the global norm is each rank's owned shards of split parameters,
 * plus its owned shards of replicated ones on tp rank 0 only (they are the
 * same on every tp rank), summed over the world in rank order -- the same
 * bits on every rank and in every run, clipping's and loss scaling's.
 * Saves gather each DP group's shards (dt_zero_gather_local) into this
 * rank's whole parts and then write as above: one file of whole tensors.
 * Loads are ZeRO's own (zero/checkpoint.c reads a split parameter's owned
 * range out of its part of the whole tensor), so any layout resumes any.
 * Inside pipeline stages (--tp --pp --zero) the pipeline's ZeRO does the
 * same per stage (pipe/dp.c: the norm; pipe/ckpt.c: the sets).
 * Sequence parallelism with ZeRO: by the time seq.c's sum could run, ZeRO
 * has reduced the gradients to owned shards, so the sum runs on them
 * (dt_tp_sum_replicated_shards, from s_after_backward after
 * dt_zero_finish_backward): the DP groups of a TP group's ranks have equal
 * layouts, so ZeRO rank d of every tp rank owns the same ranges of each
 * replicated parameter (checked once at setup), and summing those ranges of
 * the reduced gradients over the TP group equals summing first and reducing
 * after (both sums; only the rounding order differs). One packed all-reduce
 * per step on the TP group, before the norm, the loss-scale verdict and any
 * shard step (so zero.overlap_step interleaved is refused with it), after
 * every ZeRO-3 gather and release of the step, in the same place on every
 * rank. The pipeline's step does the same per stage (pipe/tp.c).
 *
 * Placement. A TP group sits inside one machine: its all-reduces run in
 * every layer, several times the DP all-reduce's bytes per step, so setup
 * refuses a group that spans machines (placement.c; the pipeline mesh too,
 * over its (machine, rank) order) rather than run it slowly. On one machine
 * comm.c's sum is dt_allreduce_node: each rank stages its buffer in the
 * group's node-shared window and sums all T slots in rank order, so the
 * invariant's "same bits on every rank" holds by construction at any T;
 * DTRAIN_TP_ALLREDUCE=mpi runs MPI's all-reduce instead (tied in speed on
 * this machine: docs/PERFORMANCE.md). */
#ifndef DT_TP_INTERNAL_H
#define DT_TP_INTERNAL_H

#include "dtrain/parallel.h"
#include "dtrain/zero.h"

typedef struct dt_tp {
    dt_tp_opts opts;
    dt_pg *world;            /* the caller's */
    dt_pg *tp_pg, *dp_pg;    /* made in setup; dp_pg NULL when dp == 1 */
    int T, rank, dp;         /* tp size, world rank, replicas */
    dt_tp_comm comm;         /* what the model's tp ops call (comm.c) */
    int node;                /* comm's sum runs dt_allreduce_node (comm.c) */
    dt_strategy inner;       /* DDP over dp_pg (dp > 1, no ZeRO), else name NULL */
    /* ZeRO over dp_pg in place of DDP (zero.c); zero_stage 0: none */
    int zero_stage;
    dt_zero_opts zopts;
    dt_zero *zero;           /* made in setup */
    unsigned char *skip_split, *skip_whole;   /* per parameter: norm.c's two sums over owned shards */
    dt_tp_stats stats;
    size_t bytes_at_step;    /* stats.bytes when the step began */
    float *stage;            /* comm.c: sequence parallelism's reorder buffer (stage_n floats), owned */
    size_t stage_n;
    float *sum_buf;          /* seq.c: the replicated gradients packed for their sum (sum_n floats), owned */
    size_t sum_n;
} dt_tp;

/* comm.c: comm over s->tp_pg (blocking collectives, counted): the sum
 * node-shared (dt_allreduce_node) when the group is on one machine, unless
 * DTRAIN_TP_ALLREDUCE=mpi; MPI's otherwise. _free frees the stage and seq.c's sum buffer. */
void dt_tp_comm_init(dt_tp *s);
void dt_tp_comm_free(dt_tp *s);
/* seq.c: every replicated parameter's gradient := its sum over the TP group. */
dt_status dt_tp_sum_replicated_grads(dt_tp *s, dt_model *m);
/* seq.c, under ZeRO (z over this rank's DP group, after dt_zero_finish_backward,
 * before any shard steps): the same sum on the owned ranges of the replicated
 * parameters' reduced gradient shards (one all-reduce over the TP group).
 * _check (collective over the TP group, once at setup): every rank of the
 * group owns the same ranges, else DT_EINVAL on every rank. */
dt_status dt_tp_sum_replicated_shards(dt_tp *s, dt_zero *z);
dt_status dt_tp_check_replicated_shards(dt_tp *s, dt_zero *z);
/* "mpi" or "node": DTRAIN_TP_ALLREDUCE as comm.c reads it (ranks agree on it). */
const char *dt_tp_allreduce_path(void);
/* placement.c: DT_EINVAL naming the ranks and their machines when a TP group
 * (places g*T .. g*T+T-1; place of world rank r: pos[r], or r when pos is
 * NULL) spans machines. Local: every rank gives the same verdict. */
dt_status dt_tp_check_placement(dt_pg *world, int T, const int *pos);
/* norm.c: the squared global gradient norm (strategy.h grad_sumsq). */
dt_status dt_tp_grad_sumsq(dt_tp *s, const dt_model *m, double *ss);
/* zero.c: ZeRO over dp_pg (s->zero_stage > 0). setup makes it and prints
 * the memory report; step clips / scales by the global norm and steps the
 * owned shards; sumsq is that norm (collective over the world). */
dt_status dt_tp_zero_setup(dt_tp *s, dt_run *r);
dt_status dt_tp_zero_sumsq(dt_tp *s, double *ss);
dt_status dt_tp_zero_step(dt_tp *s, dt_run *r, float lr);
void dt_tp_zero_free(dt_tp *s);
/* zero.c: "tp", or "tp+zero-<stage>" — the strategy's name, its memory
 * report's and its checkpoints' "strategy". */
const char *dt_tp_label(const dt_tp *s);
/* ckpt.c: one safetensors file of whole tensors, written by world rank 0. Collective. */
dt_status dt_tp_save(dt_tp *s, dt_run *r, const char *path);

#endif
