/* The tape: recording ops, backward in reverse order, grad-ready and module hooks. */
#include <stdlib.h>
#include <string.h>
#include "arena.h"
#include "dtrain/autograd.h"

struct dt_graph {
    dt_arena arena;
    dt_node **nodes; int n_nodes, cap_nodes;
    dt_param **touched; int n_touched, cap_touched;   /* params with uses on this tape */
    int grad_enabled, training, backward_done;
    dt_status sticky;    /* an allocation failed while recording: backward must not run */
    dt_graph_tick_fn tick; void *tick_user;
};

dt_graph *dt_graph_create(void) {
    dt_graph *g = calloc(1, sizeof *g);
    if (!g) { DT_ERR(DT_ENOMEM, "out of memory creating graph"); return NULL; }
    g->grad_enabled = 1;
    g->training = 1;
    return g;
}

void dt_graph_free(dt_graph *g) {
    if (!g) return;
    dt_graph_reset(g);
    dt_arena_free(&g->arena);
    free(g->nodes);
    free(g->touched);
    free(g);
}

void dt_graph_reset(dt_graph *g) {
    for (int i = 0; i < g->n_touched; i++) {
        dt_param *p = g->touched[i];
        p->uses = p->pending = p->used = 0;
    }
    g->n_touched = 0;
    g->n_nodes = 0;
    g->backward_done = 0;
    g->sticky = DT_OK;
    dt_arena_reset(&g->arena);
}

int dt_graph_set_grad_enabled(dt_graph *g, int enabled) {
    int prev = g->grad_enabled;
    g->grad_enabled = enabled != 0;
    return prev;
}
int dt_graph_grad_enabled(const dt_graph *g) { return g->grad_enabled; }
void dt_graph_set_training(dt_graph *g, int training) { g->training = training != 0; }
int dt_graph_training(const dt_graph *g) { return g->training; }
void dt_graph_set_tick(dt_graph *g, dt_graph_tick_fn fn, void *user) { g->tick = fn; g->tick_user = user; }
size_t dt_graph_arena_bytes(const dt_graph *g) { return g->arena.high_water; }

void *dt_graph_scratch(dt_graph *g, size_t bytes) {
    void *p = dt_arena_alloc(&g->arena, bytes);
    if (!p) DT_ERR(DT_ENOMEM, "out of memory: graph arena needs %zu more bytes", bytes);
    return p;
}

dt_tensor *dt_graph_tensor(dt_graph *g, int ndim, const int64_t *shape) {
    dt_tensor *t = dt_graph_scratch(g, sizeof *t);
    if (!t) return NULL;
    memset(t, 0, sizeof *t);
    if (dt_tensor_set_shape(t, ndim, shape) != DT_OK) return NULL;
    t->dtype = DT_F32;
    t->data = dt_graph_scratch(g, (size_t)t->numel * sizeof(float));
    return t->data ? t : NULL;
}

dt_tensor *dt_graph_tensor_zeros(dt_graph *g, int ndim, const int64_t *shape) {
    dt_tensor *t = dt_graph_tensor(g, ndim, shape);
    if (t) memset(t->data, 0, (size_t)t->numel * sizeof(float));
    return t;
}

static int push(void ***arr, int *n, int *cap, void *x) {
    if (*n == *cap) {
        int nc = *cap ? 2 * *cap : 256;
        void **na = realloc(*arr, (size_t)nc * sizeof *na);
        if (!na) return -1;
        *arr = na;
        *cap = nc;
    }
    (*arr)[(*n)++] = x;
    return 0;
}

static dt_node *new_node(dt_graph *g) {
    dt_node *n = dt_graph_scratch(g, sizeof *n);
    if (!n) return NULL;
    memset(n, 0, sizeof *n);
    if (push((void ***)&g->nodes, &g->n_nodes, &g->cap_nodes, n) != 0) {
        g->sticky = DT_ERR(DT_ENOMEM, "out of memory growing the tape");
        return NULL;
    }
    return n;
}

dt_node *dt_graph_record(dt_graph *g, const char *op, dt_backward_fn bw, dt_tensor *out,
                         int n_in, dt_tensor *const *in) {
    if (!g->grad_enabled || n_in > DT_NODE_MAX_INPUTS) return NULL;
    int any = 0;
    for (int i = 0; i < n_in; i++) any |= in[i] && in[i]->requires_grad;
    if (!any) return NULL;
    dt_node *n = new_node(g);
    if (!n) { g->sticky = DT_ENOMEM; return NULL; }
    n->backward = bw;
    n->op = op;
    n->out = out;
    n->n_in = n_in;
    for (int i = 0; i < n_in; i++) {
        n->in[i] = in[i];
        dt_param *p = in[i] ? in[i]->param : NULL;
        if (p && p->requires_grad) {
            if (p->uses == 0 && push((void ***)&g->touched, &g->n_touched, &g->cap_touched, p) != 0)
                g->sticky = DT_ERR(DT_ENOMEM, "out of memory recording parameter %s", p->name);
            p->uses++;
            p->pending++;
            p->used = 1;
        }
    }
    out->requires_grad = 1;
    out->grad_fn = n;
    if (g->tick) g->tick(g->tick_user);   /* forward progress too (parameter all-gathers) */
    return n;
}

float *dt_grad_of(dt_graph *g, dt_tensor *t) {
    if (!t || !t->requires_grad) return NULL;
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
        dt_tensor *gt = dt_graph_tensor_zeros(g, t->ndim, t->shape);
        if (!gt) return NULL;
        t->grad = gt;
    }
    return dt_f32(t->grad);
}

static dt_status fire_module(dt_graph *g, dt_module *m, dt_module_hook_kind k) {
    (void)g;
    return m->hook ? m->hook(m, k, m->hook_user) : DT_OK;
}

dt_status dt_module_enter(dt_graph *g, dt_module *m) {
    DT_TRY(fire_module(g, m, DT_HOOK_PRE_FORWARD));
    if (g->grad_enabled) {
        dt_node *n = new_node(g);
        if (!n) return DT_ENOMEM;
        n->marker = 1;
        n->module = m;
        n->op = "module_enter";
    }
    return DT_OK;
}

dt_status dt_module_leave(dt_graph *g, dt_module *m) {
    if (g->grad_enabled) {
        dt_node *n = new_node(g);
        if (!n) return DT_ENOMEM;
        n->marker = 2;
        n->module = m;
        n->op = "module_leave";
    }
    return fire_module(g, m, DT_HOOK_POST_FORWARD);
}

dt_status dt_graph_backward_scaled(dt_graph *g, dt_tensor *loss, float grad_scale) {
    if (g->backward_done)
        return DT_ERR(DT_ESTATE, "backward called twice on the same graph (reset it between steps)");
    if (!loss || loss->numel != 1)
        return DT_ERR(DT_EINVAL, "backward needs a scalar loss");
    if (!loss->requires_grad)
        return DT_ERR(DT_ESTATE, "loss does not require grad (was it computed with grad disabled?)");
    if (g->sticky != DT_OK)
        return DT_ERR(g->sticky, "the forward pass ran out of memory while recording the tape; no gradients computed");
    g->backward_done = 1;
    dt_error_clear();
    float *dl = dt_grad_of(g, loss);
    if (!dl) return dt_error_code();
    dl[0] += grad_scale;
    for (int k = g->n_nodes - 1; k >= 0; k--) {
        dt_node *n = g->nodes[k];
        if (n->marker) {
            DT_TRY(fire_module(g, n->module, n->marker == 2 ? DT_HOOK_PRE_BACKWARD : DT_HOOK_POST_BACKWARD));
            continue;
        }
        /* An output no gradient reached contributes nothing; its params' pending
         * uses still count down so their grad-ready hook fires. */
        if (n->out->grad || n->out == loss) {
            n->backward(g, n);   /* errors (OOM, a failed SyncBN exchange) stop backward */
            if (dt_error_code() != DT_OK) return dt_error_code();
        }
        for (int i = 0; i < n->n_in; i++) {
            dt_param *p = n->in[i] ? n->in[i]->param : NULL;
            if (p && p->requires_grad && --p->pending == 0 && p->on_grad_ready)
                DT_TRY(p->on_grad_ready(p, p->on_grad_ready_user));
        }
        if (g->tick) g->tick(g->tick_user);
    }
    return DT_OK;
}

dt_status dt_graph_backward(dt_graph *g, dt_tensor *loss) { return dt_graph_backward_scaled(g, loss, 1.0f); }
