/* The probe: run every block once to learn what it costs and which
 * parameters it uses (the cut itself: pipe/balance.c).
 *
 * The probe runs in eval mode (BatchNorm keeps its running statistics,
 * dropout draws nothing) with gradients enabled, so the tape counts each
 * parameter's uses (dt_graph_param_uses) and nothing outside the tape
 * changes: the probed model trains exactly like an unprobed one. Frozen
 * parameters are counted too (requires_grad is raised for the probe only).
 * Two passes; a block's cost is its faster one (the first pays for warm-up).
 * A temporary module hook records which block entered each module (a
 * buffer such as "bn1.running_mean" belongs to module bn1's block). */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "pipe_internal.h"

void dt_pipe_probe_free(dt_pipe_probe *p) {
    free(p->cost); free(p->used); free(p->module_block);
    memset(p, 0, sizeof *p);
}

/* module hook during the probe: which block entered the module */
typedef struct probe_ctx { dt_pipe_probe *pr; int block; } probe_ctx;
static dt_status probe_hook(dt_module *mod, dt_module_hook_kind kind, void *user) {
    probe_ctx *c = user;
    if (kind == DT_HOOK_PRE_FORWARD || kind == DT_HOOK_PRE_RECOMPUTE) c->pr->module_block[mod->index] = c->block;
    return DT_OK;
}

static dt_status probe_pass(dt_model *m, dt_graph *g, const dt_batch *ex, dt_pipe_probe *pr, int *prev,
                            probe_ctx *ctx) {
    dt_graph_reset(g);
    for (int k = 0; k < m->n_params; k++) prev[k] = 0;
    dt_tensor *x = NULL;
    for (int i = 0; i < m->n_blocks; i++) {
        ctx->block = i;
        double t0 = dt_par_now_us();
        x = dt_model_run_blocks(m, g, ex, i, i + 1, x);
        if (x && i + 1 == m->n_blocks) {
            dt_tensor *loss = dt_model_loss(m, g, ex, x, NULL);
            if (!loss) x = NULL;
        }
        if (!x) {
            char why[512];
            snprintf(why, sizeof why, "%s", dt_error_message());
            return DT_ERR(dt_error_code() ? dt_error_code() : DT_EINVAL,
                          "pipeline probe: block %s failed on one micro-batch: %s", m->blocks[i].name, why);
        }
        double ms = (dt_par_now_us() - t0) / 1e3;
        if (ms < pr->cost[i]) pr->cost[i] = ms;
        for (int k = 0; k < m->n_params; k++) {
            int u = dt_graph_param_uses(g, m->params[k]);
            if (u != prev[k]) pr->used[(size_t)k * (size_t)pr->n_blocks + (size_t)i] = 1;
            prev[k] = u;
        }
    }
    return DT_OK;
}

dt_status dt_pipe_probe_run(dt_model *m, const dt_batch *ex, dt_pipe_probe *out) {
    memset(out, 0, sizeof *out);
    int nb = m->n_blocks, np = m->n_params;
    if (nb <= 0 || m->forward)
        return DT_ERR(DT_EINVAL, "model %s: a pipeline needs a model made of blocks (nn.h section 3)", m->name);
    out->n_blocks = nb;
    out->n_params = np;
    out->cost = malloc((size_t)nb * sizeof *out->cost);
    out->used = calloc((size_t)(np ? np : 1) * (size_t)nb, 1);
    out->n_modules = m->n_modules;
    out->module_block = malloc((size_t)(m->n_modules ? m->n_modules : 1) * sizeof *out->module_block);
    dt_module_hook_fn *hooks = malloc((size_t)(m->n_modules ? m->n_modules : 1) * sizeof *hooks);
    void **hook_users = malloc((size_t)(m->n_modules ? m->n_modules : 1) * sizeof *hook_users);
    probe_ctx ctx = {out, -1};
    int *prev = malloc((size_t)(np ? np : 1) * sizeof *prev);
    unsigned char *rg = malloc((size_t)(np ? np : 1));
    dt_graph *g = dt_graph_create();
    dt_status s = out->cost && out->used && out->module_block && hooks && hook_users && prev && rg && g ? DT_OK
                : DT_ERR(DT_ENOMEM, "pipeline probe: out of memory");
    if (s == DT_OK) {
        for (int i = 0; i < nb; i++) out->cost[i] = DBL_MAX;
        for (int k = 0; k < np; k++) {
            /* the probe's uses must not count as this step's gradients */
            rg[k] = (unsigned char)((m->params[k]->requires_grad != 0) | (m->params[k]->has_grad != 0) << 1);
            m->params[k]->requires_grad = 1;
        }
        for (int k = 0; k < m->n_modules; k++) {
            out->module_block[k] = -1;
            hooks[k] = m->modules[k]->hook;
            hook_users[k] = m->modules[k]->hook_user;
            m->modules[k]->hook = probe_hook;
            m->modules[k]->hook_user = &ctx;
        }
        dt_graph_set_training(g, 0);
        for (int pass = 0; pass < 2 && s == DT_OK; pass++) s = probe_pass(m, g, ex, out, prev, &ctx);
        for (int k = 0; k < np; k++) {
            m->params[k]->requires_grad = rg[k] & 1;
            m->params[k]->has_grad = rg[k] >> 1;
        }
        for (int k = 0; k < m->n_modules; k++) {
            m->modules[k]->hook = hooks[k];
            m->modules[k]->hook_user = hook_users[k];
        }
    }
    free(hooks);
    free(hook_users);
    dt_graph_free(g);
    free(prev);
    free(rg);
    if (s != DT_OK) dt_pipe_probe_free(out);
    return s;
}

static int block_uses(const dt_pipe_probe *pr, int k, int i) {
    return pr->used[(size_t)k * (size_t)pr->n_blocks + (size_t)i];
}

int dt_pipe_chunk_uses(const dt_pipe *p, const dt_pipe_probe *pr, int k, int v) {
    for (int i = p->lay.vfirst[v]; i < p->lay.vfirst[v + 1]; i++)
        if (block_uses(pr, k, i)) return 1;
    return 0;
}

int dt_pipe_rank_uses(const dt_pipe *p, const dt_pipe_probe *pr, int k, int rank) {
    for (int v = rank; v < p->lay.S; v += p->lay.P)
        if (dt_pipe_chunk_uses(p, pr, k, v)) return 1;
    return 0;
}

int dt_pipe_last_user(const dt_pipe *p, const dt_pipe_probe *pr, int k) {
    for (int v = p->lay.S - 1; v >= 0; v--)
        if (dt_pipe_chunk_uses(p, pr, k, v)) return v;
    return -1;
}

int dt_pipe_buffer_owner(const dt_pipe *p, const dt_pipe_probe *pr, const dt_model *m, const char *name) {
    size_t best = 0;
    int block = -1;
    for (int k = 0; k < m->n_modules && k < pr->n_modules; k++) {
        size_t n = strlen(m->modules[k]->name);
        if (n > best && !strncmp(name, m->modules[k]->name, n) && name[n] == '.' && pr->module_block[k] >= 0) {
            best = n;
            block = pr->module_block[k];
        }
    }
    if (block < 0) return 0;
    for (int v = 0; v < p->lay.S; v++)
        if (block >= p->lay.vfirst[v] && block < p->lay.vfirst[v + 1]) return dt_pipe_rank_of(p, v);
    return 0;
}
