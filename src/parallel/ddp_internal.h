#ifndef DT_PARALLEL_DDP_INTERNAL_H
#define DT_PARALLEL_DDP_INTERNAL_H
#include "dtrain/parallel.h"
#include "parallel_internal.h"

struct dt_ddp {
    dt_ddp_opts opts;
    dt_model *model;
    dt_pg *pg;
    int rank, world;
    dt_ddp_bucket *buckets;
    int n_buckets;
    int *param_bucket;          /* params[i] -> bucket index, -1 if frozen */
    int next_launch;            /* buckets launch strictly in index order */
    int sync;                   /* this micro-step reduces */
    dt_graph *graph;            /* the micro-step's graph (before_forward): its parameter uses */
    dt_ddp_comm_hook hook;      /* effective hook (default: allreduce avg) */
    dt_ddp_comm_hook builtin;   /* storage for the built-in hooks */
    int red_flags;              /* DT_RED_DETERMINISTIC in deterministic mode */
    size_t wire_bytes;          /* bytes per gradient element on the wire (stats) */
    float *sync_scratch;        /* SyncBatchNorm exchange buffer */
    float *buf_scratch;         /* packed buffers for the broadcast */
    int64_t sync_scratch_n;
    dt_ddp_stats stats;
    double t_first_launch;
    dt_trace *trace;
    float *shm_grads;           /* the model's gradients in node-shared memory, or NULL */
    dt_par_used used;           /* find_unused_params: parameters some rank used this step */
    int buf_root;               /* rank whose buffers are broadcast: 0, or under join the
                                   highest rank still active (ddp_join.c) */
};

double dt_ddp_now_us(void);
/* Built-in hooks. */
void dt_ddp_hook_allreduce(dt_ddp *d, dt_ddp_comm_hook *h);
void dt_ddp_hook_compress(dt_ddp *d, dt_ddp_comm_hook *h, dt_dtype wire);
/* Launch every ready bucket whose predecessors have launched. */
dt_status dt_ddp_launch_ready(dt_ddp *d);
dt_status dt_ddp_bcast_buffers(dt_ddp *d);   /* from d->buf_root */
/* join: agree over the group whether any rank is active and which rank's
 * buffers count (the highest active one, PyTorch's common rank): sets
 * *any and d->buf_root. Active and joined ranks call it at the same point. */
dt_status dt_ddp_join_agree(dt_ddp *d, int active, int *any);
/* Wait for every bucket in index order, running the hook's finish; first error wins. */
dt_status dt_ddp_wait_buckets(dt_ddp *d);
/* Back to "nothing ready, nothing launched" for the next backward. */
void dt_ddp_reset_buckets(dt_ddp *d);
dt_status dt_ddp_bcast_buffers_from(dt_ddp *d, int root);
/* Buffers are broadcast before forward and after each reduction. */
int dt_ddp_bcast_buffers_enabled(const dt_ddp *d);
/* For a caller that runs its own tapes (a pipeline stage): the coming
 * backward passes reduce. The caller marks final the tape whose backward
 * completes each gradient and ticks MPI; it vouches that every bucketed
 * parameter's grad-ready fires once (no unused-parameter search: no graph),
 * then calls dt_ddp_finish_backward. */
dt_status dt_ddp_begin_external(dt_ddp *d);
#endif
