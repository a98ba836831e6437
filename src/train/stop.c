/* Stop requests (signal handlers) and their agreement over ranks at step
 * boundaries. The request is one sig_atomic_t, written by a handler; the
 * agreement is an allreduce (SUM) of a one-hot vector over the codes 1..31 on
 * a communicator of its own, so its issue order never mixes with a strategy's
 * collectives, and "the highest code any rank saw" is a MAX built from a SUM. */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include "stop_internal.h"

static volatile sig_atomic_t g_request;
static int g_stopped;

void dt_train_request_stop(int code) { g_request = code >= 1 && code <= DT_STOP_MAX_CODE ? code : DT_STOP_MAX_CODE; }
int dt_train_stop_requested(void) { return (int)g_request; }
int dt_train_stopped(void) { return g_stopped; }

void dt_stop_set_stopped(int code) {
    g_stopped = code;
    if (code) g_request = 0;   /* consumed: a later run in this process is not stopped by it */
}

dt_status dt_stop_sync_init(dt_stop_sync *s, int world) {
    memset(s, 0, sizeof *s);
    /* only when the trainer's ranks are the whole world (the CLI's runs);
     * a trainer on a subgroup stops on its own rank's request */
    if (world > 1 && dt_dist_initialized() && world == dt_dist_world_size()) DT_TRY(dt_pg_world(&s->pg));
    return DT_OK;
}

dt_status dt_stop_sync_begin(dt_stop_sync *s) {
    if (!s->pg) return DT_OK;
    memset(s->votes, 0, sizeof s->votes);
    int code = (int)g_request;
    if (code) s->votes[code - 1] = 1.0f;
    return dt_allreduce(s->pg, s->votes, s->votes, DT_STOP_MAX_CODE, DT_F32, DT_RED_SUM, &s->w);
}

dt_status dt_stop_sync_end(dt_stop_sync *s, int *code) {
    *code = 0;
    if (!s->pg) { *code = (int)g_request; return DT_OK; }
    dt_work *w = s->w;
    s->w = NULL;
    DT_TRY(dt_work_wait(w));
    for (int c = DT_STOP_MAX_CODE; c >= 1 && !*code; c--)
        if (s->votes[c - 1] > 0) *code = c;
    return DT_OK;
}

/* An abandoned sync may still have its allreduce in flight, writing into
 * votes: it must stay allocated (and reachable, so leak checkers stay quiet)
 * until the process ends. */
static dt_stop_sync *g_abandoned;

void dt_stop_sync_abandon(dt_stop_sync *s) {
    if (!s->pg) { free(s); return; }
    s->next = g_abandoned;
    g_abandoned = s;
}

void dt_stop_sync_free(dt_stop_sync *s) {
    if (s->w) (void)dt_work_wait(s->w);   /* every rank started it: it completes */
    s->w = NULL;
    if (s->pg) (void)dt_pg_free(s->pg);
    s->pg = NULL;
}
