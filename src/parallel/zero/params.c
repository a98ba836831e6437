/* Parameters around forward and backward, driven by module hooks.
 * Stages 1/2: a module waits for the all-gathers of its buckets (issued by the
 * previous step) just before its forward. Stage 3: a module's buckets are
 * gathered before its forward and again before its backward; the buckets of
 * the next `prefetch` modules (in the order the previous micro-step ran them)
 * are gathered ahead; every other gathered bucket is freed. Buckets holding a
 * parameter no module owns stay gathered from before_forward to the end of
 * backward. Gathers run on their own group in hook order, identical on every
 * rank.
 *
 * Recompute (stage 3): backward reaching an activation checkpoint replays its
 * modules (PRE_RECOMPUTE each), then runs their backward (PRE_BACKWARD each).
 * Both kinds are one backward-phase order (recompute entries tagged), so the
 * prefetch plan looks across them; the recomputed modules are pinned — kept
 * wanted — until backward moves on to a module outside them or a new
 * recompute begins, so a replayed block is gathered once for recompute and
 * backward. The forward order is not touched by recompute.
 *
 * Inside a pipeline stage (dt_zero3_pipeline_mode; pipe/dp.c) the F and B
 * actions of many micro-batches interleave on one rank, so the forward and
 * backward phases alternate within a step. There one order holds every hook
 * of the step (forward, recompute and backward entries in the order the
 * schedule's actions ran them), and the prefetch looks across actions: the
 * last module of an F prefetches the first ones of the B that follows. The
 * schedule is static, so the last step's order is this step's. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "zero_internal.h"

static dt_status gather(dt_zero *z, int i) {
    zbucket *b = &z->lay.b[i];
    if (b->full_param) return DT_OK;
    float *buf = dt_zero_pool_get(z, b->pub.numel);
    if (!buf) return DT_ERR(DT_ENOMEM, "zero: out of memory gathering a %zu-element parameter bucket", b->pub.numel);
    b->full_param = buf;
    z->pool.param_live += b->pub.numel;
    if (z->pool.param_live > z->pool.param_peak) z->pool.param_peak = z->pool.param_live;
    for (int k = 0; k < b->pub.n_params; k++) {
        dt_param *p = z->lay.order[b->pub.first_param + k];
        p->value.data = buf + (z->m->offsets[p->index] - b->pub.begin);
    }
    if (z->mods.in_backward) {
        z->stats.backward_gathers++;
        z->stats.backward_regathers += b->bwd_gathered;
        b->bwd_gathered = 1;
    }
    return dt_zero_wire_gather(z, i, buf, &b->ag);
}

static dt_status release(dt_zero *z, int i) {
    zbucket *b = &z->lay.b[i];
    if (!b->full_param) return DT_OK;
    dt_status s = dt_zero_wait_gather(z, i);   /* MPI may still be writing into it */
    for (int k = 0; k < b->pub.n_params; k++) z->lay.order[b->pub.first_param + k]->value.data = NULL;
    dt_zero_pool_put(z, b->full_param, b->pub.numel);
    b->full_param = NULL;
    z->pool.param_live -= b->pub.numel;
    return s;
}

dt_status dt_zero3_release_all(dt_zero *z) {
    dt_status s = DT_OK;
    for (int i = 0; i < z->lay.nb; i++) {
        dt_status si = release(z, i);
        if (s == DT_OK) s = si;
    }
    return s;
}

static dt_status push(zmod_seq *q, int v) {
    if (q->n == q->cap) {
        int c = q->cap ? 2 * q->cap : 64;
        int *a = realloc(q->seq, (size_t)c * sizeof *a);
        if (!a) return DT_ERR(DT_ENOMEM, "out of memory");
        q->seq = a;
        q->cap = c;
    }
    q->seq[q->n++] = v;
    return DT_OK;
}

static void want_module(dt_zero *z, int mod) {
    for (int k = 0; k < z->mods.nb[mod]; k++) z->mods.want[z->mods.buckets[mod][k]] = 1;
}

static void unpin_all(dt_zero *z) {
    if (z->mods.n_pinned) memset(z->mods.pinned, 0, (size_t)z->m->n_modules);
    z->mods.n_pinned = 0;
    z->mods.pin_open = 0;
}

/* Stage 3: module `mod` is about to run (forward, recompute or backward); q
 * holds this and the previous micro-step's order for that phase (a pipeline
 * stage: of the whole step), `entry` is this hook's entry in it (ENTRY). */
static dt_status stage3_enter(dt_zero *z, int mod, int entry, zmod_seq *q) {
    int pos = q->n;
    if (z->mods.recording) DT_TRY(push(q, entry));
    memset(z->mods.want, 0, (size_t)z->lay.nb);
    for (int i = 0; i < z->lay.nb; i++) z->mods.want[i] = z->lay.b[i].has_orphan;
    want_module(z, mod);
    for (int m = 0; z->mods.n_pinned && m < z->m->n_modules; m++)
        if (z->mods.pinned[m]) want_module(z, m);
    int match = z->mods.recording && pos < q->n_prev && q->prev[pos] == entry;   /* plan still follows the last run */
    for (int k = 1; match && k <= z->opts.prefetch && pos + k < q->n_prev; k++) want_module(z, q->prev[pos + k] / 4);
    for (int i = 0; i < z->lay.nb; i++)
        if (!z->mods.want[i]) DT_TRY(release(z, i));
    for (int k = 0; k < z->mods.nb[mod]; k++) DT_TRY(gather(z, z->mods.buckets[mod][k]));
    for (int i = 0; i < z->lay.nb; i++)   /* prefetches, in bucket order */
        if (z->mods.want[i]) DT_TRY(gather(z, i));
    for (int k = 0; k < z->mods.nb[mod]; k++) DT_TRY(dt_zero_wait_gather(z, z->mods.buckets[mod][k]));
    return DT_OK;
}

/* An order entry: the module and the kind of hook (0 forward, 1 recompute,
 * 2 backward); / 4 gives the module back. */
#define ENTRY(mod, tag) (4 * (mod) + (tag))

static dt_status module_hook(dt_module *mod, dt_module_hook_kind kind, void *user) {
    dt_zero *z = user;
    int i = mod->index;
    if (z->stage < 3) {
        if (kind != DT_HOOK_PRE_FORWARD) return DT_OK;
        for (int k = 0; k < z->mods.nb[i]; k++) DT_TRY(dt_zero_wait_gather(z, z->mods.buckets[i][k]));
        return DT_OK;
    }
    zmod_seq *bwd = z->mods.unified ? &z->mods.fwd : &z->mods.bwd;
    switch (kind) {
    case DT_HOOK_PRE_FORWARD:
        unpin_all(z);
        if (z->mods.unified) z->mods.in_backward = 0;   /* a pipeline's next F */
        return stage3_enter(z, i, ENTRY(i, 0), &z->mods.fwd);
    case DT_HOOK_PRE_RECOMPUTE:
        z->mods.in_backward = 1;
        if (!z->mods.pin_open) unpin_all(z);   /* backward ran since the last recompute: a new block */
        z->mods.pin_open = 1;
        z->mods.n_pinned += !z->mods.pinned[i];
        z->mods.pinned[i] = 1;
        return stage3_enter(z, i, ENTRY(i, 1), bwd);
    case DT_HOOK_PRE_BACKWARD:
        z->mods.in_backward = 1;
        if (!z->mods.pinned[i]) unpin_all(z);   /* backward moved on past the recomputed block */
        z->mods.pin_open = 0;
        return stage3_enter(z, i, ENTRY(i, 2), bwd);
    default:
        return DT_OK;
    }
}

dt_status dt_zero_modules_setup(dt_zero *z) {
    dt_model *m = z->m;
    int nm = m->n_modules;
    z->mods.buckets = calloc((size_t)(nm ? nm : 1), sizeof *z->mods.buckets);
    z->mods.nb = calloc((size_t)(nm ? nm : 1), sizeof *z->mods.nb);
    z->mods.want = calloc((size_t)(z->lay.nb ? z->lay.nb : 1), 1);
    z->mods.pinned = calloc((size_t)(nm ? nm : 1), 1);
    unsigned char *owned = calloc((size_t)(m->n_params ? m->n_params : 1), 1);
    if (!z->mods.buckets || !z->mods.nb || !z->mods.want || !z->mods.pinned || !owned) { free(owned); return DT_ERR(DT_ENOMEM, "out of memory"); }
    for (int i = 0; i < nm; i++) {
        dt_module *mod = m->modules[i];
        if (mod->hook) { free(owned); return DT_ERR(DT_ESTATE, "zero: module %s already has a hook", mod->name); }
        if (!(z->mods.buckets[i] = malloc((size_t)(mod->n_params ? mod->n_params : 1) * sizeof(int)))) {
            free(owned);
            return DT_ERR(DT_ENOMEM, "out of memory");
        }
        for (int k = 0; k < mod->n_params; k++) {
            int b = z->lay.param_bucket[mod->params[k]->index], seen = 0;
            owned[mod->params[k]->index] = 1;
            for (int j = 0; j < z->mods.nb[i]; j++) seen |= z->mods.buckets[i][j] == b;
            if (!seen) z->mods.buckets[i][z->mods.nb[i]++] = b;
        }
    }
    for (int i = 0; i < m->n_params; i++)
        if (!owned[i]) z->lay.b[z->lay.param_bucket[i]].has_orphan = 1;
    free(owned);
    for (int i = 0; i < nm; i++) {
        m->modules[i]->hook = module_hook;
        m->modules[i]->hook_user = z;
    }
    return DT_OK;
}

void dt_zero_modules_free(dt_zero *z) {
    dt_model *m = z->m;
    for (int i = 0; m && i < m->n_modules; i++)
        if (m->modules[i]->hook_user == z) {
            m->modules[i]->hook = NULL;
            m->modules[i]->hook_user = NULL;
        }
    for (int i = 0; z->mods.buckets && m && i < m->n_modules; i++) free(z->mods.buckets[i]);
    free(z->mods.buckets);
    free(z->mods.nb);
    free(z->mods.want);
    free(z->mods.pinned);
    free(z->mods.fwd.seq); free(z->mods.fwd.prev); free(z->mods.bwd.seq); free(z->mods.bwd.prev);
}

/* A new micro-step: last micro-step's module order becomes the prefetch plan. */
static dt_status rotate(zmod_seq *q) {
    if (q->n == 0) return DT_OK;
    if (q->cap_prev < q->n) {
        int *a = realloc(q->prev, (size_t)q->n * sizeof *a);
        if (!a) return DT_ERR(DT_ENOMEM, "out of memory");
        q->prev = a;
        q->cap_prev = q->n;
    }
    memcpy(q->prev, q->seq, (size_t)q->n * sizeof *q->seq);
    q->n_prev = q->n;
    q->n = 0;
    return DT_OK;
}

static dt_status gather_orphans(dt_zero *z) {
    for (int i = 0; i < z->lay.nb; i++)
        if (z->lay.b[i].has_orphan) DT_TRY(gather(z, i));
    for (int i = 0; i < z->lay.nb; i++)
        if (z->lay.b[i].has_orphan) DT_TRY(dt_zero_wait_gather(z, i));
    return DT_OK;
}

/* Stage 3 back to a whole model (dt_zero_free, and a change of the
 * trainable set, which re-shards from rank 0's copy): the parameters
 * gathered into a flat buffer; stages 1/2 with a 16-bit param_dtype: the
 * exact masters over the rounded copy; with a 16-bit wire: every owner's
 * exact shard over the others' rounded copies of it. Collective. */
void dt_zero_make_whole(dt_zero *z) {
    dt_model *m = z->m;
    if (z->stage < 3 && !z->lay.shard_param && z->wire.pdt != DT_F32 && m->param_flat.data)
        for (int i = 0; i < z->lay.nb; i++) dt_zero_gather_exact(z, i);
    if (z->stage < 3 && z->lay.shard_param && m->param_flat.data)
        for (int i = 0; i < z->lay.nb; i++)
            dt_allgather(z->ag_pg, z->lay.shard_param + z->lay.b[i].pub.shard_offset,
                         m->param_flat.data + z->lay.b[i].pub.begin, (int64_t)z->lay.b[i].pub.shard, DT_F32, NULL);
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

/* Stage 3 outside training steps (evaluation): nothing gathered but the
 * buckets no module owns, so a forward can run. */
dt_status dt_zero3_idle(dt_zero *z) {
    z->mods.recording = 0;
    z->mods.in_backward = 0;
    unpin_all(z);
    DT_TRY(dt_zero3_release_all(z));
    return gather_orphans(z);
}

void dt_zero3_pipeline_mode(dt_zero *z) { z->mods.unified = 1; }

dt_status dt_zero_params_before_forward(dt_zero *z) {
    if (z->stage < 3) {
        for (int i = 0; i < z->lay.nb; i++)
            if (z->lay.b[i].has_orphan) DT_TRY(dt_zero_wait_gather(z, i));
        return DT_OK;
    }
    DT_TRY(dt_zero3_release_all(z));
    DT_TRY(rotate(&z->mods.fwd));
    DT_TRY(rotate(&z->mods.bwd));
    z->mods.recording = 1;
    z->mods.in_backward = 0;
    unpin_all(z);
    for (int i = 0; i < z->lay.nb; i++) z->lay.b[i].bwd_gathered = 0;
    return gather_orphans(z);
}

/* The gathers are collectives issued from module hooks, so ranks that ran
 * different modules issued different gathers: of different sizes MPI fails,
 * of equal sizes parameters would be silently wrong. One 64-bit hash of the
 * forward and backward-phase (recompute included) orders per rank, compared
 * after backward. */
static uint64_t mix(uint64_t h, uint64_t v) {
    for (int k = 0; k < 8; k++) { h ^= (v >> (8 * k)) & 0xff; h *= 1099511628211ull; }   /* FNV-1a */
    return h;
}

dt_status dt_zero3_check_order(dt_zero *z) {
    uint64_t h = 1469598103934665603ull;
    const zmod_seq *dirs[2] = {&z->mods.fwd, &z->mods.bwd};
    for (int d = 0; d < 2; d++) {
        h = mix(h, (uint64_t)dirs[d]->n);
        for (int i = 0; i < dirs[d]->n; i++) h = mix(h, (uint64_t)dirs[d]->seq[i]);
    }
    uint64_t *all = malloc((size_t)z->world * sizeof *all);
    if (!all) return DT_ERR(DT_ENOMEM, "out of memory");
    dt_status s = dt_allgather(z->pg, &h, all, 2, DT_F32, NULL);   /* 8 bytes as 2 floats, unchanged */
    int bad = -1;
    for (int r = 1; s == DT_OK && r < z->world && bad < 0; r++)
        if (all[r] != all[0]) bad = r;
    free(all);
    if (s != DT_OK) return s;
    if (bad >= 0)
        return DT_ERR(DT_EINVAL, "zero stage 3: rank %d ran other modules (or another order) than rank 0 in this "
                      "step; every rank must run the same modules in the same order at stage 3 (stages 1/2 have "
                      "no such constraint)", bad);
    return DT_OK;
}
