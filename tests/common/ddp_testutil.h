/* Helpers for the multi-rank DDP tests (tests/mpi/test_ddp_*.c): models,
 * batches, nets and the single-process oracle. The checks and comparisons
 * (T_CHECK, T_OK, T_BITWISE, T_NEAR, T_SAME_ON_RANKS, ...) are mpi_check.h's.
 *
 * The single-process oracle (dtt_ref_step): a second, local copy of the model
 * computes each rank's gradient separately into a zeroed buffer, sums them in
 * rank order ((g0 + g1) + g2) + ..., divides by (float)N (dist.h's AVG) and
 * steps the same optimizer. */
#ifndef DDP_TESTUTIL_H
#define DDP_TESTUTIL_H

#include <stddef.h>
#include <stdint.h>
#include "dtrain/parallel.h"
#include "mpi_check.h"

/* ---- models ---- */
dt_model_cfg dtt_mlp_cfg(int in, int h1, int h2, int out);   /* h2 = 0: one hidden layer */
dt_model_cfg dtt_cnn_cfg(void);                              /* conv 1->4->8, fc 16, 10 classes */
dt_model_cfg dtt_gpt2_cfg(void);                             /* L=1 C=16 H=2 V=32 T=8 */

/* ---- batches: deterministic in key; labels come from a fixed teacher so the task is learnable ---- */
typedef struct dtt_batch {
    dt_batch b;
    float *x;
    int32_t *ids, *y;
} dtt_batch;
void dtt_make_batch(const dt_model_cfg *c, uint64_t key, int64_t B, dtt_batch *out);
/* Rows of parts[0..n) one after another (one forward over the global batch). */
void dtt_concat(const dt_model_cfg *c, const dtt_batch *parts, int n, dtt_batch *out);
void dtt_batch_free(dtt_batch *b);
uint64_t dtt_key(int step, int rank, int micro);

/* ---- a model with its graph and optimizer ---- */
typedef struct dtt_net {
    dt_model *m;
    dt_graph *g;
    dt_optimizer opt;
    float lr;
} dtt_net;
dt_optim_cfg dtt_adamw(float lr, float wd);
void dtt_net_init(dtt_net *n, const dt_model_cfg *c, uint64_t seed, const dt_optim_cfg *oc);
void dtt_net_free(dtt_net *n);
/* Reset the graph, forward, backward_scaled(scale). Returns the loss. With d,
 * dt_ddp_before_forward(d, g, sync) runs after the reset. logits (optional)
 * receives a pointer into the graph arena (valid until the next reset). */
float dtt_fwd_bwd(dtt_net *n, dt_ddp *d, int sync, const dt_batch *b, float scale, const float **logits);
void dtt_opt_step(dtt_net *n);   /* optimizer step, finish_step, zero_grad */
/* One DDP step: K micro-batches (sync only on the last), finish_backward,
 * optimizer step. Returns the mean loss of the micro-batches. */
float dtt_ddp_step(dtt_net *n, dt_ddp *d, const dtt_batch *micro, int K);

/* The MLP forward with layer dtt_skip_layer's bias left out (-1: none, the
 * default): a parameter without gradient for the unused-parameter tests.
 * Layer dtt_skip_module (-1: none) is left out whole, module hooks included
 * (its input and output widths must be equal). */
extern int dtt_skip_layer, dtt_skip_module;
dt_tensor *dtt_mlp_forward_skip_bias(dt_model *m, dt_graph *g, const dt_batch *b, dt_tensor **logits);

/* ---- the single-process reference ----
 * per_rank[r * K + k]: rank r's micro-batch k. Rank r's gradient is the sum of
 * its K micro-steps (each backward_scaled(1/K), accumulated like DDP does
 * locally); active[r] == 0 contributes zeros (join). NULL = all active. */
void dtt_ref_step(dtt_net *ref, const dtt_batch *per_rank, int N, int K, const int *active);
/* dtt_ref_step's gradient only: the rank average left in ref's grad_flat, no step. */
void dtt_ref_grads(dtt_net *ref, const dtt_batch *per_rank, int N, int K, const int *active);
/* Called by dtt_ref_step before it simulates rank r (rank-dependent forwards); NULL = none. */
extern void (*dtt_ref_rank_hook)(int r);

#endif
