/* The split backward (autograd.h, dt_graph_defer_weights).
 *
 * B (backward.c's loop) asks dt_defer_mask which inputs of a node are
 * deferred parameters; such a node runs with g->masked = the node, so
 * dt_grad_of hides those parameters' gradients, and is queued here with its
 * mask. W runs the queue in order with g->in_w set, so dt_grad_of hides every
 * gradient but the deferred parameters', then releases the deferred uses.
 * Why the order is plain backward's: per parameter, B-time contributions
 * (not deferred) keep their order, and W replays the deferred ones in the
 * order B reached their nodes, with the same op on the same inputs. */
#include <stdint.h>
#include <stdlib.h>
#include "graph_internal.h"

void dt_graph_defer_weights(dt_graph *g, dt_defer_fn pred, void *user) {
    if (!g) return;
    g->defer = pred;
    g->defer_user = user;
}

int dt_graph_deferred_nodes(const dt_graph *g) { return g ? g->n_deferred : 0; }

unsigned dt_defer_mask(dt_graph *g, const dt_node *n) {
    if (!g->defer || g->mode != DT_GRAPH_RECORD) return 0;   /* a replay's nodes: weights in B */
    unsigned m = 0;
    for (int i = 0; i < n->n_in; i++)   /* param_rec >= 0: a parameter with requires_grad */
        if (n->param_rec[i] >= 0 && g->defer(n->in[i]->param, g->defer_user)) m |= 1u << i;
    return m;
}

dt_status dt_defer_push(dt_graph *g, dt_node *n, unsigned mask, int run) {
    if (g->n_deferred == g->cap_deferred) {
        int nc = g->cap_deferred ? 2 * g->cap_deferred : 64;
        dt_deferred *a = realloc(g->deferred, (size_t)nc * sizeof *a);
        if (!a) return DT_ERR(DT_ENOMEM, "out of memory deferring the weight gradients of %s", n->op);
        g->deferred = a;
        g->cap_deferred = nc;
    }
    g->deferred[g->n_deferred++] = (dt_deferred){n, mask, run};
    return DT_OK;
}

int dt_grad_hidden(const dt_graph *g, const dt_tensor *t) {
    const dt_node *n = g->masked;
    int deferred = 0;
    for (int i = 0; t->param && i < n->n_in && !deferred; i++)
        deferred = (g->mask >> i & 1u) && n->in[i] && n->in[i]->param == t->param;
    return g->in_w ? !deferred : deferred;
}

static int overlaps(const void *a, size_t na, const void *b, size_t nb) {
    uintptr_t a0 = (uintptr_t)a, b0 = (uintptr_t)b;
    return a && b && na && nb && a0 < b0 + nb && b0 < a0 + na;
}

static size_t bytes_of(const dt_tensor *t) { return (size_t)t->numel * dt_dtype_size(t->dtype); }

int dt_defer_reads(const dt_graph *g, const dt_tensor *x) {
    if (!x || !g->n_deferred) return 0;
    size_t nx = bytes_of(x);
    for (int k = 0; k < g->n_deferred; k++) {
        const dt_deferred *d = &g->deferred[k];
        if (!d->run) continue;   /* W does not run it: reads nothing */
        const dt_node *n = d->n;
        if (n->out->grad && overlaps(x->data, nx, n->out->grad->data, bytes_of(n->out->grad))) return 1;
        for (int i = 0; i < n->n_in; i++)
            if (n->in[i] && overlaps(x->data, nx, n->in[i]->data, bytes_of(n->in[i]))) return 1;
    }
    return 0;
}

/* One queued node: its backward with only the deferred gradients visible
 * (unless no gradient reached it), its deferred uses released, the tick. */
static dt_status run_deferred(dt_graph *g, const dt_deferred *d) {
    dt_node *n = d->n;
    if (d->run) {
        g->masked = n;
        g->mask = d->mask;
        n->backward(g, n);
        g->masked = NULL;
        if (dt_error_code() != DT_OK) return dt_error_code();
    }
    for (int i = 0; i < n->n_in; i++)
        if (d->mask >> i & 1u) DT_TRY(dt_graph_release_use(g, n->param_rec[i]));
    if (g->tick) g->tick(g->tick_user);
    return DT_OK;
}

dt_status dt_graph_backward_weights(dt_graph *g) {
    if (!g) return DT_ERR(DT_EINVAL, "backward_weights: graph is NULL");
    switch (g->wpass) {
    case DT_WPASS_NONE:
        return DT_ERR(DT_ESTATE, "backward_weights: the graph's backward has not run since it was "
                      "created or reset (call dt_graph_backward first)");
    case DT_WPASS_DONE:
        return DT_ERR(DT_ESTATE, "backward_weights called twice for one backward (reset the graph between steps)");
    case DT_WPASS_FAILED:
        return DT_ERR(DT_ESTATE, "backward_weights: the graph's backward failed; no weight gradients to compute");
    case DT_WPASS_PENDING:
        break;
    }
    if (g->mode != DT_GRAPH_RECORD)
        return DT_ERR(DT_ESTATE, "backward_weights called from inside a checkpoint function");
    g->wpass = DT_WPASS_DONE;
    dt_error_clear();
    dt_status s = DT_OK;
    g->in_w = 1;
    for (int k = 0; s == DT_OK && k < g->n_deferred; k++) s = run_deferred(g, &g->deferred[k]);
    g->in_w = 0;
    g->masked = NULL;
    g->n_deferred = 0;
    return s;
}
