/* The machines under a process group (dist.h section 10).
 *
 * When a group is made, its ranks learn which of them share a machine
 * (MPI_Comm_split_type SHARED, or the test hook DTRAIN_TEST_MACHINES), number
 * the machines by their lowest group rank and, when the group spans machines
 * and some machine has more than one rank, build the communicators of the
 * hierarchical collectives (hier.c):
 *   node[0], node[1]   this machine's ranks (phase 0 and phase 3 of an op)
 *   lane_a/b[j]        for each lane j this rank owns: lane j's owner on
 *                      every machine, ordered by machine (phases 1 and 2)
 * A buffer is cut into `lanes` slices: lcm of the machines' rank counts when
 * that is at most 64 (every rank of a machine owns the same number of lanes,
 * so 3 + 2 ranks gives 6 lanes: 2 per rank on one machine, 3 on the other),
 * else the largest rank count (then some ranks own one more lane). With R
 * ranks on every machine that is R lanes: local rank l talks across machines
 * only with the ranks of local index l, as R concurrent exchanges of S/R.
 *
 * DTRAIN_TEST_MACHINES="0,0,1,1" (one machine id per world rank) makes the
 * library believe in those machines on one real machine: tests exercise the
 * hierarchical paths without namespaces (transport stays shared memory).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dist/dist_internal.h"

#define MAX_LCM_LANES 64

int dt__lane_lo(const dt_topo *t, int l, int R) { return (int)((int64_t)l * t->lanes / R); }
int64_t dt__lane_off(const dt_topo *t, int64_t count, int j) { return count * j / t->lanes; }

int dt__chunk_handler(const dt_topo *t, int m, int k) {
    int R = t->member_off[m + 1] - t->member_off[m];
    return t->members[t->member_off[m] + t->local_of[k] % R];
}

static int64_t gcd64(int64_t a, int64_t b) {
    while (b) { int64_t r = a % b; a = b; b = r; }
    return a;
}

/* This world rank's machine id from DTRAIN_TEST_MACHINES; -1: not set. */
static dt_status test_machine(int *id) {
    *id = -1;
    const char *e = getenv("DTRAIN_TEST_MACHINES");
    if (!e || !*e) return DT_OK;
    int want = dt__dist.world_rank, i = 0;
    const char *p = e;
    for (;;) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v > 1000000 || (*end && *end != ','))
            return DT_ERR(DT_EINVAL, "DTRAIN_TEST_MACHINES=\"%s\": expected machine ids (>= 0) separated by commas", e);
        if (i == want) *id = (int)v;
        i++;
        if (!*end) break;
        p = end + 1;
    }
    if (i != dt__dist.world_size)
        return DT_ERR(DT_EINVAL, "DTRAIN_TEST_MACHINES=\"%s\" names %d ranks, the world has %d", e, i,
                      dt__dist.world_size);
    return DT_OK;
}

static void set_ret(MPI_Comm c) { if (c != MPI_COMM_NULL) MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN); }

/* Lane communicators (hier only). Collective over comm. */
static dt_status make_lanes(dt_topo *t, MPI_Comm comm) {
    t->lane_a = malloc((size_t)t->lanes * sizeof *t->lane_a);
    t->lane_b = malloc((size_t)t->lanes * sizeof *t->lane_b);
    int oom = !t->lane_a || !t->lane_b;
    for (int j = 0; j < t->lanes; j++) {
        if (!oom) t->lane_a[j] = t->lane_b[j] = MPI_COMM_NULL;
        int mine = j >= t->lane_lo && j < t->lane_hi;
        MPI_Comm a = MPI_COMM_NULL;   /* every rank joins every split, even after an allocation failure */
        int rc = MPI_Comm_split(comm, mine ? 0 : MPI_UNDEFINED, t->machine, &a);
        if (rc != MPI_SUCCESS) return dt__mpi_err(rc, "dt_pg: lane MPI_Comm_split");
        if (a == MPI_COMM_NULL) continue;
        MPI_Comm b = MPI_COMM_NULL;
        rc = MPI_Comm_dup(a, &b);
        if (oom || rc != MPI_SUCCESS) {
            MPI_Comm_free(&a);
            if (b != MPI_COMM_NULL) MPI_Comm_free(&b);
            if (rc != MPI_SUCCESS) return dt__mpi_err(rc, "dt_pg: lane MPI_Comm_dup");
            continue;
        }
        set_ret(a);
        set_ret(b);
        t->lane_a[j] = a;
        t->lane_b[j] = b;
    }
    return oom ? DT_ERR(DT_ENOMEM, "dt_pg: out of memory for %d lanes", t->lanes) : DT_OK;
}

dt_status dt__topo_create(dt_pg *pg) {
    dt_topo *t = &pg->topo;
    memset(t, 0, sizeof *t);
    t->node[0] = t->node[1] = t->cross[0] = t->cross[1] = MPI_COMM_NULL;
    MPI_Comm comm = pg->comm[0], local = MPI_COMM_NULL;
    int fake = -1;
    dt_status st = test_machine(&fake);
    if (st != DT_OK) return st;
    int rc = fake >= 0 ? MPI_Comm_split(comm, fake, pg->rank, &local)
                       : MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, pg->rank, MPI_INFO_NULL, &local);
    if (rc != MPI_SUCCESS) return dt__mpi_err(rc, "dt_pg: machines (MPI_Comm_split_type)");
    set_ret(local);
    MPI_Comm_rank(local, &t->local_rank);
    MPI_Comm_size(local, &t->local_size);
    int lowest = pg->rank;   /* key = group rank: local rank 0 is the machine's lowest */
    rc = MPI_Bcast(&lowest, 1, MPI_INT, 0, local);
    int *low_of = malloc((size_t)pg->size * sizeof *low_of);
    t->machine_of = malloc((size_t)pg->size * sizeof *t->machine_of);
    t->local_of = malloc((size_t)pg->size * sizeof *t->local_of);
    t->members = malloc((size_t)pg->size * sizeof *t->members);
    t->member_off = malloc((size_t)(pg->size + 1) * sizeof *t->member_off);
    t->lowest = malloc((size_t)pg->size * sizeof *t->lowest);
    t->world_of = malloc((size_t)pg->size * sizeof *t->world_of);
    if (t->world_of) {
        MPI_Group gg, wg;
        MPI_Comm_group(comm, &gg);
        MPI_Comm_group(MPI_COMM_WORLD, &wg);
        for (int r = 0; r < pg->size; r++) t->world_of[r] = r;
        MPI_Group_translate_ranks(gg, pg->size, t->world_of, wg, t->world_of);
        MPI_Group_free(&gg);
        MPI_Group_free(&wg);
    }
    if (rc == MPI_SUCCESS) {   /* every rank reaches the allgather, even without memory */
        int dummy[1];
        rc = MPI_Allgather(&lowest, 1, MPI_INT, low_of ? low_of : dummy, low_of ? 1 : 0, MPI_INT, comm);
    }
    if (rc != MPI_SUCCESS || !low_of || !t->machine_of || !t->lowest || !t->local_of || !t->members ||
        !t->member_off || !t->world_of) {
        free(low_of);
        MPI_Comm_free(&local);
        dt__topo_free(t);
        return rc != MPI_SUCCESS ? dt__mpi_err(rc, "dt_pg: machines (MPI_Allgather)")
                                 : DT_ERR(DT_ENOMEM, "dt_pg: out of memory for %d ranks", pg->size);
    }
    /* machine index = number of machines whose lowest rank is smaller */
    for (int r = 0; r < pg->size; r++)
        if (low_of[r] == r) t->lowest[t->machines++] = r;
    int *count = calloc((size_t)t->machines, sizeof *count);
    if (!count) {
        free(low_of);
        MPI_Comm_free(&local);
        dt__topo_free(t);
        return DT_ERR(DT_ENOMEM, "dt_pg: out of memory for %d machines", pg->size);
    }
    t->contiguous = 1;
    for (int r = 0, m = 0; r < pg->size; r++) {
        while (t->lowest[m] != low_of[r]) m = (m + 1) % t->machines;   /* lowest[] is sorted: short walk */
        t->machine_of[r] = m;
        count[m]++;
        if (r > 0 && m != t->machine_of[r - 1] && m != t->machine_of[r - 1] + 1) t->contiguous = 0;
    }
    free(low_of);
    /* members machine by machine (ascending inside: MPI's local order, key = rank) */
    t->member_off[0] = 0;
    for (int m = 0; m < t->machines; m++) t->member_off[m + 1] = t->member_off[m] + count[m];
    for (int m = 0; m < t->machines; m++) count[m] = 0;
    for (int r = 0; r < pg->size; r++) {
        int m = t->machine_of[r];
        t->local_of[r] = count[m]++;
        t->members[t->member_off[m] + t->local_of[r]] = r;
    }
    t->machine = t->machine_of[pg->rank];
    t->min_local = t->max_local = count[0];
    int64_t lcm = 1;
    for (int m = 0; m < t->machines; m++) {
        if (count[m] < t->min_local) t->min_local = count[m];
        if (count[m] > t->max_local) t->max_local = count[m];
        if (lcm <= MAX_LCM_LANES) lcm = lcm / gcd64(lcm, count[m]) * count[m];
    }
    free(count);
    t->hier = t->machines > 1 && t->max_local > 1 && !dt__dist.flat;
    if (!t->hier) {
        MPI_Comm_free(&local);
        return DT_OK;
    }
    t->lanes = lcm <= MAX_LCM_LANES ? (int)lcm : t->max_local;
    t->lane_lo = dt__lane_lo(t, t->local_rank, t->local_size);
    t->lane_hi = dt__lane_lo(t, t->local_rank + 1, t->local_size);
    t->node[0] = local;
    rc = MPI_Comm_dup(local, &t->node[1]);
    if (rc != MPI_SUCCESS) {
        t->node[1] = MPI_COMM_NULL;
        dt__topo_free(t);
        return dt__mpi_err(rc, "dt_pg: MPI_Comm_dup");
    }
    set_ret(t->node[1]);
    for (int i = 0; i < 2; i++) {
        rc = MPI_Comm_dup(comm, &t->cross[i]);
        if (rc != MPI_SUCCESS) {
            t->cross[i] = MPI_COMM_NULL;
            dt__topo_free(t);
            return dt__mpi_err(rc, "dt_pg: MPI_Comm_dup");
        }
        set_ret(t->cross[i]);
    }
    /* the chunks each local rank handles, grouped by local rank (hier_shard.c) */
    int R = t->local_size;
    int *at = malloc((size_t)R * sizeof *at);
    t->hand = malloc((size_t)pg->size * sizeof *t->hand);
    t->hand_off = calloc((size_t)R + 1, sizeof *t->hand_off);
    if (at && t->hand && t->hand_off) {
        for (int k = 0; k < pg->size; k++) t->hand_off[t->local_of[dt__chunk_handler(t, t->machine, k)] + 1]++;
        for (int q = 0; q < R; q++) t->hand_off[q + 1] += t->hand_off[q];
        memcpy(at, t->hand_off, (size_t)R * sizeof *at);
        for (int k = 0; k < pg->size; k++) t->hand[at[t->local_of[dt__chunk_handler(t, t->machine, k)]]++] = k;
    }
    /* every machine's handlers, for a bound all ranks share (collectives.c): a
     * chunk's handler is its owner's local index mod the machine's rank count,
     * so single-rank machines' chunks all land on local rank 0 */
    int *cnt = calloc((size_t)t->max_local + 1, sizeof *cnt);
    t->rs_recv_chunks = 0;
    for (int m = 0; cnt && m < t->machines; m++) {
        int Rm = t->member_off[m + 1] - t->member_off[m];
        memset(cnt, 0, (size_t)Rm * sizeof *cnt);
        for (int k = 0; k < pg->size; k++) cnt[t->local_of[k] % Rm]++;
        for (int q = 0; q < Rm; q++)
            if ((int64_t)Rm * cnt[q] > t->rs_recv_chunks) t->rs_recv_chunks = (int64_t)Rm * cnt[q];
    }
    if (!cnt) t->rs_recv_chunks = (int64_t)t->max_local * pg->size;   /* (the largest it can be) */
    free(cnt);
    st = make_lanes(t, comm);   /* (collective: every rank makes it, with or without memory) */
    if (st == DT_OK && (!at || !t->hand || !t->hand_off))
        st = DT_ERR(DT_ENOMEM, "dt_pg: out of memory for %d ranks", pg->size);
    free(at);
    if (st != DT_OK) dt__topo_free(t);
    return st;
}

void dt__topo_free(dt_topo *t) {
    for (int i = 0; i < 2; i++) {
        if (t->node[i] != MPI_COMM_NULL) MPI_Comm_free(&t->node[i]);
        if (t->cross[i] != MPI_COMM_NULL) MPI_Comm_free(&t->cross[i]);
    }
    for (int j = 0; j < t->lanes; j++) {
        if (t->lane_a && t->lane_a[j] != MPI_COMM_NULL) MPI_Comm_free(&t->lane_a[j]);
        if (t->lane_b && t->lane_b[j] != MPI_COMM_NULL) MPI_Comm_free(&t->lane_b[j]);
    }
    free(t->lane_a);
    free(t->lane_b);
    free(t->machine_of);
    free(t->local_of);
    free(t->members);
    free(t->member_off);
    free(t->lowest);
    free(t->world_of);
    free(t->hand);
    free(t->hand_off);
    memset(t, 0, sizeof *t);
    t->node[0] = t->node[1] = t->cross[0] = t->cross[1] = MPI_COMM_NULL;
}

const char *dt__host_of(const dt_pg *pg, int r) {
    if (!dt__dist.hosts || !pg->topo.world_of || r < 0 || r >= pg->size) return "?";
    return dt__dist.hosts[pg->topo.world_of[r]];
}

/* ---- public ---- */

const char *dt_pg_host_name(const dt_pg *pg, int r) { return pg ? dt__host_of(pg, r) : "?"; }

void dt_pg_topology(const dt_pg *pg, dt_pg_topo *out) {
    if (!out) return;
    memset(out, 0, sizeof *out);
    if (!pg) {
        out->machines = out->min_ranks = out->max_ranks = out->local_size = 1;
        return;
    }
    const dt_topo *t = &pg->topo;
    out->machines = t->machines;
    out->machine = t->machine;
    out->local_rank = t->local_rank;
    out->min_ranks = t->min_local;
    out->max_ranks = t->max_local;
    out->local_size = t->local_size;
    out->hierarchical = t->hier;
    out->lanes = t->lanes;
    out->contiguous = t->contiguous;
}

void dt_pg_topology_describe(const dt_pg *pg, char *buf, size_t n) {
    if (!buf || !n) return;
    dt_pg_topo t;
    dt_pg_topology(pg, &t);
    if (!pg || t.min_ranks == t.max_ranks) {
        snprintf(buf, n, "%d machine%s x %d rank%s", t.machines, t.machines == 1 ? "" : "s", t.max_ranks,
                 t.max_ranks == 1 ? "" : "s");
        return;
    }
    /* uneven: "2 machines (3+1 ranks)" */
    size_t o = (size_t)snprintf(buf, n, "%d machines (", t.machines);
    const dt_topo *tp = &pg->topo;
    for (int m = 0; m < tp->machines && o < n; m++) {
        int c = 0;
        for (int r = 0; r < pg->size; r++) c += tp->machine_of[r] == m;
        o += (size_t)snprintf(buf + o, n - o, "%s%d", m ? "+" : "", c);
    }
    if (o < n) snprintf(buf + o, n - o, " ranks)");
}
