/* Fixed-order reductions: every element is summed in rank order in float32.
 *
 * reduce_scatter : all-to-all (rank r receives every rank's copy of chunk r)
 *                  -> local rank-ordered sum into out.                1 phase
 * allreduce(det) : the same on count split into size near-equal chunks
 *                  (alltoallv), then an in-place allgatherv.          2 phases
 * reduce(det)    : gather to root -> rank-ordered sum at root.        1 phase
 *
 * Bytes per rank match a ring reduce-scatter / allreduce, and the result only
 * depends on the inputs, never on chunking or on MPI's algorithm choice.
 * Phase p runs on comm[p] (see progress.c for why).
 */
#include <stdlib.h>
#include "dist/dist_internal.h"

/* Det allreduce layout: counts[0..size) chunk lengths (= alltoallv send counts
 * and allgatherv counts), [size..2size) chunk offsets, [2size..3size) receive
 * counts (all = my chunk length), [3size..4size) receive offsets. */
static int det_layout(dt_work *w) {
    int n = w->pg->size;
    if (!w->counts) {
        w->counts = malloc((size_t)4 * (size_t)n * sizeof(int));
        if (!w->counts) {
            dt__work_failf(w, DT_ENOMEM, "out of memory for %d counts", 4 * n);
            return -1;
        }
    }
    int *len = w->counts, *off = len + n, *rc = off + n, *rd = rc + n;
    int64_t q = w->count / n, r = w->count % n, o = 0;
    for (int j = 0; j < n; j++) {
        len[j] = (int)(q + (j < r));
        off[j] = (int)o;
        o += len[j];
    }
    int mine = len[w->pg->rank];
    for (int i = 0; i < n; i++) {
        rc[i] = mine;
        rd[i] = i * mine;
    }
    return 0;
}

static int get_stage(dt_work *w, size_t bytes) {
    w->stage = dt__pool_get(w->pg, bytes, &w->stage_cap);
    if (!w->stage) {
        dt__work_failf(w, DT_ENOMEM, "out of memory for a %zu-byte staging buffer", bytes);
        return -1;
    }
    return 0;
}

static void put_stage(dt_work *w) {
    dt__pool_put(w->pg, w->stage, w->stage_cap);
    w->stage = NULL;
}

#define CHECK(rc, name) do { int _rc = (rc); if (_rc != MPI_SUCCESS) { dt__work_fail(w, _rc, (name)); return _rc; } } while (0)

/* Issue (blocking: run) the current phase's MPI call. */
static int det_phase(dt_work *w, int blocking) {
    dt_pg *pg = w->pg;
    int n = pg->size;
    MPI_Datatype t = dt__mpi_type(w->dtype);
    size_t es = dt_dtype_size(w->dtype);
    MPI_Comm c = pg->comm[w->phase];
    MPI_Request *rq = &w->req[0];
    w->nreq = 0;
    switch (w->kind) {
    case DT_OPK_REDUCE_SCATTER: {
        if (get_stage(w, (size_t)n * (size_t)w->count * es)) return -1;
        int k = (int)w->count;
        w->fn = blocking ? "MPI_Alltoall" : "MPI_Ialltoall";
        CHECK(blocking ? MPI_Alltoall(w->in, k, t, w->stage, k, t, c)
                       : MPI_Ialltoall(w->in, k, t, w->stage, k, t, c, rq), w->fn);
        break;
    }
    case DT_OPK_REDUCE_DET: {
        int root = pg->rank == w->root;
        if (root && get_stage(w, (size_t)n * (size_t)w->count * es)) return -1;
        int k = (int)w->count;
        w->fn = blocking ? "MPI_Gather" : "MPI_Igather";
        CHECK(blocking ? MPI_Gather(w->in, k, t, w->stage, k, t, w->root, c)
                       : MPI_Igather(w->in, k, t, w->stage, k, t, w->root, c, rq), w->fn);
        break;
    }
    case DT_OPK_ALLREDUCE_DET: {
        if (w->phase == 0) {
            if (det_layout(w)) return -1;
            int *len = w->counts, *off = len + n, *rc = off + n, *rd = rc + n;
            if (get_stage(w, (size_t)n * (size_t)len[pg->rank] * es)) return -1;
            w->fn = blocking ? "MPI_Alltoallv" : "MPI_Ialltoallv";
            CHECK(blocking ? MPI_Alltoallv(w->in, len, off, t, w->stage, rc, rd, t, c)
                           : MPI_Ialltoallv(w->in, len, off, t, w->stage, rc, rd, t, c, rq), w->fn);
        } else {
            int *len = w->counts, *off = len + n;
            w->fn = blocking ? "MPI_Allgatherv" : "MPI_Iallgatherv";
            CHECK(blocking ? MPI_Allgatherv(MPI_IN_PLACE, 0, t, w->out, len, off, t, c)
                           : MPI_Iallgatherv(MPI_IN_PLACE, 0, t, w->out, len, off, t, c, rq), w->fn);
        }
        break;
    }
    default:
        return -1;
    }
    if (!blocking) w->nreq = 1;
    return MPI_SUCCESS;
}

int dt__det_start(dt_work *w) { return det_phase(w, 0); }

/* Local work after the current phase's communication completed. */
int dt__det_finish(dt_work *w) {
    dt_pg *pg = w->pg;
    int n = pg->size, avg = w->avg ? n : 0;
    size_t es = dt_dtype_size(w->dtype);
    switch (w->kind) {
    case DT_OPK_REDUCE_SCATTER:
        dt__sum_ranks(w->out, w->stage, w->count, w->count, n, w->dtype, avg);
        put_stage(w);
        break;
    case DT_OPK_REDUCE_DET:
        if (pg->rank == w->root) dt__sum_ranks(w->out, w->stage, w->count, w->count, n, w->dtype, avg);
        put_stage(w);
        break;
    case DT_OPK_ALLREDUCE_DET:
        if (w->phase == 0) {
            int *len = w->counts, *off = len + n;
            int me = pg->rank;
            dt__sum_ranks((char *)w->out + (size_t)off[me] * es, w->stage, len[me], len[me], n, w->dtype, avg);
            put_stage(w);
        }
        break;
    default:
        break;
    }
    return MPI_SUCCESS;
}

int dt__det_run(dt_work *w) {
    for (w->phase = 0; w->phase < w->nphase; w->phase++) {
        int rc = det_phase(w, 1);
        if (rc != MPI_SUCCESS) return rc;
        rc = dt__det_finish(w);
        if (rc != MPI_SUCCESS) return rc;
    }
    return MPI_SUCCESS;
}
