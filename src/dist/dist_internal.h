/* Private state of the dist layer (used only by the files in src/dist). */
#ifndef DTRAIN_DIST_INTERNAL_H
#define DTRAIN_DIST_INTERNAL_H

#include <mpi.h>
#include <pthread.h>
#include <stdint.h>
#include "dtrain/dist.h"
#include "util/clock.h"

/* Phase p of a multi-phase operation runs on its own communicators (comm[p]
 * for the flat kinds; topo.node/lane_*[p] for the hierarchical one).
 * Invariant: on every communicator, operations start in issue order on every
 * rank (see progress.c). DT_NCOMM: the full-group duplicates in comm[]. */
#define DT_MAX_PHASE 4
#define DT_NCOMM 2

typedef enum dt_opkind {
    DT_OPK_ALLREDUCE,       /* MPI reduction, segmented; 1 phase */
    DT_OPK_ALLREDUCE_DET,   /* alltoallv -> rank-ordered sum -> allgatherv; 2 phases */
    DT_OPK_REDUCE_SCATTER,  /* alltoall -> rank-ordered sum; 1 phase */
    DT_OPK_ALLGATHER,
    DT_OPK_BROADCAST,
    DT_OPK_REDUCE,          /* MPI reduction to root, segmented */
    DT_OPK_REDUCE_DET,      /* gather -> rank-ordered sum at root */
    DT_OPK_SEND,
    DT_OPK_RECV,
    DT_OPK_BARRIER,
    DT_OPK_ALLREDUCE_SHM,   /* in place on node-shared memory: rank-ordered sum of a slice each */
    DT_OPK_REDUCE_SCATTER_SHM,   /* input in node-shared memory: rank r sums chunk r of every rank's input */
    DT_OPK_ALLGATHER_SHM,        /* output in node-shared memory: rank r copies every rank's chunk */
    DT_OPK_ALLREDUCE_HIER,       /* across machines: inside -> across (per lane) -> inside; 4 phases (hier.c) */
    DT_OPK_REDUCE_SCATTER_HIER,  /* across machines: inside -> across (hier_shard.c); 4 phases */
    DT_OPK_ALLGATHER_HIER,       /* across machines: across -> inside (hier_shard.c); 4 phases */
    DT_OPK_ALLREDUCE_NODE,       /* private buffers staged through the group's node-shared window: every
                                    rank sums every slot in rank order (node_allreduce.c, shm.c) */
} dt_opkind;

/* The operations that run on node-shared memory (shm.c), not through MPI. */
static inline int dt__kind_is_shm(dt_opkind k) {
    return k == DT_OPK_ALLREDUCE_SHM || k == DT_OPK_REDUCE_SCATTER_SHM || k == DT_OPK_ALLGATHER_SHM ||
           k == DT_OPK_ALLREDUCE_NODE;
}

typedef struct dt_shm dt_shm;
typedef struct dt_wd dt_wd;

/* The machines under a group (topology.c), learned when the group is made.
 * Machines are numbered by their lowest group rank; a buffer is cut into
 * `lanes` near-equal slices, and local rank l of a machine with R ranks owns
 * lanes [lane_lo(l), lane_hi(l)) = [l*lanes/R, (l+1)*lanes/R): every lane has
 * exactly one owner per machine. Lane j's communicators hold those owners,
 * ordered by machine. hier: collectives run hierarchically (machines > 1,
 * some machine has > 1 rank, not DTRAIN_COLLECTIVES=flat). */
typedef struct dt_topo {
    int machines, machine;          /* count; this rank's machine index */
    int local_rank, local_size;     /* inside this rank's machine */
    int min_local, max_local;       /* ranks per machine */
    int contiguous;                 /* machine m holds consecutive group ranks, in machine order */
    int *machine_of;                /* [size] machine index of each group rank */
    int *local_of;                  /* [size] index of each group rank on its machine */
    int *members;                   /* [size] group ranks machine by machine, ascending in each */
    int *member_off;                /* [machines + 1] machine m's ranks: members[member_off[m] ..) */
    int *lowest;                    /* [machines] lowest group rank of each machine */
    int *world_of;                  /* [size] world rank of each group rank */
    int hier;
    int lanes, lane_lo, lane_hi;    /* (hier) lanes; the ones this rank owns */
    MPI_Comm node[2];               /* (hier) this machine's ranks: [0] phase 0, [1] phase 3 */
    MPI_Comm *lane_a, *lane_b;      /* (hier) [lanes]: NULL comm for lanes not owned */
    int *hand, *hand_off;           /* (hier) the chunks this machine's local rank q handles (reduce-
                                       scatter, allgather): hand[hand_off[q] .. hand_off[q + 1]),
                                       ascending; hand_off has local_size + 1 entries */
    int64_t rs_recv_chunks;         /* (hier) the largest R x |H(rank)| over every machine: the chunks a
                                       reduce-scatter's handler receives at most (the same on every rank) */
    MPI_Comm cross[2];              /* (hier) the whole group, for point-to-point across machines:
                                       [0] phase 2 of reduce-scatter / allgather, [1] their chain */
} dt_topo;

struct dt_work {
    dt_pg *pg;
    dt_work *next;              /* pg in-flight FIFO (poll) / run queue (thread) */
    dt_work *all_prev, *all_next;   /* every live handle of pg (owner thread only) */
    dt_opkind kind;
    uint64_t seq;
    const void *in;
    void *out;
    int64_t count;
    dt_dtype dtype;
    int avg;                    /* DT_RED_AVG */
    int root;                   /* root (bcast/reduce) or peer (send/recv) */
    int tag;
    int nphase, phase, started; /* current phase; started: its requests are live */
    MPI_Request *req;           /* live requests of the current phase */
    MPI_Status *sts;
    int nreq, req_cap;
    MPI_Request req_small[2];
    MPI_Status sts_small[2];
    const char *fn;             /* MPI function behind the live requests */
    void *stage;                /* pool buffer (det / reduce-scatter staging) */
    size_t stage_cap;
    int *counts;                /* alltoallv / allgatherv counts+displs (det allreduce) */
    /* completion; guarded by pg->mu in THREAD mode */
    volatile int done;
    dt_status st;
    char msg[512];
    dt_trace *trace;
    double t_begin_us;
    char name[48];              /* "allreduce 1.0MiB" */
    int internal;               /* blocking call: waited by the library itself */
    /* DT_OPK_*_SHM */
    dt_shm *shm;
    uint64_t shm_seq;           /* this op's number on shm (0, 1, ...) */
    size_t shm_off;             /* byte offset in every rank's segment of the shared buffer: out
                                   (allreduce, allgather) or in (reduce-scatter) */
    int shm_reduced;            /* this rank's slice is summed and published */
    int shm_out_staged;         /* reduce-scatter whose out overlaps a peer's chunk of this rank's
                                   input: summed into w->stage, copied to out on completion */
    uint64_t coll_idx;          /* collectives (not p2p) issued on pg before this one */
    int hier_det;               /* DT_OPK_ALLREDUCE_HIER: rank-ordered chain across machines */
    dt_dtype cross_dt;          /* DT_OPK_ALLREDUCE_HIER of F32: 16-bit across machines; 0 (F32): off */
    int machine_out;            /* DT_OPK_ALLGATHER_HIER into a machine buffer (machine_buf.c): phase 3
                                   is a barrier of the machine's ranks, nothing copied */
};

struct dt_pg {
    MPI_Comm comm[DT_NCOMM];
    MPI_Comm side;              /* out of band: configuration agreement (agree.c) */
    int rank, size;
    char name[64];
    dt_progress_mode mode;
    int deterministic;
    uint64_t seq;
    dt_trace *trace;
    dt_work *head, *tail;       /* POLL: in flight; THREAD: queued, not yet started */
    int inflight;               /* issued and not yet completed */
    dt_work *all;               /* live handles (owner thread) */
    double last_poll;           /* seconds (monotonic) */
    /* a failed collective breaks the group */
    int broken;
    char broken_msg[512];
    /* staging buffers reused across operations */
    void *pool[4];
    size_t pool_bytes[4];
    /* THREAD mode */
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_done;
    pthread_t thread;
    int thread_on, quit;
    dt_shm *shm;                /* node-shared allocations (shm.c) */
    struct dt_mbuf *mbuf;       /* one-per-machine buffers (machine_buf.c) */
    dt_wd *wd;                  /* watchdog: every rank's progress on this machine (watchdog.c) */
    uint64_t ncoll;             /* collectives issued (p2p not counted) */
    dt_work *running;           /* THREAD: the operation the comm thread runs (pg->mu) */
    int timed_out;              /* a wait passed the collective timeout: nothing more completes */
    char shm_why[256];          /* why the last dt_pg_alloc_shared gave NULL */
    dt_shm *node_stage;         /* dt_allreduce_node's staging window (node_allreduce.c), or NULL */
    size_t node_cap;            /* its floats per rank */
    int node_off;               /* 1: it cannot be made here; the MPI path runs instead */
    dt_topo topo;               /* machines under the group (topology.c) */
    /* registry of live groups */
    dt_pg *reg_next;
};

/* ---- topology.c ----
 * create: collective over comm (the group's comm[0]), at group creation.
 * free: with the group. lane_lo/lane_hi: local rank l's lanes on a machine
 * of R ranks. lane_elems: element offset of lane j of count. */
dt_status dt__topo_create(dt_pg *pg);
void dt__topo_free(dt_topo *t);
const char *dt__host_of(const dt_pg *pg, int r);   /* group rank r's host name */
int dt__lane_lo(const dt_topo *t, int l, int R);
int64_t dt__lane_off(const dt_topo *t, int64_t count, int j);
/* Group rank that handles rank k's chunk on machine m (reduce-scatter,
 * allgather): the rank of m whose local index is k's local index mod m's
 * rank count (k itself on k's machine). */
int dt__chunk_handler(const dt_topo *t, int m, int k);

/* ---- hier.c, hier_shard.c: hierarchical allreduce, reduce-scatter and
 * allgather (phases as in collectives.c) ---- */
int dt__hier_start(dt_work *w);
int dt__hier_finish(dt_work *w);
int dt__hshard_start(dt_work *w);
int dt__hshard_finish(dt_work *w);

/* ---- dist_init.c: process-wide state ---- */
typedef struct dt_dist_state {
    int initialized, we_init_mpi;
    dt_progress_mode mode;
    double tick_s;
    size_t segment_bytes;
    int deterministic;
    int world_rank, world_size;
    int tag_ub;
    dt_pg *groups;              /* registry */
    double stall_warn_s;        /* <= 0: off */
    double timeout_s;           /* <= 0: off */
    int debug;                  /* fingerprint every collective across ranks first */
    int flat;                   /* never hierarchical (dt_dist_opts.collectives / DTRAIN_COLLECTIVES) */
    char (*hosts)[64];          /* [world_size] each world rank's host name (MPI_Get_processor_name) */
    int timed_out;              /* a group was left after a collective timeout: no MPI_Finalize */
    int waited_out;             /* a wait of this process failed by the collective timeout
                                   (set by the waiting thread: dt_dist_collective_timed_out) */
    int first_live1;            /* after waited_out: 1 + the lowest world rank its timeout did
                                   not name, 0 none known (dt_dist_timeout_first_live) */
    double last_tick;
} dt_dist_state;
extern dt_dist_state dt__dist;
void dt__registry_add(dt_pg *pg);
void dt__registry_remove(dt_pg *pg);
dt_status dt__check_init(const char *fn);

/* ---- half_ops.c ---- */
int dt__half_ops_create(void);            /* MPI rc */
void dt__half_ops_free(void);
MPI_Datatype dt__mpi_type(dt_dtype t);
MPI_Op dt__mpi_sum(dt_dtype t);
/* out[i] = sum over r < nranks of src[r * stride + i], in rank order, in
 * float32; then / (float)avg_div if avg_div > 0; rounded once for 16-bit. */
void dt__sum_ranks(void *out, const void *src, int64_t n, int64_t stride, int nranks, dt_dtype t,
                   int avg_div);
/* The same sum with rank r's elements at src[r] (node-shared segments):
 * bitwise dt__sum_ranks. out may be one of src[] (the element is read by
 * every rank's term before it is written). */
void dt__sum_ptrs(void *out, const void *const *src, int64_t n, int nranks, dt_dtype t, int avg_div);
void dt__scale_div(void *buf, int64_t n, dt_dtype t, int div);   /* x / (float)div */

/* ---- pg.c ---- */
dt_status dt__mpi_err(int rc, const char *what);   /* DT_ECOMM "what: MPI's error string" */
/* A buffer of >= bytes (*cap: its real size); NULL on ENOMEM. THREAD mode:
 * comm thread only. */
void *dt__pool_get(dt_pg *pg, size_t bytes, size_t *cap);
void dt__pool_put(dt_pg *pg, void *p, size_t cap);
dt_status dt__pg_thread_start(dt_pg *pg);

/* ---- collectives.c / deterministic.c: per-kind phase functions ----
 * start: issue the current phase's non-blocking requests (may be none).
 * finish: local work once they completed. run: the whole op, blocking.
 * All return an MPI error code or -1 for a local failure (w->msg set). */
int dt__op_start(dt_work *w);
int dt__op_finish(dt_work *w);
int dt__op_run(dt_work *w);
int dt__det_start(dt_work *w);
int dt__det_finish(dt_work *w);
int dt__det_run(dt_work *w);
int dt__req_reserve(dt_work *w, int n);   /* ensure req capacity; -1 (w->msg set) on ENOMEM */
int dt__kind_is_det(dt_opkind k);
const char *dt__kind_name(dt_opkind k);

/* ---- shm.c: collectives on node-shared memory (see dt_pg_alloc_shared) ----
 * find: the allocation of pg holding [p, p + bytes) (and p's offset), or NULL.
 * start: publish this rank's contribution (op number, kind, dtype, offset,
 * count; an allgather first copies its input into its own output chunk).
 * advance: 0 nothing changed, 1 progressed, 2 complete, -1 failed (w->msg).
 * run: start and advance until complete (blocking). free_all: dt_pg_free. */
dt_shm *dt__shm_find(dt_pg *pg, const void *p, size_t bytes, size_t *off);   /* *off: bytes */
float *dt__shm_base(const dt_shm *s);   /* this rank's segment (what dt_pg_alloc_shared returned) */
int dt__shm_start(dt_work *w);
int dt__shm_advance(dt_work *w);
int dt__shm_run(dt_work *w);
void dt__shm_free_all(dt_pg *pg);

/* ---- node_allreduce.c: dt_allreduce_node's staging window ----
 * The group's window with room for count floats per rank (made or grown now:
 * collective, every rank at the same call), or NULL when the group spans
 * machines or the window does not fit (pg->node_off; the caller falls back
 * to MPI). *st: an error (the group is then unusable). */
dt_shm *dt__node_stage(dt_pg *pg, size_t count, dt_status *st);

/* ---- machine_buf.c: one buffer per machine (dt_pg_alloc_machine) ----
 * find: 1 if [p, p + bytes) lies in one of pg's machine buffers.
 * free_all: dt_pg_free (collective). */
int dt__mbuf_holds(const dt_pg *pg, const void *p, size_t bytes);
void dt__mbuf_free_all(dt_pg *pg);

/* ---- watchdog.c: stalled waits (dist.h section 9) ----
 * create/free: collective with the group's creation / dt_pg_free (a group
 * whose machine-local window cannot be made just reports less).
 * issued: w was handed to MPI (one relaxed store per collective).
 * beat: this rank drives pg now (a store of the poll's clock reading).
 * check: called by waits now and then with the time the wait began;
 * logs a stall warning each stall_warn seconds; 1 when the collective
 * timeout passed (pg is then broken and timed out, message in pg). */
void dt__wd_create(dt_pg *pg);
void dt__wd_free(dt_pg *pg);
void dt__wd_issued(dt_work *w);
void dt__wd_beat(dt_pg *pg, double now);
int dt__wd_check(dt_pg *pg, const dt_work *w, double t0, double *next_warn);
/* A wait outside dt_work_wait, made by the thread that will report it: a
 * shared-memory op's start waiting for the peers to free its slot (POLL), a
 * side exchange (--debug-collectives, dt_pg_agree). Every call looks at the
 * clock: call it every few hundred spins. w: the collective waited for (its
 * stall described as dt__wd_check does), or NULL (`what` named, timeout
 * only). 1 when the collective timeout passed (or had already): pg is then
 * broken and timed out; the caller fails with dt__wd_timeout_error. */
int dt__wd_wait_check(dt_pg *pg, const dt_work *w, const char *what, double t0, double *next_warn);
/* The error of a wait the collective timeout ended (pg's message). */
dt_status dt__wd_timeout_error(dt_pg *pg);
/* --debug-collectives: every rank's fingerprint of w (kind, dtype, count,
 * root, sequence) compared before it is issued; DT_ECOMM naming both sides. */
dt_status dt__debug_check(dt_work *w);

/* ---- progress.c ---- */
dt_status dt__submit(dt_work *w);        /* issue (w->internal: and wait); owns w */
/* POLL mode: poll pg and every other group with work in flight (a peer may
 * wait in this group for work of ours that another group only does when
 * polled); 1 if anything changed. */
int dt__poll_all(dt_pg *pg);
int dt__pg_broken(dt_pg *pg, char *msg, size_t n);   /* thread-safe read */
void dt__work_fail(dt_work *w, int rc, const char *mpi_fn);   /* record failure */
void dt__work_failf(dt_work *w, dt_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void *dt__comm_thread(void *arg);
/* "allreduce #12 (1.0MiB F32) on world" */
void dt__work_describe(const dt_work *w, char *o, size_t n);
/* agree.c: MPI_Iallgather of `bytes` per rank on pg->side, waited with
 * MPI_Test (POLL: polling every group meanwhile). */
dt_status dt__side_allgather(dt_pg *pg, const dt_work *w, const void *in, void *out, int bytes);
void dt__work_free(dt_work *w);

#endif
