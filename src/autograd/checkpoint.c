/* Activation recompute (torch.utils.checkpoint semantics).
 *
 * First pass, in forward: fn runs in COUNT mode with allocations in the
 * scratch arena — ops compute but record nothing, and their parameter uses
 * are counted (and listed) as if recorded, so pending totals and grad-ready
 * stay right (fn's output, if a trainable parameter's value, is one more:
 * the ops after the checkpoint read a copy). The output is copied into the
 * main arena, the scratch rewound, and one checkpoint node recorded: fn,
 * ctx, rng, the rng state fn started from and the list of uses and module
 * markers (backward's skip path, when no gradient reaches the node, releases
 * the uses and fires the markers' PRE/POST_BACKWARD hooks back to front, as
 * for a plain run's unreached nodes; no recompute hooks: nothing is re-run).
 *
 * Replay, that node's backward: x's gradient is allocated in the main arena,
 * the rng set to the saved state, fn re-run in REPLAY mode into the scratch
 * (nodes appended past a mark, uses not counted again, module hooks
 * PRE/POST_RECOMPUTE), the replay output seeded with the node's output
 * gradient, the appended nodes back-propagated in reverse with the main
 * loop's body (markers, uses released, grad-ready, tick), then the tape
 * truncated to the mark, the scratch rewound and the rng restored. Dropout
 * masks are therefore those of the first pass, and the rng stream after the
 * step is the one without recompute.
 *
 * Scratch invariant: empty outside dt_graph_checkpoint and the replay, so it
 * holds at most one block's activations (and, in the replay, their gradients). */
#include <stdio.h>
#include <string.h>
#include "graph_internal.h"

typedef struct dt_ckpt {
    dt_checkpoint_fn fn;
    void *ctx;
    dt_rng *rng;             /* may be NULL */
    dt_rng rng_before;       /* *rng when the first pass started */
    int n_uses;              /* parameter uses the first pass counted (the replay must match) */
    int n_ev;                /* those uses and fn's module markers ... */
    dt_region_event ev[];    /* ... in record order (the skip path's list) */
} dt_ckpt;

static dt_status record_node(dt_graph *g, dt_tensor *out, dt_tensor *x, dt_checkpoint_fn fn, void *ctx,
                             dt_rng *rng, const dt_rng *before, int requires_grad) {
    dt_ckpt *ck = dt_graph_scratch(g, sizeof *ck + (size_t)g->n_ck_ev * sizeof(dt_region_event));
    if (!ck) { g->sticky = DT_ENOMEM; return DT_ENOMEM; }
    ck->fn = fn;
    ck->ctx = ctx;
    ck->rng = rng;
    ck->rng_before = *before;
    ck->n_uses = g->n_ck_uses;
    ck->n_ev = g->n_ck_ev;
    if (g->n_ck_ev) memcpy(ck->ev, g->ck_ev, (size_t)g->n_ck_ev * sizeof(dt_region_event));   /* (ck_ev NULL until a first event) */
    return dt_graph_region_node(g, "checkpoint", dt_checkpoint_backward, x, out, ck, requires_grad) ? DT_OK : DT_ENOMEM;
}

dt_tensor *dt_graph_checkpoint(dt_graph *g, dt_checkpoint_fn fn, dt_tensor *x, void *ctx, dt_rng *rng) {
    if (!g || !fn) { DT_ERR(DT_EINVAL, "checkpoint: %s is NULL", g ? "fn" : "graph"); return NULL; }
    if (g->mode != DT_GRAPH_RECORD || g->alloc == &g->scratch) {   /* (scratch: inside dt_graph_pack16's fn) */
        DT_ERR(DT_ESTATE, "checkpoint: nested checkpoints are not supported "
               "(dt_graph_checkpoint called inside a checkpoint function)");
        return NULL;
    }
    if (!g->grad_enabled) return fn(g, x, ctx);   /* nothing to recompute */
    dt_rng before = rng ? *rng : (dt_rng){{0, 0}};
    g->mode = DT_GRAPH_COUNT;
    g->alloc = &g->scratch;
    g->n_ck_uses = g->n_ck_ev = 0;
    dt_tensor *y = fn(g, x, ctx);
    dt_graph_output_use(g, y);   /* y a parameter's value: its use (OOM: sticky, backward refuses) */
    g->mode = DT_GRAPH_RECORD;
    g->alloc = &g->arena;
    if (!y && dt_error_code() == DT_OK) DT_ERR(DT_EINVAL, "checkpoint: the function returned NULL without an error");
    dt_tensor *out = y ? dt_graph_copy_out(g, y, "checkpoint") : NULL;
    /* A node also for an output that needs no gradient when fn used parameters
     * or modules: no gradient reaches it, so backward's skip path releases
     * the uses (grad-ready fires) and fires the markers' hooks, as a plain
     * run's unreached nodes do. */
    if (out && (y->requires_grad || g->n_ck_ev > 0) &&
        record_node(g, out, x, fn, ctx, rng, &before, y->requires_grad) != DT_OK)
        out = NULL;
    dt_arena_rewind(&g->scratch);   /* blocks stay: pack16 images point into them */
    return out;
}

/* The replay's output must be the first pass's: same shape, same uses. */
static dt_status check_replay(dt_graph *g, const dt_ckpt *ck, const dt_node *n, const dt_tensor *y) {
    if (!y) {
        char msg[256];
        snprintf(msg, sizeof msg, "%s", dt_error_message()[0] ? dt_error_message() : "it returned NULL without an error");
        dt_status code = dt_error_code() != DT_OK ? dt_error_code() : DT_ESTATE;
        return DT_ERR(code, "checkpoint replay: the function failed: %s", msg);
    }
    if (dt_error_code() != DT_OK) return dt_error_code();   /* e.g. a parameter the first pass did not use */
    if (!dt_tensor_same_shape(y, n->out))
        return DT_ERR(DT_ESTATE, "checkpoint replay: output %s, the first pass returned %s",
                      dt_shape_str(y, (char[96]){0}, 96), dt_shape_str(n->out, (char[96]){0}, 96));
    if (!y->requires_grad)
        return DT_ERR(DT_ESTATE, "checkpoint replay: the output does not require grad, the first pass's did");
    if (g->n_replay_uses != ck->n_uses)
        return DT_ERR(DT_ESTATE, "checkpoint replay: %d parameter uses, the first pass counted %d "
                      "(the function must run the same ops both times)", g->n_replay_uses, ck->n_uses);
    return DT_OK;
}

void dt_checkpoint_backward(dt_graph *g, dt_node *n) {
    dt_ckpt *ck = n->saved;
    dt_tensor *x = n->n_in ? n->in[0] : NULL;
    if (x && x->requires_grad) {   /* main arena, before the replay (NULL without error: frozen) */
        dt_grad_of(g, x);
        if (dt_error_code() != DT_OK) return;
    }
    const float *dy = dt_f32(n->out->grad);
    int mark = g->n_nodes;
    dt_rng now = {{0, 0}};
    if (ck->rng) { now = *ck->rng; *ck->rng = ck->rng_before; }
    dt_error_clear();
    g->mode = DT_GRAPH_REPLAY;
    g->alloc = &g->scratch;
    g->n_replay_uses = 0;
    dt_tensor *y = ck->fn(g, x, ck->ctx);
    int out_rec = dt_graph_output_use(g, y);   /* (counted before the check: it compares the uses) */
    dt_status s = check_replay(g, ck, n, y);
    if (s == DT_OK) s = dt_graph_seed_region_out(g, y, dy);
    /* y's own use was counted last, so it is released first: y's gradient is complete */
    if (s == DT_OK && out_rec >= 0) s = dt_graph_release_use(g, out_rec);
    for (int k = g->n_nodes - 1; s == DT_OK && k >= mark; k--) s = dt_graph_run_node(g, g->nodes[k], y);
    if (s != DT_OK && dt_error_code() == DT_OK) DT_ERR(s, "checkpoint replay: a hook failed without a message");
    g->n_nodes = mark;
    g->mode = DT_GRAPH_RECORD;
    g->alloc = &g->arena;
    dt_arena_rewind(&g->scratch);   /* blocks stay: pack16 images point into them */
    if (ck->rng) *ck->rng = now;
}

dt_status dt_checkpoint_skip(dt_graph *g, dt_node *n) {
    const dt_ckpt *ck = n->saved;
    return dt_graph_skip_region(g, ck->ev, ck->n_ev);
}
