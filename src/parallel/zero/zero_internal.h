#ifndef DT_PARALLEL_ZERO_INTERNAL_H
#define DT_PARALLEL_ZERO_INTERNAL_H
#include "dtrain/zero.h"
#include "parallel/common/common_internal.h"

/* One bucket: its public geometry plus per-step communication state. */
typedef struct zbucket {
    dt_zero_bucket pub;
    dt_optimizer opt;        /* state for [own_begin, own_begin + shard) */
    int n_grad_params;       /* params that get gradients (requires_grad) */
    int pending;             /* of those, not yet ready in this backward */
    int ready, launched, stepped;
    int has_orphan;          /* holds a parameter no module owns (stage 3: always gathered) */
    dt_work *rs;             /* reduce-scatter of the gradient in flight */
    dt_work *ag;             /* parameter all-gather in flight */
    int ag_queued;           /* stepped, all-gather waits in the queue (AFTER_BACKWARD) */
    float *full_grad;        /* full-size gradient: grad_flat + grad_begin (stage 1) or a pool buffer;
                                NULL for a frozen bucket (it has no gradient) */
    size_t grad_begin;       /* stage 1: where it starts in grad_flat (dt_model_grad_offset: frozen
                                parameters take no gradient memory) */
    size_t gshard_offset;    /* stages 2/3: its owned gradient shard in shard_grad (trainable only) */
    float *full_param;       /* stage 3: gathered parameters (pool buffer) or NULL */
    int bwd_gathered;        /* stage 3: all-gathered in this micro-step's backward (incl. recompute) */
    /* the wire (zero/wire.c): payload buffers of the collectives in flight when the
     * payload is not the float32 data itself (16-bit wire, or a node-shared buffer) */
    void *rs_wire;           /* reduce-scatter input, numel wire elements */
    void *ag_wire;           /* all-gather buffer, N x pchunk parameter-payload elements */
    size_t xn;               /* 16-bit param_dtype: float32 values each rank's all-gather chunk carries
                                after its S 16-bit ones, the exact (1-D, nn.h dt_param_copy_exact)
                                elements of its shard: the most any chunk holds, padded with zeros */
    size_t pchunk;           /* all-gather elements per rank: S + xn floats in payload elements */
    size_t pbegin;           /* where its all-gather payload starts in wire.ag_win (elements) */
    float *ag_dest;          /* where the gathered float32 values go when ag completes */
    int rs_pooled, ag_pooled;   /* the wire buffer came from the pool (else a shared window) */
} zbucket;

/* Payload dtype and node-shared windows (zero/wire.c), fixed at create. */
typedef struct zwire {
    dt_dtype dt;             /* opts.dp.wire: the gradients' payload */
    size_t es;               /* its element size */
    dt_dtype pdt;            /* the parameters' payload: opts.param_dtype when 16-bit, else dt */
    size_t pes;              /* its element size */
    size_t ptotal;           /* payload elements of every bucket's all-gather (sum of N x pchunk) */
    float *shm_grads;        /* stage 1, float32 wire: the flat gradient buffer, node-shared */
    void *rs_win;            /* stage 1, 16-bit wire: node-shared reduce-scatter inputs (layout x es) */
    void *ag_win;            /* stages 1/2: node-shared all-gather buffers (layout x es), on ag_pg */
    size_t shm_bytes;        /* rs_win + ag_win */
    float *mparams;          /* node_params: the machine's parameters (on ag_pg), = the model's
                                param_flat; NULL: private parameters */
    char mparams_why[256];   /* node_params asked and not in effect: why */
} zwire;

/* Buckets and owned shards. Written at create (zero/layout.c, shard storage
 * in zero/zero.c), read-only after; b[i].pub.begin + numel <= total. */
typedef struct zlayout {
    zbucket *b; int nb;
    dt_param **order;        /* params in layout order */
    int *param_bucket;       /* params[i] -> bucket */
    size_t total;            /* padded layout length */
    size_t shard_total;      /* sum of shard sizes */
    size_t gshard_total;     /* sum of trainable buckets' shard sizes (frozen ones have no gradient) */
    float *shard_param;      /* owned parameter shards (the masters), compact: stage 3, and stages 1/2
                                under a 16-bit param_dtype; NULL: they are param_flat's own ranges */
    float *shard_grad;       /* stages 2/3: owned gradient shards of trainable buckets, compact */
} zlayout;

/* Gradient reduction of the micro-step (zero/reduce.c). Set by before_forward,
 * advanced by grad-ready hooks and the graph tick, closed by finish_backward;
 * reduce-scatters launch and finish in bucket order: next_done <= next_launch. */
typedef struct zreduce {
    int op;                  /* DT_RED_AVG | deterministic flag (fixed at create) */
    int sync;                /* current micro-step reduces */
    dt_graph *graph;         /* the micro-step's graph (before_forward): its parameter uses */
    int next_launch;         /* reduce-scatters launch in bucket order */
    int next_done;           /* first bucket whose reduce-scatter is not yet finished (INTERLEAVED: stepped) */
    int reduced;             /* finish_backward done, step pending */
    int unused_checked;      /* this backward looked for unused parameters */
    int hold_steps;          /* an unused parameter will fail this step: no interleaved steps */
    dt_par_used used;        /* find_unused_params: parameters some rank used, summed once per
                                step before any reduce-scatter (first grad-ready, else
                                finish_backward); applied to has_grad before any shard step */
    int used_issued;         /* this step's sum was started */
    dt_status tick_err;      /* finishing a reduction (or stepping a shard) failed inside backward */
    char tick_msg[256];
    double last_check_us;    /* graph tick: reductions tested at most every 0.5 ms */
} zreduce;

/* AFTER_BACKWARD parameter all-gathers of stages 1/2 (zero/gather.c): queued
 * by dt_zero_step in forward order (last bucket first), issued a few at a
 * time; empty (next == -1) once all are issued. Same order on every rank. */
typedef struct zgather_queue {
    int queueing;            /* inside dt_zero_step with AFTER_BACKWARD: queue, do not issue */
    int next;                /* highest queued bucket not yet issued, -1: none */
    int *live, n_live;       /* issued from the queue, not yet seen complete */
    double last_pump_us;     /* graph tick: queue pumped at most every 0.5 ms */
} zgather_queue;

/* One phase's module order (zero/params.c): this micro-step's, and the
 * previous one's as the stage-3 prefetch plan. Entries are 4 * module + tag,
 * tag 0 forward, 1 recompute (PRE_RECOMPUTE), 2 backward. */
typedef struct zmod_seq {
    int *seq, n, cap;        /* entries as their hooks ran, this step */
    int *prev, n_prev, cap_prev;
} zmod_seq;

/* Module hooks (zero/params.c). buckets/nb are fixed at create; stage 3
 * records the orders while `recording` (a training micro-step).
 * Recompute pinning (stage 3): the modules a checkpoint replay re-ran stay
 * gathered through their backward. A PRE_RECOMPUTE adds its module to the
 * pinned set (starting a new set if backward ran since the last one); a
 * PRE_BACKWARD of a module outside the set empties it. */
typedef struct zmodules {
    int **buckets; int *nb;           /* per module: buckets holding its params */
    zmod_seq fwd, bwd;                /* forward phase (PRE_FORWARD); backward phase
                                         (PRE_RECOMPUTE and PRE_BACKWARD, in hook order) */
    int recording;                    /* a training micro-step: record orders, prefetch */
    int unified;                      /* a pipeline stage: one order (fwd) for the whole step, F and B
                                         entries interleaved as its actions ran (zero/params.c) */
    int in_backward;                  /* this micro-step's backward phase has begun */
    unsigned char *pinned;            /* per module: in the pinned set */
    int n_pinned;
    int pin_open;                     /* recomputes since the last PRE_BACKWARD extend the set */
    unsigned char *want;              /* scratch: bucket needed now */
} zmodules;

/* Free full-size bucket buffers, reused (zero/layout.c), and the elements
 * handed out as gradient / stage-3 parameter buckets (live and peak). */
typedef struct zpool_buf { float *buf; size_t cap; } zpool_buf;
typedef struct zpool {
    zpool_buf *free_bufs; int n, cap;
    size_t grad_live, grad_peak, param_live, param_peak;   /* elements */
} zpool;

struct dt_zero {
    /* fixed at create */
    dt_zero_opts opts;
    dt_optim_cfg cfg;
    dt_model *m;
    dt_pg *pg;               /* gradients, buffers, norms */
    dt_pg *ag_pg;            /* parameter all-gathers: their issue order may interleave
                                with reduce-scatters differently on each rank (INTERLEAVED) */
    int rank, world, stage;
    zlayout lay;
    zreduce rd;
    zgather_queue gq;
    zmodules mods;
    zpool pool;
    zwire wire;
    float lr;                /* dt_zero_set_lr, before each step */
    dt_par_buffers bufs;     /* the model buffers' broadcast; bufs.root: 0, under join the
                                highest rank still active (zero/join.c) */
    dt_par_bn bn;            /* sync_bn: the model's SyncBatchNorm exchange over pg */
    dt_zero_stats stats;
    dt_trace *trace;         /* optional: shard steps as compute events */
    float *zero_state;       /* zeros read as the optimizer state of a frozen bucket's shard
                                (zero_state_n floats: the longest such shard), or NULL: made by
                                dt_zero_shard_state when a checkpoint asks, freed after a save */
    size_t zero_state_n;
};

/* Owned shards of bucket i: where they live depends on the stage. */
static inline float *dt_zero_shard_param_ptr(dt_zero *z, int i) {
    const dt_zero_bucket *b = &z->lay.b[i].pub;
    return z->lay.shard_param ? z->lay.shard_param + b->shard_offset : z->m->param_flat.data + b->own_begin;
}
static inline float *dt_zero_shard_grad_ptr(dt_zero *z, int i) {
    const zbucket *b = &z->lay.b[i];
    if (!b->pub.trainable) return NULL;   /* frozen: no gradient anywhere */
    return z->stage == 1 ? z->m->grad_flat.data + b->grad_begin + (size_t)z->rank * b->pub.shard
                         : z->lay.shard_grad + b->gshard_offset;
}

/* zero/layout.c: order params, cut buckets, pad, set the model layout, owned shards. */
dt_status dt_zero_build_layout(dt_zero *z, size_t first_cap_bytes, size_t cap_bytes);
/* Stage 1: every trainable bucket's full_grad into the model's grad_flat (after it moved) */
void dt_zero_point_full_grads(dt_zero *z);
/* pool of full-size bucket buffers (capacity >= numel; put back with the size it was got with) */
float *dt_zero_pool_get(dt_zero *z, size_t numel);
void dt_zero_pool_put(dt_zero *z, float *buf, size_t numel);

/* zero/zero.c */
/* Create / free without the struct itself: init fills a zeroed z (on failure
 * call dt_zero_fini), fini releases everything and zeroes z. Collective like
 * dt_zero_create / dt_zero_free (zero/refresh.c re-partitions in place). */
dt_status dt_zero_init(dt_zero *z, dt_model *m, dt_pg *pg, const dt_optim_cfg *cfg, const dt_zero_opts *o);
void dt_zero_fini(dt_zero *z);
/* The graph tick's work, for callers that run their own tapes. */
void dt_zero_tick(dt_zero *z);
/* For a caller that runs its own tapes (a pipeline stage): the coming
 * backward passes reduce. The caller marks final the tape whose backward
 * completes each gradient, calls dt_zero_tick between nodes and vouches that
 * every parameter's grad-ready fires once (no unused-parameter search);
 * then dt_zero_finish_backward and dt_zero_step_scaled. Broadcasts buffers. */
dt_status dt_zero_begin_external(dt_zero *z);
/* Sum of squares of this rank's owned gradient shards, leaving out the
 * elements of parameters with skip[index] (skip NULL: none). */
double dt_zero_owned_sumsq(dt_zero *z, const unsigned char *skip);
/* dt_zero_step with the caller's clip scale (the caller computed the norm);
 * the options' clip must be 0. */
dt_status dt_zero_step_scaled(dt_zero *z, float scale);
/* Loss scaling (strategy.h): *sumsq = the squared norm of every rank's owned
 * shards, added in rank order (collective over z's group, the same bits on
 * every rank). skip_step ends a step whose gradients were not finite:
 * nothing stepped or gathered (the parameters did not change), optimizer
 * state and step counts kept, gradients cleared for the next step. */
dt_status dt_zero_global_sumsq(dt_zero *z, double *sumsq);
dt_status dt_zero_skip_step(dt_zero *z);

/* zero/checkpoint.c: fill this rank's owned ranges of every optimizer state
 * by parameter and element range (the loader's path, without a file): read
 * gets state k of p, elements [start, start + n), name "optim.<state>.<p>".
 * Frozen buckets (no state) are skipped, padding is zeroed. */
typedef dt_status (*dt_zero_range_reader)(void *user, int k, const dt_param *p, const char *name, size_t start,
                                          size_t n, float *dst);
dt_status dt_zero_read_owned_states(dt_zero *z, dt_model *m, dt_zero_range_reader read, void *user);

/* The replicas' shards put together: values (k < 0) or optimizer state k of
 * every bucket all-gathered over z's group into flat (the padded layout's
 * z->lay.total floats; parameter i at m->offsets[i]; a frozen bucket's
 * state reads 0). Exact float32, whatever the wire. Collective; no gather
 * or reduction may be in flight (dt_zero_sync_params first). For a caller
 * that writes whole tensors itself (tp/ckpt.c). */
dt_status dt_zero_gather_local(dt_zero *z, int k, float *flat);

/* Every bucket's optimizer into out (room for z->lay.nb): the per-parameter
 * step counts of checkpoints (strategy.h: dt_checkpoint_meta_steps). */
int dt_zero_optimizers(dt_zero *z, dt_optimizer **out);

/* zero/join.c: join over the group (active or not) on every rank at the
 * same point: *any = some rank is active; bufs.root = the highest active rank
 * and the LR = its LR. Active ranks first finish last step's parameter
 * all-gathers (issued by their forward; a joined rank issues them here). */
dt_status dt_zero_join_agree(dt_zero *z, int active, int *any);

/* zero/wire.c: what travels. setup (collective, after the shard storage)
 * allocates the node-shared windows; free (collective) moves the gradients
 * back and frees them. reduce: bucket i's full gradient reduce-scattered
 * (average, z->rd.op) towards its owned gradient shard; reduced: after the
 * handle completed (also on failure), the shard filled, buffers released.
 * gather: the owned parameter shard all-gathered into dest (numel floats);
 * gathered: after completion, dest filled (the own chunk is exact float32).
 * The *_f32 gather is the exact float32 gather used outside training steps. */
dt_status dt_zero_wire_setup(dt_zero *z);
/* node_params (collective, before the shard storage): the parameters into
 * the machine's shared copy; stage 3 becomes stage 2 when it succeeds. */
dt_status dt_zero_wire_node_params(dt_zero *z);
void dt_zero_wire_free(dt_zero *z);
dt_status dt_zero_wire_reduce(dt_zero *z, int i, dt_work **w);
void dt_zero_wire_reduced(dt_zero *z, int i);
dt_status dt_zero_wire_gather(dt_zero *z, int i, float *dest, dt_work **w);
/* The gathered payload into float32 values. check (the collective
 * succeeded): an fp16 payload holding inf (a master beyond 65504) fails,
 * naming the parameter -- on every rank alike, all having the same payload. */
dt_status dt_zero_wire_gathered(dt_zero *z, int i, int check);

/* zero/reduce.c: gradients during backward. */
dt_status dt_zero_grad_alloc(dt_param *p, void *user);       /* stages 2/3: on_grad_alloc */
dt_status dt_zero_on_grad_ready(dt_param *p, void *user);    /* on_grad_ready */
/* From the graph tick: finish completed reduce-scatters (failure kept for finish_backward). */
void dt_zero_advance_in_backward(dt_zero *z, double now);
/* Wait every reduction and gather in flight; first error wins. */
dt_status dt_zero_drain(dt_zero *z);
/* Nothing ready, launched or stepped: the next backward starts afresh. */
void dt_zero_reset_buckets(dt_zero *z);

/* zero/step.c: step the owned shard of bucket i (then all-gather or queue it). */
dt_status dt_zero_step_bucket(dt_zero *z, int i, float scale);
/* INTERLEAVED shard steps allowed in this backward. */
int dt_zero_interleaving(const dt_zero *z);

/* zero/gather.c: stages 1/2 parameter all-gathers and their queue. */
/* Bucket i's shard was just stepped: all-gather it now, or queue it. */
dt_status dt_zero_gather_stepped(dt_zero *z, int i);
/* Issue queued gathers while fewer than the window are in flight, and
 * unconditionally every queued bucket with index >= force (INT_MAX: none). */
dt_status dt_zero_pump_gathers(dt_zero *z, int force);
/* Every parameter all-gather issued (queued ones first) and finished. */
dt_status dt_zero_wait_all_gathers(dt_zero *z);
/* Wait the in-flight all-gather of bucket i (any stage). */
dt_status dt_zero_wait_gather(dt_zero *z, int i);
/* stages 1/2: bucket i's owned shards, exact float32, into every rank's
 * flat parameters (blocking; not the wire) */
dt_status dt_zero_gather_exact(dt_zero *z, int i);

/* zero/params.c: module hooks; stages 1/2 wait for a module's parameter
 * all-gathers before its forward, stage 3 gathers / prefetches / frees. */
dt_status dt_zero_modules_setup(dt_zero *z);
void dt_zero_modules_free(dt_zero *z);
dt_status dt_zero_params_before_forward(dt_zero *z);
dt_status dt_zero3_release_all(dt_zero *z);
dt_status dt_zero3_idle(dt_zero *z);
/* A pipeline stage (pipe/dp.c): one prefetch order over the step's F and B
 * actions (zero/params.c). */
void dt_zero3_pipeline_mode(dt_zero *z);
/* Stage 3 back to a whole model at free: parameters gathered into a flat buffer. */
void dt_zero_make_whole(dt_zero *z);
/* Every rank ran the same modules in the same order in this micro-step's
 * forward and backward (else DT_EINVAL on every rank). Collective over pg. */
dt_status dt_zero3_check_order(dt_zero *z);
#endif
