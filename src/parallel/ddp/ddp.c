/* DDP reducer: buckets over the flat gradient buffer, launched from grad-ready
 * hooks. Bucket cutting: ddp/buckets.c; static_graph: ddp/static_graph.c;
 * parameters_to_ignore: ddp/ignore.c; refresh_trainable: ddp/buckets.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ddp_internal.h"
#include "parallel/common/common_internal.h"

double dt_ddp_now_us(void) { return dt_par_now_us(); }

void dt_ddp_opts_default(dt_ddp_opts *o) {
    memset(o, 0, sizeof *o);
    dt_dp_opts_default(&o->dp);   /* 1 MiB buckets: = 4 MiB on shared memory, more hidden on a slow link (bench_train) */
}

static dt_status validate(const dt_ddp_opts *o) {
    DT_TRY(dt_dp_opts_validate(&o->dp, "ddp"));
    int wide = o->dp.wire == DT_F32;
    if (o->hook && !wide)
        return DT_ERR(DT_EINVAL, "ddp: a custom communication hook and dp.wire %s (built-in compression) are exclusive",
                      dt_par_wire_name(o->dp.wire));
    if (o->hook && !o->hook->launch)
        return DT_ERR(DT_EINVAL, "ddp: communication hook has no launch function");
    if (o->dp.deterministic && !wide)
        return DT_ERR(DT_EINVAL, "ddp: dp.deterministic and dp.wire %s are exclusive (compressed sums round per step)",
                      dt_par_wire_name(o->dp.wire));
    if (o->dp.deterministic && o->hook)
        return DT_ERR(DT_EINVAL, "ddp: dp.deterministic cannot be guaranteed with a custom communication hook");
    if (o->dp.shm == DT_DP_SHM_REQUIRE && (o->hook || !wide))
        return DT_ERR(DT_EINVAL, "ddp: node-shared memory reduces float32 with the built-in average; dp.shm REQUIRE "
                      "cannot go with %s", o->hook ? "a custom communication hook" : "a 16-bit dp.wire (compression)");
    if (o->dp.join && o->static_graph)
        return DT_ERR(DT_EINVAL, "ddp: join and static_graph are exclusive (a joined rank records no backward)");
    if (o->n_params_to_ignore < 0 || (o->n_params_to_ignore > 0 && !o->params_to_ignore))
        return DT_ERR(DT_EINVAL, "ddp: params_to_ignore: %d patterns but no list", o->n_params_to_ignore);
    return DT_OK;
}

dt_status dt_ddp_on_grad_ready(dt_param *p, void *user) {
    dt_ddp *d = user;
    if (!d->sync) return DT_OK;
    int bi = d->param_bucket[p->index];
    if (bi < 0) return DT_OK;
    dt_ddp_static_note(d, p->index);
    dt_ddp_bucket *b = &d->buckets[bi];
    if (--b->pending == 0) {
        b->ready = 1;
        if (d->trace) dt_trace_instant(d->trace, "bucket ready", 0);
        if (!d->opts.no_overlap) return dt_ddp_launch_ready(d);
    }
    return DT_OK;
}

dt_status dt_ddp_launch_ready(dt_ddp *d) {
    while (d->next_launch < d->n_buckets && d->buckets[d->next_launch].ready) {
        dt_ddp_bucket *b = &d->buckets[d->next_launch++];
        if (d->t_first_launch == 0) d->t_first_launch = dt_ddp_now_us();
        b->launched = 1;
        if (b->staged) dt_ddp_stage_in(d, b);
        d->stats.bytes_reduced += b->numel * d->wire_bytes;
        DT_TRY(d->hook.launch(d->hook.state, d->pg, b, &b->work));
    }
    return DT_OK;
}

static void graph_tick(void *user) { dt_pg_tick(((dt_ddp *)user)->pg); }

dt_status dt_ddp_create(dt_model *m, dt_pg *pg, const dt_ddp_opts *o, dt_ddp **out) {
    *out = NULL;
    dt_ddp_opts opts;
    if (o) opts = *o;
    else dt_ddp_opts_default(&opts);
    DT_TRY(validate(&opts));
    dt_ddp *d = calloc(1, sizeof *d);
    if (!d) return DT_ERR(DT_ENOMEM, "out of memory");
    d->opts = opts;
    d->model = m;
    d->pg = pg;
    d->bufs = (dt_par_buffers){.m = m, .pg = pg};
    d->rank = dt_pg_rank(pg);
    d->world = dt_pg_size(pg);
    d->red_flags = opts.dp.deterministic ? DT_RED_DETERMINISTIC : 0;
    d->wire_bytes = opts.hook ? sizeof(float) : dt_dtype_size(opts.dp.wire);
    dt_pg_topo topo;
    dt_pg_topology(pg, &topo);
    if (opts.hook) d->hook = *opts.hook;
    else if (opts.dp.wire == DT_F32) dt_ddp_hook_allreduce(d, &d->hook);
    else if (topo.hierarchical) {   /* float32 inside each machine, 16 bits only between machines */
        dt_ddp_hook_allreduce(d, &d->hook);
        d->red_flags |= opts.dp.wire == DT_BF16 ? DT_RED_CROSS_BF16 : DT_RED_CROSS_F16;
    } else dt_ddp_hook_compress(d, &d->hook, opts.dp.wire);
    dt_status s = dt_ddp_match_ignored(d);
    if (s == DT_OK) s = dt_model_refresh_grads(m);   /* parameters frozen since: no gradient memory */
    if (s == DT_OK) s = dt_ddp_build_buckets(d);
    /* last, so no local failure can follow the collective window creation
     * (moving into caller memory cannot fail) */
    if (s == DT_OK) s = dt_ddp_share_grads(d);
    /* same model on every rank: rank 0's parameters and buffers */
    if (s == DT_OK) s = dt_ddp_bcast_params(d, 0);
    if (s == DT_OK) s = dt_par_buffers_bcast(&d->bufs);   /* rank 0's, whatever the options */
    if (s == DT_OK && opts.dp.sync_bn) {   /* the exchange ZeRO's sync_bn uses too (common/sync_bn.c) */
        /* float32 statistics whatever the gradients' wire: a count and sums
         * of x and x^2 rounded to 16 bits lose the variance (ZeRO's too) */
        d->bn = (dt_par_bn){.pg = pg, .red_flags = d->red_flags & DT_RED_DETERMINISTIC};
        m->bn_sync = (dt_bn_sync){dt_par_bn_sync, &d->bn};
    }
    if (s != DT_OK) { dt_ddp_free(d); return s; }
    *out = d;
    return DT_OK;
}

/* Node-shared gradients (dist.h section 6), when the options allow:
 * collective, the same decision on every rank; sized for the trainable set
 * of now. The buckets are pointed into it. */
dt_status dt_ddp_share_grads(dt_ddp *d) {
    dt_model *m = d->model;
    const dt_ddp_opts *o = &d->opts;
    if (o->dp.shm == DT_DP_SHM_OFF || o->hook || o->dp.wire != DT_F32 ||
        (d->world < 2 && o->dp.shm != DT_DP_SHM_REQUIRE))
        return DT_OK;
    size_t n = dt_model_grad_numel(m);
    dt_status s = dt_pg_alloc_shared(d->pg, n ? n : 1, &d->shm_grads);   /* collective */
    if (s == DT_OK && d->shm_grads) s = dt_model_set_grad_buffer(m, d->shm_grads);
    for (int i = 0; i < d->n_buckets && m->grad_flat.data; i++)
        if (!d->buckets[i].staged) d->buckets[i].grad = m->grad_flat.data + dt_model_grad_offset(m, d->buckets[i].begin);
    if (s == DT_OK && !d->shm_grads && o->dp.shm == DT_DP_SHM_REQUIRE)
        s = DT_ERR(DT_EINVAL, "ddp: node-shared memory required but unavailable: %s", dt_pg_shared_unavailable(d->pg));
    return s;
}

/* The gradients back into private memory (the model keeps them; without
 * memory for them it has none) and the window freed: collective. */
void dt_ddp_unshare_grads(dt_ddp *d) {
    if (!d->shm_grads) return;
    if (d->model->grad_flat.data == d->shm_grads && dt_model_set_grad_buffer(d->model, NULL) != DT_OK)
        dt_model_drop_grads(d->model);
    dt_pg_free_shared(d->pg, d->shm_grads);
    d->shm_grads = NULL;
}

void dt_ddp_free(dt_ddp *d) {
    if (!d) return;
    dt_ddp_free_buckets(d);
    if (d->model && d->model->bn_sync.user == &d->bn) d->model->bn_sync = (dt_bn_sync){0};
    dt_ddp_unshare_grads(d);
    dt_par_used_free(&d->used);
    free(d->ready_order);
    free(d->ignored);
    free(d->ignored_has);
    dt_par_bn_free(&d->bn);
    dt_par_buffers_free(&d->bufs);
    free(d);
}

dt_status dt_ddp_before_forward(dt_ddp *d, dt_graph *g, int sync) {
    d->sync = sync;
    d->graph = g;
    dt_graph_set_final(g, sync);   /* grad-ready only on the synchronising micro-step */
    dt_graph_set_tick(g, d->world > 1 ? graph_tick : NULL, d);
    if (sync) DT_TRY(dt_ddp_static_begin(d));
    /* With join, collectives happen only on synchronising micro-steps so a
     * joined rank (which does not know K) can shadow them: see ddp/join.c. */
    if (d->opts.dp.join && !sync) return DT_OK;
    if (d->opts.dp.join) {
        int any;
        DT_TRY(dt_ddp_join_agree(d, 1, &any));
    }
    DT_TRY(dt_par_buffers_sync(&d->bufs, &d->opts.dp));
    return DT_OK;
}

dt_status dt_ddp_begin_external(dt_ddp *d) {
    d->sync = 1;
    d->graph = NULL;
    DT_TRY(dt_ddp_static_begin(d));
    return DT_OK;
}

dt_status dt_ddp_wait_buckets(dt_ddp *d) {
    dt_status s = DT_OK;
    for (int i = 0; i < d->n_buckets; i++) {   /* index order, like the launches */
        dt_ddp_bucket *b = &d->buckets[i];
        dt_status si = dt_work_wait(b->work);
        b->work = NULL;
        if (si == DT_OK && b->launched && d->hook.finish) si = d->hook.finish(d->hook.state, d->pg, b);
        if (si == DT_OK && b->launched && b->staged) dt_ddp_stage_out(d, b);
        if (s == DT_OK) s = si;
    }
    return s;
}

void dt_ddp_reset_buckets(dt_ddp *d) {
    for (int i = 0; i < d->n_buckets; i++) {
        dt_ddp_bucket *b = &d->buckets[i];
        if (b->work) dt_work_wait(b->work);   /* never leave a reduction in flight */
        b->pending = b->n_params;
        b->ready = b->launched = 0;
        b->work = NULL;
    }
    d->next_launch = 0;
    d->t_first_launch = 0;
}

dt_status dt_ddp_finish_backward(dt_ddp *d) {
    if (!d->sync) return DT_ERR(DT_ESTATE, "ddp: finish_backward on a no_sync micro-step");
    dt_model *m = d->model;
    dt_par_unused unused = {0};
    for (int i = 0; i < m->n_params; i++) {
        dt_param *p = m->params[i];
        int bi = d->param_bucket[i];
        if (bi < 0 || !d->graph || dt_graph_param_uses(d->graph, p) > 0) continue;
        dt_par_unused_add(&unused, p->name);
        dt_ddp_static_note(d, i);   /* a static graph's unused parameters: ready last */
        /* reduced as zeros (its gradient is whatever was accumulated, normally zero) */
        if (--d->buckets[bi].pending == 0) d->buckets[bi].ready = 1;
    }
    for (int i = 0; i < d->n_buckets; i++)
        if (d->buckets[i].pending != 0) {
            int pending = d->buckets[i].pending;
            dt_ddp_reset_buckets(d);
            return DT_ERR(DT_ESTATE, "ddp: bucket %d still waits for %d gradients after backward (was backward run?)",
                          i, pending);
        }
    double t_end_bw = dt_ddp_now_us();
    dt_status s = dt_ddp_launch_ready(d);
    /* after every bucket's launch, on every rank: which parameters some rank
     * used (without find_unused every rank used every bucketed one) */
    int agree_used = d->opts.dp.find_unused_params && d->world > 1;
    if (agree_used) {
        dt_status su = dt_par_used_start(&d->used, m, d->pg, 1);
        if (s == DT_OK) s = su;
    }
    double w0 = dt_ddp_now_us();
    dt_status sw = dt_ddp_wait_buckets(d);
    if (s == DT_OK) s = sw;
    if (agree_used) {
        dt_ddp_ignored_save_has_grad(d);
        dt_status su = dt_par_used_finish(&d->used, m);
        dt_ddp_ignored_restore_has_grad(d);
        if (s == DT_OK) s = su;
    }
    double w1 = dt_ddp_now_us();
    if (d->trace) dt_trace_event(d->trace, "wait reductions", "comm", 0, dt_trace_now_us(d->trace) - (w1 - w0), dt_trace_now_us(d->trace));
    d->stats.wait_us += w1 - w0;
    if (d->t_first_launch > 0 && d->t_first_launch < t_end_bw) d->stats.backward_us += t_end_bw - d->t_first_launch;
    d->stats.steps++;
    dt_ddp_reset_buckets(d);
    /* static_graph: the recorded order agreed and the buckets re-cut
     * (collective while recording: on every rank whatever s) */
    dt_status sg = dt_ddp_static_end(d, s == DT_OK);
    if (s == DT_OK) s = sg;
    if (s != DT_OK) return s;
    /* Forward passes updated each rank's running statistics with its own
     * data: end the step with one rank's on every rank (eval, checkpoints):
     * rank 0's, under join the highest active rank's. */
    DT_TRY(dt_par_buffers_sync(&d->bufs, &d->opts.dp));
    if (unused.n && !d->opts.dp.find_unused_params) return dt_par_unused_error(&unused, "ddp");
    return DT_OK;
}

int dt_ddp_num_buckets(const dt_ddp *d) { return d->n_buckets; }
int dt_ddp_uses_shared_memory(const dt_ddp *d) { return d && d->shm_grads != NULL; }
const dt_ddp_bucket *dt_ddp_bucket_at(const dt_ddp *d, int i) { return i >= 0 && i < d->n_buckets ? &d->buckets[i] : NULL; }
dt_ddp_stats dt_ddp_get_stats(const dt_ddp *d) { return d->stats; }
