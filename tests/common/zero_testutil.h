/* Helpers for the multi-rank ZeRO tests (tests/mpi/test_zero_*.c), on top of
 * ddp_testutil.h (models, batches, nets) and mpi_check.h (checks, comparisons).
 *
 * The oracle of every ZeRO test is plain DDP on the same model, seed, data
 * and optimizer (dtt_net + dt_ddp + dt_optimizer over the whole flat
 * buffer). ZeRO re-lays out its model, so results are compared parameter by
 * parameter: both sides are flattened in *registration* order
 * (model->params[0], params[1], ...), independent of either layout.
 *
 * Stage 3 keeps only shards between uses; dtz_gather_layout() rebuilds the
 * whole padded layout with plain MPI (not through dtrain) from the owned
 * shards the ZeRO object exposes, so mid-training parameters can be compared
 * without relying on ZeRO's own gather. */
#ifndef ZERO_TESTUTIL_H
#define ZERO_TESTUTIL_H

#include "ddp_testutil.h"
#include "dtrain/zero.h"

/* One training run: the same for the DDP reference and for ZeRO. */
typedef struct dtz_spec {
    dt_model_cfg cfg;
    dt_optim_cfg oc;
    int steps, K;                /* optimizer steps; micro-steps per step (sync on the last) */
    const int *Ks;               /* optional: micro-steps of step st = Ks[st] (overrides K) */
    int64_t B;                   /* rows per micro-batch per rank */
    int det;                     /* deterministic reductions (both sides) */
    float clip;                  /* DDP: dt_clip_scale on the global norm; ZeRO: opts.clip */
    int find_unused;             /* both sides */
    int no_bcast_buffers;        /* both sides: broadcast_buffers = 0 */
    size_t ddp_bucket_bytes;     /* 0: DDP default */
    /* optional: replaces the model's forward (unused-parameter tests) */
    dt_tensor *(*forward)(dt_model *m, dt_graph *g, const dt_batch *b, dt_tensor **logits);
    /* optional: called before every micro-step's forward on every rank */
    void (*before_micro)(int step, int rank, int k);
    /* optional: called on each fresh model before DDP / ZeRO wraps it (freezing) */
    void (*prepare)(dt_model *m);
} dtz_spec;

/* AdamW lr 1e-2 wd 0.01, K = 1, deterministic when N > 2. */
dtz_spec dtz_mk_spec(dt_model_cfg c, int64_t B, int steps);
/* Micro-steps of step st. */
int dtz_k(const dtz_spec *s, int st);
/* LR of step st (0-based): changes every step, so a stale LR shows. */
float dtz_lr(const dtz_spec *s, int st);
/* Zero options for a spec: stage, overlap, det/clip/find_unused from s. */
dt_zero_opts dtz_opts(const dtz_spec *s, int stage, dt_zero_overlap ov);

/* Result of a run: parameters in registration order, buffers in registration
 * order, per-step gradient norm (clip only) and the mean loss of the last step. */
typedef struct dtz_result {
    float *params; size_t n_params;
    float *buffers; size_t n_buffers;
    double norms[64];
    float last_loss;
} dtz_result;
void dtz_result_free(dtz_result *r);

/* The DDP reference: dtt_net (seeded 1 + rank; DDP broadcasts rank 0's) +
 * dt_ddp (find_unused, det from s). */
void dtz_ddp_run(const dtz_spec *s, dt_pg *pg, dtz_result *out);

/* ---- a ZeRO-wrapped model ---- */
typedef struct dtz_net {
    dt_model *m;
    dt_graph *g;
    dt_zero *z;
} dtz_net;
void dtz_net_init(dtz_net *n, const dtz_spec *s, uint64_t seed, dt_pg *pg, const dt_zero_opts *o);
/* dt_zero_free (stage 3: gathers the model back), then graph, then model. */
void dtz_net_free(dtz_net *n);
/* Reset, before_forward(sync), forward, backward_scaled(scale). Returns the loss. */
float dtz_fwd_bwd(dtz_net *n, int sync, const dt_batch *b, float scale);
/* One step as zero.h prescribes: set_lr, K micro-steps (sync on the last),
 * finish_backward, step. Returns the mean loss; *norm (may be NULL) gets
 * dt_zero_step's grad norm. */
float dtz_step(dtz_net *n, float lr, const dtt_batch *micro, int K, double *norm);
/* The same training loop as dtz_ddp_run, on ZeRO; *out from the live model
 * (stage 3 via dtz_gather_layout) before dt_zero_free. */
void dtz_zero_run(const dtz_spec *s, dt_pg *pg, const dt_zero_opts *o, dtz_result *out);

/* ---- reading a model ---- */
/* Registration-order parameters of a fresh model (seed 1: what both runs start from). */
float *dtz_init_params(const dt_model_cfg *c);
size_t dtz_param_count(const dt_model *m);           /* sum of parameter numel */
size_t dtz_layout_len(const dt_zero *z);             /* end of the last bucket */
/* The whole padded layout, assembled from every rank's owned shards with
 * MPI_Allgather on MPI_COMM_WORLD. Collective. */
float *dtz_gather_layout(dt_zero *z);
/* Parameters in registration order; from layout (offsets m->offsets) when
 * layout != NULL, else from each parameter's value.data. */
float *dtz_params(const dt_model *m, const float *layout);
float *dtz_buffers(const dt_model *m, size_t *n);
/* Registration-order parameter vectors of the same model config compared
 * parameter by parameter (the first differing one is named). rtol = 0:
 * bitwise; else ||got - want|| / ||want|| over everything <= rtol and no
 * single parameter off by more than max(rtol, 1e-3) relative. */
void dtz_expect_params(const dt_model *m, const float *got, const float *want, double rtol, const char *what);
/* Zero-padding check: every element of the layout outside a parameter is 0. */
void dtz_expect_padding_zero(dt_zero *z, const float *layout, const char *what);
/* Bucket geometry invariants (contiguous, padded to N, shard = numel/N,
 * own_begin, shard_offset, every parameter inside its bucket exactly once). */
void dtz_check_geometry(dt_zero *z, const dt_model *m);

#endif
