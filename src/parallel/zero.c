/* ZeRO core: sharded optimizer over padded buckets, gradient reduce-scatter
 * launched from grad-ready hooks, shard steps (optionally interleaved with
 * backward), parameter all-gathers. Stage 3's gathers live in zero_params.c. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "zero_internal.h"

void dt_zero_opts_default(dt_zero_opts *o) {
    memset(o, 0, sizeof *o);
    o->stage = 1;
    o->first_bucket_bytes = (size_t)1 << 20;
    o->bucket_bytes = (size_t)4 << 20;
    o->overlap_step = DT_ZERO_OVERLAP_AFTER_BACKWARD;
    o->broadcast_buffers = 1;
    o->prefetch = 2;   /* bench_zero W1 stage 3, 1 Gbit/s: 1240 ms/step vs 1610 with 1 */
}

static dt_status validate(const dt_zero_opts *o) {
    if (o->stage < 1 || o->stage > 3)
        return DT_ERR(DT_EINVAL, "zero: stage must be 1, 2 or 3 (got %d; stage 0 is plain DDP)", o->stage);
    if (o->first_bucket_bytes < 4 || o->bucket_bytes < 4)
        return DT_ERR(DT_EINVAL, "zero: bucket caps must be at least one float (got first %zu, normal %zu bytes)",
                      o->first_bucket_bytes, o->bucket_bytes);
    if ((unsigned)o->overlap_step > DT_ZERO_OVERLAP_INTERLEAVED)
        return DT_ERR(DT_EINVAL, "zero: unknown step overlap mode %d", (int)o->overlap_step);
    if (!(o->clip >= 0.0f) || !isfinite(o->clip))
        return DT_ERR(DT_EINVAL, "zero: clip must be finite and >= 0 (got %g)", (double)o->clip);
    if (o->clip > 0.0f && o->overlap_step == DT_ZERO_OVERLAP_INTERLEAVED)
        return DT_ERR(DT_EINVAL, "zero: gradient clipping needs the global norm before any shard is stepped, "
                      "so it cannot be combined with the interleaved step overlap (use after-backward or off)");
    if (o->prefetch < 0) return DT_ERR(DT_EINVAL, "zero: prefetch must be >= 0 (got %d)", o->prefetch);
    return DT_OK;
}

static float *shard_param(dt_zero *z, int i) {
    const dt_zero_bucket *b = &z->lay.b[i].pub;
    return z->stage == 3 ? z->lay.shard_param + b->shard_offset : z->m->param_flat.data + b->own_begin;
}
static float *shard_grad(dt_zero *z, int i) {
    const dt_zero_bucket *b = &z->lay.b[i].pub;
    return z->stage == 1 ? z->m->grad_flat.data + b->own_begin : z->lay.shard_grad + b->shard_offset;
}

/* Point every parameter of bucket b at base (NULL: detach). */
static void point_grads(dt_zero *z, zbucket *b, float *base) {
    for (int k = 0; k < b->pub.n_params; k++) {
        dt_param *p = z->lay.order[b->pub.first_param + k];
        p->grad.data = base ? base + (z->m->offsets[p->index] - b->pub.begin) : NULL;
    }
}

/* Stages 2/3: a zeroed full-size gradient buffer for bucket b. */
static dt_status acquire_grad(dt_zero *z, zbucket *b) {
    if (b->full_grad) return DT_OK;
    float *buf = dt_zero_pool_get(z, b->pub.numel);
    if (!buf) return DT_ERR(DT_ENOMEM, "zero: out of memory for a %zu-element gradient bucket", b->pub.numel);
    memset(buf, 0, b->pub.numel * sizeof(float));
    b->full_grad = buf;
    point_grads(z, b, buf);
    z->pool.grad_live += b->pub.numel;
    if (z->pool.grad_live > z->pool.grad_peak) z->pool.grad_peak = z->pool.grad_live;
    return DT_OK;
}

static void release_grad(dt_zero *z, zbucket *b) {
    if (z->stage == 1 || !b->full_grad) return;
    point_grads(z, b, NULL);
    dt_zero_pool_put(z, b->full_grad, b->pub.numel);
    b->full_grad = NULL;
    z->pool.grad_live -= b->pub.numel;
}

static dt_status grad_alloc(dt_param *p, void *user) {
    dt_zero *z = user;
    return acquire_grad(z, &z->lay.b[z->lay.param_bucket[p->index]]);
}

/* Reduce-scatter (average) every ready bucket whose predecessors have launched. */
static dt_status launch_ready(dt_zero *z) {
    while (z->rd.next_launch < z->lay.nb && z->lay.b[z->rd.next_launch].ready) {
        zbucket *b = &z->lay.b[z->rd.next_launch++];
        if (z->stage > 1) DT_TRY(acquire_grad(z, b));   /* a bucket nobody wrote: zeros */
        b->launched = 1;
        float *out = z->stage == 1 ? b->full_grad + (size_t)z->rank * b->pub.shard : z->lay.shard_grad + b->pub.shard_offset;
        DT_TRY(dt_reduce_scatter(z->pg, b->full_grad, out, (int64_t)b->pub.shard, DT_F32, z->rd.op, &b->rs));
    }
    return DT_OK;
}

/* Reduce-scatter of bucket i done: keep only the shard. */
static dt_status finish_reduce(dt_zero *z, int i) {
    zbucket *b = &z->lay.b[i];
    dt_status s = dt_work_wait(b->rs);
    b->rs = NULL;
    release_grad(z, b);
    return s;
}

/* AFTER_BACKWARD: the updated parameters' all-gathers are not issued all at
 * once: sharing the link, every one of them (the first layers' included)
 * would finish near the end. They are queued in the order the next forward
 * needs them (last bucket first) and at most GATHER_WINDOW run at a time;
 * forward ticks and waits keep the queue moving. Same order on every rank. */
#define GATHER_WINDOW 2

/* On failure the bucket stays queued: the wait that needs it retries and
 * reports the error. */
static dt_status issue_gather(dt_zero *z, int i) {
    zbucket *b = &z->lay.b[i];
    DT_TRY(dt_allgather(z->ag_pg, shard_param(z, i), z->m->param_flat.data + b->pub.begin, (int64_t)b->pub.shard,
                        DT_F32, &b->ag));
    b->ag_queued = 0;
    return DT_OK;
}

static void forget_live(dt_zero *z, int i) {
    for (int k = 0; k < z->gq.n_live;)
        if (z->gq.live[k] == i) z->gq.live[k] = z->gq.live[--z->gq.n_live];
        else k++;
}

/* Issue queued gathers while fewer than GATHER_WINDOW are in flight, and
 * unconditionally every queued bucket with index >= force (INT_MAX: none). */
static dt_status pump_gathers(dt_zero *z, int force) {
    if (z->gq.next < 0) return DT_OK;
    for (int k = 0; k < z->gq.n_live;) {
        int done = 1;
        if (z->lay.b[z->gq.live[k]].ag) DT_TRY(dt_work_test(z->lay.b[z->gq.live[k]].ag, &done));
        if (done) z->gq.live[k] = z->gq.live[--z->gq.n_live];
        else k++;
    }
    while (z->gq.next >= 0 && (z->gq.next >= force || z->gq.n_live < GATHER_WINDOW)) {
        int i = z->gq.next;
        DT_TRY(issue_gather(z, i));
        z->gq.live[z->gq.n_live++] = i;
        if (!z->gq.queueing) z->stats.deferred_gathers++;
        do z->gq.next--; while (z->gq.next >= 0 && !z->lay.b[z->gq.next].ag_queued);
    }
    return DT_OK;
}

/* Every parameter all-gather issued (queued ones first) and finished. */
static dt_status wait_all_gathers(dt_zero *z) {
    dt_status s = DT_OK;
    for (int i = 0; i < z->lay.nb; i++) {
        dt_status si = dt_zero_wait_gather(z, i);
        if (s == DT_OK) s = si;
    }
    return s;
}

static dt_status step_bucket(dt_zero *z, int i, float scale) {
    zbucket *b = &z->lay.b[i];
    float *ps = shard_param(z, i);
    /* a gather of the last step no forward waited for (a skipped module)
     * still reads the shard: finish it first */
    if (b->ag || b->ag_queued) DT_TRY(dt_zero_wait_gather(z, i));
    double t0 = dt_trace_now_us(z->trace);
    dt_optimizer_step_owned(&b->opt, z->lr, ps, shard_grad(z, i), scale);
    if (z->trace) {
        char name[48];
        snprintf(name, sizeof name, "step shard %d", i);
        dt_trace_event(z->trace, name, "compute", 0, t0, dt_trace_now_us(z->trace));
    }
    b->stepped = 1;
    if (z->stage == 1) memset(b->full_grad, 0, b->pub.numel * sizeof(float));   /* next accumulation */
    if (z->stage < 3 && z->gq.queueing) {
        b->ag_queued = 1;
        if (i > z->gq.next) z->gq.next = i;
    } else if (z->stage < 3) {
        DT_TRY(issue_gather(z, i));
    }
    return DT_OK;
}

static int interleaving(const dt_zero *z) {
    return z->rd.sync && z->opts.overlap_step == DT_ZERO_OVERLAP_INTERLEAVED && !z->rd.hold_steps;
}

/* During backward: in bucket order, finish every reduce-scatter that has
 * completed, so (stages 2/3) its full-size gradient buffer is released as
 * soon as possible in every overlap mode; INTERLEAVED also steps the shard. */
static dt_status advance_reduced(dt_zero *z) {
    while (z->rd.next_done < z->rd.next_launch) {
        int done = 0;
        DT_TRY(dt_work_test(z->lay.b[z->rd.next_done].rs, &done));
        if (!done) break;
        DT_TRY(finish_reduce(z, z->rd.next_done));
        if (interleaving(z)) {
            DT_TRY(step_bucket(z, z->rd.next_done, 1.0f));
            z->stats.interleaved_steps++;
        }
        z->rd.next_done++;
    }
    return DT_OK;
}

/* At the first gradient of a synchronising backward the forward is complete,
 * so the parameters it did not use are known. If that will fail the step
 * (find_unused_params off), no shard may be stepped during backward. */
static void check_unused_once(dt_zero *z) {
    if (z->rd.unused_checked) return;
    z->rd.unused_checked = 1;
    if (z->opts.find_unused_params) return;
    for (int i = 0; i < z->m->n_params; i++)
        if (z->m->params[i]->requires_grad && !z->m->params[i]->used) { z->rd.hold_steps = 1; return; }
}

/* advance_reduced from inside backward: a failure is kept for
 * finish_backward, so every rank still reaches the same collectives. */
static void advance_in_backward(dt_zero *z, double now) {
    if (!z->rd.sync || z->rd.next_done >= z->rd.next_launch || z->rd.tick_err) return;
    z->rd.last_check_us = now;
    if (advance_reduced(z) != DT_OK) {
        z->rd.tick_err = dt_error_code();
        snprintf(z->rd.tick_msg, sizeof z->rd.tick_msg, "%s", dt_error_message());
        dt_error_clear();   /* backward goes on; finish_backward reports it */
    }
}

static void graph_tick(void *user) {
    dt_zero *z = user;
    dt_pg_tick(z->pg);
    dt_pg_tick(z->ag_pg);
    if (z->gq.next < 0 && z->rd.next_done >= z->rd.next_launch) return;   /* nothing queued, nothing reducing */
    double now = dt_par_now_us();
    if (z->gq.next >= 0 && now - z->gq.last_pump_us >= 500.0) {
        z->gq.last_pump_us = now;
        if (pump_gathers(z, INT_MAX) != DT_OK) dt_error_clear();   /* retried and reported by the wait needing it */
    }
    if (now - z->rd.last_check_us >= 500.0) advance_in_backward(z, now);
}

static dt_status on_grad_ready(dt_param *p, void *user) {
    dt_zero *z = user;
    if (!z->rd.sync) return DT_OK;
    check_unused_once(z);
    zbucket *b = &z->lay.b[z->lay.param_bucket[p->index]];
    if (--b->pending == 0) {
        b->ready = 1;
        DT_TRY(launch_ready(z));
        advance_in_backward(z, dt_par_now_us());   /* earlier buckets may be done: release them now */
    }
    return DT_OK;
}

static dt_status init_optimizers(dt_zero *z) {
    dt_model *m = z->m;
    dt_optim_segment *segs = malloc((size_t)(m->n_params ? m->n_params : 1) * sizeof *segs);
    if (!segs) return DT_ERR(DT_ENOMEM, "out of memory");
    dt_status s = DT_OK;
    for (int i = 0; i < z->lay.nb && s == DT_OK; i++) {
        dt_zero_bucket *b = &z->lay.b[i].pub;
        for (int k = 0; k < b->n_params; k++) {
            dt_param *p = z->lay.order[b->first_param + k];
            segs[k] = (dt_optim_segment){m->offsets[p->index], (size_t)p->value.numel, p->weight_decay};
        }
        s = dt_optimizer_init(&z->lay.b[i].opt, &z->cfg, segs, b->n_params, b->own_begin, b->own_begin + b->shard);
    }
    free(segs);
    return s;
}

/* Stages 2/3: gradients only as shards (+ full buckets while alive).
 * Stage 3: parameters only as shards (+ gathered buckets while in use). */
static dt_status shard_storage(dt_zero *z) {
    dt_model *m = z->m;
    if (z->stage == 1) {
        for (int i = 0; i < z->lay.nb; i++) z->lay.b[i].full_grad = m->grad_flat.data + z->lay.b[i].pub.begin;
        return DT_OK;
    }
    if (!(z->lay.shard_grad = dt_calloc((z->lay.shard_total ? z->lay.shard_total : 1) * sizeof(float))))
        return DT_ERR(DT_ENOMEM, "zero: out of memory for gradient shards");
    for (int i = 0; i < m->n_params; i++) m->params[i]->on_grad_alloc = grad_alloc;   /* grads dropped at create */
    if (z->stage < 3) return DT_OK;
    if (!(z->lay.shard_param = dt_calloc((z->lay.shard_total ? z->lay.shard_total : 1) * sizeof(float))))
        return DT_ERR(DT_ENOMEM, "zero: out of memory for parameter shards");
    for (int i = 0; i < z->lay.nb; i++)
        memcpy(shard_param(z, i), m->param_flat.data + z->lay.b[i].pub.own_begin, z->lay.b[i].pub.shard * sizeof(float));
    for (int i = 0; i < m->n_params; i++) m->params[i]->value.data = NULL;
    dt_flat_free(&m->param_flat);
    return DT_OK;
}

static void reset_buckets(dt_zero *z) {
    for (int i = 0; i < z->lay.nb; i++) {
        zbucket *b = &z->lay.b[i];
        b->pending = b->n_grad_params;
        b->ready = b->n_grad_params == 0;
        b->launched = b->stepped = 0;
    }
    z->rd.next_launch = z->rd.next_done = 0;
}

dt_status dt_zero_create(dt_model *m, dt_pg *pg, const dt_optim_cfg *cfg, const dt_zero_opts *o, dt_zero **out) {
    *out = NULL;
    dt_zero_opts opts;
    if (o) opts = *o;
    else dt_zero_opts_default(&opts);
    DT_TRY(validate(&opts));
    DT_TRY(dt_optim_cfg_validate(cfg));
    dt_zero *z = calloc(1, sizeof *z);
    if (!z) return DT_ERR(DT_ENOMEM, "out of memory");
    z->opts = opts;
    z->cfg = *cfg;
    z->m = m;
    z->pg = pg;
    z->rank = dt_pg_rank(pg);
    z->world = dt_pg_size(pg);
    z->stage = opts.stage;
    z->rd.op = DT_RED_AVG | (opts.deterministic ? DT_RED_DETERMINISTIC : 0);
    dt_status s = dt_pg_split(pg, 0, z->rank, &z->ag_pg);
    z->gq.next = -1;
    /* stages 2/3 keep gradients per bucket: dropped before the re-layout, so
     * it allocates none (set-up peak); dt_zero_free gives them back */
    if (s == DT_OK && z->stage >= 2) dt_model_drop_grads(m);
    if (s == DT_OK) s = dt_zero_build_layout(z, opts.first_bucket_bytes, opts.bucket_bytes);
    if (s == DT_OK && !(z->gq.live = malloc((size_t)(z->lay.nb ? z->lay.nb : 1) * sizeof *z->gq.live)))
        s = DT_ERR(DT_ENOMEM, "out of memory");
    /* same model on every rank: rank 0's parameters and buffers */
    if (s == DT_OK) s = dt_broadcast(pg, m->param_flat.data, (int64_t)m->param_flat.numel, DT_F32, 0, NULL);
    if (s == DT_OK) s = dt_par_bcast_buffers(m, pg, &z->buf_scratch, 0);
    if (s == DT_OK) s = init_optimizers(z);
    if (s == DT_OK) s = dt_zero_modules_setup(z);
    if (s == DT_OK) s = shard_storage(z);
    if (s != DT_OK) { dt_zero_free(z); return s; }
    for (int i = 0; i < m->n_params; i++)
        if (m->params[i]->requires_grad) {
            m->params[i]->on_grad_ready = on_grad_ready;
            m->params[i]->on_grad_ready_user = z;
        } else {
            m->params[i]->on_grad_ready_user = z;   /* on_grad_alloc's user */
        }
    reset_buckets(z);
    *out = z;
    return DT_OK;
}

/* Wait every reduction and gather in flight; first error wins. */
static dt_status drain(dt_zero *z) {
    dt_status s = DT_OK;
    for (int i = 0; i < z->lay.nb; i++) {
        if (z->lay.b[i].rs) {
            dt_status si = finish_reduce(z, i);
            if (s == DT_OK) s = si;
        }
        dt_status si = dt_zero_wait_gather(z, i);
        if (s == DT_OK) s = si;
    }
    return s;
}

/* Stages 2/3 back to a whole model: flat gradient (zeros), stage 3 also the
 * parameters gathered into a flat buffer. Collective. */
static void make_whole(dt_zero *z) {
    dt_model *m = z->m;
    if (z->stage == 3 && !m->param_flat.data && dt_flat_alloc(&m->param_flat, z->lay.total) == DT_OK) {
        for (int i = 0; i < z->lay.nb; i++) {
            zbucket *b = &z->lay.b[i];
            dt_allgather(z->ag_pg, z->lay.shard_param + b->pub.shard_offset, m->param_flat.data + b->pub.begin,
                         (int64_t)b->pub.shard, DT_F32, NULL);
            for (int k = 0; k < b->pub.n_params; k++) {
                dt_param *p = z->lay.order[b->pub.first_param + k];
                p->value.data = m->param_flat.data + m->offsets[p->index];
            }
        }
    }
}

void dt_zero_free(dt_zero *z) {
    if (!z) return;
    dt_model *m = z->m;
    drain(z);
    if (z->stage == 3) dt_zero3_release_all(z);
    if (z->lay.b && z->ag_pg) make_whole(z);
    /* gradients back (zeros) whatever dropped them: stages 2/3 or a failed create */
    if (m && m->param_flat.data && dt_model_alloc_grads(m) != DT_OK) dt_error_clear();
    for (int i = 0; m && i < m->n_params; i++) {
        dt_param *p = m->params[i];
        if (p->on_grad_ready_user != z) continue;
        p->on_grad_ready = NULL;
        p->on_grad_alloc = NULL;
        p->on_grad_ready_user = NULL;
    }
    dt_zero_modules_free(z);
    for (int i = 0; z->lay.b && i < z->lay.nb; i++) {
        if (z->stage > 1) dt_free(z->lay.b[i].full_grad);
        dt_optimizer_free(&z->lay.b[i].opt);
    }
    for (int i = 0; i < z->pool.n; i++) dt_free(z->pool.free_bufs[i].buf);
    free(z->pool.free_bufs);
    free(z->lay.b);
    free(z->lay.order);
    free(z->lay.param_bucket);
    free(z->gq.live);
    dt_free(z->lay.shard_param);
    dt_free(z->lay.shard_grad);
    free(z->buf_scratch);
    if (z->ag_pg) dt_pg_free(z->ag_pg);
    free(z);
}

void dt_zero_set_lr(dt_zero *z, float lr) { z->lr = lr; }

static int bcast_buffers_enabled(const dt_zero *z) {
    return z->opts.broadcast_buffers && z->m->n_buffers > 0 && z->world > 1;
}

dt_status dt_zero_before_forward(dt_zero *z, dt_graph *g, int sync) {
    z->rd.sync = sync;
    z->rd.tick_err = DT_OK;
    z->rd.unused_checked = z->rd.hold_steps = 0;
    dt_graph_set_tick(g, graph_tick, z);
    if (bcast_buffers_enabled(z)) DT_TRY(dt_par_bcast_buffers(z->m, z->pg, &z->buf_scratch, 0));
    return dt_zero_params_before_forward(z);
}

dt_status dt_zero_finish_backward(dt_zero *z) {
    if (!z->rd.sync) return DT_ERR(DT_ESTATE, "zero: finish_backward on a no_sync micro-step");
    dt_model *m = z->m;
    char unused[512] = "";
    int n_unused = 0;
    for (int i = 0; i < m->n_params; i++) {
        dt_param *p = m->params[i];
        if (!p->requires_grad || p->used) continue;
        if (n_unused++ < 4) {
            size_t l = strlen(unused);
            snprintf(unused + l, sizeof unused - l, "%s'%s'", l ? ", " : "", p->name);
        }
        zbucket *b = &z->lay.b[z->lay.param_bucket[i]];
        if (--b->pending == 0) b->ready = 1;   /* reduced with whatever it accumulated (zeros) */
    }
    dt_status s = z->rd.tick_err ? DT_ERR(z->rd.tick_err, "zero: finishing a reduction (or stepping a shard) during backward failed: %s", z->rd.tick_msg) : DT_OK;
    for (int i = 0; i < z->lay.nb && s == DT_OK; i++)
        if (z->lay.b[i].pending != 0)
            s = DT_ERR(DT_ESTATE, "zero: bucket %d still waits for %d gradients after backward (was backward run?)",
                       i, z->lay.b[i].pending);
    if (s == DT_OK) s = launch_ready(z);
    /* an unused parameter that is an error fails the step: reduce (the other
     * ranks may not fail) but step nothing */
    int fail_unused = n_unused && !z->opts.find_unused_params;
    double w0 = dt_par_now_us();
    for (int i = z->rd.next_done; i < z->lay.nb; i++) {
        dt_status si = z->lay.b[i].launched ? finish_reduce(z, i) : DT_OK;
        if (si == DT_OK && s == DT_OK && interleaving(z) && !fail_unused) si = step_bucket(z, i, 1.0f);
        if (s == DT_OK) s = si;
    }
    z->rd.next_done = z->lay.nb;
    z->mods.recording = 0;
    z->stats.wait_us += dt_par_now_us() - w0;
    if (z->stage == 3) {   /* collective: on every rank, whatever s */
        dt_status so = dt_zero3_check_order(z);
        if (s == DT_OK) s = so;
    }
    if (z->stage == 3 && s == DT_OK) s = dt_zero3_release_all(z);
    if (s != DT_OK) { drain(z); reset_buckets(z); return s; }
    if (bcast_buffers_enabled(z)) DT_TRY(dt_par_bcast_buffers(m, z->pg, &z->buf_scratch, 0));
    if (fail_unused) {
        reset_buckets(z);
        return DT_ERR(DT_EINVAL, "zero: parameter%s %s%s received no gradient in this step; if that is expected "
                      "enable find_unused_params (--find-unused)", n_unused > 1 ? "s" : "", unused,
                      n_unused > 4 ? " and more" : "");
    }
    z->rd.reduced = 1;
    return DT_OK;
}

/* Global gradient norm over the owned shards: per-rank partial sums in
 * double exchanged bit-exactly and added in rank order (same on every rank). */
static dt_status global_norm(dt_zero *z, double *norm) {
    double local = 0;
    for (int i = 0; i < z->lay.nb; i++) local += dt_sumsq(shard_grad(z, i), z->lay.b[i].pub.shard);
    double *all = malloc((size_t)z->world * sizeof *all);
    if (!all) return DT_ERR(DT_ENOMEM, "out of memory");
    dt_status s = dt_allgather(z->pg, &local, all, 2, DT_F32, NULL);   /* 8 bytes as 2 floats, unchanged */
    double sum = 0;
    for (int r = 0; r < z->world; r++) sum += all[r];
    free(all);
    *norm = sqrt(sum);
    return s;
}

dt_status dt_zero_step(dt_zero *z, double *grad_norm) {
    if (grad_norm) *grad_norm = -1;
    if (!z->rd.reduced) return DT_ERR(DT_ESTATE, "zero: step before finish_backward reduced the gradients");
    z->rd.reduced = 0;
    double t0 = dt_par_now_us();
    float scale = 1.0f;
    /* AFTER_BACKWARD: every gather queued by the last step is issued (in
     * queue order) and done before this step queues any, so the issue order
     * on ag_pg never depends on timing. Normally the forward waited them all. */
    dt_status s = z->opts.overlap_step == DT_ZERO_OVERLAP_AFTER_BACKWARD ? wait_all_gathers(z) : DT_OK;
    if (z->opts.clip > 0) {   /* collective: on every rank, whatever s */
        double norm = 0;
        dt_status sn = global_norm(z, &norm);
        if (s == DT_OK) s = sn;
        scale = dt_clip_scale(norm, z->opts.clip);
        if (grad_norm) *grad_norm = norm;
    }
    /* last bucket first: its all-gather (the model's first layers, in
     * reverse-registration layout) is the one the next forward needs first */
    z->gq.queueing = z->opts.overlap_step == DT_ZERO_OVERLAP_AFTER_BACKWARD;
    for (int i = z->lay.nb - 1; i >= 0 && s == DT_OK; i--)
        if (!z->lay.b[i].stepped) s = step_bucket(z, i, scale);
    if (s == DT_OK) s = pump_gathers(z, INT_MAX);
    z->gq.queueing = 0;
    for (int i = 0; i < z->lay.nb; i++) dt_optimizer_finish_step(&z->lay.b[i].opt);
    z->stats.steps++;
    reset_buckets(z);
    if (s == DT_OK && z->opts.overlap_step == DT_ZERO_OVERLAP_OFF) s = dt_zero_sync_params(z);
    z->stats.step_us += dt_par_now_us() - t0;
    return s;
}

dt_status dt_zero_wait_gather(dt_zero *z, int i) {
    zbucket *b = &z->lay.b[i];
    double t0 = dt_par_now_us();
    if (b->ag_queued) DT_TRY(pump_gathers(z, i));
    if (b->ag_queued) return DT_ERR(DT_ESTATE, "zero: parameter all-gather of bucket %d was not issued", i);
    if (!b->ag) return DT_OK;
    dt_status s = dt_work_wait(b->ag);
    b->ag = NULL;
    forget_live(z, i);
    z->stats.gather_wait_us += dt_par_now_us() - t0;
    if (s == DT_OK) s = pump_gathers(z, INT_MAX);   /* keep the queue moving */
    return s;
}

dt_status dt_zero_sync_params(dt_zero *z) {
    dt_status s = wait_all_gathers(z);
    if (z->stage == 3 && s == DT_OK) s = dt_zero3_idle(z);
    return s;
}

dt_status dt_zero_gather_params(dt_zero *z) {
    DT_TRY(dt_zero_sync_params(z));
    if (z->stage == 3) return DT_OK;
    for (int i = 0; i < z->lay.nb; i++) {
        zbucket *b = &z->lay.b[i];
        DT_TRY(dt_allgather(z->ag_pg, shard_param(z, i), z->m->param_flat.data + b->pub.begin,
                            (int64_t)b->pub.shard, DT_F32, NULL));
    }
    return DT_OK;
}

/* ---- introspection ---- */
int dt_zero_stage(const dt_zero *z) { return z->stage; }
int dt_zero_num_buckets(const dt_zero *z) { return z->lay.nb; }
const dt_zero_bucket *dt_zero_bucket_at(const dt_zero *z, int i) { return i >= 0 && i < z->lay.nb ? &z->lay.b[i].pub : NULL; }
dt_param *const *dt_zero_param_order(const dt_zero *z) { return z->lay.order; }
float *dt_zero_shard_params(dt_zero *z, int i) { return i >= 0 && i < z->lay.nb ? shard_param(z, i) : NULL; }
float *dt_zero_shard_state(dt_zero *z, int i, int k) {
    return i >= 0 && i < z->lay.nb && k >= 0 && k < 2 ? z->lay.b[i].opt.state[k] : NULL;
}
int64_t dt_zero_optim_step(const dt_zero *z) { return z->lay.nb ? z->lay.b[0].opt.step : 0; }
void dt_zero_set_optim_step(dt_zero *z, int64_t step) {
    for (int i = 0; i < z->lay.nb; i++) z->lay.b[i].opt.step = step;
}
const dt_optim_cfg *dt_zero_optim_cfg(const dt_zero *z) { return &z->cfg; }
dt_pg *dt_zero_pg(const dt_zero *z) { return z->pg; }

dt_zero_memory dt_zero_get_memory(const dt_zero *z) {
    size_t f = sizeof(float), full = z->lay.total * f, shard = z->lay.shard_total * f;
    dt_zero_memory r = {
        .param_bytes = z->stage == 3 ? shard : full,
        .grad_bytes = z->stage == 1 ? full : shard,
        .optim_bytes = (size_t)dt_optim_state_per_elem(&z->cfg) * shard,
        .grad_window_peak = z->pool.grad_peak * f,
        .param_window_peak = z->pool.param_peak * f,
    };
    return r;
}
dt_zero_stats dt_zero_get_stats(const dt_zero *z) { return z->stats; }
