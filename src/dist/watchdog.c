/* The collective watchdog (dist.h section 9) and --debug-collectives.
 *
 * Side channel: at group creation the ranks of each machine allocate one
 * small MPI shared-memory window (on a node split of pg->side); every rank
 * owns a 64-byte slot it writes with relaxed C11 stores and anyone on the
 * machine may read without involving it -- so a stopped or busy rank can
 * still be inspected. Per collective the cost is two relaxed stores at issue
 * (count, sequence) and one per poll (heartbeat, from the clock reading
 * the poll takes anyway). Only a wait that has lasted stall_warn seconds
 * reads the other slots.
 *
 * Across machines: when the group spans machines, local rank 0's segment also
 * holds a table with an entry per group rank (remote). A rank whose wait has
 * lasted half the warning time (or of the timeout) sends, every quarter of
 * it, a snapshot of its machine's slots (collectives issued, last operation,
 * idle time as measured there) to one rank on every other machine (the one
 * with its local index, modulo that machine's rank count) over a duplicate of
 * pg->side, and polls for snapshots sent to it, which it stores in its
 * machine's remote table, so every rank of the machine sees them. A warning
 * then reads ranks on other machines from that table, names their host, and
 * counts as "not inspected" only ranks no snapshot has described within the
 * last few periods (e.g. every rank of a machine stopped).
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dist/dist_internal.h"
#include "util/log_internal.h"

/* 64 bytes (a cache line of its own when the segment is line-aligned; Open
 * MPI only guarantees 8-byte alignment of a rank's segment) */
typedef struct wd_slot {
    _Atomic uint64_t ncoll;       /* collectives issued */
    _Atomic uint64_t last_seq1;   /* sequence number + 1 of the latest op issued (any kind) */
    _Atomic uint64_t beat_us;     /* CLOCK_MONOTONIC us when it last drove the group */
    uint64_t pad[5];
} wd_slot;
_Static_assert(sizeof(wd_slot) == 64, "one slot per cache line");

/* What one machine saw of one of its ranks, as stored on another machine. */
typedef struct wd_remote {
    _Atomic uint64_t ncoll, last_seq1;
    _Atomic uint64_t idle_us;     /* idle time at the sender's snapshot */
    _Atomic uint64_t recv_us;     /* this machine's clock when it arrived; 0: never */
} wd_remote;

/* A snapshot entry on the wire. */
typedef struct wd_msg {
    int64_t rank;
    uint64_t ncoll, last_seq1, idle_us;
} wd_msg;

#define WD_TAG 7

struct dt_wd {
    MPI_Win win;
    MPI_Comm node;
    wd_slot **slot;   /* [pg->size]; NULL: a rank on another machine */
    wd_slot *mine;
    /* across machines (NULL / MPI_COMM_NULL on one machine) */
    wd_remote *remote;    /* [pg->size] in local rank 0's segment */
    MPI_Comm x;
    MPI_Request rreq, *sreq;   /* [machines] */
    wd_msg *rbuf, *sbuf;       /* [max_local], [local_size] */
    double next_pub;
};

static uint64_t to_us(double s) { return (uint64_t)(s * 1e6); }

/* The side channel across machines; without memory it is simply absent. */
static void wd_cross_create(dt_pg *pg, dt_wd *wd) {
    MPI_Comm x = MPI_COMM_NULL;
    if (MPI_Comm_dup(pg->side, &x) != MPI_SUCCESS) return;   /* every rank calls it */
    const dt_topo *t = &pg->topo;
    wd->sreq = malloc((size_t)t->machines * sizeof *wd->sreq);
    wd->rbuf = malloc((size_t)t->max_local * sizeof *wd->rbuf);
    wd->sbuf = malloc((size_t)t->local_size * sizeof *wd->sbuf);
    if (!wd->sreq || !wd->rbuf || !wd->sbuf || !wd->remote) {
        free(wd->sreq);
        free(wd->rbuf);
        free(wd->sbuf);
        wd->sreq = NULL;
        wd->rbuf = wd->sbuf = NULL;
        MPI_Comm_free(&x);
        return;
    }
    MPI_Comm_set_errhandler(x, MPI_ERRORS_RETURN);
    for (int m = 0; m < t->machines; m++) wd->sreq[m] = MPI_REQUEST_NULL;
    wd->x = x;
    if (MPI_Irecv(wd->rbuf, (int)((size_t)t->max_local * sizeof *wd->rbuf), MPI_BYTE, MPI_ANY_SOURCE, WD_TAG, x,
                  &wd->rreq) != MPI_SUCCESS)
        wd->rreq = MPI_REQUEST_NULL;
}

static void wd_cross_free(dt_wd *wd) {
    if (wd->x == MPI_COMM_NULL) return;
    /* every rank passed dt_pg_free's barrier: nothing more is sent; take in what arrived */
    int flag = 0;
    if (wd->rreq != MPI_REQUEST_NULL) {
        MPI_Cancel(&wd->rreq);
        MPI_Wait(&wd->rreq, MPI_STATUS_IGNORE);
    }
    for (;;) {
        MPI_Status st;
        if (MPI_Iprobe(MPI_ANY_SOURCE, WD_TAG, wd->x, &flag, &st) != MPI_SUCCESS || !flag) break;
        int n = 0;
        MPI_Get_count(&st, MPI_BYTE, &n);
        char *junk = malloc(n > 0 ? (size_t)n : 1);
        MPI_Recv(junk, n, MPI_BYTE, st.MPI_SOURCE, WD_TAG, wd->x, MPI_STATUS_IGNORE);
        free(junk);
    }
    free(wd->sreq);
    free(wd->rbuf);
    free(wd->sbuf);
    MPI_Comm_free(&wd->x);
}

/* Store what arrived; publish this machine's slots if due. */
static void wd_cross(dt_pg *pg, double now, double waited) {
    dt_wd *wd = pg->wd;
    if (!wd || wd->x == MPI_COMM_NULL) return;
    const dt_topo *t = &pg->topo;
    for (int guard = 0; wd->rreq != MPI_REQUEST_NULL && guard < 64; guard++) {
        int flag = 0;
        MPI_Status st;
        if (MPI_Test(&wd->rreq, &flag, &st) != MPI_SUCCESS || !flag) break;
        int n = 0;
        MPI_Get_count(&st, MPI_BYTE, &n);
        for (int i = 0; i < n / (int)sizeof(wd_msg); i++) {
            const wd_msg *e = &wd->rbuf[i];
            if (e->rank < 0 || e->rank >= pg->size || t->machine_of[e->rank] == t->machine) continue;
            wd_remote *r = &wd->remote[e->rank];
            atomic_store_explicit(&r->ncoll, e->ncoll, memory_order_relaxed);
            atomic_store_explicit(&r->last_seq1, e->last_seq1, memory_order_relaxed);
            atomic_store_explicit(&r->idle_us, e->idle_us, memory_order_relaxed);
            atomic_store_explicit(&r->recv_us, to_us(now), memory_order_relaxed);
        }
        if (MPI_Irecv(wd->rbuf, (int)((size_t)t->max_local * sizeof *wd->rbuf), MPI_BYTE, MPI_ANY_SOURCE, WD_TAG,
                      wd->x, &wd->rreq) != MPI_SUCCESS)
            wd->rreq = MPI_REQUEST_NULL;
    }
    double warn = dt__dist.stall_warn_s, limit = dt__dist.timeout_s;
    double first = warn > 0 && (limit <= 0 || warn < limit) ? warn : limit;
    if (waited < 0.5 * first || now < wd->next_pub) return;
    int done = 0;
    if (MPI_Testall(t->machines, wd->sreq, &done, MPI_STATUSES_IGNORE) != MPI_SUCCESS || !done) return;
    wd->next_pub = now + (0.25 * first > 0.1 ? 0.25 * first : 0.1);
    int n = 0;
    for (int q = 0; q < t->local_size; q++) {
        int r = t->members[t->member_off[t->machine] + q];
        wd_slot *sl = wd->slot[r];
        if (!sl) continue;
        uint64_t beat = atomic_load_explicit(&sl->beat_us, memory_order_relaxed), nu = to_us(now);
        wd->sbuf[n++] = (wd_msg){r, atomic_load_explicit(&sl->ncoll, memory_order_relaxed),
                                 atomic_load_explicit(&sl->last_seq1, memory_order_relaxed), nu > beat ? nu - beat : 0};
    }
    for (int m = 0; m < t->machines; m++)
        if (m != t->machine)
            MPI_Isend(wd->sbuf, n * (int)sizeof(wd_msg), MPI_BYTE, dt__chunk_handler(t, m, pg->rank), WD_TAG, wd->x,
                      &wd->sreq[m]);
}

void dt__wd_create(dt_pg *pg) {
    MPI_Comm node;
    if (MPI_Comm_split_type(pg->side, MPI_COMM_TYPE_SHARED, pg->rank, MPI_INFO_NULL, &node) != MPI_SUCCESS) return;
    int nl = 0;
    MPI_Comm_size(node, &nl);
    int *gr = malloc((size_t)nl * sizeof *gr);
    dt_wd *wd = calloc(1, sizeof *wd);
    wd_slot **slot = calloc((size_t)pg->size, sizeof *slot);
    /* every rank takes part in the collectives below even when short of memory */
    int ok = gr && wd && slot, all_ok = 0;
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, node);
    wd_slot *base = NULL;
    MPI_Win win = MPI_WIN_NULL;
    int across = pg->topo.machines > 1, lr = 0;
    MPI_Comm_rank(node, &lr);
    size_t seg = sizeof(wd_slot) + (across && lr == 0 ? (size_t)pg->size * sizeof(wd_remote) : 0);
    if (all_ok && MPI_Allgather(&pg->rank, 1, MPI_INT, gr, 1, MPI_INT, node) == MPI_SUCCESS &&
        MPI_Win_allocate_shared((MPI_Aint)seg, 1, MPI_INFO_NULL, node, &base, &win) == MPI_SUCCESS) {
        for (int i = 0; i < nl; i++) {
            MPI_Aint sz;
            int du;
            void *p = NULL;
            MPI_Win_shared_query(win, i, &sz, &du, &p);
            if (gr[i] >= 0 && gr[i] < pg->size && ((uintptr_t)p & 7) == 0) slot[gr[i]] = p;
            if (i == 0 && across && p && ((uintptr_t)p & 7) == 0) wd->remote = (wd_remote *)((char *)p + sizeof(wd_slot));
        }
        if (lr == 0 && wd->remote) memset(wd->remote, 0, (size_t)pg->size * sizeof(wd_remote));
        wd->win = win;
        wd->node = node;
        wd->slot = slot;
        wd->mine = slot[pg->rank];
        if (wd->mine) {
            atomic_store_explicit(&wd->mine->ncoll, 0, memory_order_relaxed);
            atomic_store_explicit(&wd->mine->last_seq1, 0, memory_order_relaxed);
            atomic_store_explicit(&wd->mine->beat_us, to_us(dt_mono_s()), memory_order_relaxed);
        }
        MPI_Barrier(node);   /* every slot initialised before anyone reads it */
        pg->wd = wd->mine ? wd : NULL;
        wd->x = MPI_COMM_NULL;
        wd->rreq = MPI_REQUEST_NULL;
        if (across) wd_cross_create(pg, wd);   /* collective over pg->side */
        if (pg->wd) { free(gr); return; }
        wd_cross_free(wd);
        MPI_Win_free(&wd->win);
    }
    MPI_Comm_free(&node);
    free(gr);
    free(wd);
    free(slot);
}

void dt__wd_free(dt_pg *pg) {
    dt_wd *wd = pg->wd;
    if (!wd) return;
    wd_cross_free(wd);
    MPI_Win_free(&wd->win);   /* collective over the machine's ranks of pg */
    MPI_Comm_free(&wd->node);
    free(wd->slot);
    free(wd);
    pg->wd = NULL;
}

void dt__wd_issued(dt_work *w) {
    dt_wd *wd = w->pg->wd;
    if (!wd) return;
    if (w->kind != DT_OPK_SEND && w->kind != DT_OPK_RECV)
        atomic_store_explicit(&wd->mine->ncoll, w->coll_idx + 1, memory_order_relaxed);
    atomic_store_explicit(&wd->mine->last_seq1, w->seq + 1, memory_order_relaxed);
}

void dt__wd_beat(dt_pg *pg, double now) {
    if (pg->wd) atomic_store_explicit(&pg->wd->mine->beat_us, to_us(now), memory_order_relaxed);
}

/* ---- the stall report ---- */

/* Appends ", piece" (at most 12 pieces, then ", ..."). */
static void add_rank(char *o, size_t n, size_t *at, int *k, const char *piece) {
    if (*at >= n || *k > 12) return;
    *at += (size_t)snprintf(o + *at, n - *at, "%s%s", *k ? ", " : "", *k == 12 ? "..." : piece);
    (*k)++;
}

/* "allreduce #12 (1.0MiB F32) on world has waited 2.0 s: rank 1 has not
 * joined it (its last operation #11, idle 2.0 s)" */
static void describe_stall(dt_pg *pg, const dt_work *op, double waited, double now, char *o, size_t n,
                           unsigned char *named) {
    char d[160];
    dt__work_describe(op, d, sizeof d);
    size_t at = (size_t)snprintf(o, n, "%s has waited %.1f s", d, waited);
    dt_wd *wd = pg->wd;
    if (!wd) {
        if (at < n) snprintf(o + at, n - at, " (no view of the other ranks: no shared memory window)");
        return;
    }
    int p2p = op->kind == DT_OPK_SEND || op->kind == DT_OPK_RECV;
    char late[400] = "", idle[400] = "";
    size_t la = 0, ia = 0;
    int nl = 0, ni = 0, unknown = 0;
    int across = pg->topo.machines > 1;
    double fresh = 4.0 * (dt__dist.stall_warn_s > 0 ? dt__dist.stall_warn_s : dt__dist.timeout_s);
    for (int r = 0; r < pg->size; r++) {
        if (r == pg->rank || (p2p && r != op->root)) continue;
        wd_slot *s = wd->slot[r];
        uint64_t nc, last;
        double quiet;
        if (s) {
            nc = atomic_load_explicit(&s->ncoll, memory_order_relaxed);
            last = atomic_load_explicit(&s->last_seq1, memory_order_relaxed);
            quiet = now - (double)atomic_load_explicit(&s->beat_us, memory_order_relaxed) * 1e-6;
        } else {   /* another machine: its last snapshot, if recent */
            wd_remote *e = wd->remote ? &wd->remote[r] : NULL;
            double got = e ? (double)atomic_load_explicit(&e->recv_us, memory_order_relaxed) * 1e-6 : 0;
            if (!e || got <= 0 || now - got > fresh) {   /* (no fresh news: counted among the named) */
                unknown++;
                if (named) named[r] = 1;
                continue;
            }
            nc = atomic_load_explicit(&e->ncoll, memory_order_relaxed);
            last = atomic_load_explicit(&e->last_seq1, memory_order_relaxed);
            quiet = (double)atomic_load_explicit(&e->idle_us, memory_order_relaxed) * 1e-6 + (now - got);
        }
        char who[96];
        if (across) snprintf(who, sizeof who, "%d on %.60s", r, dt__host_of(pg, r));
        else snprintf(who, sizeof who, "%d", r);
        /* quiet for most of this wait (and longer than THREAD mode's 0.25 s beat) */
        int stale = quiet >= 0.5 * waited && quiet >= 1.0;
        char piece[160];
        if (!p2p && nc <= op->coll_idx) {
            /* idle ~0: it drives the group, held up in an earlier operation */
            if (last) snprintf(piece, sizeof piece, "%s (its last operation #%llu, idle %.1f s)", who,
                               (unsigned long long)(last - 1), quiet);
            else snprintf(piece, sizeof piece, "%s (no operation yet, idle %.1f s)", who, quiet);
            add_rank(late, sizeof late, &la, &nl, piece);
            if (named && stale) named[r] = 1;   /* (late but moving: alive) */
        } else if (stale) {
            snprintf(piece, sizeof piece, "%s (idle %.1f s)", who, quiet);
            add_rank(idle, sizeof idle, &ia, &ni, piece);
            if (named) named[r] = 1;
        }
    }
    if (p2p && at < n)
        at += (size_t)snprintf(o + at, n - at, " for rank %d", op->root);
    if (nl && at < n)
        at += (size_t)snprintf(o + at, n - at, ": %s %s %s not joined it", nl == 1 ? "rank" : "ranks", late,
                               nl == 1 ? "has" : "have");
    if (ni && at < n)
        at += (size_t)snprintf(o + at, n - at, "%s %s %s %s no progress (stopped, or busy without dt_pg_tick)",
                               nl ? ";" : ":", ni == 1 ? "rank" : "ranks", idle, ni == 1 ? "shows" : "show");
    if (!nl && !ni && !p2p && at < n)
        at += (size_t)snprintf(o + at, n - at, unknown ? ": every rank on this machine has joined it"
                                                       : ": every rank has joined it");
    if (unknown && at < n) snprintf(o + at, n - at, " (%d rank%s on other machines not inspected)", unknown, unknown == 1 ? "" : "s");
}

/* The lowest world rank this timeout found alive (not silent: no heartbeat
 * for half the wait, or no fresh news from its machine), group ranks
 * translated, kept once: the rank that reports the job's error
 * (cli/errors.c). Only from a view of every rank (see dt__wd_check). */
static void note_first_live(dt_pg *pg, const unsigned char *named) {
    if (dt__dist.first_live1) return;
    MPI_Group g, wg;
    int first = -1;
    if (MPI_Comm_group(pg->comm[0], &g) != MPI_SUCCESS) return;
    if (MPI_Comm_group(MPI_COMM_WORLD, &wg) == MPI_SUCCESS) {
        unsigned char *out = calloc((size_t)dt__dist.world_size, 1);
        for (int r = 0; out && r < pg->size; r++) {
            int wr = MPI_UNDEFINED;
            if (named[r] && MPI_Group_translate_ranks(g, 1, &r, wg, &wr) == MPI_SUCCESS && wr >= 0 &&
                wr < dt__dist.world_size)
                out[wr] = 1;
        }
        for (int r = 0; out && r < dt__dist.world_size && first < 0; r++)
            if (!out[r]) first = r;
        free(out);
        MPI_Group_free(&wg);
    }
    MPI_Group_free(&g);
    dt__dist.first_live1 = first + 1;
}

int dt__wd_check(dt_pg *pg, const dt_work *w, double t0, double *next_warn) {
    double warn = dt__dist.stall_warn_s, limit = dt__dist.timeout_s;
    if ((warn <= 0 && limit <= 0) || !w) return 0;
    double now = dt_mono_s();
    dt__wd_beat(pg, now);
    wd_cross(pg, now, now - t0);
    int timeout = limit > 0 && now - t0 >= limit;
    if (!timeout && (warn <= 0 || now < *next_warn)) return 0;
    *next_warn = now + warn;
    char msg[900];
    /* a view of every rank: a collective of the whole world with the
     * watchdog's window (else the reporter stays unknown: errors.c's order) */
    int whole = timeout && pg->wd && pg->size == dt__dist.world_size && w->kind != DT_OPK_SEND &&
                w->kind != DT_OPK_RECV;
    unsigned char *named = whole ? calloc((size_t)pg->size, 1) : NULL;
    describe_stall(pg, w, now - t0, now, msg, sizeof msg, named);
    if (!timeout) {
        dt_log(DT_LOG_WARN, "collective stalled: %s\n", msg);
        return 0;
    }
    if (named) note_first_live(pg, named);
    free(named);
    pg->timed_out = 1;
    if (!pg->broken) {
        pg->broken = 1;
        snprintf(pg->broken_msg, sizeof pg->broken_msg, "collective timed out (dist.collective_timeout_s %.0f s): %.440s",
                 limit, msg);
    }
    return 1;
}

int dt__wd_wait_check(dt_pg *pg, const dt_work *w, const char *what, double t0, double *next_warn) {
    int thr = pg->mode == DT_PROGRESS_THREAD;
    if (thr) pthread_mutex_lock(&pg->mu);   /* (as thread_wait holds it around dt__wd_check) */
    int to = pg->timed_out;
    double limit = dt__dist.timeout_s, now = dt_mono_s();
    if (!to && w) {
        to = dt__wd_check(pg, w, t0, next_warn);
    } else if (!to && limit > 0 && now - t0 >= limit) {
        to = pg->timed_out = 1;
        if (!pg->broken) {
            pg->broken = 1;
            snprintf(pg->broken_msg, sizeof pg->broken_msg, "collective timed out (dist.collective_timeout_s %.0f s): "
                     "%s on %s has waited %.1f s: a rank has not joined it", limit, what, pg->name, now - t0);
        }
    }
    if (thr) pthread_mutex_unlock(&pg->mu);
    return to;
}

dt_status dt__wd_timeout_error(dt_pg *pg) {
    dt__dist.waited_out = 1;
    char msg[512];
    dt__pg_broken(pg, msg, sizeof msg);
    return dt_error_set(DT_ECOMM, __FILE__, __LINE__, "%s", msg);
}

/* ---- --debug-collectives ---- */

typedef struct fingerprint {
    int32_t kind, dtype, root, avg;
    int64_t count;
    uint64_t coll_idx, seq;
} fingerprint;

static void fp_describe(const fingerprint *f, char *o, size_t n) {
    int rooted = f->kind == DT_OPK_BROADCAST || f->kind == DT_OPK_REDUCE || f->kind == DT_OPK_REDUCE_DET;
    snprintf(o, n, "%s #%llu (%lld %s%s%s", dt__kind_name((dt_opkind)f->kind), (unsigned long long)f->seq,
             (long long)f->count, dt_dtype_name((dt_dtype)f->dtype), f->avg ? ", avg" : "", rooted ? ", root " : ")");
    if (rooted) snprintf(o + strlen(o), n - strlen(o), "%d)", f->root);
}

dt_status dt__debug_check(dt_work *w) {
    dt_pg *pg = w->pg;
    int rooted = w->kind == DT_OPK_BROADCAST || w->kind == DT_OPK_REDUCE || w->kind == DT_OPK_REDUCE_DET;
    fingerprint me = {(int32_t)w->kind, (int32_t)w->dtype, rooted ? w->root : -1, w->avg, w->count, w->coll_idx, w->seq};
    fingerprint *all = malloc((size_t)pg->size * sizeof *all);
    if (!all) return DT_ERR(DT_ENOMEM, "dist.debug_collectives on %s: out of memory", pg->name);
    dt_status s = dt__side_allgather(pg, w, &me, all, (int)sizeof me);
    int bad = -1;
    for (int r = 0; s == DT_OK && r < pg->size && bad < 0; r++)
        if (all[r].kind != all[0].kind || all[r].dtype != all[0].dtype || all[r].root != all[0].root ||
            all[r].avg != all[0].avg || all[r].count != all[0].count || all[r].coll_idx != all[0].coll_idx)
            bad = r;
    if (s == DT_OK && bad >= 0) {   /* every rank sees the same table: the same message everywhere */
        char a[128], b[128];
        fp_describe(&all[bad], a, sizeof a);
        fp_describe(&all[0], b, sizeof b);
        s = DT_ERR(DT_ECOMM, "collectives diverge on %s at collective %llu (dist.debug_collectives): rank %d issues %s, "
                   "rank 0 issues %s", pg->name, (unsigned long long)all[0].coll_idx, bad, a, b);
        if (pg->mode == DT_PROGRESS_THREAD) pthread_mutex_lock(&pg->mu);
        if (!pg->broken) {
            pg->broken = 1;
            snprintf(pg->broken_msg, sizeof pg->broken_msg, "%s", dt_error_message());
        }
        if (pg->mode == DT_PROGRESS_THREAD) pthread_mutex_unlock(&pg->mu);
    }
    free(all);
    return s;
}
