/* The state of a dt_graph, shared by the files of src/autograd:
 *   graph.c       create / reset, allocation, recording ops and module markers
 *   backward.c    the backward loop and its entry points, graph inputs
 *   checkpoint.c  activation recompute (dt_graph_checkpoint)
 *   pack16.c      activations kept in 16 bits until backward (dt_graph_pack16)
 *   param_table.c per-graph parameter use records
 *   backward_weights.c  the split backward: deferral in B, the W pass
 */
#ifndef DT_AUTOGRAD_GRAPH_INTERNAL_H
#define DT_AUTOGRAD_GRAPH_INTERNAL_H
#include "arena.h"
#include "dtrain/autograd.h"

/* One parameter's bookkeeping on one tape: uses recorded, uses not yet
 * back-propagated (0 <= pending <= uses). */
typedef struct dt_param_rec { dt_param *p; int uses, pending; } dt_param_rec;

/* Records in first-use order, found by pointer through an open-addressing
 * table: slots[h] = record index + 1 (0 = empty), n_slots a power of two
 * and at least twice n, so a probe always ends at an empty slot. */
typedef struct dt_param_table {
    dt_param_rec *recs; int n, cap;
    int *slots; int n_slots;
} dt_param_table;

int dt_ptab_find(const dt_param_table *t, const dt_param *p);   /* record index or -1 */
int dt_ptab_get(dt_param_table *t, dt_param *p);                /* found or added (zero counts); -1 on OOM */
void dt_ptab_clear(dt_param_table *t);                          /* no records, memory kept */
void dt_ptab_free(dt_param_table *t);

/* What the backward loop would do for one of a region's nodes, listed so a
 * region no gradient reaches (its nodes gone: the checkpoint's never
 * recorded, pack16's in an image not restored) can still do it: module set,
 * fire its marker's hook (2, a leave: PRE_BACKWARD; 1, an enter:
 * POST_BACKWARD); module NULL, release parameter use record `rec`. Listed in
 * record order (a node's uses in reverse input order), so read back to
 * front they are the loop's order: nodes last to first, inputs in order. */
typedef struct dt_region_event { dt_module *module; int marker, rec; } dt_region_event;

/* What dt_graph_record does with an op. */
typedef enum dt_graph_mode {
    DT_GRAPH_RECORD = 0,   /* append a node, count parameter uses */
    DT_GRAPH_COUNT,        /* checkpoint first pass: no node; count uses, list them and markers in ck_ev */
    DT_GRAPH_REPLAY,       /* checkpoint replay in backward: append a node; uses were counted */
} dt_graph_mode;

/* A node B queued for the W pass. */
typedef struct dt_deferred {
    dt_node *n;
    unsigned mask;   /* bit i: n->in[i] is a deferred parameter */
    int run;         /* B ran n's backward (its output got a gradient): W runs it again */
} dt_deferred;

/* Where a graph's split backward stands. */
typedef enum dt_wpass_state {
    DT_WPASS_NONE = 0,   /* no backward since creation / reset: W refuses */
    DT_WPASS_PENDING,    /* backward done: W may run, once */
    DT_WPASS_DONE,       /* W ran */
    DT_WPASS_FAILED,     /* backward failed: W refuses */
} dt_wpass_state;

struct dt_graph {
    dt_arena arena;          /* main: tape nodes, kept activations, gradients */
    dt_arena scratch;        /* in use only during a checkpoint's first pass or replay, or a pack16 region's forward or backward */
    dt_arena *alloc;         /* where dt_graph_scratch allocates: &arena, or &scratch inside a checkpoint */
    dt_node **nodes; int n_nodes, cap_nodes;
    dt_param_table params;   /* uses of the parameters on this tape */
    int grad_enabled, training, final, backward_done;
    dt_graph_mode mode;
    dt_region_event *ck_ev; int n_ck_ev, cap_ck_ev;   /* COUNT: each use and module marker, in order */
    int n_ck_uses;           /* COUNT: the uses among them */
    int n_replay_uses;       /* REPLAY: parameter inputs of the nodes appended */
    dt_status sticky;        /* an allocation failed while recording: backward must not run */
    int packing;             /* 1 while a pack16 region's forward runs */
    struct { const float *data; int64_t n; int keep; } *saved_decl;   /* its ops' dt_graph_saved_may_round (keep 0) */
    int n_saved_decl, cap_saved_decl;                                   /* and dt_graph_saved_keep_exact (keep 1) */
    dt_graph_tick_fn tick; void *tick_user;
    /* split backward (backward_weights.c) */
    dt_defer_fn defer; void *defer_user;       /* kept across resets */
    dt_deferred *deferred; int n_deferred, cap_deferred;
    dt_wpass_state wpass;
    int in_w;                /* 1 while the W pass runs */
    const dt_node *masked;   /* the node whose backward runs with gradients hidden (B: deferred node, W: every node) */
    unsigned mask;           /* its deferred inputs */
};

/* A zeroed node appended to the tape, from g->alloc. NULL (sticky set) on OOM. */
dt_node *dt_graph_new_node(dt_graph *g);
/* Room on the tape for `more` node pointers beyond n_nodes (DT_ENOMEM + message). */
dt_status dt_graph_reserve_nodes(dt_graph *g, int more);
/* A region's (checkpoint's, pack16's) output y copied into the main arena,
 * for the ops after it; `who` names the caller in the error for a y that is
 * not an F32 tensor with data. */
dt_tensor *dt_graph_copy_out(dt_graph *g, const dt_tensor *y, const char *who);
/* The one node that stands for a region on the tape: op, bw, the region's
 * input x (may be NULL; a parameter's uses are counted inside the region),
 * its copied output, saved; the output requires grad (grad_fn = the node)
 * if `requires_grad`. NULL on OOM. */
dt_node *dt_graph_region_node(dt_graph *g, const char *op, dt_backward_fn bw, dt_tensor *x, dt_tensor *out,
                              void *saved, int requires_grad);
/* A region's output y that is a trainable parameter's value (fn returned it
 * unchanged): in a plain run the op after the region counts that use, after
 * the region its copy does not, so the region counts it (RECORD / COUNT:
 * counted, COUNT also listed; REPLAY: matched against the first pass). The
 * use's record, to release once y's gradient is seeded; -1 if y is no such
 * value, or on error (message set; OOM also sticky). */
int dt_graph_output_use(dt_graph *g, const dt_tensor *y);
/* Seeds a region's output y with its upstream gradient `up` (as
 * dt_graph_seed_grad), except that a frozen parameter's value takes none. */
dt_status dt_graph_seed_region_out(dt_graph *g, dt_tensor *y, const float *up);
/* Uninitialised F32 tensor from arena a. */
dt_tensor *dt_graph_tensor_in(dt_graph *g, dt_arena *a, int ndim, const int64_t *shape);
/* The backward loop body for node n (markers fire PRE/POST_BACKWARD; an op
 * whose output got a gradient, or is `start`, runs its backward; then its
 * parameter uses are released; then the tick). */
dt_status dt_graph_run_node(dt_graph *g, dt_node *n, const dt_tensor *start);
/* A region's events (n, in record order) back to front: what the backward
 * loop does for the region's nodes when no gradient reached them. */
dt_status dt_graph_skip_region(dt_graph *g, const dt_region_event *ev, int n);
/* One use of record `rec` back-propagated: at pending 0 a final graph fires grad-ready. */
dt_status dt_graph_release_use(dt_graph *g, int rec);
/* t's gradient = up (t's gradient fresh: copied, so bitwise up) or += up. */
dt_status dt_graph_seed_grad(dt_graph *g, dt_tensor *t, const float *up);

/* backward_weights.c. The inputs of n whose weight gradient B defers (bit i:
 * in[i]); 0 without a predicate and in a checkpoint's replay. */
unsigned dt_defer_mask(dt_graph *g, const dt_node *n);
/* Queue n for the W pass (DT_ENOMEM on failure). */
dt_status dt_defer_push(dt_graph *g, dt_node *n, unsigned mask, int run);
/* 1 if dt_grad_of must return NULL for t: in B the running node's deferred
 * parameters, in W everything but them. */
int dt_grad_hidden(const dt_graph *g, const dt_tensor *t);
/* 1 if writing x's storage could change what a queued node reads in W. */
int dt_defer_reads(const dt_graph *g, const dt_tensor *x);

/* checkpoint.c: the checkpoint node's backward (the replay), and what the
 * loop does instead when no gradient reached that node: release the uses its
 * first pass counted, so grad-ready still fires, and fire its module
 * markers' backward hooks. */
void dt_checkpoint_backward(dt_graph *g, dt_node *n);
dt_status dt_checkpoint_skip(dt_graph *g, dt_node *n);
/* pack16.c: the same pair for a region kept in 16 bits (dt_graph_pack16). */
void dt_pack16_backward(dt_graph *g, dt_node *n);
dt_status dt_pack16_skip(dt_graph *g, dt_node *n);
#endif
