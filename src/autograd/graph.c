/* The tape: creating and resetting a graph, allocation, recording ops and
 * module markers, per-graph parameter use counts. Backward is backward.c,
 * the recompute modes (COUNT, REPLAY) are driven by checkpoint.c. */
#include <stdlib.h>
#include <string.h>
#include "graph_internal.h"

dt_graph *dt_graph_create(void) {
    dt_graph *g = calloc(1, sizeof *g);
    if (!g) { DT_ERR(DT_ENOMEM, "out of memory creating graph"); return NULL; }
    g->alloc = &g->arena;
    g->grad_enabled = 1;
    g->training = 1;
    g->final = 1;
    return g;
}

void dt_graph_free(dt_graph *g) {
    if (!g) return;
    dt_arena_free(&g->arena);
    dt_arena_free(&g->scratch);
    dt_ptab_free(&g->params);
    free(g->nodes);
    free(g->ck_ev);
    free(g->deferred);
    free(g->saved_decl);
    free(g);
}

/* Touches nothing outside the graph: its parameter records are its own.
 * Pending W work is dropped; the defer predicate is kept. */
void dt_graph_reset(dt_graph *g) {
    dt_ptab_clear(&g->params);
    g->n_nodes = 0;
    g->backward_done = 0;
    g->n_deferred = 0;
    g->wpass = DT_WPASS_NONE;
    g->in_w = 0;
    g->masked = NULL;
    g->sticky = DT_OK;
    g->packing = 0;
    g->n_saved_decl = 0;
    g->mode = DT_GRAPH_RECORD;
    g->alloc = &g->arena;
    dt_arena_reset(&g->arena);
    dt_arena_reset(&g->scratch);
}

int dt_graph_set_grad_enabled(dt_graph *g, int enabled) {
    int prev = g->grad_enabled;
    g->grad_enabled = enabled != 0;
    return prev;
}
int dt_graph_grad_enabled(const dt_graph *g) { return g->grad_enabled; }
void dt_graph_set_training(dt_graph *g, int training) { g->training = training != 0; }
int dt_graph_training(const dt_graph *g) { return g->training; }
int dt_graph_recomputing(const dt_graph *g) { return g->mode == DT_GRAPH_REPLAY; }
void dt_graph_set_final(dt_graph *g, int final) { g->final = final != 0; }
int dt_graph_final(const dt_graph *g) { return g->final; }
void dt_graph_set_tick(dt_graph *g, dt_graph_tick_fn fn, void *user) { g->tick = fn; g->tick_user = user; }
size_t dt_graph_arena_bytes(const dt_graph *g) { return g->arena.high_water + g->scratch.high_water; }

int dt_graph_param_uses(const dt_graph *g, const dt_param *p) {
    int i = dt_ptab_find(&g->params, p);
    return i < 0 ? 0 : g->params.recs[i].uses;
}

static void *alloc_in(dt_arena *a, size_t bytes) {
    void *p = dt_arena_alloc(a, bytes);
    if (!p) DT_ERR(DT_ENOMEM, "out of memory: graph arena needs %zu more bytes", bytes);
    return p;
}

void *dt_graph_scratch(dt_graph *g, size_t bytes) { return alloc_in(g->alloc, bytes); }

dt_tensor *dt_graph_tensor_in(dt_graph *g, dt_arena *a, int ndim, const int64_t *shape) {
    (void)g;
    dt_tensor *t = alloc_in(a, sizeof *t);
    if (!t) return NULL;
    memset(t, 0, sizeof *t);
    if (dt_tensor_set_shape(t, ndim, shape) != DT_OK) return NULL;
    t->dtype = DT_F32;
    t->data = alloc_in(a, (size_t)t->numel * sizeof(float));
    return t->data ? t : NULL;
}

dt_tensor *dt_graph_tensor(dt_graph *g, int ndim, const int64_t *shape) {
    return dt_graph_tensor_in(g, g->alloc, ndim, shape);
}

dt_tensor *dt_graph_tensor_zeros(dt_graph *g, int ndim, const int64_t *shape) {
    dt_tensor *t = dt_graph_tensor(g, ndim, shape);
    if (t) memset(t->data, 0, (size_t)t->numel * sizeof(float));
    return t;
}

dt_node *dt_graph_new_node(dt_graph *g) {
    dt_node *n = dt_graph_scratch(g, sizeof *n);
    if (!n) { g->sticky = DT_ENOMEM; return NULL; }
    memset(n, 0, sizeof *n);
    if (dt_graph_reserve_nodes(g, 1) != DT_OK) { g->sticky = DT_ENOMEM; return NULL; }
    g->nodes[g->n_nodes++] = n;
    return n;
}

dt_status dt_graph_reserve_nodes(dt_graph *g, int more) {
    if (g->n_nodes + more <= g->cap_nodes) return DT_OK;
    int nc = g->cap_nodes ? 2 * g->cap_nodes : 256;
    if (nc < g->n_nodes + more) nc = g->n_nodes + more;
    dt_node **na = realloc(g->nodes, (size_t)nc * sizeof *na);
    if (!na) return DT_ERR(DT_ENOMEM, "out of memory growing the tape");
    g->nodes = na;
    g->cap_nodes = nc;
    return DT_OK;
}

dt_tensor *dt_graph_copy_out(dt_graph *g, const dt_tensor *y, const char *who) {
    if (y->dtype != DT_F32 || (y->numel > 0 && !y->data)) {
        DT_ERR(DT_EINVAL, "%s: the function's output %s is not an F32 tensor with data", who,
               dt_shape_str(y, (char[96]){0}, 96));
        return NULL;
    }
    dt_tensor *out = dt_graph_tensor_in(g, &g->arena, y->ndim, y->shape);
    if (out) memcpy(out->data, y->data, (size_t)y->numel * sizeof(float));
    return out;
}

dt_node *dt_graph_region_node(dt_graph *g, const char *op, dt_backward_fn bw, dt_tensor *x, dt_tensor *out,
                              void *saved, int requires_grad) {
    dt_node *n = dt_graph_new_node(g);
    if (!n) return NULL;
    n->backward = bw;
    n->op = op;
    n->out = out;
    n->n_in = x ? 1 : 0;
    n->in[0] = x;
    n->param_rec[0] = -1;   /* x's uses, if a parameter, are counted inside the region */
    n->saved = saved;
    out->requires_grad = requires_grad != 0;
    out->grad_fn = requires_grad ? n : NULL;
    if (g->tick) g->tick(g->tick_user);
    return n;
}

/* COUNT: room for one more event in ck_ev (0, or -1 on OOM). */
static int ck_room(dt_graph *g) {
    if (g->n_ck_ev < g->cap_ck_ev) return 0;
    int nc = g->cap_ck_ev ? 2 * g->cap_ck_ev : 64;
    dt_region_event *a = realloc(g->ck_ev, (size_t)nc * sizeof *a);
    if (!a) return -1;
    g->ck_ev = a;
    g->cap_ck_ev = nc;
    return 0;
}

/* One more use of p on this tape (COUNT: also listed for the checkpoint);
 * its record index, -1 (sticky set) on OOM. */
static int count_use(dt_graph *g, dt_param *p) {
    int r = dt_ptab_get(&g->params, p);
    if (r >= 0 && g->mode == DT_GRAPH_COUNT && ck_room(g) != 0) r = -1;
    if (r < 0) {
        g->sticky = DT_ERR(DT_ENOMEM, "out of memory recording parameter %s", p->name);
        return -1;
    }
    if (g->mode == DT_GRAPH_COUNT) {
        g->ck_ev[g->n_ck_ev++] = (dt_region_event){NULL, 0, r};
        g->n_ck_uses++;
    }
    p->has_grad = 1;
    g->params.recs[r].uses++;
    g->params.recs[r].pending++;
    return r;
}

/* REPLAY: the record the first pass counted p's use in (-1 + error if none). */
static int replayed_use(dt_graph *g, dt_param *p) {
    int r = dt_ptab_find(&g->params, p);
    if (r < 0)
        DT_ERR(DT_ESTATE, "checkpoint replay: parameter %s was not used by the first pass "
               "(the checkpoint function must run the same ops both times)", p->name);
    g->n_replay_uses++;
    return r;
}

int dt_graph_output_use(dt_graph *g, const dt_tensor *y) {
    dt_param *p = y ? y->param : NULL;
    if (!p || !p->requires_grad || !y->requires_grad || !g->grad_enabled) return -1;
    return g->mode == DT_GRAPH_REPLAY ? replayed_use(g, p) : count_use(g, p);
}

/* COUNT: the op runs but is not recorded; its parameter uses are counted
 * (listed in reverse input order, so the list read backwards releases them
 * as a recorded node would: nodes last to first, inputs in order), its
 * output marked as requiring grad so the checkpoint knows. */
static dt_node *count_only(dt_graph *g, dt_tensor *out, int n_in, dt_tensor *const *in) {
    for (int i = n_in - 1; i >= 0; i--) {
        dt_param *p = in[i] ? in[i]->param : NULL;
        if (p && p->requires_grad) count_use(g, p);
    }
    out->requires_grad = 1;
    out->grad_fn = NULL;
    if (g->tick) g->tick(g->tick_user);
    return NULL;
}

dt_node *dt_graph_record(dt_graph *g, const char *op, dt_backward_fn bw, dt_tensor *out,
                         int n_in, dt_tensor *const *in) {
    if (!g->grad_enabled || n_in > DT_NODE_MAX_INPUTS) return NULL;
    int any = 0;
    for (int i = 0; i < n_in; i++) any |= in[i] && in[i]->requires_grad;
    if (!any) return NULL;
    if (g->mode == DT_GRAPH_COUNT) return count_only(g, out, n_in, in);
    dt_node *n = dt_graph_new_node(g);
    if (!n) return NULL;
    n->backward = bw;
    n->op = op;
    n->out = out;
    n->n_in = n_in;
    for (int i = 0; i < n_in; i++) {
        n->in[i] = in[i];
        dt_param *p = in[i] ? in[i]->param : NULL;
        n->param_rec[i] = !p || !p->requires_grad ? -1 : g->mode == DT_GRAPH_REPLAY ? replayed_use(g, p) : count_use(g, p);
    }
    out->requires_grad = 1;
    out->grad_fn = n;
    if (g->tick) g->tick(g->tick_user);   /* forward progress too (parameter all-gathers) */
    return n;
}

/* Where t's gradient lives: with the tape being recorded, except that inside
 * a replay a tensor from outside it (a ctx input in the main arena, the
 * caller's) needs a gradient that outlives the scratch. */
static dt_arena *grad_arena(dt_graph *g, const dt_tensor *t) {
    return g->alloc == &g->scratch && !dt_arena_owns(&g->scratch, t) ? &g->arena : g->alloc;
}

float *dt_grad_of(dt_graph *g, dt_tensor *t) {
    if (!t || !t->requires_grad) return NULL;
    if (g->masked && dt_grad_hidden(g, t)) return NULL;   /* split backward: not in this pass */
    if (t->param) {
        dt_param *p = t->param;
        if (!p->requires_grad) return NULL;
        if (!p->grad.data) {
            if (!p->on_grad_alloc) { DT_ERR(DT_ESTATE, "parameter %s has no gradient storage", p->name); return NULL; }
            if (p->on_grad_alloc(p, p->on_grad_ready_user) != DT_OK) return NULL;
        }
        return dt_f32(&p->grad);
    }
    if (!t->grad) {
        dt_tensor *gt = dt_graph_tensor_in(g, grad_arena(g, t), t->ndim, t->shape);
        if (!gt) return NULL;
        memset(gt->data, 0, (size_t)gt->numel * sizeof(float));
        t->grad = gt;
    }
    return dt_f32(t->grad);
}

/* x (no gradient yet, not a parameter) gets as gradient a view of `data`,
 * which must live as long as x's own gradient would (grad_arena). Returns 1,
 * or 0 (the caller allocates as usual: dt_grad_of reports an OOM). */
static int grad_view(dt_graph *g, dt_tensor *x, float *data) {
    dt_arena *a = grad_arena(g, x);
    if (a == &g->arena && dt_arena_owns(&g->scratch, data)) return 0;   /* would outlive data */
    dt_tensor *gt = dt_arena_alloc(a, sizeof *gt);
    if (!gt) return 0;
    dt_tensor_view(gt, data, DT_F32, x->ndim, x->shape);
    x->grad = gt;
    return 1;
}

/* Safe with deferred weights (B): a queued node reads in W its output's
 * gradient, final when B reached the node. y's gradient can be that buffer
 * only if y is downstream of the output; then x is too (or is the output),
 * so every write into x's gradient comes from a node B processed before the
 * queued one. */
int dt_grad_alias(dt_graph *g, dt_tensor *x, dt_tensor *y) {
    if (g->in_w) return 0;
    if (!x || !y || !x->requires_grad || x->param || x->grad || !y->grad || x->numel != y->numel) return 0;
    return grad_view(g, x, dt_f32(y->grad));
}

/* With deferred weights (B): a queued node reads its inputs again in W; x
 * overlapping one of them (x a view of a queued linear's input, consumed in
 * place by an op recorded before that linear) must keep its values. */
int dt_grad_in_place(dt_graph *g, dt_tensor *x) {
    if (g->in_w || dt_defer_reads(g, x)) return 0;
    if (!x || !x->requires_grad || x->param || x->grad || x->dtype != DT_F32) return 0;
    return grad_view(g, x, dt_f32(x));
}

static dt_status fire_module(dt_module *m, dt_module_hook_kind k) {
    return m->hook ? m->hook(m, k, m->hook_user) : DT_OK;
}

/* Markers are not recorded in a checkpoint's first pass (its replay records
 * them), only listed, for the skip path of a checkpoint no gradient reaches. */
static dt_status add_marker(dt_graph *g, dt_module *m, int marker) {
    if (!g->grad_enabled) return DT_OK;
    if (g->mode == DT_GRAPH_COUNT) {
        if (ck_room(g) != 0) {
            g->sticky = DT_ERR(DT_ENOMEM, "out of memory recording module %s", m->name);
            return DT_ENOMEM;
        }
        g->ck_ev[g->n_ck_ev++] = (dt_region_event){m, marker, -1};
        return DT_OK;
    }
    dt_node *n = dt_graph_new_node(g);
    if (!n) return DT_ENOMEM;
    n->marker = marker;
    n->module = m;
    n->op = marker == 1 ? "module_enter" : "module_leave";
    return DT_OK;
}

dt_status dt_module_enter(dt_graph *g, dt_module *m) {
    DT_TRY(fire_module(m, g->mode == DT_GRAPH_REPLAY ? DT_HOOK_PRE_RECOMPUTE : DT_HOOK_PRE_FORWARD));
    return add_marker(g, m, 1);
}

dt_status dt_module_leave(dt_graph *g, dt_module *m) {
    DT_TRY(add_marker(g, m, 2));
    return fire_module(m, g->mode == DT_GRAPH_REPLAY ? DT_HOOK_POST_RECOMPUTE : DT_HOOK_POST_FORWARD);
}
