/* Backward: the tape in reverse from any tensor and its upstream gradient,
 * parameter uses released (grad-ready on a final graph), module markers
 * firing pre/post-backward; nodes with deferred weight gradients run with
 * those hidden and are queued for the W pass (backward_weights.c). Graph
 * inputs and reading their gradients. */
#include <string.h>
#include "graph_internal.h"

dt_status dt_graph_release_use(dt_graph *g, int rec) {
    dt_param_rec *r = &g->params.recs[rec];
    if (--r->pending == 0 && g->final && r->p->on_grad_ready)
        return r->p->on_grad_ready(r->p, r->p->on_grad_ready_user);
    return DT_OK;
}

/* A module marker in backward: a leave (2) fires PRE_BACKWARD, an enter (1) POST_BACKWARD. */
static dt_status fire_marker(dt_module *m, int marker) {
    return m->hook ? m->hook(m, marker == 2 ? DT_HOOK_PRE_BACKWARD : DT_HOOK_POST_BACKWARD, m->hook_user) : DT_OK;
}

dt_status dt_graph_skip_region(dt_graph *g, const dt_region_event *ev, int n) {
    for (int k = n - 1; k >= 0; k--)
        DT_TRY(ev[k].module ? fire_marker(ev[k].module, ev[k].marker) : dt_graph_release_use(g, ev[k].rec));
    return DT_OK;
}

dt_status dt_graph_run_node(dt_graph *g, dt_node *n, const dt_tensor *start) {
    if (n->marker) return fire_marker(n->module, n->marker);
    /* An output no gradient reached contributes nothing; its params' pending
     * uses still count down so their grad-ready hook fires (a deferred
     * parameter's in the W pass). */
    int run = n->out->grad || n->out == start;
    unsigned defer = dt_defer_mask(g, n);
    if (defer) DT_TRY(dt_defer_push(g, n, defer, run));
    if (run) {
        const dt_node *masked = g->masked;
        unsigned mask = g->mask;
        g->masked = defer ? n : NULL;   /* the deferred parameters' gradients wait for W */
        g->mask = defer;
        n->backward(g, n);   /* errors (OOM, a failed SyncBN exchange) stop backward */
        g->masked = masked;
        g->mask = mask;
        if (dt_error_code() != DT_OK) return dt_error_code();
    } else if (n->backward == dt_checkpoint_backward) {
        DT_TRY(dt_checkpoint_skip(g, n));   /* its parameter uses and markers are inside it */
    } else if (n->backward == dt_pack16_backward) {
        DT_TRY(dt_pack16_skip(g, n));
    }
    for (int i = 0; i < n->n_in; i++)
        if (n->param_rec[i] >= 0 && !(defer >> i & 1u)) DT_TRY(dt_graph_release_use(g, n->param_rec[i]));
    if (g->tick) g->tick(g->tick_user);
    return DT_OK;
}

dt_status dt_graph_seed_grad(dt_graph *g, dt_tensor *t, const float *up) {
    int fresh = !t->param && !t->grad;
    float *d = dt_grad_of(g, t);
    if (!d) return dt_error_code() != DT_OK ? dt_error_code() : DT_ERR(DT_ESTATE, "backward: no gradient storage for the start tensor");
    if (fresh) memcpy(d, up, (size_t)t->numel * sizeof(float));
    else for (int64_t i = 0; i < t->numel; i++) d[i] += up[i];
    return DT_OK;
}

dt_status dt_graph_seed_region_out(dt_graph *g, dt_tensor *y, const float *up) {
    if (y->param && !y->param->requires_grad) return DT_OK;   /* frozen: its gradient goes nowhere */
    return dt_graph_seed_grad(g, y, up);
}

dt_status dt_graph_backward_from(dt_graph *g, dt_tensor *out, const float *upstream) {
    if (!g) return DT_ERR(DT_EINVAL, "backward: graph is NULL");
    if (g->backward_done)
        return DT_ERR(DT_ESTATE, "backward called twice on the same graph (reset it between steps)");
    if (!out) return DT_ERR(DT_EINVAL, "backward: the start tensor is NULL");
    if (!upstream) return DT_ERR(DT_EINVAL, "backward: the upstream gradient is NULL (want %lld floats)", (long long)out->numel);
    if (!out->requires_grad)
        return DT_ERR(DT_ESTATE, "backward: the start tensor does not require grad (was it computed with grad disabled?)");
    if (g->sticky != DT_OK)
        return DT_ERR(g->sticky, "the forward pass ran out of memory while recording the tape; no gradients computed");
    if (g->mode != DT_GRAPH_RECORD)
        return DT_ERR(DT_ESTATE, "backward called from inside a checkpoint function");
    g->backward_done = 1;
    g->wpass = DT_WPASS_FAILED;   /* until the loop completes */
    g->n_deferred = 0;
    dt_error_clear();
    dt_status s = dt_graph_seed_grad(g, out, upstream);
    for (int k = g->n_nodes - 1; s == DT_OK && k >= 0; k--) s = dt_graph_run_node(g, g->nodes[k], out);
    if (s != DT_OK) {
        g->n_deferred = 0;   /* a failed backward leaves no W work */
        return s;
    }
    g->wpass = DT_WPASS_PENDING;
    return DT_OK;
}

dt_status dt_graph_backward_scaled(dt_graph *g, dt_tensor *loss, float grad_scale) {
    if (loss && loss->numel != 1 && g && !g->backward_done)   /* (a second backward: backward_from's error) */
        return DT_ERR(DT_EINVAL, "backward needs a scalar loss, got %lld elements", (long long)loss->numel);
    return dt_graph_backward_from(g, loss, &grad_scale);
}

dt_status dt_graph_backward(dt_graph *g, dt_tensor *loss) { return dt_graph_backward_scaled(g, loss, 1.0f); }

dt_tensor *dt_graph_input(dt_graph *g, int ndim, const int64_t *shape, const float *data, int requires_grad) {
    if (!g) { DT_ERR(DT_EINVAL, "graph input: graph is NULL"); return NULL; }
    dt_tensor *t = dt_graph_scratch(g, sizeof *t);
    if (!t) return NULL;
    memset(t, 0, sizeof *t);
    if (dt_tensor_set_shape(t, ndim, shape) != DT_OK) return NULL;
    if (t->numel > 0 && !data) {
        DT_ERR(DT_EINVAL, "graph input: data is NULL for %s", dt_shape_str(t, (char[96]){0}, 96));
        return NULL;
    }
    t->dtype = DT_F32;
    t->data = (void *)data;   /* read only: ops never write their inputs */
    t->requires_grad = requires_grad != 0;
    return t;
}

const float *dt_graph_grad(dt_graph *g, dt_tensor *t) {
    if (!g || !t) { DT_ERR(DT_EINVAL, "graph grad: %s is NULL", g ? "tensor" : "graph"); return NULL; }
    if (t->param) {
        DT_ERR(DT_EINVAL, "graph grad: the tensor is parameter %s's value; read its gradient from p->grad", t->param->name);
        return NULL;
    }
    if (!t->requires_grad) {
        DT_ERR(DT_ESTATE, "graph grad: tensor %s does not require grad", dt_shape_str(t, (char[96]){0}, 96));
        return NULL;
    }
    return dt_grad_of(g, t);   /* zeros when no gradient reached t */
}
