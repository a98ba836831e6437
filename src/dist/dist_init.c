/* MPI start-up / shut-down, tuned Open MPI defaults, the registry of groups. */
#include <stdlib.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <string.h>
#include <strings.h>
#include "dist/dist_internal.h"

dt_dist_state dt__dist;

/* Built-in progress mode (see the measurements in dtrain/dist.h). */
#define DT_DEFAULT_PROGRESS DT_PROGRESS_POLL

dt_status dt__check_init(const char *fn) {
    if (!dt__dist.initialized) return DT_ERR(DT_ESTATE, "%s: dt_dist_init has not been called", fn);
    return DT_OK;
}

/* Set an Open MPI parameter unless the user already chose a value (an
 * OMPI_MCA_* variable, which is also what `mpiexec --mca` exports). */
/* Keep freed memory in the heap instead of returning it to the kernel.
 * Open MPI allocates and frees a temporary buffer per reduction segment; with
 * glibc's defaults every such buffer is a fresh mmap whose pages fault in on
 * each call (expensive under virtualisation). Measured with bench_train W3,
 * 2 ranks on shared memory, denormals flushed: 84-85 ms/step with glibc's
 * defaults, 82 with these settings. (An earlier, larger figure was mostly the
 * denormal slow-down, see dt_cpu_set_flush_denormal.) DTRAIN_KEEP_MALLOC=1
 * skips it. */
static void keep_heap_memory(void) {
#ifdef __GLIBC__
    if (getenv("DTRAIN_KEEP_MALLOC")) return;
    mallopt(M_MMAP_THRESHOLD, 32 << 20);    /* glibc's maximum on 64-bit */
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
#endif
}

static void set_default(const char *name, const char *value) {
    if (!getenv(name)) setenv(name, value, 0);
}

/* Measured on this machine (shared/README.md, shared/tools/netsim.sh):
 *  - btl_tcp_flags: the default includes emulated RDMA put, which makes TCP
 *    transfers effectively half duplex; send,inplace,... runs both directions
 *    at once (~2x on a 1 Gbit/s link).
 *  - coll_libnbc_iallreduce_algorithm=1: ring MPI_Iallreduce; libnbc's default
 *    (binomial for small groups) moves about twice the bytes per link.
 *  - reduce-scatter: Open MPI's MPI_Reduce_scatter_block runs at 1/3 of a TCP
 *    link and its libnbc variants are as slow (and on shared memory the
 *    tuned "recursive halving" alternative drops to 0.2 GB/s). We do not
 *    tune it: dt_reduce_scatter uses an all-to-all exchange plus a local sum,
 *    which runs at link speed on both (71 ms vs 215 ms for 16 MiB, 2 ranks,
 *    1 Gbit/s).
 *  - btl_tcp_eager_limit=4 MiB: above the eager limit (64 KiB) a message
 *    needs a rendezvous handshake, i.e. both ranks inside MPI, which they are
 *    not while backward computes; eager messages stream into the socket
 *    buffers on their own. bench_train W1, 1 Gbit/s netsim, 1 MiB buckets:
 *    exposed wait 51 ms/step -> 26-34 (of 370-380 without overlap), so the
 *    share hidden goes from 86% to 91-93%. Costs receive-side buffering of
 *    up to 4 MiB per unexpected message.
 *  - mpi_yield_when_idle (THREAD mode only): a communication thread blocked
 *    in MPI otherwise spins and steals the compute thread's core.
 */
static void set_mca_defaults(dt_progress_mode mode) {
    set_default("OMPI_MCA_btl_tcp_flags", "send,inplace,need-ack,need-csum");
    set_default("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "1");
    set_default("OMPI_MCA_btl_tcp_eager_limit", "4194304");
    if (mode == DT_PROGRESS_THREAD) set_default("OMPI_MCA_mpi_yield_when_idle", "1");
}

static dt_progress_mode resolve_mode(const dt_dist_opts *o) {
    if (o && (o->progress == DT_PROGRESS_POLL || o->progress == DT_PROGRESS_THREAD)) return o->progress;
    const char *e = getenv("DTRAIN_PROGRESS");
    if (e && !strcasecmp(e, "poll")) return DT_PROGRESS_POLL;
    if (e && !strcasecmp(e, "thread")) return DT_PROGRESS_THREAD;
    return DT_DEFAULT_PROGRESS;
}

dt_status dt_dist_init(int *argc, char ***argv, const dt_dist_opts *opts) {
    if (dt__dist.initialized) return DT_ERR(DT_ESTATE, "dt_dist_init: already initialized");
    if (opts && (opts->progress < DT_PROGRESS_DEFAULT || opts->progress > DT_PROGRESS_THREAD))
        return DT_ERR(DT_EINVAL, "dt_dist_init: unknown progress mode %d", (int)opts->progress);
    if (opts && (opts->collectives < DT_COLL_DEFAULT || opts->collectives > DT_COLL_FLAT))
        return DT_ERR(DT_EINVAL, "dt_dist_init: unknown collectives mode %d", (int)opts->collectives);
    dt_dist_state *g = &dt__dist;
    memset(g, 0, sizeof *g);
    g->mode = resolve_mode(opts);
    g->tick_s = (opts && opts->tick_ms > 0) ? opts->tick_ms * 1e-3 : 0.5e-3;
    g->segment_bytes = (opts && opts->segment_bytes) ? opts->segment_bytes : (size_t)4 << 20;
    if (g->segment_bytes < 64) g->segment_bytes = 64;
    g->deterministic = opts ? (opts->deterministic != 0) : 0;
    g->stall_warn_s = opts && opts->stall_warn_s != 0 ? opts->stall_warn_s : 60.0;
    g->timeout_s = opts ? opts->collective_timeout_s : 0.0;
    g->debug = opts ? opts->debug_collectives != 0 : 0;
    dt_collectives_mode cm = opts ? opts->collectives : DT_COLL_DEFAULT;
    if (cm == DT_COLL_DEFAULT) {
        const char *e = getenv("DTRAIN_COLLECTIVES");
        if (e && *e && strcasecmp(e, "flat") && strcasecmp(e, "hierarchical"))
            return DT_ERR(DT_EINVAL, "DTRAIN_COLLECTIVES=%s: expected flat or hierarchical", e);
        cm = e && !strcasecmp(e, "flat") ? DT_COLL_FLAT : DT_COLL_HIERARCHICAL;
    }
    g->flat = cm == DT_COLL_FLAT;

    int already = 0, finalized = 0, provided = MPI_THREAD_SINGLE;
    MPI_Initialized(&already);
    MPI_Finalized(&finalized);
    if (finalized) return DT_ERR(DT_ESTATE, "dt_dist_init: MPI has already been finalized");
    if (already) {
        MPI_Query_thread(&provided);
    } else {
        if (!(opts && opts->keep_mpi_env)) {
            set_mca_defaults(g->mode);
            keep_heap_memory();
        }
        int want = g->mode == DT_PROGRESS_THREAD ? MPI_THREAD_MULTIPLE : MPI_THREAD_SERIALIZED;
        int rc = MPI_Init_thread(argc, argv, want, &provided);
        if (rc != MPI_SUCCESS) return DT_ERR(DT_ECOMM, "dt_dist_init: MPI_Init_thread failed (%d)", rc);
        g->we_init_mpi = 1;
    }
    /* THREAD mode needs concurrent MPI calls from the comm thread(s). */
    if (g->mode == DT_PROGRESS_THREAD && provided < MPI_THREAD_MULTIPLE) g->mode = DT_PROGRESS_POLL;

    MPI_Comm_rank(MPI_COMM_WORLD, &g->world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g->world_size);
    int flag = 0;
    int *ub = NULL;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag);
    g->tag_ub = (flag && ub) ? *ub : 32767;
    /* host names, for messages that name where a rank runs */
    g->hosts = calloc((size_t)g->world_size, sizeof *g->hosts);
    char name[MPI_MAX_PROCESSOR_NAME + 1] = "";
    int nlen = 0;
    MPI_Get_processor_name(name, &nlen);
    char mine[64];
    snprintf(mine, sizeof mine, "%.63s", name);
    int hrc = MPI_Allgather(mine, 64, MPI_CHAR, g->hosts ? (void *)g->hosts : (void *)mine, g->hosts ? 64 : 0,
                            MPI_CHAR, MPI_COMM_WORLD);
    if (hrc != MPI_SUCCESS || !g->hosts) {
        free(g->hosts);
        g->hosts = NULL;
    }
    int rc = dt__half_ops_create();
    if (rc != MPI_SUCCESS) {
        if (g->we_init_mpi) MPI_Finalize();
        return DT_ERR(DT_ECOMM, "dt_dist_init: cannot create 16-bit reduction ops (%d)", rc);
    }
    g->last_tick = dt_mono_s();
    g->initialized = 1;
    return DT_OK;
}

dt_status dt_dist_finalize(void) {
    dt_dist_state *g = &dt__dist;
    if (!g->initialized) return DT_ERR(DT_ESTATE, "dt_dist_finalize: not initialized");
    dt_status first = DT_OK;
    while (g->groups) {
        dt_status s = dt_pg_free(g->groups);
        if (s != DT_OK && first == DT_OK) first = s;
    }
    dt__half_ops_free();
    free(g->hosts);
    g->hosts = NULL;
    int fin = 0;
    MPI_Finalized(&fin);
    if (g->timed_out) {   /* MPI_Finalize would wait for the collective that never came */
        g->initialized = 0;
        return DT_ERR(DT_ECOMM, "dt_dist_finalize: MPI not finalized after a collective timeout (abort the job)");
    }
    if (g->we_init_mpi && !fin) MPI_Finalize();
    g->initialized = 0;
    return first;
}

int dt_dist_initialized(void) { return dt__dist.initialized; }
int dt_dist_collective_timed_out(void) { return dt__dist.waited_out; }
int dt_dist_timeout_first_live(void) { return dt__dist.waited_out ? dt__dist.first_live1 - 1 : -1; }
dt_progress_mode dt_dist_progress_mode(void) { return dt__dist.mode; }
int dt_dist_world_rank(void) { return dt__dist.world_rank; }
int dt_dist_world_size(void) { return dt__dist.initialized ? dt__dist.world_size : 1; }

void dt__registry_add(dt_pg *pg) {
    pg->reg_next = dt__dist.groups;
    dt__dist.groups = pg;
}

void dt__registry_remove(dt_pg *pg) {
    for (dt_pg **p = &dt__dist.groups; *p; p = &(*p)->reg_next)
        if (*p == pg) { *p = pg->reg_next; return; }
}

void dt_dist_poll(void) {
    for (dt_pg *p = dt__dist.groups; p; p = p->reg_next) dt_pg_poll(p);
    dt__dist.last_tick = dt_mono_s();
}

void dt_dist_tick(void) {
    if (!dt__dist.groups) return;
    double t = dt_mono_s();
    if (t - dt__dist.last_tick < dt__dist.tick_s) return;
    dt_dist_poll();
}
