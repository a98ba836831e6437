/* dtrain/parallel.h — data parallelism (DDP) over a process group.
 *
 * dt_ddp wraps a model whose gradients live in one flat buffer (nn.h). The
 * buffer is cut into buckets — contiguous ranges in layout order (reverse
 * registration ≈ backward order); the first bucket is capped small so the
 * first reduction starts early. With static_graph the buckets are cut once
 * more after the first iteration, in the order gradients became ready then
 * (a model that registers its parameters out of execution order); such a
 * bucket has a buffer of its own, gradients are copied in at launch and
 * back after the reduction. During backward each parameter's grad-ready
 * hook marks it in its bucket; a full bucket is handed to the process group
 * (all-reduce, average) at once, buckets strictly in index order on every
 * rank; the graph's tick callback keeps MPI progressing while backward
 * computes. dt_ddp_finish_backward waits for all of them.
 *
 *   dt_ddp *d; dt_ddp_create(model, world_pg, &opts, &d);   // broadcasts rank 0's params+buffers
 *   for each step:
 *     for k in micro-steps:
 *       dt_graph_reset(g);
 *       dt_ddp_before_forward(d, g, k == K-1);   // sync only on the last (no_sync otherwise)
 *       loss = dt_model_forward(...); dt_graph_backward_scaled(g, loss, 1.0f/K);
 *     dt_ddp_finish_backward(d);                 // grads now averaged over ranks
 *     optimizer step; dt_model_zero_grad(model);
 */
#ifndef DTRAIN_PARALLEL_H
#define DTRAIN_PARALLEL_H

#include "dtrain/dist.h"
#include "dtrain/nn.h"
#include "dtrain/strategy.h"

typedef struct dt_ddp dt_ddp;

typedef struct dt_ddp_bucket {
    int index;
    size_t begin, end;        /* element range [begin, end) of param_flat (staged: of the staging
                                 buffer); it holds no frozen or ignored parameter */
    float *grad;              /* grad_flat + dt_model_grad_offset(begin): reduce in place (the
                                 gradient layout leaves frozen parameters out; staged: staging +
                                 begin) */
    size_t numel;             /* end - begin */
    int staged;               /* 1: a static_graph bucket: its parameters are not contiguous in the
                                 flat gradient, they are copied into grad at launch and back after
                                 the reduction */
    const int *params;        /* its n_params parameters (model params[] indices), in bucket order:
                                 layout order, or (static_graph, after iteration 1) ready order */
    int n_params;
    int pending;              /* params not yet ready in this backward */
    int ready, launched;
    dt_work *work;
    void *scratch;            /* comm-hook scratch, owned by the hook (freed with free()) */
} dt_ddp_bucket;

/* Communication hook: replaces the default reduction of a bucket.
 * launch: start reducing b->grad (every rank calls it for the same bucket, in
 *   the same order); return a handle in *w (or NULL if already done).
 * finish: called after the handle completed (may be NULL); must leave the
 *   rank-average in b->grad. */
typedef struct dt_ddp_comm_hook {
    dt_status (*launch)(void *state, dt_pg *pg, dt_ddp_bucket *b, dt_work **w);
    dt_status (*finish)(void *state, dt_pg *pg, dt_ddp_bucket *b);
    void *state;
} dt_ddp_comm_hook;

/* ---- The data-parallel options DDP, ZeRO and a pipeline's replicas share ----
 * One struct, embedded as `.dp` in dt_ddp_opts and dt_zero_opts (a pipeline
 * passes its dt_ddp_opts or dt_zero_opts on to its stages' replicas), so a
 * setting has one name wherever it applies and the start-up agreement
 * describes it once. Defaults: dt_dp_opts_default (the strategies' own
 * defaults start from it; ZeRO's buckets are 4 MiB). */
typedef enum dt_dp_shm {
    DT_DP_SHM_AUTO = 0,       /* node-shared memory when the group (> 1 rank) is on one machine and the
                                 windows fit Open MPI's backing directory (/dev/shm); else MPI
                                 collectives. DDP: when buckets are reduced as float32 by the built-in
                                 hook. ZeRO: zero.h "Node-shared memory" */
    DT_DP_SHM_OFF = 1,        /* always MPI collectives (private buffers) */
    DT_DP_SHM_REQUIRE = 2,    /* DDP only: node-shared memory (also for 1 rank) or a creation error
                                 naming why */
} dt_dp_shm;

typedef struct dt_dp_opts {
    size_t first_bucket_bytes;   /* cap of the first bucket (small: the first reduction starts early);
                                    default 1 MiB */
    size_t bucket_bytes;         /* cap of the others; default 1 MiB (DDP: hides more on a slow link than
                                    4 MiB, costs nothing on shared memory: docs/PERFORMANCE.md), 4 MiB
                                    for ZeRO (fewer shard steps) */
    int find_unused_params;      /* 0: a parameter without gradient is an error naming it; 1: it is
                                    reduced as zeros, the ranks agree (one small sum per step) which
                                    parameters some rank used, and has_grad (autograd.h) says so: only
                                    those are stepped */
    int broadcast_buffers;       /* 1 (default): rank 0's buffers (BatchNorm statistics) to every rank
                                    each step (under join the highest rank still active); not with
                                    sync_bn (the statistics are equal already) */
    int sync_bn;                 /* 1: BatchNorm statistics all-reduced (SyncBatchNorm) */
    int deterministic;           /* fixed rank-order summation of every reduction (bitwise the same at
                                    any world size; the group's own setting is left alone) */
    int join;                    /* uneven inputs: agree on activity each step (dt_ddp_join,
                                    dt_zero_join); exclusive with sync_bn */
    dt_dtype wire;               /* what gradients (and ZeRO's gathered parameters) travel as: DT_F32
                                    (default), DT_BF16 or DT_F16, summed in float, rounded per step */
    dt_dp_shm shm;               /* default AUTO */
} dt_dp_opts;

void dt_dp_opts_default(dt_dp_opts *o);
/* The checks every strategy makes of its dp options: DT_EINVAL naming the
 * setting ("<who>: dp.wire ..."), else DT_OK. */
dt_status dt_dp_opts_validate(const dt_dp_opts *o, const char *who);

typedef struct dt_ddp_opts {
    dt_dp_opts dp;               /* buckets, wire, shared memory, ... (above). DDP's wire: bf16 / fp16
                                 * compression by the built-in hook; on a group whose allreduce is
                                 * hierarchical (dist.h section 10) only between machines, float32
                                 * inside each (DT_RED_CROSS_*); exclusive with hook and with
                                 * deterministic */
    int no_overlap;              /* 1: reduce only after backward (for measurement) */
    const dt_ddp_comm_hook *hook;   /* custom reduction; exclusive with a 16-bit wire */
    int static_graph;            /* 1: record the order gradients become ready in the first
                                    synchronising backward; after its reductions, check the order is
                                    the same on every rank (else an error naming the rank) and cut the
                                    buckets again in that order, once. Numerics are unchanged (each
                                    element is reduced the same way); only when buckets launch moves.
                                    Exclusive with join. */
    const char *const *params_to_ignore;   /* names or fnmatch globs (PyTorch's
                                    _set_params_and_buffers_to_ignore_for_model): these parameters
                                    are never reduced or broadcast; every rank keeps its own value,
                                    gradient and has_grad. A pattern matching no parameter is an
                                    error naming it. */
    int n_params_to_ignore;
} dt_ddp_opts;

void dt_ddp_opts_default(dt_ddp_opts *o);
/* Validates options (contradictions fail), buckets the flat gradient buffer,
 * installs grad-ready hooks, broadcasts parameters and buffers from rank 0. */
dt_status dt_ddp_create(dt_model *m, dt_pg *pg, const dt_ddp_opts *o, dt_ddp **out);
/* Waits for in-flight reductions and removes the hooks; gradients in
 * node-shared memory move back to a private buffer and the shared memory is
 * freed, which is collective over the group then. Call it before freeing the
 * group (dt_pg_free, dt_dist_finalize), which unmaps that memory. The progress tick it
 * installed on a graph stays: clear it with dt_graph_set_tick(g, NULL, NULL)
 * before running that graph again without a DDP. */
void dt_ddp_free(dt_ddp *d);
/* Before each micro-step's forward: sync = 0 accumulates locally (no_sync).
 * Broadcasts buffers if enabled, installs the progress tick on g and marks g
 * final = sync (autograd.h: grad-ready fires on the synchronising backward).
 * g must stay alive until finish_backward, which asks it which parameters
 * the forward used. With opts.join, active ranks also agree here that they
 * are active. */
dt_status dt_ddp_before_forward(dt_ddp *d, dt_graph *g, int sync);
/* After the synchronising micro-step's backward: marks unused parameters
 * (error if not allowed), launches remaining buckets, waits for all. With
 * find_unused_params every parameter's has_grad then means "some rank used
 * it in this step" (frozen ones: 0). */
dt_status dt_ddp_finish_backward(dt_ddp *d);
/* Uneven inputs (opts.join): a rank whose data ran out calls this instead of
 * training; it answers the other ranks' collectives (with zero gradients) for
 * as many steps as they still run, and returns when every rank has joined.
 * Active ranks must also call it once their own data runs out. Under join only
 * synchronising micro-steps communicate, and buffers are broadcast from the
 * highest rank still active (PyTorch's common rank), never from a joined one.
 * On return every rank holds the parameters and buffers of the highest rank
 * that ran the most steps (optimizer state is not synchronised). */
dt_status dt_ddp_join(dt_ddp *d);

/* Collective: after requires_grad changed on some parameters (between
 * steps: no micro-step of a step may have run), cut the buckets again over
 * the now trainable parameters. Every rank must have the same trainable set
 * (else DT_EINVAL on every rank naming a parameter and the ranks that
 * differ). With static_graph the next synchronising backward is recorded
 * again. The caller's optimizer is untouched (a dt_optimizer_init_model one
 * steps a parameter only while it has a gradient: a newly trainable one
 * starts from its zero state with its own step count). */
dt_status dt_ddp_refresh_trainable(dt_ddp *d);
/* 1 once static_graph re-cut the buckets in the recorded order. */
int dt_ddp_buckets_rebuilt(const dt_ddp *d);

int dt_ddp_num_buckets(const dt_ddp *d);
int dt_ddp_uses_shared_memory(const dt_ddp *d);   /* 1: buckets in node-shared memory */
const dt_ddp_bucket *dt_ddp_bucket_at(const dt_ddp *d, int i);

/* Communication statistics since creation (for benchmarks). */
typedef struct dt_ddp_stats {
    int64_t steps;
    double wait_us;        /* time blocked in finish_backward waiting for reductions */
    double backward_us;    /* time from first launch to end of backward (overlap window) */
    size_t bytes_reduced;  /* payload bytes handed to the group (2 per element when compressed) */
} dt_ddp_stats;
dt_ddp_stats dt_ddp_get_stats(const dt_ddp *d);

/* A dt_strategy for the trainer: creates the DDP in setup() on the
 * trainer's model. The group must outlive the trainer. */
dt_status dt_ddp_strategy(dt_pg *pg, const dt_ddp_opts *o, dt_strategy *out);

/* ---- tensor parallelism (src/parallel/tp/) ----
 * Megatron-style: the model's large layers split over `size` ranks (GPT-2
 * only: attention by heads, the MLP by its 4C columns; nn.h cfg.tp_size),
 * on a mesh world = dp x tp with tp innermost (ranks tp*k .. tp*k+tp-1 hold
 * one replica), DDP over each tensor-parallel rank's replicas, and whole
 * tensors in checkpoints. ZeRO over the replicas in place of DDP:
 * zero.h dt_tp_zero_strategy. With pipeline stages: pipeline.h tp_size. */
typedef struct dt_tp_opts {
    int size;                /* tp.size: ranks per replica; must divide the world */
    dt_ddp_opts ddp;         /* data parallelism across the replicas (world / size of them) */
} dt_tp_opts;
/* Counters since creation (benchmarks): the tensor-parallel all-reduces. */
typedef struct dt_tp_stats {
    int64_t calls, steps;
    size_t bytes;            /* payload handed to the group's all-reduces */
    size_t bytes_last_step;  /* of the last training step (forward + backward) */
} dt_tp_stats;
/* The strategy on `world` (which must outlive the trainer). No collective
 * here: the groups are made in setup(), after the configuration agreement. */
dt_status dt_tp_strategy(dt_pg *world, const dt_tp_opts *o, dt_strategy *out);
/* The counters of a strategy dt_tp_strategy made (self = its .self). */
dt_tp_stats dt_tp_get_stats(const void *self);

#endif
