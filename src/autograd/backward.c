/* Backward: the tape in reverse, parameter uses released (grad-ready on a
 * final graph), module markers firing pre/post-backward. */
#include "graph_internal.h"

dt_status dt_graph_release_use(dt_graph *g, int rec) {
    dt_param_rec *r = &g->params.recs[rec];
    if (--r->pending == 0 && g->final && r->p->on_grad_ready)
        return r->p->on_grad_ready(r->p, r->p->on_grad_ready_user);
    return DT_OK;
}

dt_status dt_graph_run_node(dt_graph *g, dt_node *n, const dt_tensor *start) {
    if (n->marker) {
        dt_module *m = n->module;
        return m->hook ? m->hook(m, n->marker == 2 ? DT_HOOK_PRE_BACKWARD : DT_HOOK_POST_BACKWARD, m->hook_user)
                       : DT_OK;
    }
    /* An output no gradient reached contributes nothing; its params' pending
     * uses still count down so their grad-ready hook fires. */
    if (n->out->grad || n->out == start) {
        n->backward(g, n);   /* errors (OOM, a failed SyncBN exchange) stop backward */
        if (dt_error_code() != DT_OK) return dt_error_code();
    }
    for (int i = 0; i < n->n_in; i++)
        if (n->param_rec[i] >= 0) DT_TRY(dt_graph_release_use(g, n->param_rec[i]));
    if (g->tick) g->tick(g->tick_user);
    return DT_OK;
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
    for (int k = g->n_nodes - 1; k >= 0; k--) DT_TRY(dt_graph_run_node(g, g->nodes[k], loss));
    return DT_OK;
}

dt_status dt_graph_backward(dt_graph *g, dt_tensor *loss) { return dt_graph_backward_scaled(g, loss, 1.0f); }
