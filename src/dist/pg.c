/* Process groups: creation (world, split), teardown, accessors, staging pool. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dist/dist_internal.h"

dt_status dt__mpi_err(int rc, const char *what) {
    char s[MPI_MAX_ERROR_STRING];
    int len = 0;
    s[0] = 0;
    MPI_Error_string(rc, s, &len);
    return DT_ERR(DT_ECOMM, "%s: %s", what, s);
}

/* Takes ownership of comm (already created for this group). */
static dt_status pg_create(MPI_Comm comm, const char *name, dt_pg **out) {
    dt_pg *pg = calloc(1, sizeof *pg);
    if (!pg) {
        MPI_Comm_free(&comm);
        return DT_ERR(DT_ENOMEM, "dt_pg: out of memory");
    }
    pg->comm[0] = comm;
    MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    for (int p = 1; p < DT_NCOMM; p++) {
        int rc = MPI_Comm_dup(comm, &pg->comm[p]);
        if (rc != MPI_SUCCESS) {
            for (int q = 0; q < p; q++) MPI_Comm_free(&pg->comm[q]);
            free(pg);
            return dt__mpi_err(rc, "dt_pg: MPI_Comm_dup");
        }
        MPI_Comm_set_errhandler(pg->comm[p], MPI_ERRORS_RETURN);
    }
    int rc = MPI_Comm_dup(comm, &pg->side);
    if (rc != MPI_SUCCESS) {
        for (int q = 0; q < DT_NCOMM; q++) MPI_Comm_free(&pg->comm[q]);
        free(pg);
        return dt__mpi_err(rc, "dt_pg: MPI_Comm_dup");
    }
    MPI_Comm_set_errhandler(pg->side, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm, &pg->rank);
    MPI_Comm_size(comm, &pg->size);
    snprintf(pg->name, sizeof pg->name, "%s", name);
    pg->mode = dt__dist.mode;
    pg->deterministic = dt__dist.deterministic;
    pg->last_poll = dt_mono_s();
    pthread_mutex_init(&pg->mu, NULL);
    pthread_cond_init(&pg->cv_work, NULL);
    pthread_cond_init(&pg->cv_done, NULL);
    dt_status ts = dt__topo_create(pg);   /* collective: the machines under the group */
    if (ts != DT_OK) {
        for (int q = 0; q < DT_NCOMM; q++) MPI_Comm_free(&pg->comm[q]);
        MPI_Comm_free(&pg->side);
        pthread_mutex_destroy(&pg->mu);
        pthread_cond_destroy(&pg->cv_work);
        pthread_cond_destroy(&pg->cv_done);
        free(pg);
        return ts;
    }
    dt__wd_create(pg);   /* collective, like the communicator */
    if (pg->mode == DT_PROGRESS_THREAD) {
        dt_status s = dt__pg_thread_start(pg);
        if (s != DT_OK) {
            dt__wd_free(pg);
            dt__topo_free(&pg->topo);
            for (int q = 0; q < DT_NCOMM; q++) MPI_Comm_free(&pg->comm[q]);
            MPI_Comm_free(&pg->side);
            free(pg);
            return s;
        }
    }
    dt__registry_add(pg);
    *out = pg;
    return DT_OK;
}

dt_status dt__pg_thread_start(dt_pg *pg) {
    if (pthread_create(&pg->thread, NULL, dt__comm_thread, pg) != 0)
        return DT_ERR(DT_ENOMEM, "dt_pg %s: cannot start the communication thread", pg->name);
    pg->thread_on = 1;
    return DT_OK;
}

dt_status dt_pg_world(dt_pg **out) {
    if (!out) return DT_ERR(DT_EINVAL, "dt_pg_world: NULL out");
    *out = NULL;
    DT_TRY(dt__check_init("dt_pg_world"));
    MPI_Comm c;
    int rc = MPI_Comm_dup(MPI_COMM_WORLD, &c);
    if (rc != MPI_SUCCESS) return dt__mpi_err(rc, "dt_pg_world: MPI_Comm_dup");
    return pg_create(c, "world", out);
}

dt_status dt_pg_split(dt_pg *parent, int color, int key, dt_pg **out) {
    if (!out) return DT_ERR(DT_EINVAL, "dt_pg_split: NULL out");
    *out = NULL;
    DT_TRY(dt__check_init("dt_pg_split"));
    if (!parent) return DT_ERR(DT_EINVAL, "dt_pg_split: NULL parent");
    if (color < 0 && color != DT_PG_NO_COLOR)
        return DT_ERR(DT_EINVAL, "dt_pg_split: color %d (must be >= 0 or DT_PG_NO_COLOR)", color);
    /* The split is a blocking collective on comm[0]: nothing of ours may be
     * running on it (THREAD mode: the comm thread must be idle). */
    DT_TRY(dt_pg_wait_all(parent));
    if (parent->broken) return DT_ERR(DT_ECOMM, "dt_pg_split %s: %s", parent->name, parent->broken_msg);
    /* every rank here before any blocks inside MPI_Comm_split (the barrier's
     * wait polls every group: a peer may still need our work elsewhere) */
    DT_TRY(dt_barrier(parent, NULL));
    MPI_Comm c;
    int rc = MPI_Comm_split(parent->comm[0], color < 0 ? MPI_UNDEFINED : color, key, &c);
    if (rc != MPI_SUCCESS) return dt__mpi_err(rc, "dt_pg_split: MPI_Comm_split");
    if (c == MPI_COMM_NULL) return DT_OK;
    char name[64];
    snprintf(name, sizeof name, "%.40s/%d", parent->name, color);
    return pg_create(c, name, out);
}

dt_status dt_pg_node_of(dt_pg *pg, int *node) {
    DT_TRY(dt__check_init("dt_pg_node_of"));
    if (!pg || !node) return DT_ERR(DT_EINVAL, "dt_pg_node_of: NULL argument");
    for (int r = 0; r < pg->size; r++) node[r] = pg->topo.lowest[pg->topo.machine_of[r]];
    return DT_OK;
}

dt_status dt_pg_free(dt_pg *pg) {
    if (!pg) return DT_OK;
    dt_status st = dt_pg_wait_all(pg);
    if (pg->timed_out) {   /* MPI still owns its requests and may never finish them: leave it all */
        dt__registry_remove(pg);
        dt__dist.timed_out = 1;
        char msg[512];
        dt__pg_broken(pg, msg, sizeof msg);
        return DT_ERR(DT_ECOMM, "dt_pg_free %s: left in place after a collective timeout (abort the job): %s", pg->name, msg);
    }
    if (st == DT_OK && (pg->shm || pg->mbuf || pg->wd) && !dt__pg_broken(pg, NULL, 0))
        st = dt_barrier(pg, NULL);   /* before MPI_Win_free blocks */
    if (pg->thread_on) {
        pthread_mutex_lock(&pg->mu);
        pg->quit = 1;
        pthread_cond_broadcast(&pg->cv_work);
        pthread_mutex_unlock(&pg->mu);
        pthread_join(pg->thread, NULL);
        pg->thread_on = 0;
    }
    while (pg->all) dt__work_free(pg->all);   /* unwaited handles become invalid */
    dt__shm_free_all(pg);                      /* collective, like the communicator */
    dt__mbuf_free_all(pg);
    dt__wd_free(pg);
    dt__topo_free(&pg->topo);
    for (int p = 0; p < DT_NCOMM; p++)
        if (pg->comm[p] != MPI_COMM_NULL) MPI_Comm_free(&pg->comm[p]);
    if (pg->side != MPI_COMM_NULL) MPI_Comm_free(&pg->side);
    for (int i = 0; i < 4; i++) dt_free(pg->pool[i]);
    pthread_mutex_destroy(&pg->mu);
    pthread_cond_destroy(&pg->cv_work);
    pthread_cond_destroy(&pg->cv_done);
    dt__registry_remove(pg);
    free(pg);
    return st;
}

int dt_pg_rank(const dt_pg *pg) { return pg ? pg->rank : 0; }
int dt_pg_size(const dt_pg *pg) { return pg ? pg->size : 1; }

int dt_pg_world_rank(const dt_pg *pg, int r) {
    if (!pg || r < 0 || r >= pg->size) return -1;
    return pg->topo.world_of ? pg->topo.world_of[r] : r;
}
const char *dt_pg_name(const dt_pg *pg) { return pg ? pg->name : "(null)"; }
void dt_pg_set_deterministic(dt_pg *pg, int on) { if (pg) pg->deterministic = on != 0; }
int dt_pg_deterministic(const dt_pg *pg) { return pg ? pg->deterministic : 0; }
void dt_pg_set_trace(dt_pg *pg, dt_trace *t) { if (pg) pg->trace = t; }

/* ---- staging pool: a few buffers kept across operations so large
 * exchanges do not page-fault fresh memory every call ---- */
void *dt__pool_get(dt_pg *pg, size_t bytes, size_t *cap) {
    int best = -1;
    for (int i = 0; i < 4; i++)
        if (pg->pool[i] && pg->pool_bytes[i] >= bytes && (best < 0 || pg->pool_bytes[i] < pg->pool_bytes[best]))
            best = i;
    if (best >= 0) {
        void *p = pg->pool[best];
        *cap = pg->pool_bytes[best];
        pg->pool[best] = NULL;
        pg->pool_bytes[best] = 0;
        return p;
    }
    *cap = bytes ? bytes : 64;
    return dt_alloc(*cap);
}

void dt__pool_put(dt_pg *pg, void *p, size_t cap) {
    if (!p) return;
    int slot = -1;
    for (int i = 0; i < 4; i++) {
        if (!pg->pool[i]) { slot = i; break; }
        if (slot < 0 || pg->pool_bytes[i] < pg->pool_bytes[slot]) slot = i;
    }
    if (pg->pool[slot] && pg->pool_bytes[slot] >= cap) { dt_free(p); return; }
    dt_free(pg->pool[slot]);
    pg->pool[slot] = p;
    pg->pool_bytes[slot] = cap;
}
