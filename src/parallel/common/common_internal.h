#ifndef DT_PARALLEL_COMMON_INTERNAL_H
#define DT_PARALLEL_COMMON_INTERNAL_H
/* parallel/common: the pieces DDP, ZeRO and the pipeline share (the rooms
 * above it: ddp/ and zero/ use common/, pipe/ uses all three; see
 * scripts/check_layers.sh). One file a concern:
 *   common/bucket_plan.c    the bucket cutting rule
 *   bcast.c          model buffers and optimizer state from one rank to all
 *   agree.c          agreements: a status, join activity, words, the trainable set
 *   unused.c         which parameters got a gradient on any rank, and the error
 *   metrics.c        a clock, small exact sums, the memory report
 *   common/sync_bn.c        SyncBatchNorm's exchange
 *   options_agree.c  the strategies' options in the configuration agreement
 *   dp_opts.c        the data-parallel options' defaults and shared checks */
#include "dtrain/dist.h"
#include "dtrain/nn.h"
#include "dtrain/optim.h"
#include "dtrain/parallel.h"
#include "dtrain/pipeline.h"
#include "dtrain/zero.h"

/* bcast.c. The model's buffers (BatchNorm statistics) kept equal across a
 * DDP or ZeRO group: from rank `root` (0; under join the highest rank still
 * active), packed into one broadcast through `scratch` (allocated on first
 * use). Each strategy holds one. */
typedef struct dt_par_buffers {
    dt_model *m;
    dt_pg *pg;
    float *scratch;
    int root;
} dt_par_buffers;
/* The broadcast every step, as dp says: broadcast_buffers on, sync_bn off
 * (SyncBN's statistics are equal already), a model with buffers, > 1 rank. */
int dt_par_buffers_enabled(const dt_par_buffers *b, const dt_dp_opts *dp);
/* From b->root (dt_par_buffers_from: from root), always; collective. */
dt_status dt_par_buffers_bcast(dt_par_buffers *b);
dt_status dt_par_buffers_from(dt_par_buffers *b, int root);
/* When enabled: dt_par_buffers_bcast. */
dt_status dt_par_buffers_sync(dt_par_buffers *b, const dt_dp_opts *dp);
void dt_par_buffers_free(dt_par_buffers *b);
double dt_par_now_us(void);
/* Sum n <= 16 doubles across the group (metrics and counts; each as three
 * floats, so one rank's value or an integer count arrives exactly). */
dt_status dt_par_allreduce_sum(dt_pg *pg, double *x, int n);
/* *x summed over the group in rank order, exactly the same bits on every
 * rank and in every run (an allgather of the doubles, added 0, 1, ...): a
 * clip norm's partial sums, where the float sums of dt_par_allreduce_sum
 * depend on the order MPI adds in. Collective. */
dt_status dt_par_sum_rank_order(dt_pg *pg, double *x);
/* Rank 0 prints one line per rank: the given bytes and peak RSS. Collective. */
/* Rank root's optimizer state, step count and per-segment skipped counts
 * onto every rank of pg (same segments everywhere). Collective. */
dt_status dt_par_bcast_optimizer(dt_pg *pg, dt_optimizer *o, int root);
dt_status dt_par_memory_report(dt_pg *pg, const char *label, size_t param_bytes, size_t grad_bytes,
                               size_t optim_bytes, int print);
/* Collective: every rank learns whether all succeeded. A failing rank keeps
 * its own status and message; the others get DT_ECOMM naming the failed
 * rank (or how many failed). */
dt_status dt_par_agree(dt_pg *pg, dt_status mine, const char *what);
/* Collective: every rank's n (<= 8) 32-bit words, gathered into all[r * n
 * .. + n) (room for n * group size), bit for bit. */
dt_status dt_par_gather_words(dt_pg *pg, const uint32_t *mine, int n, uint32_t *all);
/* FNV-1a over n ints, continuing from h (start: 2166136261u). */
uint32_t dt_par_hash_ints(uint32_t h, const int *x, int n);
/* common/agree.c. Collective (dt_pg_agree): every rank has the same
 * requires_grad on every parameter, else DT_EINVAL on every rank, "<who>:
 * ranks disagree on the trainable parameters (...): configuration differs
 * between ranks: parameter 'fc2.weight': rank 1 has frozen, rank 0 has
 * trainable". */
dt_status dt_par_agree_trainable(const dt_model *m, dt_pg *pg, const char *who);
/* Parameters that got no gradient in a backward: count, first four named. */
typedef struct dt_par_unused { char names[512]; int n; } dt_par_unused;
void dt_par_unused_add(dt_par_unused *u, const char *name);
/* DT_EINVAL: "<who>: parameter(s) '<names>' received no gradient ...". */
dt_status dt_par_unused_error(const dt_par_unused *u, const char *who);

/* common/agree.c. Collective (join): *top = the highest rank still active,
 * -1 when none is; *top_value (if not NULL) = the value that rank passed. */
dt_status dt_par_join_agree(dt_pg *pg, int active, float value, int *top, float *top_value);

/* common/unused.c: with find_unused_params, which parameters got a gradient on
 * any rank. start: each parameter's has_grad (0 for all when !contribute: a
 * joined rank) summed over pg, asynchronously (a collective: issue it at the
 * same point on every rank). finish: wait, then (m not NULL) has_grad = "some
 * rank used it"; a no-op when nothing was started. */
typedef struct dt_par_used { float *map; int n; dt_work *work; int started; } dt_par_used;
dt_status dt_par_used_start(dt_par_used *u, dt_model *m, dt_pg *pg, int contribute);
dt_status dt_par_used_finish(dt_par_used *u, dt_model *m);
void dt_par_used_free(dt_par_used *u);

/* common/bucket_plan.c: the bucket cutting DDP and ZeRO share. */
/* Items (parameters, in layout order) are cut into buckets by one rule: an
 * item opens a new bucket when there is none yet, when its class differs
 * from the open bucket's, when (pad == 0) it does not start where the open
 * bucket ends (a skipped item or a hole lies between), or when the open
 * bucket is non-empty and the item would take it over its cap:
 * first_cap_bytes while the open bucket is bucket 0, cap_bytes after. So a
 * bucket never splits an item, never covers a skipped one (frozen: it has no
 * gradient to reduce), and an item larger than the cap gets a bucket of its
 * own. A bucket's size is its span in the layout (float elements): from its
 * first item's position to its last item's end.
 *   pad == 0: items stay at items[k].offset (DDP: in place).
 *   pad  > 0: items are packed from 0 (offset ignored), buckets back to back,
 *             each bucket's numel its span rounded up to a multiple of pad,
 *             at least pad (ZeRO: equal shards per rank). */
typedef struct dt_bucket_rule { size_t first_cap_bytes, cap_bytes, pad; } dt_bucket_rule;
typedef struct dt_bucket_item {
    size_t numel;        /* elements */
    size_t offset;       /* pad == 0: position in the layout */
    int skip;            /* in no bucket (DDP: frozen parameters) */
    int cls;             /* buckets never mix classes (ZeRO: frozen apart from trainable) */
} dt_bucket_item;
typedef struct dt_bucket_cut {
    int first, n;        /* first item; items in the bucket (skipped ones not counted) */
    size_t begin, used;  /* position of the first item; span of the items */
    size_t numel;        /* pad == 0: used; else padded as above */
    int cls;             /* the class of its items */
} dt_bucket_cut;
/* Fills cuts[0 .. return) (room for n), bucket_of[k] (-1: skipped) and, if
 * pos is not NULL, pos[k] for every bucketed item: its position (pad == 0:
 * its offset). */
int dt_bucket_plan(const dt_bucket_rule *r, const dt_bucket_item *items, int n, dt_bucket_cut *cuts,
                   int *bucket_of, size_t *pos);
/* The model's parameters cut by r: order[k] is the params[] index of the k-th
 * in layout order (by offset, stable: the backward order); bucket_of, pos
 * and cuts as above, per k. frozen: what parameters without requires_grad
 * do (MIX: share buckets with trainable ones; SKIP: join no bucket (DDP);
 * APART: buckets of their own, class 1 (ZeRO: no optimizer state)).
 * skip (NULL: none): skip[params index] != 0 joins no bucket either (DDP's
 * parameters_to_ignore). Free with dt_par_plan_free. */
typedef enum dt_plan_frozen { DT_PLAN_FROZEN_MIX = 0, DT_PLAN_FROZEN_SKIP = 1, DT_PLAN_FROZEN_APART = 2 } dt_plan_frozen;
typedef struct dt_param_plan {
    int *order, *bucket_of;
    size_t *pos;
    dt_bucket_cut *cuts;
    int nb;
} dt_param_plan;
dt_status dt_par_plan_params(const dt_model *m, const dt_bucket_rule *r, dt_plan_frozen frozen,
                             const unsigned char *skip, dt_param_plan *out);
void dt_par_plan_free(dt_param_plan *p);
/* ---- common/sync_bn.c ---- */
/* SyncBatchNorm's exchange (ops.h dt_bn_sync) over a process group: the
 * per-channel sums and the element count summed across ranks. Install as
 * model->bn_sync = (dt_bn_sync){dt_par_bn_sync, &state}. */

typedef struct dt_par_bn {
    dt_pg *pg;
    int red_flags;           /* DT_RED_DETERMINISTIC or 0 */
    float *scratch;          /* [n sums..., count]: one message per exchange */
    int64_t cap;
} dt_par_bn;

/* data[0..n) and *count summed over bn->pg (a blocking collective: every
 * rank calls it at the same op of its forward / backward). */
dt_status dt_par_bn_sync(float *data, int64_t n, double *count, void *user);
void dt_par_bn_free(dt_par_bn *bn);

/* ---- options_agree.c ---- */
/* The strategies' options in the configuration agreement (dist.h section 8):
 * each adds what must match on every rank, named by its CLI flag. */

/* dp_opts.c: "f32", "bf16", "fp16" (a dp.wire in messages), "?" */
const char *dt_par_wire_name(dt_dtype wire);
void dt_par_describe_dp(const dt_dp_opts *o, dt_agree *a);
void dt_par_describe_ddp(const dt_ddp_opts *o, dt_agree *a);
void dt_par_describe_zero(const dt_zero_opts *o, dt_agree *a);
/* the pipeline's own options, then its data-parallel ones (DDP or ZeRO) */
void dt_par_describe_pipe(const dt_pipe_opts *o, dt_agree *a);

#endif
