/* ZeRO backward: gradients reach their bucket (stages 2/3: a pooled full-size
 * buffer acquired on first write), a bucket whose gradients are all ready is
 * reduce-scattered (average) into the owned shard, and a finished reduction
 * releases the full buffer at once. Constraints: reduce-scatters launch and
 * finish in bucket order on z->pg, the same on every rank; a failure inside
 * backward is kept (rd.tick_err) and reported by finish_backward, so every
 * rank still reaches the same collectives. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "zero_internal.h"

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

dt_status dt_zero_grad_alloc(dt_param *p, void *user) {
    dt_zero *z = user;
    return acquire_grad(z, &z->lay.b[z->lay.param_bucket[p->index]]);
}

/* Reduce-scatter (average) every ready bucket whose predecessors have launched. */
static dt_status launch_ready(dt_zero *z) {
    while (z->rd.next_launch < z->lay.nb && z->lay.b[z->rd.next_launch].ready) {
        int i = z->rd.next_launch++;
        zbucket *b = &z->lay.b[i];
        if (!b->pub.trainable) continue;   /* frozen parameters only: no gradient, nothing to reduce */
        if (z->stage > 1) DT_TRY(acquire_grad(z, b));   /* a bucket nobody wrote: zeros */
        b->launched = 1;
        DT_TRY(dt_zero_wire_reduce(z, i, &b->rs));   /* into the owned gradient shard */
    }
    return DT_OK;
}

/* Reduce-scatter of bucket i done: keep only the shard. */
static dt_status finish_reduce(dt_zero *z, int i) {
    zbucket *b = &z->lay.b[i];
    dt_status s = dt_work_wait(b->rs);
    b->rs = NULL;
    dt_zero_wire_reduced(z, i);   /* 16-bit wire: the reduced chunk into the float32 shard */
    release_grad(z, b);
    return s;
}

/* During backward: in bucket order, finish every reduce-scatter that has
 * completed, so (stages 2/3) its full-size gradient buffer is released as
 * soon as possible in every overlap mode; INTERLEAVED also steps the shard. */
static dt_status advance_reduced(dt_zero *z) {
    while (z->rd.next_done < z->rd.next_launch) {
        int done = 1;
        if (z->lay.b[z->rd.next_done].launched) {   /* (a frozen bucket never is) */
            DT_TRY(dt_work_test(z->lay.b[z->rd.next_done].rs, &done));
            if (!done) break;
            DT_TRY(finish_reduce(z, z->rd.next_done));
        }
        if (dt_zero_interleaving(z)) {
            DT_TRY(dt_zero_step_bucket(z, z->rd.next_done, 1.0f));
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
    if (z->opts.dp.find_unused_params || !z->rd.graph) return;
    for (int i = 0; i < z->m->n_params; i++)
        if (z->m->params[i]->requires_grad && !dt_graph_param_uses(z->rd.graph, z->m->params[i])) { z->rd.hold_steps = 1; return; }
}

/* advance_reduced from inside backward: a failure is kept for
 * finish_backward, so every rank still reaches the same collectives. */
void dt_zero_advance_in_backward(dt_zero *z, double now) {
    if (!z->rd.sync || z->rd.next_done >= z->rd.next_launch || z->rd.tick_err) return;
    z->rd.last_check_us = now;
    if (advance_reduced(z) != DT_OK) {
        z->rd.tick_err = dt_error_code();
        snprintf(z->rd.tick_msg, sizeof z->rd.tick_msg, "%s", dt_error_message());
        dt_error_clear();   /* backward goes on; finish_backward reports it */
    }
}

/* find_unused_params: start the used-parameter sum once per step, before
 * this rank's first reduce-scatter (the forward is complete, and every rank
 * issues it first on z->pg). */
static dt_status start_used(dt_zero *z) {
    if (!z->opts.dp.find_unused_params || z->world < 2 || z->rd.used_issued) return DT_OK;
    z->rd.used_issued = 1;
    return dt_par_used_start(&z->rd.used, z->m, z->pg, 1);
}

dt_status dt_zero_on_grad_ready(dt_param *p, void *user) {
    dt_zero *z = user;
    if (!z->rd.sync) return DT_OK;
    check_unused_once(z);
    DT_TRY(start_used(z));
    zbucket *b = &z->lay.b[z->lay.param_bucket[p->index]];
    if (--b->pending == 0) {
        b->ready = 1;
        DT_TRY(launch_ready(z));
        dt_zero_advance_in_backward(z, dt_par_now_us());   /* earlier buckets may be done: release them now */
    }
    return DT_OK;
}

void dt_zero_reset_buckets(dt_zero *z) {
    /* the step is over (or failed): no parameter has a gradient (PyTorch: None) */
    for (int i = 0; i < z->m->n_params; i++) z->m->params[i]->has_grad = 0;
    z->rd.used_issued = 0;
    for (int i = 0; i < z->lay.nb; i++) {
        zbucket *b = &z->lay.b[i];
        b->pending = b->n_grad_params;
        b->ready = b->n_grad_params == 0;
        b->launched = b->stepped = 0;
    }
    z->rd.next_launch = z->rd.next_done = 0;
}

/* Wait every reduction and gather in flight; first error wins. */
dt_status dt_zero_drain(dt_zero *z) {
    dt_status s = DT_OK;
    for (int i = 0; i < z->lay.nb; i++) {
        if (z->lay.b[i].rs) {
            dt_status si = finish_reduce(z, i);
            if (s == DT_OK) s = si;
        }
        dt_status si = dt_zero_wait_gather(z, i);
        if (s == DT_OK) s = si;
    }
    dt_status su = dt_par_used_finish(&z->rd.used, NULL);
    if (s == DT_OK) s = su;
    return s;
}

dt_status dt_zero_finish_backward(dt_zero *z) {
    if (!z->rd.sync) return DT_ERR(DT_ESTATE, "zero: finish_backward on a no_sync micro-step");
    dt_model *m = z->m;
    dt_par_unused unused = {0};
    for (int i = 0; i < m->n_params; i++) {
        dt_param *p = m->params[i];
        if (!p->requires_grad || !z->rd.graph || dt_graph_param_uses(z->rd.graph, p) > 0) continue;
        dt_par_unused_add(&unused, p->name);
        zbucket *b = &z->lay.b[z->lay.param_bucket[i]];
        if (--b->pending == 0) b->ready = 1;   /* reduced with whatever it accumulated (zeros) */
    }
    dt_status s = z->rd.tick_err ? DT_ERR(z->rd.tick_err, "zero: finishing a reduction (or stepping a shard) during backward failed: %s", z->rd.tick_msg) : DT_OK;
    for (int i = 0; i < z->lay.nb && s == DT_OK; i++)
        if (z->lay.b[i].pending != 0)
            s = DT_ERR(DT_ESTATE, "zero: bucket %d still waits for %d gradients after backward (was backward run?)",
                       i, z->lay.b[i].pending);
    if (s == DT_OK) s = start_used(z);   /* no grad-ready fired on this rank: before the launches too */
    if (s == DT_OK) s = launch_ready(z);
    /* an unused parameter that is an error fails the step: reduce (the other
     * ranks may not fail) but step nothing */
    int fail_unused = unused.n && !z->opts.dp.find_unused_params;
    double w0 = dt_par_now_us();
    for (int i = z->rd.next_done; i < z->lay.nb; i++) {
        dt_status si = z->lay.b[i].launched ? finish_reduce(z, i) : DT_OK;
        if (si == DT_OK && s == DT_OK && dt_zero_interleaving(z) && !fail_unused) si = dt_zero_step_bucket(z, i, 1.0f);
        if (s == DT_OK) s = si;
    }
    z->rd.next_done = z->lay.nb;
    if (s == DT_OK) s = dt_par_used_finish(&z->rd.used, m);   /* has_grad: used on some rank */
    z->mods.recording = 0;
    z->stats.wait_us += dt_par_now_us() - w0;
    if (z->stage == 3) {   /* collective: on every rank, whatever s */
        dt_status so = dt_zero3_check_order(z);
        if (s == DT_OK) s = so;
    }
    if (z->stage == 3 && s == DT_OK) s = dt_zero3_release_all(z);
    if (s != DT_OK) { dt_zero_drain(z); dt_zero_reset_buckets(z); return s; }
    DT_TRY(dt_par_buffers_sync(&z->bufs, &z->opts.dp));
    if (fail_unused) {
        dt_zero_reset_buckets(z);
        return dt_par_unused_error(&unused, "zero");
    }
    z->rd.reduced = 1;
    return DT_OK;
}
