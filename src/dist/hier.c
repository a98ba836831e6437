/* The hierarchical allreduce (dist.h section 10): for a group that spans
 * machines, bytes cross between machines once per machine, not per rank.
 *
 *   phase 0  node[0]     alltoallv: local rank l receives every local rank's
 *                        copy of l's lanes (R rows of its range, in stage);
 *                        plain: summed in local rank order into out[range]
 *   phase 1  lane_b[j]   deterministic only: receive the running float32 sum
 *                        of each own lane j from the previous machine
 *   phase 2  lane_a[j]   plain: all-reduce each own lane among its owners
 *                        (segmented, like the flat reduction); deterministic:
 *                        add this machine's rows in rank order to the running
 *                        sum, send it on (lane_b[j]) unless last, and take the
 *                        total from a broadcast by the last machine
 *   phase 3  node[1]     allgatherv: every local rank's range into out
 * With w->cross_dt (F32 payload, DT_RED_CROSS_*), phase 2 converts the own
 * range to 16 bits in stage row R, all-reduces that, and widens it back.
 *
 * Every op has the 4 phases (an unused phase issues nothing) so phase p
 * always runs on the same communicators: with the engine's rule that phase p
 * starts in issue order (progress.c), each communicator sees issue order on
 * every rank, and the chain's receives (phase 1) and sends (phase 2) on
 * lane_b[j] match in issue order (MPI never reorders messages between one
 * pair on one communicator and tag).
 *
 * w->counts: [0,R) lane-range lengths of each local rank (alltoallv send
 * counts = allgatherv counts), [R,2R) their offsets, [2R,3R) receive counts
 * (all = own range), [3R,4R) receive offsets. stage: R + 1 rows of the own
 * range (row R: the chain's running sum).
 */
#include <limits.h>
#include <stdlib.h>
#include "dist/dist_internal.h"

#define CHECK(rc, name) do { int _rc = (rc); if (_rc != MPI_SUCCESS) { dt__work_fail(w, _rc, (name)); return _rc; } } while (0)

static int64_t lane_off(const dt_work *w, int j) { return dt__lane_off(&w->pg->topo, w->count, j); }

static int layout(dt_work *w) {
    const dt_topo *t = &w->pg->topo;
    int R = t->local_size;
    if (!w->counts) {
        w->counts = malloc((size_t)4 * (size_t)R * sizeof(int));
        if (!w->counts) {
            dt__work_failf(w, DT_ENOMEM, "out of memory for %d counts", 4 * R);
            return -1;
        }
    }
    int *len = w->counts, *off = len + R, *rc = off + R, *rd = rc + R;
    for (int q = 0; q < R; q++) {
        int64_t a = lane_off(w, dt__lane_lo(t, q, R)), b = lane_off(w, dt__lane_lo(t, q + 1, R));
        off[q] = (int)a;
        len[q] = (int)(b - a);
    }
    int mine = len[t->local_rank];
    for (int q = 0; q < R; q++) {
        rc[q] = mine;
        rd[q] = q * mine;
    }
    return 0;
}

/* Own range: elements [*off, *off + *n). */
static void own_range(const dt_work *w, int64_t *off, int64_t *n) {
    const dt_topo *t = &w->pg->topo;
    *off = lane_off(w, t->lane_lo);
    *n = lane_off(w, t->lane_hi) - *off;
}

static char *row(const dt_work *w, int r, int64_t n) {
    return (char *)w->stage + (size_t)r * (size_t)n * dt_dtype_size(w->dtype);
}

static int64_t seg_elems(const dt_work *w) {
    int64_t s = (int64_t)(dt__dist.segment_bytes / dt_dtype_size(w->dtype));
    return s > 0 ? s : 1;
}

/* Requests phase p issues (an upper bound). */
static int phase_requests(const dt_work *w, int p) {
    const dt_topo *t = &w->pg->topo;
    int own = t->lane_hi - t->lane_lo;
    if (p == 1) return w->hier_det ? own : 0;
    if (p != 2) return 1;
    if (w->hier_det) return 2 * own;
    int n = 0;
    for (int j = t->lane_lo; j < t->lane_hi; j++) {
        int64_t len = lane_off(w, j + 1) - lane_off(w, j);
        n += (int)((len + seg_elems(w) - 1) / seg_elems(w));
    }
    return n > 0 ? n : 1;
}

/* Issue phase w->phase. */
static int hier_phase(dt_work *w) {
    dt_pg *pg = w->pg;
    const dt_topo *t = &pg->topo;
    MPI_Datatype ty = dt__mpi_type(w->dtype);
    size_t es = dt_dtype_size(w->dtype);
    int R = t->local_size;
    int64_t mo, mn;
    own_range(w, &mo, &mn);
    if (dt__req_reserve(w, phase_requests(w, w->phase))) return -1;
    w->nreq = 0;
    switch (w->phase) {
    case 0: {
        if (layout(w)) return -1;
        size_t bytes = (size_t)(R + 1) * (size_t)mn * es;
        w->stage = dt__pool_get(pg, bytes ? bytes : 64, &w->stage_cap);
        if (!w->stage) {
            dt__work_failf(w, DT_ENOMEM, "out of memory for a %zu-byte staging buffer", bytes);
            return -1;
        }
        int *len = w->counts, *off = len + R, *rc = off + R, *rd = rc + R;
        w->fn = "MPI_Ialltoallv";
        CHECK(MPI_Ialltoallv(w->in, len, off, ty, w->stage, rc, rd, ty, t->node[0], &w->req[w->nreq++]), w->fn);
        break;
    }
    case 1:
        if (!w->hier_det || t->machine == 0) break;
        w->fn = "MPI_Irecv";
        for (int j = t->lane_lo; j < t->lane_hi; j++) {
            int64_t a = lane_off(w, j), n = lane_off(w, j + 1) - a;
            CHECK(MPI_Irecv(row(w, R, mn) + (size_t)(a - mo) * es, (int)n, ty, t->machine - 1, 0, t->lane_b[j],
                            &w->req[w->nreq++]), w->fn);
        }
        break;
    case 2:
        for (int j = t->lane_lo; j < t->lane_hi; j++) {
            int64_t a = lane_off(w, j), n = lane_off(w, j + 1) - a;
            char *o = (char *)w->out + (size_t)a * es;
            if (w->hier_det) {
                if (t->machine + 1 < t->machines) {
                    w->fn = "MPI_Isend";
                    CHECK(MPI_Isend(row(w, R, mn) + (size_t)(a - mo) * es, (int)n, ty, t->machine + 1, 0,
                                    t->lane_b[j], &w->req[w->nreq++]), w->fn);
                }
                w->fn = "MPI_Ibcast";
                CHECK(MPI_Ibcast(o, (int)n, ty, t->machines - 1, t->lane_a[j], &w->req[w->nreq++]), w->fn);
                continue;
            }
            w->fn = "MPI_Iallreduce";
            dt_dtype wt = w->dtype;
            size_t wes = es;
            if (w->cross_dt != DT_F32) {   /* 16 bits across: row R holds the own range, converted */
                wt = w->cross_dt;
                wes = dt_dtype_size(wt);
                o = row(w, R, mn) + (size_t)(a - mo) * wes;
                dt_convert(o, wt, (char *)w->out + (size_t)a * es, DT_F32, (size_t)n);
            }
            for (int64_t s = 0; s < n; s += seg_elems(w)) {
                int k = (int)(n - s < seg_elems(w) ? n - s : seg_elems(w));
                CHECK(MPI_Iallreduce(MPI_IN_PLACE, o + (size_t)s * wes, k, dt__mpi_type(wt), dt__mpi_sum(wt),
                                     t->lane_a[j], &w->req[w->nreq++]), w->fn);
            }
        }
        break;
    default: {
        int *len = w->counts, *off = len + R;
        w->fn = "MPI_Iallgatherv";
        CHECK(MPI_Iallgatherv(MPI_IN_PLACE, 0, ty, w->out, len, off, ty, t->node[1], &w->req[w->nreq++]), w->fn);
        break;
    }
    }
    return MPI_SUCCESS;
}

int dt__hier_start(dt_work *w) { return hier_phase(w); }

int dt__hier_finish(dt_work *w) {
    const dt_topo *t = &w->pg->topo;
    size_t es = dt_dtype_size(w->dtype);
    int R = t->local_size;
    int64_t mo, mn;
    own_range(w, &mo, &mn);
    char *mine = (char *)w->out + (size_t)mo * es;
    if (w->phase == 0 && !w->hier_det) {
        dt__sum_ranks(mine, w->stage, mn, mn, R, w->dtype, 0);
    } else if (w->phase == 1 && w->hier_det) {
        /* running sum: (prefix + row 0) + row 1 ..., float32 (F32 only) */
        const void **src = malloc((size_t)(R + 1) * sizeof *src);
        if (!src) {
            dt__work_failf(w, DT_ENOMEM, "out of memory for %d pointers", R + 1);
            return -1;
        }
        int n = 0;
        if (t->machine > 0) src[n++] = row(w, R, mn);
        for (int q = 0; q < R; q++) src[n++] = row(w, q, mn);
        int last = t->machine + 1 == t->machines;
        dt__sum_ptrs(last ? mine : row(w, R, mn), src, mn, n, w->dtype, last && w->avg ? w->pg->size : 0);
        free(src);
    } else if (w->phase == 2 && !w->hier_det) {
        if (w->cross_dt != DT_F32) dt_convert(mine, DT_F32, row(w, R, mn), w->cross_dt, (size_t)mn);
        if (w->avg) dt__scale_div(mine, mn, w->dtype, w->pg->size);
    }
    return MPI_SUCCESS;
}
