#ifndef DT_PIPE_INTERNAL_H
#define DT_PIPE_INTERNAL_H
/* The pipeline's pieces: probe + partition (pipe_probe.c), tied parameters
 * (pipe_tie.c), the schedule runner (pipe_engine.c), the strategy glue
 * (pipe_strategy.c). */
#include "dtrain/optim.h"
#include "dtrain/pipeline.h"
#include "parallel_internal.h"
#include "pipe_schedule.h"

/* ---- probe (pipe_probe.c) and partition (pipe_balance.c) ---- */
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
 * found is returned unproved (pipe_probe.c). Equally good cuts: a fixed
 * choice (the same on every rank). DT_EINVAL when S > n or a cost is not
 * finite. */
dt_status dt_pipe_balance_ranks(const double *cost, int n, int P, int V, int *first);
/* Blocks of one kind differ only by timing noise: each group of costs within
 * 5% of each other (sorted, every neighbour within 5%, the largest within 5%
 * of the smallest) is set to its mean, in place. Returns cost (pipe_probe.c
 * says why). */
double *dt_pipe_snap_costs(double *cost, int n);

/* ---- rank placement (pipe_place.c) ----
 * node[r]: machine id of world rank r (dt_pg_node_of: ids are ranks < W).
 * pos[r]: r's place in the (machine, rank) order; stage pos / D, replica
 * pos % D. place_local: 1 when every stage's replicas share a machine. */
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
    dt_grad_ready_fn ready_fn;   /* the data-parallel reducer's grad-ready, held until the total is known (pipe_dp.c) */
    size_t msg_len;           /* floats per message buffer: 1 + rows + rows * cols */
    dt_work *work[DT_PIPE_MAX_STAGES];
} dt_pipe_tie;

/* ---- one micro-batch on one chunk ---- */
typedef struct dt_pipe_slot {
    dt_graph *g;              /* its tape (from the pool), NULL when done */
    dt_tensor *x;             /* input activation (graph input), NULL on virtual stage 0 */
    dt_tensor *out;           /* output activation, or the loss on the last virtual stage */
    float *act, *grad;        /* receive buffers: input activation, output gradient */
    int64_t act_n, grad_n;    /* their elements */
    dt_work *recv_act, *recv_grad, *send_act, *send_grad;
    int b_done;               /* its B ran (the authority's tied W waits for it) */
} dt_pipe_slot;

struct dt_pipe {
    dt_pipe_opts o;
    dt_pg *world, *pp, *dp;   /* pp: this replica's pipeline (rank = stage); dp: this stage's replicas */
    int P, D, stage, replica, V, S;
    int dp_local;             /* every stage's replicas share a machine (pipe_place.c) */
    int vfirst[DT_PIPE_MAX_VSTAGES + 1];   /* virtual stage v = blocks [vfirst[v], vfirst[v+1]) */
    dt_model *m;
    /* schedule for the current M */
    dt_pipe_schedule sched;
    int M;
    /* per step: slots[c * M + j] */
    dt_pipe_slot *slots;
    int slots_cap;
    const dt_batch *mb;
    float loss_scale;
    double loss_sum;
    /* tapes: a pool reused across micro-batches and steps */
    dt_graph **pool; int n_pool, n_free; dt_graph **free_list;
    int graphs_live, graphs_peak;
    /* weight-gradient deferral predicate state: defer[local param index] */
    unsigned char *defer;
    /* tied parameters */
    dt_pipe_tie *ties; int n_ties;
    int *tie_of;              /* local param index -> tie or -1 */
    int tie_auth_chunk;       /* authority of some tie: the chunk whose tape defers them (-1: none) */
    int tie_next_w, tie_next_fold;   /* authority: next micro-batch whose own tied W / holders' rows come */
    /* optimizer over this stage's flat buffer (without ZeRO) */
    dt_optimizer optim;
    int optim_ready;
    /* data parallel across this stage's replicas (pipe_dp.c): at most one */
    struct dt_ddp *ddp;
    struct dt_zero *zero;
    unsigned char *norm_skip; /* per local parameter: a tied copy whose authority is another rank */
    /* checkpoints: every parameter of the whole model (for the index) and the
     * buffers this rank writes */
    int n_global;
    char (*gname)[128];
    dt_ckpt_shape *gshape;
    unsigned char *buffer_mine;
    dt_trace *trace;
    dt_pipe_stats stats;
    double compute_us, wait_us;
    /* a step or evaluation failed midway: its messages may never complete, so
     * teardown neither waits for them nor frees their buffers (MPI may still
     * write into them) */
    int broken;
    /* pipe_engine.c: abort notices between the stages of a step that failed
     * midway (one receive per peer stays posted on pp from the first step or
     * evaluation to dt_pipe_engine_free) */
    struct dt_pipe_notice *notice;
};

/* pipe_engine.c: one step's forward + backward over mb[0..M) / evaluation. */
dt_status dt_pipe_run_step(dt_pipe *p, const dt_batch *mb, int M, double *loss_sum);
dt_status dt_pipe_run_eval(dt_pipe *p, const dt_batch *b, int n, double sums[3]);
void dt_pipe_engine_free(dt_pipe *p);
/* rank (in pp) and chunk of virtual stage v */
static inline int dt_pipe_rank_of(const dt_pipe *p, int v) { return v % p->P; }
static inline int dt_pipe_vstage(const dt_pipe *p, int chunk) { return chunk * p->P + p->stage; }

/* pipe_dp.c: data parallel across the replicas of this stage (DDP or ZeRO-1/2
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
 * (gathers waited), per-rank bytes */
double dt_pipe_dp_sumsq(dt_pipe *p, const unsigned char *skip);
dt_status dt_pipe_dp_step(dt_pipe *p, float lr, float scale);
dt_status dt_pipe_dp_sync(dt_pipe *p);
void dt_pipe_dp_memory(const dt_pipe *p, size_t *param, size_t *grad, size_t *optim);

/* pipe_ckpt.c: sharded checkpoints under global names (any layout reads them) */
dt_status dt_pipe_ckpt_capture(dt_pipe *p, const dt_pipe_probe *pr);   /* before dt_model_keep_params */
void dt_pipe_ckpt_free(dt_pipe *p);
dt_status dt_pipe_save(dt_pipe *p, dt_run *r, const char *dir);
dt_status dt_pipe_load(dt_pipe *p, dt_run *r, const char *path);

/* pipe_tie.c */
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
