/* dt_allreduce_node's staging window (dist.h dt_allreduce_node).
 *
 * A tensor-parallel group all-reduces [B, T, C] activations several times
 * per layer, from private buffers, on one machine. Through MPI each call
 * copies every byte into and out of MPI's own shared segments and meets the
 * peer in a handful of protocol steps; here each rank copies its input once
 * into its slot of a node-shared window, the ranks meet on the window's
 * counters (shm.c's protocol: publish, sum, done), and every rank sums all
 * slots in rank order straight into its output. Every rank computes the
 * whole sum (T reads of the message per rank, T small), so the result is
 * the same bits on every rank without a second exchange, and a rank is done
 * when its sum is: the "barrier before reuse" is the next call's wait for
 * every peer's done counter (shm.c dt__shm_start), usually long passed.
 *
 * The window is one dt_pg_alloc_shared allocation per group (slot = a
 * rank's segment), made at the first call and replaced by a larger one when
 * a call needs more room: both collective, which holds because every rank
 * passes the same count to the same call. Where it cannot be made (the group
 * spans machines, /dev/shm too small) the group remembers it and every
 * later call runs dt_allreduce (deterministic: the same bits). Freed with the group (dt_pg_free
 * frees its shared allocations). */
#include <string.h>
#include "dist/dist_internal.h"
#include "util/log_internal.h"

dt_shm *dt__node_stage(dt_pg *pg, size_t count, dt_status *st) {
    *st = DT_OK;
    if (pg->node_off) return NULL;
    if (pg->node_stage && count <= pg->node_cap) return pg->node_stage;
    if (pg->topo.machines > 1) {   /* known locally, the same on every rank: no collective */
        pg->node_off = 1;
        return NULL;
    }
    /* room for this call, at least double the last window, in whole pages */
    size_t cap = count > 2 * pg->node_cap ? count : 2 * pg->node_cap;
    cap = (cap + 1023) & ~(size_t)1023;
    char why[sizeof pg->shm_why];   /* the user's dt_pg_shared_unavailable stays theirs */
    memcpy(why, pg->shm_why, sizeof why);
    if (pg->node_stage) {
        *st = dt_pg_free_shared(pg, dt__shm_base(pg->node_stage));
        pg->node_stage = NULL;
        pg->node_cap = 0;
        if (*st != DT_OK) return NULL;
    }
    float *base = NULL;
    *st = dt_pg_alloc_shared(pg, cap, &base);
    if (*st == DT_OK && !base) {   /* no room: the same verdict on every rank */
        pg->node_off = 1;
        if (pg->rank == 0)   /* the start-up line promised node-shared memory: say what runs instead */
            dt_log(DT_LOG_WARN, "node-shared window of %zu bytes per rank could not be made (%s); "
                   "these all-reduces go through MPI from now on (the same bits)\n", cap * sizeof(float), pg->shm_why);
    }
    memcpy(pg->shm_why, why, sizeof why);
    if (*st != DT_OK || !base) return NULL;
    size_t off = 0;
    pg->node_stage = dt__shm_find(pg, base, sizeof(float), &off);
    pg->node_cap = cap;
    return pg->node_stage;
}
