/* ZeRO stages 1/2 parameter all-gathers, on their own group z->ag_pg, after
 * each shard step: issued at once, or (AFTER_BACKWARD) queued and issued a
 * few at a time in the order the next forward needs them. Every rank issues
 * them in the same order; dt_zero_step drains the queue before refilling it,
 * so that order never depends on timing. dt_zero_wait_gather serves stage
 * 3 too; stage 3's own gathers live in zero/params.c. */
#include <limits.h>
#include <stdlib.h>
#include "zero_internal.h"

/* AFTER_BACKWARD: the updated parameters' all-gathers are not issued all at
 * once: sharing the link, every one of them (the first layers' included)
 * would finish near the end. They are queued in the order the next forward
 * needs them (last bucket first) and at most GATHER_WINDOW run at a time;
 * forward ticks and waits keep the queue moving. Same order on every rank. */
#define GATHER_WINDOW 2

/* Bucket i's owned shard into its place in the flat parameters of every
 * rank, exactly (float32: after a checkpoint load without a 16-bit wire). */
static dt_status allgather_bucket(dt_zero *z, int i, dt_work **w) {
    const dt_zero_bucket *b = &z->lay.b[i].pub;
    if (z->wire.mparams)   /* the own shard is in place in the machine's copy */
        return dt_allgather_machine(z->ag_pg, z->m->param_flat.data + b->begin, (int64_t)b->shard, DT_F32, w);
    return dt_allgather(z->ag_pg, dt_zero_shard_param_ptr(z, i), z->m->param_flat.data + b->begin, (int64_t)b->shard,
                        DT_F32, w);
}

dt_status dt_zero_gather_exact(dt_zero *z, int i) { return allgather_bucket(z, i, NULL); }

/* On failure the bucket stays queued: the wait that needs it retries and
 * reports the error. A training step's gather goes over the wire (16-bit or
 * node-shared: zero/wire.c). */
static dt_status issue_gather(dt_zero *z, int i) {
    DT_TRY(dt_zero_wire_gather(z, i, z->m->param_flat.data + z->lay.b[i].pub.begin, &z->lay.b[i].ag));
    z->lay.b[i].ag_queued = 0;
    return DT_OK;
}

static void forget_live(dt_zero *z, int i) {
    for (int k = 0; k < z->gq.n_live;)
        if (z->gq.live[k] == i) z->gq.live[k] = z->gq.live[--z->gq.n_live];
        else k++;
}

/* Issue queued gathers while fewer than GATHER_WINDOW are in flight, and
 * unconditionally every queued bucket with index >= force (INT_MAX: none). */
dt_status dt_zero_pump_gathers(dt_zero *z, int force) {
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

dt_status dt_zero_wait_all_gathers(dt_zero *z) {   /* queued ones are issued first */
    dt_status s = DT_OK;
    for (int i = 0; i < z->lay.nb; i++) {
        dt_status si = dt_zero_wait_gather(z, i);
        if (s == DT_OK) s = si;
    }
    return s;
}

dt_status dt_zero_gather_stepped(dt_zero *z, int i) {
    if (z->stage == 3) return DT_OK;   /* stage 3 gathers from module hooks (zero/params.c) */
    if (!z->gq.queueing) return issue_gather(z, i);
    z->lay.b[i].ag_queued = 1;
    if (i > z->gq.next) z->gq.next = i;
    return DT_OK;
}

dt_status dt_zero_wait_gather(dt_zero *z, int i) {
    zbucket *b = &z->lay.b[i];
    double t0 = dt_par_now_us();
    if (b->ag_queued) DT_TRY(dt_zero_pump_gathers(z, i));
    if (b->ag_queued) return DT_ERR(DT_ESTATE, "zero: parameter all-gather of bucket %d was not issued", i);
    if (!b->ag) return DT_OK;
    dt_status s = dt_work_wait(b->ag);
    b->ag = NULL;
    dt_status sw = dt_zero_wire_gathered(z, i, s == DT_OK);   /* wire buffer -> float32 parameters */
    if (s == DT_OK) s = sw;
    forget_live(z, i);
    z->stats.gather_wait_us += dt_par_now_us() - t0;
    if (s == DT_OK) s = dt_zero_pump_gathers(z, INT_MAX);   /* keep the queue moving */
    return s;
}

dt_status dt_zero_sync_params(dt_zero *z) {
    dt_status s = dt_zero_wait_all_gathers(z);
    if (z->stage == 3 && s == DT_OK) s = dt_zero3_idle(z);
    return s;
}

dt_status dt_zero_gather_params(dt_zero *z) {
    DT_TRY(dt_zero_sync_params(z));
    if (z->stage == 3) return DT_OK;
    /* a 16-bit wire with float32 masters: gathered as a training step
     * leaves them (zero.h: every other rank's shard rounded), so a resumed
     * run goes on bit for bit as the uninterrupted one */
    int wire = !z->lay.shard_param && z->wire.pdt != DT_F32;
    for (int i = 0; i < z->lay.nb; i++) {
        if (!wire) {
            DT_TRY(allgather_bucket(z, i, NULL));
            continue;
        }
        DT_TRY(issue_gather(z, i));
        DT_TRY(dt_zero_wait_gather(z, i));
    }
    if (z->lay.shard_param) {   /* 16-bit param_dtype: the copy forward reads holds the rounded masters */
        if (z->opts.param_dtype == DT_F16)   /* (gathered whole: every rank refuses alike) */
            DT_TRY(dt_model_check_f16_range(z->m, z->m->param_flat.data));
        dt_model_round_params(z->m, z->m->param_flat.data, z->m->param_flat.data, z->opts.param_dtype);
    }
    return DT_OK;
}
