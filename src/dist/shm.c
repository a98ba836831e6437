/* Node-shared memory and the collectives that run on it.
 *
 * When every rank of a group runs on one machine, dt_pg_alloc_shared puts each
 * rank's buffer in one MPI shared-memory window (MPI_Win_allocate_shared over
 * the group's communicator): every rank can load and store every other
 * rank's buffer. Collectives on such buffers then send no message:
 *  - allreduce (F32, in place on a shared range): rank r sums slice r of the
 *    range over all ranks in rank order and stores the result into every
 *    rank's buffer. Per rank that reads S bytes and writes S bytes, where
 *    MPI's shared-memory transport also copies every byte into and out of
 *    its own segments (bench/bench_comm shm).
 *  - reduce-scatter (any payload dtype, input a shared range): rank r sums
 *    chunk r of every rank's input in rank order into its output (dt__sum_ptrs:
 *    bitwise the MPI path's dt__sum_ranks), which may lie anywhere, e.g.
 *    in place at in + r * count.
 *  - allgather (any payload dtype, output a shared range): rank r's input
 *    is first copied into chunk r of its own output (unless in place), then
 *    rank r copies chunk q of rank q's output into its own, for every q.
 *  - staged allreduce (dt_allreduce_node, the window node_allreduce.c
 *    keeps per group): rank r copies its private input into its segment,
 *    then sums every rank's segment in rank order into its private output;
 *    it completes there, and its next start waits until every rank's done
 *    has passed this op (no peer reads the segment any more).
 * A rank writes only its own segment, and only where no peer reads during
 * the operation (its own chunk for reduce-scatter, the others' chunks for
 * allgather).
 *
 * Each rank's segment starts with a control block (C11 atomics; MPI only
 * allocates the memory). Operations on one allocation are numbered 0, 1, ...
 * in issue order, the same on every rank:
 *   ready         ops this rank has published: its data for them is final
 *   done          ops whose work this rank has done (slice summed, chunks read)
 *   desc[k%RING]  op k's kind, dtype, byte offset, count and AVG flag, checked
 *                 by every peer
 * Op k: publish (desc, then ready = k+1, release); once every rank's
 * ready >= k+1 (acquire) do the own work, then done = k+1; the op completes
 * once every rank's done >= k+1 (no peer reads this rank's data any more). A
 * rank works on ops in op order, so both are counts. Until an op completes,
 * its ranges belong to it on every rank.
 * A rank publishes op k only once every rank's done >= k+1-RING: the
 * descriptor slot it reuses has been read by all.
 */
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/statvfs.h>
#include "dist/dist_internal.h"

_Static_assert(ATOMIC_LONG_LOCK_FREE == 2, "node-shared counters need lock-free 64-bit atomics");

#define RING 1024
#define CTL_BYTES 65536   /* sizeof(shm_ctl) rounded to pages; data starts here */

typedef struct shm_desc {
    _Atomic uint64_t seq1;   /* op number + 1, stored last */
    uint64_t off, count;     /* bytes into the segment; elements (per chunk: reduce-scatter, allgather) */
    uint64_t avg;
    uint64_t kind, dtype;    /* dt_opkind, dt_dtype */
} shm_desc;

typedef struct shm_ctl {
    _Alignas(64) _Atomic uint64_t ready;
    _Alignas(64) _Atomic uint64_t done;
    _Alignas(64) shm_desc desc[RING];
} shm_ctl;
_Static_assert(sizeof(shm_ctl) <= CTL_BYTES, "control block larger than its reserved space");

struct dt_shm {
    dt_shm *next;
    MPI_Win win;
    size_t count;        /* floats per rank */
    int size, rank;
    shm_ctl **ctl;       /* [size] */
    float **data;        /* [size] */
    const void **src;    /* [size] scratch: a reduce-scatter's source chunks */
    uint64_t issued;     /* ops this rank published */
    uint64_t reduced;    /* ops whose slice this rank summed */
    int failed;          /* an op failed (every rank sees it): later ones fail too */
};

static void shm_struct_free(dt_shm *s) {
    if (!s) return;
    free(s->ctl);
    free(s->data);
    free(s->src);
    free(s);
}

dt_status dt_pg_alloc_shared(dt_pg *pg, size_t count, float **out) {
    if (!out) return DT_ERR(DT_EINVAL, "dt_pg_alloc_shared: NULL out");
    *out = NULL;
    DT_TRY(dt__check_init("dt_pg_alloc_shared"));
    if (!pg) return DT_ERR(DT_EINVAL, "dt_pg_alloc_shared: NULL process group");
    pg->shm_why[0] = 0;
    if (count == 0 || count > ((size_t)1 << 40))
        return DT_ERR(DT_EINVAL, "dt_pg_alloc_shared on %s: count %zu out of range [1, 2^40]", pg->name, count);
    /* blocking collectives on comm[0]: nothing of ours may be running there,
     * and every rank must be here before any blocks inside MPI (a barrier
     * whose wait polls every group: a peer may still need our work elsewhere) */
    DT_TRY(dt_pg_wait_all(pg));
    DT_TRY(dt_barrier(pg, NULL));
    char bmsg[512];
    if (dt__pg_broken(pg, bmsg, sizeof bmsg))
        return DT_ERR(DT_ECOMM, "dt_pg_alloc_shared on %s: group unusable after an earlier failure: %s", pg->name, bmsg);
    /* + a page: Open MPI may hand out a segment off page alignment; every rank
     * rounds every segment's base up the same way */
    size_t bytes = 4096 + CTL_BYTES + ((count * sizeof(float) + 4095) & ~(size_t)4095);
    /* Open MPI backs the window with a file in osc_sm_backing_directory (a
     * tmpfs, /dev/shm): pages beyond its free space would fault (SIGBUS) when
     * first touched, so a window that does not fit falls back to MPI */
    const char *dir = getenv("OMPI_MCA_osc_sm_backing_directory");
    if (!dir || !*dir) dir = "/dev/shm";
    struct statvfs vfs;
    double avail = statvfs(dir, &vfs) == 0 ? (double)vfs.f_bavail * (double)vfs.f_frsize : -1.0;
    int fits = avail < 0 || avail >= (double)bytes * pg->size * 1.05;
    /* the per-rank pointer tables first: every rank must reach the collective
     * window creation, so ranks agree on ENOMEM with the checks below */
    dt_shm *s = calloc(1, sizeof *s);
    if (s) {
        s->ctl = calloc((size_t)pg->size, sizeof *s->ctl);
        s->data = calloc((size_t)pg->size, sizeof *s->data);
        s->src = calloc((size_t)pg->size, sizeof *s->src);
    }
    int ok = s && s->ctl && s->data && s->src;
    MPI_Comm c = pg->comm[0];
    /* the same count on every rank (a mismatch fails everywhere); all ranks
     * agree whether the window fits and whether anyone is out of memory */
    unsigned long long mm[4] = {count, ~(unsigned long long)count, (unsigned long long)!fits, (unsigned long long)!ok};
    int rc = MPI_Allreduce(MPI_IN_PLACE, mm, 4, MPI_UNSIGNED_LONG_LONG, MPI_MAX, c);
    dt_status st = DT_OK;
    if (rc != MPI_SUCCESS)
        st = dt__mpi_err(rc, "dt_pg_alloc_shared: MPI_Allreduce");
    else if (mm[0] != ~mm[1])
        st = DT_ERR(DT_EINVAL, "dt_pg_alloc_shared on %s: ranks asked for different sizes (%llu to %llu floats)",
                    pg->name, ~mm[1], mm[0]);
    else if (mm[3])
        st = DT_ERR(DT_ENOMEM, "dt_pg_alloc_shared on %s: out of memory", pg->name);
    else if (pg->topo.machines > 1)   /* the group spans machines (topology.c): nothing shared */
        snprintf(pg->shm_why, sizeof pg->shm_why, "the ranks of %s run on %d machines", pg->name, pg->topo.machines);
    else if (mm[2])
        snprintf(pg->shm_why, sizeof pg->shm_why, "%s has %.0f MiB free, %d ranks need %.0f MiB "
                 "(set OMPI_MCA_osc_sm_backing_directory or enlarge it)", dir, avail / 1048576.0, pg->size,
                 (double)bytes * pg->size / 1048576.0);
    if (st != DT_OK || pg->shm_why[0]) {
        shm_struct_free(s);
        return st;
    }
    s->count = count;
    s->size = pg->size;
    s->rank = pg->rank;
    MPI_Info info;
    MPI_Info_create(&info);
    MPI_Info_set(info, "alloc_shared_noncontig", "true");   /* each rank's segment on its own pages */
    void *base = NULL;
    rc = MPI_Win_allocate_shared((MPI_Aint)bytes, 1, info, c, &base, &s->win);
    MPI_Info_free(&info);
    if (rc != MPI_SUCCESS) {
        shm_struct_free(s);
        return dt__mpi_err(rc, "dt_pg_alloc_shared: MPI_Win_allocate_shared");
    }
    MPI_Win_set_errhandler(s->win, MPI_ERRORS_RETURN);
    for (int q = 0; q < pg->size; q++) {
        MPI_Aint sz = 0;
        int du = 0;
        void *b = NULL;
        MPI_Win_shared_query(s->win, q, &sz, &du, &b);
        char *a = (char *)(((uintptr_t)b + 4095) & ~(uintptr_t)4095);
        s->ctl[q] = (shm_ctl *)a;
        s->data[q] = (float *)(a + CTL_BYTES);
    }
    shm_ctl *me = s->ctl[s->rank];
    atomic_init(&me->ready, 0);
    atomic_init(&me->done, 0);
    for (int i = 0; i < RING; i++) atomic_init(&me->desc[i].seq1, 0);
    memset(s->data[s->rank], 0, count * sizeof(float));
    MPI_Win_lock_all(MPI_MODE_NOCHECK, s->win);   /* load/store access for the window's life */
    MPI_Win_sync(s->win);
    rc = MPI_Barrier(c);                           /* every control block initialised */
    if (rc != MPI_SUCCESS) {
        MPI_Win_unlock_all(s->win);
        MPI_Win_free(&s->win);
        shm_struct_free(s);
        return dt__mpi_err(rc, "dt_pg_alloc_shared: MPI_Barrier");
    }
    s->next = pg->shm;
    pg->shm = s;
    *out = s->data[s->rank];
    return DT_OK;
}

static void shm_destroy(dt_shm *s) {
    MPI_Win_unlock_all(s->win);
    MPI_Win_free(&s->win);
    shm_struct_free(s);
}

dt_status dt_pg_free_shared(dt_pg *pg, float *p) {
    if (!p) return DT_OK;
    if (!pg) return DT_ERR(DT_EINVAL, "dt_pg_free_shared: NULL process group");
    dt_shm **pp = &pg->shm;
    while (*pp && (*pp)->data[(*pp)->rank] != p) pp = &(*pp)->next;
    if (!*pp) return DT_ERR(DT_EINVAL, "dt_pg_free_shared on %s: %p was not allocated by dt_pg_alloc_shared on this group",
                            pg->name, (void *)p);
    dt_status st = dt_pg_wait_all(pg);   /* no operation may still use it */
    if (st == DT_OK) st = dt_barrier(pg, NULL);   /* all ranks here before MPI_Win_free blocks */
    dt_shm *s = *pp;
    *pp = s->next;
    shm_destroy(s);
    return st;
}

void dt__shm_free_all(dt_pg *pg) {
    while (pg->shm) {
        dt_shm *s = pg->shm;
        pg->shm = s->next;
        shm_destroy(s);
    }
}

dt_shm *dt__shm_find(dt_pg *pg, const void *p, size_t bytes, size_t *off) {
    for (dt_shm *s = pg->shm; s; s = s->next) {
        const char *b = (const char *)s->data[s->rank], *e = b + s->count * sizeof(float);
        if ((const char *)p >= b && (const char *)p + bytes <= e) {
            *off = (size_t)((const char *)p - b);
            return s;
        }
    }
    return NULL;
}

float *dt__shm_base(const dt_shm *s) { return s->data[s->rank]; }

const char *dt_pg_shared_unavailable(const dt_pg *pg) { return pg ? pg->shm_why : ""; }

static int all_at_least(const dt_shm *s, int done, uint64_t v) {
    for (int q = 0; q < s->size; q++) {
        uint64_t x = atomic_load_explicit(done ? &s->ctl[q]->done : &s->ctl[q]->ready, memory_order_acquire);
        if (x < v) return 0;
    }
    return 1;
}

/* Rank q's segment of s, off bytes in. */
static char *seg(const dt_shm *s, int q, size_t off) { return (char *)s->data[q] + off; }

int dt__shm_start(dt_work *w) {
    dt_shm *s = w->shm;
    dt_pg *pg = w->pg;
    uint64_t k = s->issued;
    int idle = 0;
    /* the descriptor slot of op k - RING must have been read by every rank
     * (POLL: finishing our own earlier ops is what lets the peers advance);
     * a staged allreduce (node_allreduce.c) rewrites the slot op k - 1 read */
    int staged = w->kind == DT_OPK_ALLREDUCE_NODE;
    double t0 = 0, next_warn = 0;
    for (int spins = 0; (k >= RING && !all_at_least(s, 1, k + 1 - RING)) || (staged && k > 0 && !all_at_least(s, 1, k));) {
        if (pg->mode == DT_PROGRESS_POLL) {   /* this thread is the one that waits: it watches the wait too */
            dt__poll_all(pg);
            if (!spins++) t0 = dt_mono_s(), next_warn = t0 + dt__dist.stall_warn_s;
            if (pg->timed_out || ((spins & 255) == 0 && dt__wd_wait_check(pg, w, NULL, t0, &next_warn))) {
                snprintf(w->msg, sizeof w->msg, "%s", pg->broken_msg);   /* (not published: nobody waits for it) */
                w->st = DT_ECOMM;
                dt__dist.waited_out = 1;
                return MPI_ERR_OTHER;
            }
        }
        if (++idle > 64) sched_yield();
    }
    w->shm_seq = k;
    w->shm_reduced = 0;
    /* out of memory: the op is still published and its counters advanced (the
     * peers must not wait forever), and fails on this rank when it completes */
    if (w->shm_out_staged && !w->stage)
        w->stage = dt__pool_get(pg, (size_t)w->count * dt_dtype_size(w->dtype), &w->stage_cap);
    if (staged) memcpy(seg(s, s->rank, w->shm_off), w->in, (size_t)w->count * sizeof(float));
    if (w->kind == DT_OPK_ALLGATHER_SHM && w->in) {   /* not in place: the own chunk first */
        size_t cb = (size_t)w->count * dt_dtype_size(w->dtype);
        memcpy(seg(s, s->rank, w->shm_off) + (size_t)s->rank * cb, w->in, cb);
    }
    shm_desc *d = &s->ctl[s->rank]->desc[k % RING];
    d->off = w->shm_off;
    d->count = (uint64_t)w->count;
    d->avg = (uint64_t)w->avg;
    d->kind = (uint64_t)w->kind;
    d->dtype = (uint64_t)w->dtype;
    atomic_store_explicit(&d->seq1, k + 1, memory_order_release);
    atomic_store_explicit(&s->ctl[s->rank]->ready, k + 1, memory_order_release);
    s->issued = k + 1;
    w->nreq = 0;
    w->fn = staged ? "node-shared allreduce"
            : w->kind == DT_OPK_ALLREDUCE_SHM ? "shared-memory allreduce"
            : w->kind == DT_OPK_REDUCE_SCATTER_SHM ? "shared-memory reduce-scatter" : "shared-memory allgather";
    return MPI_SUCCESS;
}

/* out[i] = ((x0[i] + x1[i]) + x2[i]) + ... (/ size), stored into every rank's buffer.
 * For a power-of-two size, / size is * (1 / size): the same correctly rounded
 * real, so the same bits, without a division per element. */
static void sum_slice(dt_shm *s, size_t off_bytes, size_t b, size_t e, int avg) {
    const size_t off = off_bytes / sizeof(float);
    enum { BLK = 1024 };
    float acc[BLK];
    const float div = (float)s->size;
    const int pow2 = (s->size & (s->size - 1)) == 0;
    const float mul = avg ? 1.0f / div : 1.0f;
    if (s->size == 2) {   /* one fused pass (2 is a power of two) */
        float *restrict x0 = s->data[0] + off, *restrict x1 = s->data[1] + off;
        for (size_t i = b; i < e; i++) {
            float v = (x0[i] + x1[i]) * mul;
            x0[i] = v;
            x1[i] = v;
        }
        return;
    }
    for (size_t i0 = b; i0 < e; i0 += BLK) {
        size_t m = e - i0 < BLK ? e - i0 : BLK;
        const float *x0 = s->data[0] + off + i0;
        for (size_t j = 0; j < m; j++) acc[j] = x0[j];
        for (int q = 1; q < s->size; q++) {
            const float *x = s->data[q] + off + i0;
            for (size_t j = 0; j < m; j++) acc[j] += x[j];
        }
        if (avg && pow2)
            for (size_t j = 0; j < m; j++) acc[j] = acc[j] * mul;
        else if (avg)
            for (size_t j = 0; j < m; j++) acc[j] = acc[j] / div;
        for (int q = 0; q < s->size; q++) memcpy(s->data[q] + off + i0, acc, m * sizeof(float));
    }
}

/* This rank's part of op w, every rank's data published. */
static void do_work(dt_shm *s, dt_work *w) {
    size_t n = (size_t)w->count, N = (size_t)s->size, es = dt_dtype_size(w->dtype);
    if (w->kind == DT_OPK_REDUCE_SCATTER_SHM) {   /* chunk r of every rank's input, rank order */
        for (size_t q = 0; q < N; q++) s->src[q] = seg(s, (int)q, w->shm_off) + (size_t)s->rank * n * es;
        void *dst = w->shm_out_staged ? w->stage : w->out;
        if (dst) dt__sum_ptrs(dst, s->src, (int64_t)n, s->size, w->dtype, w->avg ? s->size : 0);
        return;
    }
    if (w->kind == DT_OPK_ALLREDUCE_NODE) {   /* every rank's slot, in rank order, into our private out */
        if (N == 2 && !w->avg) {   /* one pass (dt__sum_ptrs' bits: x0 + x1) */
            const float *restrict x0 = (const float *)seg(s, 0, w->shm_off), *restrict x1 = (const float *)seg(s, 1, w->shm_off);
            float *restrict o = w->out;
            for (size_t i = 0; i < n; i++) o[i] = x0[i] + x1[i];
            return;
        }
        for (size_t q = 0; q < N; q++) s->src[q] = seg(s, (int)q, w->shm_off);
        dt__sum_ptrs(w->out, s->src, (int64_t)n, s->size, DT_F32, w->avg ? s->size : 0);
        return;
    }
    if (w->kind == DT_OPK_ALLGATHER_SHM) {   /* chunk q of rank q's output into ours */
        char *mine = seg(s, s->rank, w->shm_off);
        for (size_t q = 0; q < N; q++)
            if ((int)q != s->rank) memcpy(mine + q * n * es, seg(s, (int)q, w->shm_off) + q * n * es, n * es);
        return;
    }
    size_t chunk = ((n + N - 1) / N + 15) & ~(size_t)15;   /* 16 floats: whole cache lines if off is aligned */
    size_t b = (size_t)s->rank * chunk < n ? (size_t)s->rank * chunk : n;
    size_t e = b + chunk < n ? b + chunk : n;
    sum_slice(s, w->shm_off, b, e, w->avg);
}

int dt__shm_advance(dt_work *w) {
    dt_shm *s = w->shm;
    uint64_t k = w->shm_seq;
    int changed = 0;
    if (!w->shm_reduced) {
        if (s->failed) {   /* its slices will never be summed: fail instead of waiting forever */
            dt__work_failf(w, DT_ECOMM, "not run: an earlier operation on this shared buffer failed");
            return -1;
        }
        if (s->reduced != k || !all_at_least(s, 0, k + 1)) return 0;   /* earlier slices first */
        for (int q = 0; q < s->size; q++) {
            const shm_desc *d = &s->ctl[q]->desc[k % RING];
            uint64_t seq1 = atomic_load_explicit(&((shm_desc *)d)->seq1, memory_order_acquire);
            if (seq1 != k + 1 || d->off != w->shm_off || d->count != (uint64_t)w->count || d->avg != (uint64_t)w->avg ||
                d->kind != (uint64_t)w->kind || d->dtype != (uint64_t)w->dtype) {
                const char *kq = d->kind < 64 ? dt__kind_name((dt_opkind)d->kind) : "?";
                dt__work_failf(w, DT_ECOMM,
                               "ranks disagree: rank %d runs %s of %llu %s at byte %llu (%s), rank %d %s of %lld %s "
                               "at %zu (%s); every rank must pass the same range of its shared buffer",
                               q, kq, (unsigned long long)d->count, d->dtype < 4 ? dt_dtype_name((dt_dtype)d->dtype) : "?",
                               (unsigned long long)d->off, d->avg ? "avg" : "sum", s->rank, dt__kind_name(w->kind),
                               (long long)w->count, dt_dtype_name(w->dtype), w->shm_off, w->avg ? "avg" : "sum");
                s->failed = 1;
                return -1;
            }
        }
        do_work(s, w);
        atomic_store_explicit(&s->ctl[s->rank]->done, k + 1, memory_order_release);
        s->reduced = k + 1;
        w->shm_reduced = 1;
        changed = 1;
    }
    /* a staged allreduce wrote only its private out: done (its slot is
     * guarded by the next one's start) */
    if (w->kind == DT_OPK_ALLREDUCE_NODE) return 2;
    if (!all_at_least(s, 1, k + 1)) return changed;
    if (w->shm_out_staged) {   /* no peer reads our input any more: out may be written */
        if (!w->stage) {
            dt__work_failf(w, DT_ENOMEM, "out of memory for a %zu-byte staging buffer",
                           (size_t)w->count * dt_dtype_size(w->dtype));
            return -1;
        }
        memcpy(w->out, w->stage, (size_t)w->count * dt_dtype_size(w->dtype));
        dt__pool_put(w->pg, w->stage, w->stage_cap);
        w->stage = NULL;
    }
    return 2;
}

int dt__shm_run(dt_work *w) {
    int rc = dt__shm_start(w);
    if (rc != MPI_SUCCESS) return rc;
    int idle = 0;
    for (;;) {
        int r = dt__shm_advance(w);
        if (r == 2) return MPI_SUCCESS;
        if (r < 0) return -1;
        if (r == 1) idle = 0;
        else if (++idle > 64) sched_yield();
    }
}
