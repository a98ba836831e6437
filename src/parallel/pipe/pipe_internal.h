#ifndef DT_PIPE_INTERNAL_H
#define DT_PIPE_INTERNAL_H
/* The pipeline's pieces: probe + partition (pipe/probe.c), tied parameters
 * (pipe/tie.c), the schedule runner (pipe/engine.c), the strategy glue
 * (pipe/strategy.c); the state they share is struct dt_pipe, in named parts
 * (below, after the engine's types). */
#include "dtrain/optim.h"
#include "dtrain/pipeline.h"
#include "parallel/common/common_internal.h"

/* ==== schedules (schedule.c, schedule_sim.c): plain data, no engine ==== */
/* Static pipeline-parallel schedules: which action each rank runs, in order.
 *
 * P ranks (1..64), M micro-batches per step, V model chunks per rank. The
 * model's blocks are cut into S = P*V consecutive virtual stages; virtual
 * stage v = c*P + s is chunk c of rank s (Megatron's interleaving: rank s
 * holds virtual stages s, P+s, 2P+s, ...). Activations flow v -> v+1,
 * gradients v+1 -> v; virtual stage S-1 (rank P-1, chunk V-1) computes the
 * loss. Each rank runs its list act[s][0..n[s]) in order; a send never
 * blocks, a receive blocks until the message is there.
 *
 * One rule for every schedule: on every rank, the backwards (B) of a chunk
 * run in increasing micro-batch order, and the weight-gradient passes (W)
 * in the order of their B's. Gradients then accumulate in the same order
 * as sequential gradient accumulation over micro-batches 0..M-1, so they
 * are bitwise equal to it. dt_pipe_schedule_check enforces the rule.
 *
 * The schedules (s = rank, 0 is the first stage):
 *   gpipe        V = 1, any M. All F's, then all B's (mb 0 first). With
 *                max_outstanding L: fill-drain in groups of L micro-batches.
 *   1f1b         V = 1, any M (PipeDream-Flush). min(P-s-1, M) warm-up F's,
 *                then F,B pairs, then the remaining B's. M < P is allowed:
 *                it degenerates to fill-drain (the bubble is GPipe's).
 *   interleaved  V >= 2, M a multiple of P (Megatron-LM's virtual pipeline).
 *                The k-th forward of a rank is micro-batch (k / PV)*P + k % P
 *                on chunk (k % PV) / P; the k-th backward the same micro-
 *                batch on chunk V-1-(k % PV)/P. Warm-up min((P-s-1)*2 +
 *                (V-1)*P, M*V) forwards, then forward k+warm-up and backward
 *                k alternate, then the remaining backwards.
 *   zb-h1        V = 1, any M, B split from W (Zero Bubble, handcrafted
 *                schedule 1). F and B in 1F1B's order; W(i - s) runs right
 *                after B(i), the remaining W's at the end. Rank s so holds
 *                up to s+1 W's back and ends with B(M-1) followed by s+1
 *                W's: with tf = tb = tw and no latency every rank ends at
 *                3M+P-1, idle P-1 per rank (1f1b with tb = 2tf: 3(P-1)).
 *                The deferred W's grow toward the LAST stage: it must end
 *                with P W's after its last B so the B chain to rank 0 fits
 *                before the common end (rank s needs s+1). Memory: at most P
 *                micro-batches forwarded but not yet W'ed on every rank,
 *                rank 0's 1F1B peak. */

#define DT_PIPE_MAX_RANKS 64

/* F: forward of micro-batch mb through chunk c. B: backward (input gradient;
 * also the weight gradient unless the schedule splits W). W: weight gradient
 * of (mb, c), zb-h1 only. */
typedef enum dt_pipe_op { DT_PIPE_F = 0, DT_PIPE_B, DT_PIPE_W } dt_pipe_op;
typedef struct dt_pipe_action { uint8_t op, chunk; int32_t mb; } dt_pipe_action;
typedef struct dt_pipe_schedule {
    dt_pipe_kind kind;
    int P, M, V;
    int split_w;          /* 1: B computes input gradients only, W the weight gradients (zb-h1) */
    int max_outstanding;  /* gpipe: micro-batches forwarded but not yet backwarded per rank, at most
                             (1..M after build; build's 0 means M: plain fill-drain); else 0 */
    int *n;               /* n[s]: actions of rank s */
    dt_pipe_action **act; /* act[s][0..n[s]) */
} dt_pipe_schedule;

/* Builds every rank's list. DT_EINVAL names the offending value: P outside
 * 1..64, M < 1, V outside 1..255, V != 1 for gpipe/1f1b/zb-h1, V < 2 or
 * M % P != 0 for interleaved, max_outstanding < 0 or set for a schedule
 * other than gpipe. max_outstanding > M is M. Free with
 * dt_pipe_schedule_free (also safe on a zeroed or failed schedule). */
dt_status dt_pipe_schedule_build(dt_pipe_kind kind, int P, int M, int V, int max_outstanding,
                                 dt_pipe_schedule *out);
void dt_pipe_schedule_free(dt_pipe_schedule *s);
/* "gpipe" "1f1b" "interleaved" "zb-h1" -> 0; else -1 and DT_EINVAL recorded. */
/* dt_pipe_kind_parse / dt_pipe_kind_name: dtrain/pipeline.h */
/* Rank's list as "F0 F1 B0 ..." (V = 1) or "F0c0 F1c0 F0c1 ..." (V > 1:
 * micro-batch then chunk), snprintf-style: writes at most n bytes (always
 * terminated when n > 0) and returns the length of the whole text; -1 for a
 * rank out of range. */
int dt_pipe_schedule_format(const dt_pipe_schedule *s, int rank, char *buf, size_t n);

/* Textbook bubble fraction (idle / step time per rank): gpipe and 1f1b
 * (P-1)/(M+P-1) (plain fill-drain; the simulator gives exactly this on every
 * rank at tb = 2tf, no latency), interleaved that divided by V (Megatron's
 * approximation: the simulated value at tb = 2tf, no latency, is exactly
 * (P-1)/(MV+P-1), higher by the factor 1 + (V-1)(P-1)/(MV+P-1)), zb-h1
 * (P-1)/(3M+P-1): the paper's idle (P-1)(tf+tb-tw) over the step 3M+P-1 at
 * tf = tb = tw (simulated exactly when M >= P; fewer micro-batches idle
 * more). Use dt_pipe_schedule_simulate for the value of a built schedule. */
/* dt_pipe_bubble_formula(kind, P, M, V): declared in dtrain/pipeline.h */

/* Every action takes its cost (tf, tb or tw, chunks equal), a message to
 * another rank arrives lat after the end of the action that produced it (the
 * same rank: at once), and an action starts when its rank is free and its
 * inputs are there. Per rank s < P: busy time, bubble (makespan - busy) /
 * makespan (0 when makespan is 0), peak_outstanding: most (mb, chunk)
 * forwarded but not yet B'ed at once (deferred W's not counted). Entries
 * from P on are 0. DT_EINVAL as dt_pipe_schedule_check, and when the lists
 * deadlock: names the rank, action index and (op, mb, chunk) that can never
 * start and the input it waits for. */
typedef struct dt_pipe_sim {
    double makespan;
    double busy[DT_PIPE_MAX_RANKS];
    double bubble[DT_PIPE_MAX_RANKS];
    int peak_outstanding[DT_PIPE_MAX_RANKS];
} dt_pipe_sim;
dt_status dt_pipe_schedule_simulate(const dt_pipe_schedule *s, double tf, double tb, double tw, double lat,
                                    dt_pipe_sim *out);
/* DT_OK when: P, M, V in range; every rank runs each F(mb, c) and B(mb, c),
 * and W(mb, c) when split_w (never otherwise), exactly once; the lists can
 * run to the end (F(mb, v) after F(mb, v-1) wherever that runs, B(mb, v)
 * after B(mb, v+1) and after F(mb, v), W(mb, c) after B(mb, c)); on every
 * rank the B's of a chunk run in increasing mb order and the W's in the order
 * of the B's. Else DT_EINVAL naming the rank, the action index and the
 * action. */
dt_status dt_pipe_schedule_check(const dt_pipe_schedule *s);

/* ==== the engine and the strategy ==== */

/* Message tags on the pipeline group (dt_pipe.comm.pp), one range per kind of
 * message. v: the receiving virtual stage, j: the micro-batch, M micro-batches
 * per step, t: a tie id (0..n-1 over n ties). The engine refuses S*M >= 10000
 * and tie.c n*M >= 10000 or n > 1000, so no two ranges overlap. */
enum dt_pipe_tag {
    DT_PIPE_TAG_ACT = 0,           /* + v*M + j: activations (engine.c) */
    DT_PIPE_TAG_GRAD = 10000,      /* + v*M + j: activation gradients (engine.c) */
    DT_PIPE_TAG_TIE_ROWS = 20000,  /* + t*M + j: a tied parameter's rows (tie.c) */
    DT_PIPE_TAG_SHAPES = 30000,    /* + chunk: start-up activation shape check (strategy.c) */
    DT_PIPE_TAG_TIE_TOTAL = 31000, /* + t: a step's total tied gradient (tie.c) */
    DT_PIPE_TAG_NOTICE = 32000,    /* abort and closing notices (engine.c) */
};

/* ---- probe (pipe/probe.c) and partition (pipe/balance.c) ---- */
/* One forward of every block on ex: cost[i] = block i's time in ms (the
 * loss head counted with the last block), and used[k * n_blocks + i] = 1 when
 * block i used parameter k (index before any dt_model_keep_params). */
typedef struct dt_pipe_probe {
    int n_blocks, n_params, n_modules;
    double *cost;
    unsigned char *used;
    int *module_block;        /* the block that entered module k (-1: none) */
} dt_pipe_probe;
dt_status dt_pipe_probe_run(dt_model *m, const dt_batch *ex, dt_pipe_probe *out);
void dt_pipe_probe_free(dt_pipe_probe *p);
/* Whether virtual stage v / pipeline rank `rank` uses parameter k (global
 * index), and the last virtual stage that does (-1: no block uses it). */
typedef struct dt_pipe dt_pipe;
int dt_pipe_chunk_uses(const dt_pipe *p, const dt_pipe_probe *pr, int k, int v);
int dt_pipe_rank_uses(const dt_pipe *p, const dt_pipe_probe *pr, int k, int rank);
int dt_pipe_last_user(const dt_pipe *p, const dt_pipe_probe *pr, int k);
/* The pipeline rank whose blocks use buffer `name` (by its module), else 0. */
int dt_pipe_buffer_owner(const dt_pipe *p, const dt_pipe_probe *pr, const dt_model *m, const char *name);
/* Cut n blocks into S contiguous non-empty ranges minimising the largest
 * summed cost: first[v] .. first[v+1] (first[0] = 0, first[S] = n). */
dt_status dt_pipe_balance(const double *cost, int n, int S, int *first);
/* The interleaved cut: S = P * V contiguous non-empty ranges first[v] ..
 * first[v+1] (first[0] = 0, first[S] = n), range v on rank v % P, minimising
 * lexicographically (1) the largest rank total (rank r: ranges r, r + P,
 * r + 2P, ... summed), then (2) the largest single range. Negative costs count
 * as 0; costs are compared on a fixed-point grid of 2^-50 of their total
 * (exact for integer costs below 2^50). V = 1 or P = 1 (the same objective as
 * dt_pipe_balance's) is dt_pipe_balance(cost, n, S, first). Otherwise a
 * heuristic cut (never worse than dt_pipe_balance's) is proved optimal by
 * lower bounds or improved by a bounded search, exact while its states fit
 * its budget (2^16 extensions, a few milliseconds); past it the best cut
 * found is returned unproved (pipe/probe.c). Equally good cuts: a fixed
 * choice (the same on every rank). DT_EINVAL when S > n or a cost is not
 * finite. */
dt_status dt_pipe_balance_ranks(const double *cost, int n, int P, int V, int *first);
/* Blocks of one kind differ only by timing noise: each group of costs within
 * 5% of each other (sorted, every neighbour within 5%, the largest within 5%
 * of the smallest) is set to its mean, in place. Returns cost (pipe/probe.c
 * says why). */
double *dt_pipe_snap_costs(double *cost, int n);

/* ---- rank placement (pipe/strategy.c) ----
 * node[r]: machine id of world rank r (dt_pg_node_of: ids are ranks < W).
 * pos[r]: r's place in the (machine, rank) order; tensor-parallel rank
 * pos % T, replica (pos / T) % D, stage pos / (D T). place_local(.., n):
 * 1 when each run of n consecutive places (a stage's D T ranks) shares a
 * machine. */
void dt_pipe_place(const int *node, int W, int *pos);
int dt_pipe_place_local(const int *node, const int *pos, int W, int D);

/* ---- tied parameters ----
 * Used on several ranks of the pipeline. The authority (the rank of the last
 * virtual stage using it) accumulates the step's gradient in the order one
 * process would: per micro-batch its own contribution (deferred weight
 * gradient), then each other holder's, received as non-zero rows. At the end
 * of the step the authority sends the total to the holders. */
typedef struct dt_pipe_tie {
    dt_param *p;              /* this rank's copy */
    int id;                   /* among the model's tied parameters, by registration order (same on every rank) */
    int authority;            /* pipeline rank */
    int is_authority;
    int chunk;                /* the chunk of this rank whose blocks use it */
    int n_holders;            /* authority: the other ranks holding it, by descending virtual stage (the
                                 order one process's backward reaches them); a holder: 1 (the authority) */
    int holders[DT_PIPE_MAX_STAGES];
    int64_t rows, cols;       /* gradient viewed as [rows, cols] for the row messages */
    float *e;                 /* holder: this micro-batch's contribution (zero between micro-batches) */
    float *saved_grad;        /* holder: p->grad.data while it points at e */
    float *msg;               /* holder: send buffer; authority: n_holders receive buffers */
    dt_grad_ready_fn ready_fn;   /* the data-parallel reducer's grad-ready, held until the total is known (pipe/dp.c) */
    size_t msg_len;           /* floats per message buffer: 1 + rows + rows * cols */
    dt_work *work[DT_PIPE_MAX_STAGES];
} dt_pipe_tie;

/* ---- one micro-batch on one chunk ---- */
typedef struct dt_pipe_slot {
    dt_graph *g;              /* its tape (from the pool), NULL when done */
    dt_tensor *x;             /* input activation (graph input), NULL on virtual stage 0 */
    dt_tensor *out;           /* output activation, or the loss on the last virtual stage */
    float *act, *grad;        /* receive buffers: input activation, output gradient */
    int64_t act_n, grad_n;    /* their elements (and the 16-bit buffers' of each side) */
    /* o.wire 16-bit: the messages' own buffers, widened into act / grad on
     * arrival and rounded from the output / input gradient before sending.
     * in16 receives the input activation (done at F) and then sends the input
     * gradient (from B); out16 sends the output, gout16 receives its gradient
     * (posted at the start of the step while out16's send may be under way:
     * two buffers). NULL with a float32 wire. */
    uint16_t *in16, *out16, *gout16;
    dt_work *recv_act, *recv_grad, *send_act, *send_grad;
    int b_done;               /* its B ran (the authority's tied W waits for it) */
} dt_pipe_slot;

/* ---- the pipeline's state, in named parts ----
 * o and m are set at create / setup; each part below says who writes it. */

/* Where this rank sits and which blocks it runs. Set at create and setup
 * (pipe/strategy.c: make_groups, s_setup, cut_blocks), read-only after.
 * W = P x D world ranks: P pipeline stages (1..DT_PIPE_MAX_STAGES), each run
 * by D data-parallel replicas; this rank is (stage, replica), placed by
 * dt_pipe_place. The model's blocks are cut into S = P x V virtual stages
 * (S <= DT_PIPE_MAX_VSTAGES); virtual stage v = blocks [vfirst[v], vfirst[v+1])
 * (vfirst[0] = 0, vfirst[S] = n_blocks of the whole model, none empty) is
 * chunk v / P of pipeline rank v % P (dt_pipe_rank_of, dt_pipe_vstage). */
typedef struct dt_pipe_layout {
    int P, D, V, S;
    int stage, replica;       /* 0 <= stage < P (its rank in comm.pp), 0 <= replica < D (its rank in dp.pg) */
    int T, tp_rank;           /* tensor parallelism inside the stage: T >= 1 ranks, this one tp_rank (its rank in tp.pg) */
    int vfirst[DT_PIPE_MAX_VSTAGES + 1];
} dt_pipe_layout;

/* The pipeline's messages. world is the caller's group; pp (this replica's
 * pipeline, rank = stage, split at create and owned) carries every message,
 * tagged by enum dt_pipe_tag; the ones of a step are posted and waited by
 * the engine through the slots (dt_pipe_step). */
typedef struct dt_pipe_comm {
    dt_pg *world, *pp;
    /* pipe/engine.c: abort notices between the stages of a step that failed
     * midway (one receive per peer stays posted on pp from the first step or
     * evaluation to dt_pipe_engine_free); NULL before, and when P = 1 */
    struct dt_pipe_notice *notice;
    /* a step or evaluation failed midway: its messages may never complete, so
     * teardown neither waits for them nor frees their buffers (MPI may still
     * write into them) */
    int broken;
} dt_pipe_comm;

/* The current step (pipe/engine.c). sched is the schedule for M micro-batches
 * (rebuilt when a step brings another M; sched.act[stage] is this rank's
 * list); mb[0..M) the step's micro-batches (the caller's, valid during the
 * step). slots[c * M + j]: micro-batch j on chunk c < V, each with its tape,
 * receive buffers and the sends / receives in flight; slots_cap >= V x M of
 * them allocated. After a step that completed no slot holds a tape. */
typedef struct dt_pipe_step {
    dt_pipe_schedule sched;
    int M;
    const dt_batch *mb;
    dt_pipe_slot *slots;
    int slots_cap;
    float loss_scale;         /* S / M: the last virtual stage's backward seed */
    float grad_scale;         /* S: the run's loss scale (strategy.h; 0 or 1: none), set per step */
    double loss_sum;          /* the step's summed micro-batch losses (last stage only) */
} dt_pipe_step;

/* Tapes, reused across micro-batches and steps (pipe/engine.c): pool[0..n_pool)
 * every tape made, free_list[0..n_free) those in no slot; live = n_pool - n_free
 * are in slots, peak the most at once this step (the schedule's in-flight
 * count). defer[local parameter index] = 1: its weight gradient waits for a
 * W action (set per step: zb-h1, every parameter but a holder's tied copies;
 * other schedules, the ties this rank is the authority of). */
typedef struct dt_pipe_tapes {
    dt_graph **pool; int n_pool;
    dt_graph **free_list; int n_free;
    int live, peak;
    unsigned char *defer;
} dt_pipe_tapes;

/* Tied parameters (pipe/tie.c): list[0..n), one per tied parameter this
 * rank holds; of[local parameter index] = its index in list, or -1. The ties
 * a rank is the authority of all sit in its chunk auth_chunk (-1: it is the
 * authority of none), whose tape defers their weight gradients; during a
 * step (pipe/engine.c) the authority folds the holders' rows and runs its
 * own tied W in micro-batch order: next_w, next_fold are the next
 * micro-batch of each (next_fold <= next_w <= M). */
typedef struct dt_pipe_tie_set {
    dt_pipe_tie *list; int n;
    int *of;
    int auth_chunk;
    int next_w, next_fold;
} dt_pipe_tie_set;

/* Data parallel across this stage's D replicas (pipe/dp.c): pg (split at
 * create, owned, rank = replica) and at most one reducer over it, DDP or
 * ZeRO-1/2/3 of the stage's parameters; none when D = 1 without ZeRO. */
typedef struct dt_pipe_dp {
    dt_pg *pg;
    int local;                /* every stage's replicas share a machine (dt_pipe_place_local) */
    struct dt_ddp *ddp;
    struct dt_zero *zero;     /* owns the optimizer state when set */
    /* ZeRO in tensor-parallel stages: per local parameter, left out of the
     * norm's split sum / whole sum (norm_skip, and the other kind); made at
     * the first norm (dp.c) */
    unsigned char *skip_split, *skip_whole;
} dt_pipe_dp;

/* The stage's update (pipe/strategy.c): without ZeRO, optim steps this
 * stage's whole flat buffer (ready: initialised). norm_skip[local parameter
 * index]: a tied copy whose authority is another rank, left out of the clip
 * norm (and of the ZeRO states this rank saves) so a tied gradient counts
 * once. */
typedef struct dt_pipe_update {
    dt_optimizer optim;
    dt_working_copy wcopy;   /* without ZeRO: param_dtype's 16-bit weights during a step or an evaluation */
    int ready;
    unsigned char *norm_skip;
} dt_pipe_update;

/* Checkpoints (pipe/ckpt.c): every parameter of the whole model, captured
 * before the stage dropped the others' (n_global names and shapes, for the
 * index), local_of[global index]: its index in the stage's model (-1: not
 * held here; the "optim_steps" metadata counts global indices),
 * saver[local index]: this rank's stage is the one that writes the
 * parameter (the last that uses it, as a tie's authority; an unused one:
 * stage 0), so a parameter held by several stages is written once, frozen
 * (no tie) or not, and buffer_mine[buffer index]: the buffers this rank
 * writes. */
typedef struct dt_pipe_ckpt {
    int n_global;
    char (*gname)[128];
    dt_ckpt_shape *gshape;
    int *local_of;
    unsigned char *saver;
    unsigned char *buffer_mine;
} dt_pipe_ckpt;

/* What the last step measured (dt_pipe_strategy_stats): compute_us, wait_us
 * are the running step's timers, copied into stats at its end; trace (the
 * run's, optional) gets the actions as events. */
typedef struct dt_pipe_metrics {
    dt_pipe_stats stats;
    double compute_us, wait_us;
    size_t sent_bytes;        /* this step so far (engine.c send_wire) */
    dt_trace *trace;
} dt_pipe_metrics;

/* Tensor parallelism inside the stage (pipe/tp.c): pg joins this stage's T
 * ranks of this replica (rank = lay.tp_rank; split at create, owned, NULL
 * when T = 1); tp is the tp room's state over pg, whose dt_tp_comm the
 * stage's model calls (m->tp), so the split layers communicate exactly as
 * under dt_tp_strategy. */
typedef struct dt_pipe_tp {
    dt_pg *pg;
    struct dt_tp *tp;
} dt_pipe_tp;

struct dt_pipe {
    dt_pipe_opts o;
    dt_model *m;              /* the run's model; after setup only this stage's parameters */
    dt_pipe_layout lay;
    dt_pipe_comm comm;
    dt_pipe_step step;
    dt_pipe_tapes tapes;
    dt_pipe_tie_set ties;
    dt_pipe_dp dp;
    dt_pipe_tp tp;
    dt_pipe_update upd;
    dt_pipe_ckpt ck;
    dt_pipe_metrics metrics;
};

/* pipe/engine.c: p->step.sched for M micro-batches (kept while M stays);
 * refuses S x M beyond the activation tags' range (a (virtual stage,
 * micro-batch) pair each). */
dt_status dt_pipe_ensure_schedule(dt_pipe *p, int M);
/* pipe/engine.c: one step's forward + backward over mb[0..M) / evaluation. */
dt_status dt_pipe_run_step(dt_pipe *p, const dt_batch *mb, int M, double *loss_sum);
dt_status dt_pipe_run_eval(dt_pipe *p, const dt_batch *b, int n, double sums[3]);
void dt_pipe_engine_free(dt_pipe *p);
/* rank (in pp) and chunk of virtual stage v */
static inline int dt_pipe_rank_of(const dt_pipe *p, int v) { return v % p->lay.P; }
static inline int dt_pipe_vstage(const dt_pipe *p, int chunk) { return chunk * p->lay.P + p->lay.stage; }

/* pipe/dp.c: data parallel across the replicas of this stage (DDP or ZeRO-1/2/3
 * over the stage's parameters); the tapes' tick calls dt_pipe_dp_tick. */
dt_status dt_pipe_dp_setup(dt_pipe *p, dt_run *r);   /* after the stage's parameters and ties exist */
void dt_pipe_dp_free(dt_pipe *p);
int dt_pipe_dp_active(const dt_pipe *p);             /* a reducer exists (D > 1, or ZeRO) */
dt_status dt_pipe_dp_begin(dt_pipe *p, dt_run *r);   /* before the step's first action */
void dt_pipe_dp_tick(dt_pipe *p);
/* after the ties' totals are shared: their held grad-ready fires, every
 * reduction is waited (collective over the stage's replicas) */
dt_status dt_pipe_dp_finish(dt_pipe *p);
/* ZeRO only: sum of squares of the owned gradient shards (skip[local index]:
 * left out), the step with the pipeline's clip scale, parameters current
 * (gathers waited; stage 3: only buckets no module owns stay gathered),
 * per-rank bytes */
/* This rank's part of the clip norm's squared sum under ZeRO (skip: tied
 * copies left out). In tensor-parallel stages a replicated parameter's
 * owned shards count on tp rank 0 only (the other ranks hold the same). */
double dt_pipe_dp_sumsq(dt_pipe *p, const unsigned char *skip);
dt_status dt_pipe_dp_step(dt_pipe *p, float lr, float scale);
dt_status dt_pipe_dp_skip(dt_pipe *p);   /* ZeRO: a step skipped by loss scaling (nothing stepped) */
dt_status dt_pipe_dp_sync(dt_pipe *p);
void dt_pipe_dp_memory(const dt_pipe *p, size_t *param, size_t *grad, size_t *optim);

/* pipe/tp.c: tensor parallelism inside the stages (lay.T > 1; each a no-op
 * at T = 1). prepare sets cfg's split before the trainer builds the model;
 * attach checks the model was built split and gives it the group's comm
 * (before the probe: its forward communicates); split_sumsq sums the split
 * parameters' squares (local[0]) over the group in rank order; whole gathers
 * a split tensor (q's value or state `local`) over the group into *whole
 * (malloc'd on tp rank 0, the checkpoint's writer; NULL elsewhere or when q
 * is not split); sum_replicated (sequence parallelism only) sums the
 * replicated parameters' gradients over the group (under ZeRO the owned
 * ranges of their reduced shards); check_shards (setup, sequence parallelism
 * with ZeRO) verifies the group's ranks own equal ranges. Collective over tp.pg. */
dt_status dt_pipe_tp_prepare(const dt_pipe *p, dt_model_cfg *cfg);
dt_status dt_pipe_tp_attach(dt_pipe *p, dt_model *m);
dt_status dt_pipe_tp_split_sumsq(dt_pipe *p, double *split);
dt_status dt_pipe_tp_sum_replicated(dt_pipe *p);
dt_status dt_pipe_tp_check_shards(dt_pipe *p);
dt_status dt_pipe_tp_whole(dt_pipe *p, const dt_param *q, const float *local, float **whole);
void dt_pipe_tp_free(dt_pipe *p);

/* pipe/ckpt.c: sharded checkpoints under global names (any layout reads them) */
/* before dt_model_keep_params, which keeps global[0..n_kept) as the stage's parameters 0..n_kept) */
dt_status dt_pipe_ckpt_capture(dt_pipe *p, const dt_pipe_probe *pr, const int *global, int n_kept);
void dt_pipe_ckpt_free(dt_pipe *p);
dt_status dt_pipe_save(dt_pipe *p, dt_run *r, const char *dir);
dt_status dt_pipe_load(dt_pipe *p, dt_run *r, const char *path);

/* pipe/tie.c */
dt_status dt_pipe_ties_setup(dt_pipe *p, const dt_pipe_probe *pr, const int *global_index_of);
void dt_pipe_ties_free(dt_pipe *p);
/* holder, around the B of (micro-batch j, chunk c): point the gradients of
 * the ties chunk c uses at their zeroed contribution buffers / point them
 * back and send micro-batch j's non-zero rows to the authority */
void dt_pipe_ties_redirect(dt_pipe *p, int c);
dt_status dt_pipe_ties_export(dt_pipe *p, int c, int j);
/* authority: post the receives of micro-batch j's rows (every holder) */
dt_status dt_pipe_ties_post(dt_pipe *p, int j);
/* authority: whether the posted rows have all arrived (tests, no wait) /
 * fold them into the gradients (waits) */
int dt_pipe_ties_arrived(dt_pipe *p);
dt_status dt_pipe_ties_fold(dt_pipe *p, int j);
/* authority -> holders: the step's total tied gradients; holders wait for
 * their sends first */
dt_status dt_pipe_ties_share(dt_pipe *p);

#endif
