/* One buffer per machine (dist.h section 10): the ranks of a group that run
 * on one machine share one MPI shared-memory window, allocated whole by the
 * machine's lowest rank (the others allocate nothing and map its segment),
 * so a machine holds one copy where a plain buffer costs one per rank.
 *
 * dt_allgather_machine fills it with the hierarchical allgather's
 * cross-machine phase (hier_shard.c: each chunk goes from its owner to the
 * rank that handles it on every other machine, which receives it straight
 * into the buffer) and, instead of the allgather inside the machine, a
 * barrier of the machine's ranks (node[1]): nothing is copied inside a
 * machine. A group on one machine needs only the barrier; a group of one
 * rank per machine runs a plain in-place allgather (the buffer is private).
 *
 * Invariant: every byte of a machine's buffer is written by one rank per
 * fill (a chunk's owner, or its handler on another machine), and read by
 * the machine's ranks only after the fill's barrier. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include "dist/dist_internal.h"

typedef struct dt_mbuf {
    MPI_Win win;
    MPI_Comm node;          /* this machine's ranks of the group */
    float *base;            /* the machine's buffer (page aligned) */
    size_t count;
    struct dt_mbuf *next;
} dt_mbuf;

int dt__mbuf_holds(const dt_pg *pg, const void *p, size_t bytes) {
    for (const dt_mbuf *b = pg->mbuf; b; b = b->next) {
        const char *s = (const char *)b->base, *e = s + b->count * sizeof(float);
        if ((const char *)p >= s && (const char *)p + bytes <= e) return 1;
    }
    return 0;
}

static void mbuf_destroy(dt_mbuf *b) {
    MPI_Win_unlock_all(b->win);
    MPI_Win_free(&b->win);
    MPI_Comm_free(&b->node);
    free(b);
}

void dt__mbuf_free_all(dt_pg *pg) {
    while (pg->mbuf) {
        dt_mbuf *b = pg->mbuf;
        pg->mbuf = b->next;
        mbuf_destroy(b);
    }
}

/* Why this group's machines cannot share a buffer, or NULL. */
static const char *unshareable(const dt_pg *pg) {
    const dt_topo *t = &pg->topo;
    if (t->machines > 1 && t->max_local > 1 && !t->hier)
        return "the collectives are flat (DTRAIN_COLLECTIVES=flat): a machine's ranks would each receive every chunk";
    return NULL;
}

dt_status dt_pg_alloc_machine(dt_pg *pg, size_t count, const float *init, float **out) {
    if (!out) return DT_ERR(DT_EINVAL, "dt_pg_alloc_machine: NULL out");
    *out = NULL;
    DT_TRY(dt__check_init("dt_pg_alloc_machine"));
    if (!pg) return DT_ERR(DT_EINVAL, "dt_pg_alloc_machine: NULL process group");
    pg->shm_why[0] = 0;
    if (count == 0 || count > ((size_t)1 << 40))
        return DT_ERR(DT_EINVAL, "dt_pg_alloc_machine on %s: count %zu out of range [1, 2^40]", pg->name, count);
    /* blocking collectives on comm[0] follow: nothing of ours may run there */
    DT_TRY(dt_pg_wait_all(pg));
    DT_TRY(dt_barrier(pg, NULL));
    char bmsg[512];
    if (dt__pg_broken(pg, bmsg, sizeof bmsg))
        return DT_ERR(DT_ECOMM, "dt_pg_alloc_machine on %s: group unusable after an earlier failure: %s", pg->name, bmsg);
    const dt_topo *t = &pg->topo;
    size_t bytes = 4096 + ((count * sizeof(float) + 4095) & ~(size_t)4095);
    const char *dir = getenv("OMPI_MCA_osc_sm_backing_directory");
    if (!dir || !*dir) dir = "/dev/shm";
    struct statvfs vfs;
    double avail = statvfs(dir, &vfs) == 0 ? (double)vfs.f_bavail * (double)vfs.f_frsize : -1.0;
    int fits = t->local_rank != 0 || avail < 0 || avail >= (double)bytes * 1.05;
    dt_mbuf *b = calloc(1, sizeof *b);
    /* same count everywhere; every rank learns whether any leader lacks room
     * or any rank memory (each machine's leader alone checks its directory) */
    unsigned long long mm[4] = {count, ~(unsigned long long)count, (unsigned long long)!fits, (unsigned long long)!b};
    int rc = MPI_Allreduce(MPI_IN_PLACE, mm, 4, MPI_UNSIGNED_LONG_LONG, MPI_MAX, pg->comm[0]);
    dt_status st = DT_OK;
    const char *why = unshareable(pg);
    if (rc != MPI_SUCCESS)
        st = dt__mpi_err(rc, "dt_pg_alloc_machine: MPI_Allreduce");
    else if (mm[0] != ~mm[1])
        st = DT_ERR(DT_EINVAL, "dt_pg_alloc_machine on %s: ranks asked for different sizes (%llu to %llu floats)",
                    pg->name, ~mm[1], mm[0]);
    else if (mm[3])
        st = DT_ERR(DT_ENOMEM, "dt_pg_alloc_machine on %s: out of memory", pg->name);
    else if (why)
        snprintf(pg->shm_why, sizeof pg->shm_why, "%s", why);
    else if (mm[2])
        snprintf(pg->shm_why, sizeof pg->shm_why, "a machine's %s has less free space than the %.0f MiB buffer "
                 "(set OMPI_MCA_osc_sm_backing_directory or enlarge it)", dir, (double)bytes / 1048576.0);
    if (st != DT_OK || pg->shm_why[0]) {
        free(b);
        return st;
    }
    b->count = count;
    b->node = MPI_COMM_NULL;
    rc = MPI_Comm_split(pg->comm[0], t->machine, pg->rank, &b->node);
    if (rc != MPI_SUCCESS) {
        free(b);
        return dt__mpi_err(rc, "dt_pg_alloc_machine: MPI_Comm_split");
    }
    MPI_Comm_set_errhandler(b->node, MPI_ERRORS_RETURN);
    void *mine = NULL;
    rc = MPI_Win_allocate_shared((MPI_Aint)(t->local_rank == 0 ? bytes : 0), 1, MPI_INFO_NULL, b->node, &mine, &b->win);
    if (rc != MPI_SUCCESS) {
        MPI_Comm_free(&b->node);
        free(b);
        return dt__mpi_err(rc, "dt_pg_alloc_machine: MPI_Win_allocate_shared");
    }
    MPI_Win_set_errhandler(b->win, MPI_ERRORS_RETURN);
    MPI_Aint sz = 0;
    int du = 0;
    void *lead = NULL;
    MPI_Win_shared_query(b->win, 0, &sz, &du, &lead);
    b->base = (float *)(((uintptr_t)lead + 4095) & ~(uintptr_t)4095);   /* the same rounding on every rank */
    MPI_Win_lock_all(MPI_MODE_NOCHECK, b->win);   /* load/store access for the window's life */
    if (t->local_rank == 0) {
        if (init) memcpy(b->base, init, count * sizeof(float));
        else memset(b->base, 0, count * sizeof(float));
    }
    MPI_Win_sync(b->win);
    rc = MPI_Barrier(b->node);   /* filled before any rank of the machine reads it */
    MPI_Win_sync(b->win);
    if (rc != MPI_SUCCESS) {
        mbuf_destroy(b);
        return dt__mpi_err(rc, "dt_pg_alloc_machine: MPI_Barrier");
    }
    b->next = pg->mbuf;
    pg->mbuf = b;
    *out = b->base;
    return DT_OK;
}

dt_status dt_pg_free_machine(dt_pg *pg, float *p) {
    if (!p) return DT_OK;
    if (!pg) return DT_ERR(DT_EINVAL, "dt_pg_free_machine: NULL process group");
    dt_mbuf **pp = &pg->mbuf;
    while (*pp && (*pp)->base != p) pp = &(*pp)->next;
    if (!*pp)
        return DT_ERR(DT_EINVAL, "dt_pg_free_machine on %s: %p was not allocated by dt_pg_alloc_machine on this group",
                      pg->name, (void *)p);
    dt_status st = dt_pg_wait_all(pg);            /* no operation may still use it */
    if (st == DT_OK) st = dt_barrier(pg, NULL);   /* every rank done reading before MPI_Win_free */
    dt_mbuf *b = *pp;
    *pp = b->next;
    mbuf_destroy(b);
    return st;
}
