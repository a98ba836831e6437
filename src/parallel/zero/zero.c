/* ZeRO: a sharded optimizer over padded buckets. This file: options, create
 * (layout, optimizer state, shard storage, hooks) and free, forward entry,
 * graph tick and introspection. The rest by concern: zero/layout.c (buckets,
 * buffer pool), zero/reduce.c (backward), zero/step.c (optimizer step),
 * zero/gather.c (stages 1/2 parameter all-gathers), zero/params.c (module
 * hooks, stage 3 gathers). */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "zero_internal.h"

void dt_zero_opts_default(dt_zero_opts *o) {
    memset(o, 0, sizeof *o);
    dt_dp_opts_default(&o->dp);
    o->dp.bucket_bytes = (size_t)4 << 20;   /* fewer, larger shard steps */
    o->stage = 1;
    o->overlap_step = DT_ZERO_OVERLAP_AFTER_BACKWARD;
    o->prefetch = 2;   /* bench_zero W1 stage 3, 1 Gbit/s: 1240 ms/step vs 1610 with 1 */
}

static dt_status validate(const dt_zero_opts *o) {
    DT_TRY(dt_dp_opts_validate(&o->dp, "zero"));
    if (o->stage < 1 || o->stage > 3)
        return DT_ERR(DT_EINVAL, "zero: stage must be 1, 2 or 3 (got %d; stage 0 is plain DDP)", o->stage);
    if (o->dp.shm == DT_DP_SHM_REQUIRE)
        return DT_ERR(DT_EINVAL, "zero: dp.shm REQUIRE is DDP's; ZeRO takes AUTO or OFF");
    if ((unsigned)o->overlap_step > DT_ZERO_OVERLAP_INTERLEAVED)
        return DT_ERR(DT_EINVAL, "zero: unknown step overlap mode %d", (int)o->overlap_step);
    if (!(o->clip >= 0.0f) || !isfinite(o->clip))
        return DT_ERR(DT_EINVAL, "zero: clip must be finite and >= 0 (got %g)", (double)o->clip);
    if (o->clip > 0.0f && o->overlap_step == DT_ZERO_OVERLAP_INTERLEAVED)
        return DT_ERR(DT_EINVAL, "zero: gradient clipping needs the global norm before any shard is stepped, "
                      "so it cannot be combined with the interleaved step overlap (use after-backward or off)");
    if (o->prefetch < 0) return DT_ERR(DT_EINVAL, "zero: prefetch must be >= 0 (got %d)", o->prefetch);
    if (o->node_params && o->dp.wire != DT_F32)
        return DT_ERR(DT_EINVAL, "zero: zero.node_params shares float32 parameters; a %s wire would round the "
                      "other shards each step (use the float32 wire)", dt_dtype_name(o->dp.wire));
    if (o->param_dtype != DT_F32 && o->param_dtype != DT_BF16 && o->param_dtype != DT_F16)
        return DT_ERR(DT_EINVAL, "zero: param_dtype must be F32, BF16 or F16 (got %s)", dt_dtype_name(o->param_dtype));
    if (o->node_params && o->param_dtype != DT_F32)
        return DT_ERR(DT_EINVAL, "zero: zero.node_params shares the float32 masters; a %s working copy of the parameters "
                      "needs private ones (use zero.param_dtype fp32 or leave zero.node_params off)",
                      dt_dtype_name(o->param_dtype));
    if (o->node_params && o->dp.join)
        return DT_ERR(DT_EINVAL, "zero: zero.node_params does not combine with dp.join");
    if (o->dp.join && o->stage == 3)
        return DT_ERR(DT_EINVAL, "zero: dp.join supports stages 1 and 2 only (stage 3 gathers parameters from "
                      "module hooks, which a rank without data does not run)");
    return DT_OK;
}

static dt_status init_optimizers(dt_zero *z) {
    dt_model *m = z->m;
    dt_optim_segment *segs = malloc((size_t)(m->n_params ? m->n_params : 1) * sizeof *segs);
    if (!segs) return DT_ERR(DT_ENOMEM, "out of memory");
    dt_status s = DT_OK;
    size_t zeros = 0;   /* longest frozen shard: what dt_zero_shard_state reads for one */
    for (int i = 0; i < z->lay.nb && s == DT_OK; i++) {
        dt_zero_bucket *b = &z->lay.b[i].pub;
        if (!b->trainable) {   /* frozen parameters only: no optimizer state */
            s = dt_optimizer_init(&z->lay.b[i].opt, &z->cfg, NULL, 0, b->own_begin, b->own_begin);
            if (b->shard > zeros) zeros = b->shard;
            continue;
        }
        for (int k = 0; k < b->n_params; k++) {
            dt_param *p = z->lay.order[b->first_param + k];
            /* stepped only while it has a gradient (agreed over ranks: zero/reduce.c) */
            segs[k] = (dt_optim_segment){m->offsets[p->index], (size_t)p->value.numel, p->weight_decay, &p->has_grad, &p->hp, 0};
        }
        s = dt_optimizer_init(&z->lay.b[i].opt, &z->cfg, segs, b->n_params, b->own_begin, b->own_begin + b->shard);
    }
    free(segs);
    z->zero_state_n = dt_optim_state_per_elem(&z->cfg) > 0 ? zeros : 0;   /* allocated when first read */
    return s;
}

/* Stages 2/3: gradients only as shards (+ full buckets while alive).
 * Stage 3: parameters only as shards (+ gathered buckets while in use).
 * A 16-bit param_dtype at stages 1/2: the owned shards' float32 masters in
 * shard_param too, and the whole flat copy rounded (what every gather will
 * bring: the same on every rank, the values being rank 0's). */
static dt_status shard_storage(dt_zero *z) {
    dt_model *m = z->m;
    if (z->stage == 1) {
        dt_zero_point_full_grads(z);
    } else {
        if (!(z->lay.shard_grad = dt_calloc((z->lay.gshard_total ? z->lay.gshard_total : 1) * sizeof(float))))
            return DT_ERR(DT_ENOMEM, "zero: out of memory for gradient shards");
        for (int i = 0; i < m->n_params; i++) m->params[i]->on_grad_alloc = dt_zero_grad_alloc;   /* grads dropped at create */
    }
    if (z->stage < 3 && z->opts.param_dtype == DT_F32) return DT_OK;
    if (!(z->lay.shard_param = dt_calloc((z->lay.shard_total ? z->lay.shard_total : 1) * sizeof(float))))
        return DT_ERR(DT_ENOMEM, "zero: out of memory for parameter shards");
    for (int i = 0; i < z->lay.nb; i++)
        memcpy(dt_zero_shard_param_ptr(z, i), m->param_flat.data + z->lay.b[i].pub.own_begin,
               z->lay.b[i].pub.shard * sizeof(float));
    if (z->stage < 3) {   /* (the masters are whole on every rank here: all refuse alike) */
        if (z->opts.param_dtype == DT_F16) DT_TRY(dt_model_check_f16_range(m, m->param_flat.data));
        dt_model_round_params(m, m->param_flat.data, m->param_flat.data, z->opts.param_dtype);
        return DT_OK;
    }
    for (int i = 0; i < m->n_params; i++) m->params[i]->value.data = NULL;
    dt_flat_free(&m->param_flat);
    return DT_OK;
}

/* Between graph nodes: progress both groups, keep the gather queue moving,
 * finish completed reductions. */
static void graph_tick(void *user) { dt_zero_tick(user); }

void dt_zero_tick(dt_zero *z) {
    dt_pg_tick(z->pg);
    dt_pg_tick(z->ag_pg);
    if (z->gq.next < 0 && z->rd.next_done >= z->rd.next_launch) return;   /* nothing queued, nothing reducing */
    double now = dt_par_now_us();
    if (z->gq.next >= 0 && now - z->gq.last_pump_us >= 500.0) {
        z->gq.last_pump_us = now;
        if (dt_zero_pump_gathers(z, INT_MAX) != DT_OK) dt_error_clear();   /* retried and reported by the wait needing it */
    }
    if (now - z->rd.last_check_us >= 500.0) dt_zero_advance_in_backward(z, now);
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
    dt_status s = dt_zero_init(z, m, pg, cfg, &opts);
    if (s != DT_OK) { dt_zero_free(z); return s; }
    *out = z;
    return DT_OK;
}

dt_status dt_zero_init(dt_zero *z, dt_model *m, dt_pg *pg, const dt_optim_cfg *cfg, const dt_zero_opts *o) {
    dt_zero_opts opts = *o;
    z->opts = opts;
    z->cfg = *cfg;
    z->m = m;
    z->pg = pg;
    z->bufs = (dt_par_buffers){.m = m, .pg = pg};
    z->rank = dt_pg_rank(pg);
    z->world = dt_pg_size(pg);
    z->stage = opts.stage;
    z->rd.op = DT_RED_AVG | (opts.dp.deterministic ? DT_RED_DETERMINISTIC : 0);
    dt_status s = dt_pg_split(pg, 0, z->rank, &z->ag_pg);
    z->gq.next = -1;
    /* stages 2/3 keep gradients per bucket: dropped before the re-layout, so
     * it allocates none (set-up peak); dt_zero_free gives them back */
    if (s == DT_OK && z->stage >= 2) dt_model_drop_grads(m);
    if (s == DT_OK) s = dt_zero_build_layout(z, opts.dp.first_bucket_bytes, opts.dp.bucket_bytes);
    if (s == DT_OK && !(z->gq.live = malloc((size_t)(z->lay.nb ? z->lay.nb : 1) * sizeof *z->gq.live)))
        s = DT_ERR(DT_ENOMEM, "out of memory");
    /* same model on every rank: rank 0's parameters and buffers */
    if (s == DT_OK) s = dt_broadcast(pg, m->param_flat.data, (int64_t)m->param_flat.numel, DT_F32, 0, NULL);
    if (s == DT_OK) s = dt_par_buffers_bcast(&z->bufs);   /* rank 0's, whatever the options */
    if (s == DT_OK && opts.node_params) s = dt_zero_wire_node_params(z);   /* may make stage 3 stage 2 */
    if (s == DT_OK) s = init_optimizers(z);
    if (s == DT_OK) s = dt_zero_modules_setup(z);
    if (s == DT_OK) s = shard_storage(z);
    if (s == DT_OK) s = dt_zero_wire_setup(z);
    if (s != DT_OK) return s;
    if (opts.dp.sync_bn) {
        z->bn = (dt_par_bn){.pg = pg, .red_flags = opts.dp.deterministic ? DT_RED_DETERMINISTIC : 0};
        m->bn_sync = (dt_bn_sync){dt_par_bn_sync, &z->bn};
    }
    for (int i = 0; i < m->n_params; i++)
        if (m->params[i]->requires_grad) {
            m->params[i]->on_grad_ready = dt_zero_on_grad_ready;
            m->params[i]->on_grad_ready_user = z;
        } else {
            m->params[i]->on_grad_ready_user = z;   /* on_grad_alloc's user */
        }
    dt_zero_reset_buckets(z);
    return DT_OK;
}

void dt_zero_free(dt_zero *z) {
    if (!z) return;
    dt_zero_fini(z);
    free(z);
}

void dt_zero_fini(dt_zero *z) {
    dt_model *m = z->m;
    dt_zero_drain(z);
    if (z->stage == 3) dt_zero3_release_all(z);
    if (z->lay.b && z->ag_pg) dt_zero_make_whole(z);
    dt_zero_wire_free(z);
    /* gradients back (zeros) whatever dropped them: stages 2/3 or a failed create */
    if (m && m->param_flat.data && dt_model_alloc_grads(m) != DT_OK) dt_error_clear();
    for (int i = 0; m && i < m->n_params; i++) {
        dt_param *p = m->params[i];
        if (p->on_grad_ready_user != z) continue;
        p->on_grad_ready = NULL;
        p->on_grad_alloc = NULL;
        p->on_grad_ready_user = NULL;
    }
    if (m && m->bn_sync.user == &z->bn) m->bn_sync = (dt_bn_sync){0};
    dt_par_bn_free(&z->bn);
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
    dt_par_buffers_free(&z->bufs);
    dt_par_used_free(&z->rd.used);
    dt_free(z->zero_state);
    if (z->ag_pg) dt_pg_free(z->ag_pg);
    memset(z, 0, sizeof *z);
}

void dt_zero_set_lr(dt_zero *z, float lr) { z->lr = lr; }

dt_status dt_zero_before_forward(dt_zero *z, dt_graph *g, int sync) {
    z->rd.sync = sync;
    z->rd.graph = g;
    dt_graph_set_final(g, sync);   /* grad-ready only on the synchronising micro-step */
    z->rd.tick_err = DT_OK;
    z->rd.unused_checked = z->rd.hold_steps = 0;
    dt_graph_set_tick(g, graph_tick, z);
    /* join: collectives on z->pg only on synchronising micro-steps, which a
     * joined rank (not knowing K) can shadow (zero/join.c) */
    int any;
    if (z->opts.dp.join && sync) DT_TRY(dt_zero_join_agree(z, 1, &any));
    if (!z->opts.dp.join || sync) DT_TRY(dt_par_buffers_sync(&z->bufs, &z->opts.dp));
    return dt_zero_params_before_forward(z);
}

dt_status dt_zero_begin_external(dt_zero *z) {
    z->rd.sync = 1;
    z->rd.graph = NULL;
    z->rd.tick_err = DT_OK;
    z->rd.unused_checked = 1;
    z->rd.hold_steps = 0;
    DT_TRY(dt_par_buffers_sync(&z->bufs, &z->opts.dp));
    return dt_zero_params_before_forward(z);
}

/* ---- introspection ---- */
int dt_zero_stage(const dt_zero *z) { return z->stage; }
int dt_zero_values_sharded(const dt_zero *z) { return z->lay.shard_param != NULL; }
int dt_zero_node_params(const dt_zero *z, const char **why) {
    if (why) *why = z->wire.mparams_why;
    return z->wire.mparams != NULL;
}
int dt_zero_num_buckets(const dt_zero *z) { return z->lay.nb; }
const dt_zero_bucket *dt_zero_bucket_at(const dt_zero *z, int i) { return i >= 0 && i < z->lay.nb ? &z->lay.b[i].pub : NULL; }
dt_param *const *dt_zero_param_order(const dt_zero *z) { return z->lay.order; }
float *dt_zero_shard_params(dt_zero *z, int i) { return i >= 0 && i < z->lay.nb ? dt_zero_shard_param_ptr(z, i) : NULL; }
float *dt_zero_shard_state(dt_zero *z, int i, int k) {
    if (!(i >= 0 && i < z->lay.nb && k >= 0 && k < 2)) return NULL;
    if (z->lay.b[i].pub.trainable) return z->lay.b[i].opt.state[k];
    /* frozen: zeros, read-only, allocated on demand (checkpoints) and released after a save */
    if (!z->zero_state && z->zero_state_n) z->zero_state = dt_calloc(z->zero_state_n * sizeof(float));
    return z->zero_state;
}
dt_status dt_zero_state_open(dt_zero *z) {
    for (int i = 0; i < z->lay.nb; i++) {
        dt_status s = dt_optimizer_state_open(&z->lay.b[i].opt);
        if (s != DT_OK) {
            while (i-- > 0) dt_optimizer_state_close(&z->lay.b[i].opt, 0);
            return s;
        }
    }
    return DT_OK;
}
void dt_zero_state_close(dt_zero *z, int store) {
    for (int i = 0; i < z->lay.nb; i++) dt_optimizer_state_close(&z->lay.b[i].opt, store);
}
int64_t dt_zero_optim_step(const dt_zero *z) { return z->lay.nb ? z->lay.b[0].opt.step : 0; }
void dt_zero_set_optim_step(dt_zero *z, int64_t step) {
    for (int i = 0; i < z->lay.nb; i++) z->lay.b[i].opt.step = step;
}
int dt_zero_optimizers(dt_zero *z, dt_optimizer **out) {
    for (int i = 0; i < z->lay.nb; i++) out[i] = &z->lay.b[i].opt;
    return z->lay.nb;
}
const dt_optim_cfg *dt_zero_optim_cfg(const dt_zero *z) { return &z->cfg; }
dt_pg *dt_zero_pg(const dt_zero *z) { return z->pg; }

dt_zero_memory dt_zero_get_memory(const dt_zero *z) {
    size_t f = sizeof(float), full = z->lay.total * f, shard = z->lay.shard_total * f, stateful = 0;
    for (int i = 0; i < z->lay.nb; i++) stateful += z->lay.b[i].pub.trainable ? z->lay.b[i].pub.shard : 0;
    dt_pg_topo t;
    dt_pg_topology(z->ag_pg, &t);
    size_t mine = z->wire.mparams ? full / (size_t)(t.local_size > 0 ? t.local_size : 1) : full;   /* its share */
    dt_zero_memory r = {   /* gradients: trainable parameters only (frozen ones have none) */
        .param_bytes = z->stage == 3 ? shard : z->lay.shard_param ? mine + shard : mine,   /* 16-bit copy: + masters */
        .grad_bytes = z->stage == 1 ? z->m->grad_flat.numel * f : z->lay.gshard_total * f,
        .optim_bytes = dt_optim_state_bytes(&z->cfg) * stateful + (z->zero_state ? z->zero_state_n * f : 0),
        .grad_window_peak = z->pool.grad_peak * f,
        .param_window_peak = z->pool.param_peak * f,
        .shm_bytes = z->wire.shm_bytes,
    };
    return r;
}
dt_zero_stats dt_zero_get_stats(const dt_zero *z) { return z->stats; }
