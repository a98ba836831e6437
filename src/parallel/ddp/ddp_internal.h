#ifndef DT_PARALLEL_DDP_INTERNAL_H
#define DT_PARALLEL_DDP_INTERNAL_H
#include "dtrain/parallel.h"
#include "parallel/common/common_internal.h"

struct dt_ddp {
    dt_ddp_opts opts;
    dt_model *model;
    dt_pg *pg;
    int rank, world;
    dt_ddp_bucket *buckets;
    int n_buckets;
    int *param_bucket;          /* params[i] -> bucket index, -1 if frozen or ignored */
    int *bucket_params;         /* params[] indices, bucket by bucket (bucket b: b->params) */
    size_t *stage_pos;          /* params[i]'s place in its staged bucket's grad (static_graph) */
    float *stage;               /* staged buckets' buffers, back to back (node-shared when the
                                   gradients are: stage_shm), or NULL */
    int stage_shm;
    unsigned char *ignored;     /* params[i] matched opts.params_to_ignore (NULL: none) */
    unsigned char *ignored_has; /* scratch: ignored parameters' own has_grad across the used sum */
    /* static_graph (ddp/static_graph.c): the first synchronising backward's ready order */
    int *ready_order, n_ready;
    int recording;              /* this backward records */
    int recorded;               /* the order was recorded (and agreed) */
    int rebuilt;                /* buckets were cut again in that order */
    int next_launch;            /* buckets launch strictly in index order */
    int sync;                   /* this micro-step reduces */
    dt_graph *graph;            /* the micro-step's graph (before_forward): its parameter uses */
    dt_ddp_comm_hook hook;      /* effective hook (default: allreduce avg) */
    dt_ddp_comm_hook builtin;   /* storage for the built-in hooks */
    int red_flags;              /* DT_RED_DETERMINISTIC in deterministic mode */
    size_t wire_bytes;          /* bytes per gradient element on the wire (stats) */
    dt_par_bn bn;               /* SyncBatchNorm's exchange (common/sync_bn.c) */
    dt_par_buffers bufs;        /* the model buffers' broadcast; bufs.root: 0, or under join the
                                   highest rank still active (ddp/join.c) */
    dt_ddp_stats stats;
    double t_first_launch;
    dt_trace *trace;
    float *shm_grads;           /* the model's gradients in node-shared memory, or NULL */
    dt_par_used used;           /* find_unused_params: parameters some rank used this step */
};

double dt_ddp_now_us(void);
/* ddp/buckets.c. Buckets over the trainable, not ignored parameters in layout
 * order, in place in grad_flat; installs the grad-ready hooks. */
dt_status dt_ddp_build_buckets(dt_ddp *d);
/* Buckets over params order[0..n) in that order, each staged (its own
 * buffer): collective when the gradients live in node-shared memory (the
 * staging buffer does too). Replaces the current buckets. */
dt_status dt_ddp_build_staged(dt_ddp *d, const int *order, int n);
/* Frees buckets and staging (collective if staging is node-shared) and
 * removes the grad-ready hooks. */
void dt_ddp_free_buckets(dt_ddp *d);
/* ddp/ddp.c: the gradients into a node-shared window sized for the trainable set
 * (when the options allow; collective; buckets re-pointed), and back out. */
dt_status dt_ddp_share_grads(dt_ddp *d);
void dt_ddp_unshare_grads(dt_ddp *d);
/* A staged bucket's gradients in (before launch) / out (after reduction). */
void dt_ddp_stage_in(dt_ddp *d, dt_ddp_bucket *b);
void dt_ddp_stage_out(dt_ddp *d, dt_ddp_bucket *b);
dt_status dt_ddp_on_grad_ready(dt_param *p, void *user);
/* ddp/ignore.c: opts.params_to_ignore -> d->ignored; a pattern matching
 * nothing is DT_EINVAL naming it. */
dt_status dt_ddp_match_ignored(dt_ddp *d);
/* The root's parameters to every rank, ignored ones kept. */
dt_status dt_ddp_bcast_params(dt_ddp *d, int root);
/* Ignored parameters keep their own has_grad across the used-parameter sum. */
void dt_ddp_ignored_save_has_grad(dt_ddp *d);
void dt_ddp_ignored_restore_has_grad(dt_ddp *d);
/* ddp/static_graph.c: static_graph. begin: a synchronising backward starts
 * (records if nothing was recorded yet). note: p's gradient is ready.
 * end: after the reductions; ok = this rank's step succeeded. Collective
 * while recording: agrees the order over the group and re-cuts the buckets. */
dt_status dt_ddp_static_begin(dt_ddp *d);
void dt_ddp_static_note(dt_ddp *d, int param);
dt_status dt_ddp_static_end(dt_ddp *d, int ok);
/* Built-in hooks. */
void dt_ddp_hook_allreduce(dt_ddp *d, dt_ddp_comm_hook *h);
void dt_ddp_hook_compress(dt_ddp *d, dt_ddp_comm_hook *h, dt_dtype wire);
/* Launch every ready bucket whose predecessors have launched. */
dt_status dt_ddp_launch_ready(dt_ddp *d);
/* join: agree over the group whether any rank is active and which rank's
 * buffers count (the highest active one, PyTorch's common rank): sets
 * *any and d->bufs.root. Active and joined ranks call it at the same point. */
dt_status dt_ddp_join_agree(dt_ddp *d, int active, int *any);
/* Wait for every bucket in index order, running the hook's finish; first error wins. */
dt_status dt_ddp_wait_buckets(dt_ddp *d);
/* Back to "nothing ready, nothing launched" for the next backward. */
void dt_ddp_reset_buckets(dt_ddp *d);
/* For a caller that runs its own tapes (a pipeline stage): the coming
 * backward passes reduce. The caller marks final the tape whose backward
 * completes each gradient and ticks MPI; it vouches that every bucketed
 * parameter's grad-ready fires once (no unused-parameter search: no graph),
 * then calls dt_ddp_finish_backward. */
dt_status dt_ddp_begin_external(dt_ddp *d);
#endif
