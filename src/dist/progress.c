/* The progress engine: issuing, polling, waiting, and the communication thread.
 *
 * POLL mode. Operations are started on the caller's thread at issue time and
 * kept in the group's FIFO (pg->head..tail) until complete. dt_pg_poll walks
 * the FIFO in issue order, MPI_Testall's each operation's live requests and,
 * when a phase completes, runs its local work and starts the next phase.
 *
 * Ordering invariant: MPI requires that collectives on a communicator start
 * in the same order on every rank. Phase 0 of every operation starts at issue
 * time on comm[0], so comm[0] sees issue order. Later phases start whenever a
 * poll notices the previous phase finished, which differs between ranks, so
 * phase p runs on its own communicator comm[p] and may start only when every
 * earlier operation that has a phase p has already started it (the
 * `pending` mask below). Hence comm[p] also sees issue order on every rank.
 *
 * THREAD mode. The group's thread pops operations from the FIFO in issue
 * order and runs each with blocking MPI calls (point-to-point ones are started
 * non-blocking and tested between operations, so a send and a receive queued
 * in either order on two ranks cannot deadlock). The owner thread sleeps on a
 * condition variable in dt_work_wait. pg->mu guards the queue, done flags,
 * inflight and the broken flag.
 */
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "dist/dist_internal.h"

static int is_p2p(dt_opkind k) { return k == DT_OPK_SEND || k == DT_OPK_RECV; }

/* ---- failures ---- */

void dt__work_describe(const dt_work *w, char *o, size_t n) {
    snprintf(o, n, "%s #%llu (%s %s) on %s", dt__kind_name(w->kind), (unsigned long long)w->seq,
             strchr(w->name, ' ') ? strchr(w->name, ' ') + 1 : "", dt_dtype_name(w->dtype), w->pg->name);
}

void dt__work_fail(dt_work *w, int rc, const char *mpi_fn) {
    char es[MPI_MAX_ERROR_STRING], d[160];
    int len = 0;
    es[0] = 0;
    MPI_Error_string(rc, es, &len);
    dt__work_describe(w, d, sizeof d);
    snprintf(w->msg, sizeof w->msg, "%.159s: %.40s: %.255s", d, mpi_fn ? mpi_fn : "MPI", es);
    w->st = DT_ECOMM;
}

void dt__work_failf(dt_work *w, dt_status st, const char *fmt, ...) {
    char d[160], m[240];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    dt__work_describe(w, d, sizeof d);
    snprintf(w->msg, sizeof w->msg, "%.159s: %.239s", d, m);
    w->st = st;
}

int dt__pg_broken(dt_pg *pg, char *msg, size_t n) {
    int thr = pg->mode == DT_PROGRESS_THREAD;
    if (thr) pthread_mutex_lock(&pg->mu);
    int b = pg->broken;
    if (b && msg) snprintf(msg, n, "%s", pg->broken_msg);
    if (thr) pthread_mutex_unlock(&pg->mu);
    return b;
}

/* ---- completion (runs on whichever thread drives the operation) ---- */

static void complete(dt_work *w) {
    dt_pg *pg = w->pg;
    if (w->stage) {   /* failure paths may leave the staging buffer */
        dt__pool_put(pg, w->stage, w->stage_cap);
        w->stage = NULL;
    }
    if (w->trace) dt_trace_event(w->trace, w->name, "comm", 1, w->t_begin_us, dt_trace_now_us(w->trace));
    int thr = pg->mode == DT_PROGRESS_THREAD;
    if (thr) pthread_mutex_lock(&pg->mu);
    if (pg->running == w) pg->running = NULL;
    if (w->st == DT_ECOMM && !is_p2p(w->kind) && !pg->broken) {
        pg->broken = 1;
        snprintf(pg->broken_msg, sizeof pg->broken_msg, "%s", w->msg);
    }
    w->done = 1;
    pg->inflight--;
    if (thr) {
        pthread_cond_broadcast(&pg->cv_done);
        pthread_mutex_unlock(&pg->mu);   /* w may be freed by its owner from here on */
    }
}

static int run_blocking(dt_work *w) { return dt__op_run(w); }
static int start_phase(dt_work *w) { return dt__op_start(w); }
static int finish_phase(dt_work *w) { return dt__op_finish(w); }

/* ---- POLL mode ---- */

/* Test w's live requests; on completion run local work and start the next
 * phase if the ordering invariant allows. Returns 1 if anything changed. */
static int advance(dt_work *w, const int *pending) {
    if (dt__kind_is_shm(w->kind)) {   /* no MPI requests: shared-memory counters */
        int r = dt__shm_advance(w);
        if (r == 2 || r < 0) { complete(w); return 1; }
        return r;
    }
    int changed = 0;
    for (;;) {
        if (w->started) {
            int flag = 0;
            int rc = MPI_Testall(w->nreq, w->req, &flag, w->sts);
            if (rc != MPI_SUCCESS) {
                if (rc == MPI_ERR_IN_STATUS)
                    for (int i = 0; i < w->nreq; i++)
                        if (w->sts[i].MPI_ERROR != MPI_SUCCESS && w->sts[i].MPI_ERROR != MPI_ERR_PENDING) {
                            rc = w->sts[i].MPI_ERROR;
                            break;
                        }
                dt__work_fail(w, rc, w->fn);
                complete(w);
                return 1;
            }
            if (!flag) return changed;
            changed = 1;
            w->started = 0;
            w->nreq = 0;
            if (finish_phase(w) != MPI_SUCCESS) { complete(w); return 1; }
            if (++w->phase == w->nphase) { complete(w); return 1; }
        }
        if (pending[w->phase]) return changed;
        if (start_phase(w) != MPI_SUCCESS) { complete(w); return 1; }
        w->started = 1;
        changed = 1;
    }
}

static int poll_pg(dt_pg *pg) {
    int pending[DT_MAX_PHASE] = {0};
    int changed = 0;
    dt_work *prev = NULL;
    for (dt_work *w = pg->head, *next; w; w = next) {
        next = w->next;
        changed |= advance(w, pending);
        if (w->done) {
            if (prev) prev->next = next; else pg->head = next;
            if (pg->tail == w) pg->tail = prev;
            w->next = NULL;
        } else {
            for (int p = w->phase + (w->started ? 1 : 0); p < w->nphase; p++) pending[p] = 1;
            prev = w;
        }
    }
    pg->last_poll = dt_mono_s();
    dt__wd_beat(pg, pg->last_poll);
    return changed;
}

/* Spin on poll; after a while yield the core (ranks may outnumber cores).
 * Every other group with work in flight is polled too: a peer may be waiting
 * in this group for work of ours that another group only advances when polled
 * (a deterministic phase to start, a shared-memory slice to sum). */
int dt__poll_all(dt_pg *pg) {
    int changed = pg->head ? poll_pg(pg) : 0;
    for (dt_pg *g = dt__dist.groups; g; g = g->reg_next)
        if (g != pg && g->mode == DT_PROGRESS_POLL && g->head) changed |= poll_pg(g);
    return changed;
}

/* 1: the collective timeout passed (the watchdog looks every 256 rounds). */
static int poll_until(dt_pg *pg, const dt_work *w) {
    int idle = 0, k = 0;
    double t0 = dt_mono_s(), next_warn = t0 + dt__dist.stall_warn_s;
    while (w ? !w->done : pg->head != NULL) {
        if (pg->timed_out) return 1;
        if (dt__poll_all(pg)) idle = 0;
        else if (++idle > 64) sched_yield();
        if ((++k & 255) == 0 && dt__wd_check(pg, pg->head ? pg->head : w, t0, &next_warn)) return 1;
    }
    return 0;
}

/* THREAD mode, pg->mu held: sleep until cv_done or a watchdog look is due.
 * 1: the collective timeout passed. */
static int thread_wait(dt_pg *pg, const dt_work *w, double t0, double *next_warn) {
    if (pg->timed_out) return 1;
    if (dt__dist.stall_warn_s <= 0 && dt__dist.timeout_s <= 0) {
        pthread_cond_wait(&pg->cv_done, &pg->mu);
        return 0;
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 250000000L;   /* looks 4 times a second */
    if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
    pthread_cond_timedwait(&pg->cv_done, &pg->mu, &ts);
    const dt_work *op = pg->running ? pg->running : pg->head ? pg->head : w;
    return dt__wd_check(pg, op, t0, next_warn);
}

static dt_status timed_out(dt_pg *pg) { return dt__wd_timeout_error(pg); }

void dt_pg_poll(dt_pg *pg) {
    if (!pg || pg->mode != DT_PROGRESS_POLL || !pg->head) return;
    poll_pg(pg);
}

void dt_pg_tick(dt_pg *pg) {
    if (!pg || pg->mode != DT_PROGRESS_POLL || !pg->head) return;
    if (dt_mono_s() - pg->last_poll >= dt__dist.tick_s) poll_pg(pg);
}

/* ---- issue ---- */

static void link_all(dt_work *w) {
    dt_pg *pg = w->pg;
    w->all_next = pg->all;
    if (pg->all) pg->all->all_prev = w;
    pg->all = w;
}

void dt__work_free(dt_work *w) {
    dt_pg *pg = w->pg;
    if (w->all_prev) w->all_prev->all_next = w->all_next; else if (pg->all == w) pg->all = w->all_next;
    if (w->all_next) w->all_next->all_prev = w->all_prev;
    if (w->req != w->req_small) { free(w->req); free(w->sts); }
    free(w->counts);
    dt_free(w->stage);
    free(w);
}

static dt_status finish_handle(dt_work *w) {
    dt_status st = w->st;
    if (st != DT_OK) dt_error_set(st, __FILE__, __LINE__, "%s", w->msg);
    dt__work_free(w);
    return st;
}

dt_status dt__submit(dt_work *w) {
    dt_pg *pg = w->pg;
    w->trace = pg->trace;
    link_all(w);
    if (pg->mode == DT_PROGRESS_POLL) {
        pg->inflight++;
        w->t_begin_us = dt_trace_now_us(w->trace);
        /* Blocking calls take the non-blocking path too: MPI never matches a
         * blocking collective with a non-blocking one, and whether earlier
         * work has completed differs between ranks, so it must not decide
         * which call a rank makes; and the wait polls the other groups. */
        if (start_phase(w) != MPI_SUCCESS) {
            complete(w);
            return finish_handle(w);   /* nothing queued: report at issue */
        }
        w->started = 1;
        if (pg->tail) pg->tail->next = w; else pg->head = w;
        pg->tail = w;
        if (w->internal) return dt_work_wait(w);
        return DT_OK;
    }
    pthread_mutex_lock(&pg->mu);
    pg->inflight++;
    if (pg->tail) pg->tail->next = w; else pg->head = w;
    pg->tail = w;
    pthread_cond_signal(&pg->cv_work);
    pthread_mutex_unlock(&pg->mu);
    if (w->internal) return dt_work_wait(w);
    return DT_OK;
}

/* ---- handles ---- */

dt_status dt_work_wait(dt_work *w) {
    if (!w) return DT_OK;
    dt_pg *pg = w->pg;
    /* after a timeout w stays with the group: MPI may still write its buffers */
    if (pg->mode == DT_PROGRESS_POLL) {
        if (poll_until(pg, w)) return timed_out(pg);
    } else {
        pthread_mutex_lock(&pg->mu);
        double t0 = dt_mono_s(), next_warn = t0 + dt__dist.stall_warn_s;
        int to = 0;
        while (!w->done && !to) to = thread_wait(pg, w, t0, &next_warn);
        pthread_mutex_unlock(&pg->mu);
        if (to) return timed_out(pg);
    }
    return finish_handle(w);
}

dt_status dt_work_test(dt_work *w, int *done) {
    if (!w || !done) return DT_ERR(DT_EINVAL, "dt_work_test: NULL %s", w ? "done" : "handle");
    dt_pg *pg = w->pg;
    if (pg->mode == DT_PROGRESS_POLL) {
        if (!w->done) dt__poll_all(pg);
        *done = w->done;
    } else {
        pthread_mutex_lock(&pg->mu);
        *done = w->done;
        pthread_mutex_unlock(&pg->mu);
    }
    return DT_OK;
}

dt_status dt_pg_wait_all(dt_pg *pg) {
    if (!pg) return DT_ERR(DT_EINVAL, "dt_pg_wait_all: NULL process group");
    if (pg->mode == DT_PROGRESS_POLL) {
        if (poll_until(pg, NULL)) return timed_out(pg);
    } else {
        pthread_mutex_lock(&pg->mu);
        double t0 = dt_mono_s(), next_warn = t0 + dt__dist.stall_warn_s;
        int to = 0;
        while (pg->inflight > 0 && !to) to = thread_wait(pg, NULL, t0, &next_warn);
        pthread_mutex_unlock(&pg->mu);
        if (to) return timed_out(pg);
    }
    /* report the oldest failure among live handles */
    const dt_work *bad = NULL;
    for (const dt_work *w = pg->all; w; w = w->all_next)
        if (w->st != DT_OK) bad = w;
    if (bad) return dt_error_set(bad->st, __FILE__, __LINE__, "%s", bad->msg);
    return DT_OK;
}

/* ---- THREAD mode: the communication thread ---- */

static void nap(void) {
    struct timespec ts = {0, 20000};   /* 20 us */
    nanosleep(&ts, NULL);
}

/* Test started point-to-point operations; complete the finished ones.
 * Returns 1 if any completed. */
static int test_p2p(dt_work **pend) {
    int any = 0;
    for (dt_work **pp = pend; *pp;) {
        dt_work *w = *pp;
        int flag = 0;
        MPI_Status st;
        int rc = MPI_Test(&w->req[0], &flag, &st);
        if (rc != MPI_SUCCESS) dt__work_fail(w, rc, w->fn);
        if (rc != MPI_SUCCESS || flag) {
            *pp = w->next;
            w->next = NULL;
            complete(w);
            any = 1;
        } else {
            pp = &w->next;
        }
    }
    return any;
}

void *dt__comm_thread(void *arg) {
    dt_pg *pg = arg;
    dt_work *pend = NULL;   /* started p2p operations (thread-private) */
    int idle = 0;
    pthread_mutex_lock(&pg->mu);
    for (;;) {
        while (!pg->head && !pend && !pg->quit) pthread_cond_wait(&pg->cv_work, &pg->mu);
        if (pg->quit && !pg->head && !pend) break;
        dt_work *w = pg->head;
        if (w) {
            pg->head = w->next;
            if (!pg->head) pg->tail = NULL;
            w->next = NULL;
            if (!is_p2p(w->kind)) pg->running = w;
        }
        int broken = pg->broken;
        char bmsg[512];
        if (broken) snprintf(bmsg, sizeof bmsg, "%s", pg->broken_msg);
        pthread_mutex_unlock(&pg->mu);

        int progressed = 0;
        if (w) {
            progressed = 1;
            w->t_begin_us = dt_trace_now_us(w->trace);
            if (broken && !is_p2p(w->kind)) {
                dt__work_failf(w, DT_ECOMM, "not run: group broken by an earlier failure: %s", bmsg);
                complete(w);
            } else if (is_p2p(w->kind)) {
                if (start_phase(w) != MPI_SUCCESS) {
                    complete(w);
                } else {
                    w->next = pend;
                    pend = w;
                }
            } else {
                run_blocking(w);
                complete(w);
            }
        }
        if (pend) progressed |= test_p2p(&pend);
        if (progressed) dt__wd_beat(pg, dt_mono_s());
        if (progressed) idle = 0;
        else if (++idle > 64) nap();
        else sched_yield();
        pthread_mutex_lock(&pg->mu);
    }
    pthread_mutex_unlock(&pg->mu);
    return NULL;
}
