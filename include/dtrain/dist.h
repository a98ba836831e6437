/* dtrain/dist.h — process groups, asynchronous collectives, the progress engine.
 *
 * 1. Start and stop
 * -----------------
 *   dt_dist_opts o = {0};                  // zero = defaults
 *   if (dt_dist_init(&argc, &argv, &o) != DT_OK) { ...dt_error_message()... }
 *   ...
 *   dt_dist_finalize();
 *
 * dt_dist_init calls MPI_Init_thread (unless MPI is already initialised by the
 * caller, in which case it adopts it and leaves MPI_Finalize to the caller).
 * A program started without mpiexec runs as a world of size 1 (Open MPI
 * singleton); every collective then works and is a local copy.
 *
 * Before MPI_Init it sets a few Open MPI parameters, each ONLY if the user has
 * not set it in the environment (so `OMPI_MCA_x=... mpiexec ...` overrides):
 *   OMPI_MCA_btl_tcp_flags=send,inplace,need-ack,need-csum
 *   OMPI_MCA_coll_libnbc_iallreduce_algorithm=1        (ring)
 *   OMPI_MCA_btl_tcp_eager_limit=4194304               (no handshake per bucket)
 *   OMPI_MCA_mpi_yield_when_idle=1                     (DT_PROGRESS_THREAD only)
 * See src/dist/dist_init.c for the measurements behind them. Set
 * opts.keep_mpi_env = 1 to set none of them.
 *
 * 2. Process groups
 * -----------------
 * A dt_pg is a set of ranks that run collectives together: it owns a private
 * MPI communicator (so it never interferes with anyone else's MPI traffic), a
 * FIFO of in-flight operations and a sequence number. dt_pg_world gives all
 * ranks; dt_pg_split partitions a group like MPI_Comm_split (same color -> same
 * new group, ordered by key, then by parent rank). Creating, splitting and
 * freeing groups are collective over the (parent) group.
 *
 *   dt_pg *world, *node;
 *   dt_pg_world(&world);
 *   dt_pg_split(world, dt_pg_rank(world) / 2, 0, &node);   // pairs of ranks
 *
 * A group is used by one thread at a time (the thread that drives training);
 * in POLL mode one thread drives all groups (a wait polls every group). A
 * split, dt_pg_alloc_shared/free_shared and dt_pg_free start with a barrier
 * of the group whose wait also polls every group, so ranks may reach them
 * with other groups' work still in flight.
 *
 * 3. Collectives and work handles
 * -------------------------------
 * Every collective takes a final `dt_work **w`. With w == NULL the call is
 * blocking. Otherwise it returns at once with *w set to a handle; the
 * operation runs in the background and the buffers belong to it until the
 * handle completes. Every handle must be finished with dt_work_wait, which
 * waits, frees the handle and returns the operation's status:
 *
 *   dt_work *h;
 *   dt_allreduce(pg, grad, grad, n, DT_F32, DT_RED_AVG, &h);  // in place
 *   ...compute, calling dt_pg_tick(pg) now and then...
 *   if (dt_work_wait(h) != DT_OK) ...;
 *
 * Rules that keep every rank consistent:
 *  - Every rank of the group issues the same collectives in the same order
 *    with the same count/dtype/op/root. dtrain hands them to MPI in exactly
 *    that issue order (multi-phase operations included).
 *  - Handles may be waited in any order; several may be in flight at once.
 *  - Payload dtypes: DT_F32, DT_BF16, DT_F16. 16-bit sums convert to float32,
 *    add, and round back to the 16-bit type (round to nearest even).
 *  - DT_RED_AVG = the sum, then x / (float)size in float32 (a division, not a
 *    multiplication by 1/size: so the result equals a single process dividing
 *    the same sum by the world size), rounded back for 16-bit payloads.
 *  - count is in elements, 0 <= count <= INT_MAX. Bad arguments fail with
 *    DT_EINVAL before anything is issued (so no rank is left waiting for a
 *    call that will never come, as long as all ranks pass the same arguments).
 *  - MPI failures give DT_ECOMM with a message naming the operation, its
 *    sequence number in the group and MPI's error string, e.g.
 *    "recv #12 (20B F32) on world/0: MPI_Irecv: MPI_ERR_TRUNCATE: message truncated".
 *    After a failed *collective* the group is broken: later calls fail at once
 *    with DT_ECOMM. Nothing in this layer exits or aborts.
 *  - Reductions through MPI are issued in pieces of opts.segment_bytes
 *    (4 MiB): in one piece, Open MPI page-faults a fresh temporary of the
 *    message size on every call. Blocking calls take the non-blocking path
 *    too (section 4). Figures: docs/PERFORMANCE.md, "Collectives".
 *
 * 4. Progress
 * -----------
 * Open MPI 4.1 has no asynchronous progress: a non-blocking collective only
 * moves while the process is inside an MPI call. A group therefore runs in one
 * of two progress modes (chosen at dt_dist_init for all groups):
 *
 *  DT_PROGRESS_POLL   operations are started at issue time on the calling
 *                     thread; they advance whenever that thread calls
 *                     dt_pg_poll (one MPI_Testall per in-flight operation,
 *                     plus any local reduction work of a finished phase) or
 *                     dt_pg_tick (a clock read; polls only if >= tick_ms, default
 *                     0.5 ms, passed since the last poll). Compute code should
 *                     call dt_pg_tick (or dt_dist_tick for every group) often,
 *                     e.g. between kernels or from autograd hooks. Blocking
 *                     calls are issued non-blocking and waited (MPI does not
 *                     match a blocking collective with a non-blocking one, and
 *                     which one a rank would pick must not depend on timing);
 *                     every wait and dt_work_test polls all groups with work
 *                     in flight.
 *  DT_PROGRESS_THREAD each group has a communication thread that runs the
 *                     queued operations one by one with blocking MPI calls, in
 *                     issue order, under MPI_THREAD_MULTIPLE, while the caller
 *                     computes. poll/tick are no-ops. Costs a thread per group
 *                     that competes for a core.
 *
 * On shared memory the "communication" is copying done by the ranks
 * themselves, so with as many ranks as cores nothing hides it; over TCP the
 * link does the work and polling hides most of it (measured per mode:
 * docs/PERFORMANCE.md, "Progress modes").
 * Default: DT_PROGRESS_POLL — it hid more on the slow link, costs no extra
 * thread (ranks == cores here), keeps every MPI call on the caller's thread
 * (MPI_THREAD_SERIALIZED suffices) and its cost is one clock read per tick.
 * THREAD mode is for code that cannot call dt_pg_tick regularly.
 * Override with opts.progress or the environment: DTRAIN_PROGRESS=poll|thread.
 *
 * 5. Determinism
 * --------------
 * A plain allreduce sums in whatever order MPI's algorithm picks, which
 * depends on the world size, message size and algorithm choice. For 2 ranks
 * that is still exact (a + b == b + a); for more it is not.
 * With DT_RED_DETERMINISTIC or'ed into the op (or dt_pg_set_deterministic on
 * the group) every element is summed in rank order, ((x0 + x1) + x2) + ...,
 * in float32 (16-bit payloads are rounded once, at the end), independent of
 * message size, of how a buffer is split into calls and of MPI's algorithm.
 * The result is bitwise equal to one process adding the size contributions in
 * rank order (and for AVG dividing by (float)size). It runs as an all-to-all
 * exchange of chunks, a local rank-ordered sum, and an allgather: the same
 * bytes on the wire as a ring allreduce.
 * dt_reduce_scatter is ALWAYS deterministic in this sense on one machine (it
 * is implemented as that exchange + local sum, which is also faster than Open
 * MPI's reduce-scatter on both shared memory and TCP here); across machines
 * only when asked for (section 10).
 *
 * 6. Node-shared memory
 * ----------------------
 * When every rank of a group runs on one machine, memory from
 * dt_pg_alloc_shared lies in one MPI shared-memory window
 * (MPI_Win_allocate_shared): every rank can read and write every rank's part.
 * An in-place F32 dt_allreduce on a range of it (the same offset and count on
 * every rank: ranks passing different ranges of it all fail, and the group
 * breaks; a call that is in shared memory on some ranks only, e.g. in != out
 * elsewhere, hangs like any mismatched collective) then runs without
 * messages: rank r sums slice r over all ranks in rank order (so the result
 * is the deterministic one of section 5 at any world size) and stores it into
 * every rank's buffer. Each rank's buffer is read and written once,
 * instead of the copies into and out of MPI's shared-memory segments
 * (about 3x less time: docs/PERFORMANCE.md, "Collectives").
 * The same holds for dt_reduce_scatter whose input, and dt_allgather whose
 * output, lies in such memory (any payload dtype; the same offset on every
 * rank): rank r sums chunk r straight from every rank's input in rank order
 * (bitwise the MPI path's result), or copies every rank's chunk straight from
 * its output. A reduce-scatter's out may lie anywhere (in place at
 * in + rank * count, or private); an out over a peer's chunk of the input is
 * written once every peer has read it.
 * It is a collective like any other: issue order, handles and tracing are the
 * same; in POLL mode its work is done when this rank polls the group (tick,
 * poll, or any wait: a wait polls every group with work in flight). Free
 * whatever lent the memory out (dt_ddp_free) before dt_pg_free or
 * dt_dist_finalize, which unmap it. A group that spans machines gets
 * *out = NULL: use ordinary memory.
 * dt_allreduce_node (below) serves callers whose buffers are private: it
 * stages them through a window of this kind that the group keeps.
 *
 * 7. Tracing
 * ----------
 * dt_pg_set_trace(pg, t): every operation issued afterwards records a Chrome
 * trace event "allreduce 1.0MiB" (category "comm") in lane 1 from the moment
 * it is handed to MPI until it completes. Keep t open while work is in flight.
 *
 * 8. Configuration agreement
 * ---------------------------
 * Ranks that disagree on what they run (model size, batch, steps, strategy)
 * issue different collectives and then hang, corrupt memory or silently train
 * something else. dt_pg_agree compares a list of named settings across the
 * group and fails on EVERY rank with one message naming the first setting
 * that differs and the ranks on each side:
 *
 *   dt_agree a;
 *   dt_agree_init(&a);
 *   dt_agree_add(&a, "arch.layers", "%d", n_layer);
 *   dt_agree_add(&a, "train.batch", "%lld", (long long)batch);
 *   dt_status s = dt_pg_agree(pg, &a);   // collective
 *   dt_agree_free(&a);
 *   // "configuration differs between ranks: arch.layers: rank 1 has 3, rank 0 has 2"
 *
 * Call it before any other collective that depends on those settings (the
 * trainer does, before a strategy's set-up; strategy.h). It is safe whatever
 * the ranks hold: a fixed-size exchange (hash and length of the list) first,
 * and only when those differ the lists themselves, padded to the longest.
 * It runs on a communicator of its own with the same MPI calls in both
 * progress modes, and adds the dist settings that must match themselves
 * (progress mode, segment size). Settings are compared in rank 0's order
 * (then those only other ranks have); the ranks with rank 0's value are
 * named last. The same name twice in one list: the first one counts.
 *
 * 9. Watchdog
 * -----------
 * A wait (dt_work_wait, dt_pg_wait_all and every blocking call) that lasts
 * opts.stall_warn_s (default 60 s) logs a warning (dt_log, WARN) naming the
 * operation it waits for (op, sequence number, bytes, group) and the ranks
 * that have not issued it yet, or that have but show no progress (stopped, or
 * computing without dt_pg_tick in POLL mode), e.g.
 *   "collective stalled: allreduce #12 (1.0MiB F32) on world has waited
 *    60.0 s: rank 1 (its last operation #11, idle 60.0 s) has not joined it"
 * and again every stall_warn_s while it lasts. The ranks' progress is read
 * from a tiny shared-memory window per group and machine (two relaxed stores
 * per collective, one per poll), so it needs nothing from the ranks it
 * inspects; ranks on other machines are counted as not inspected.
 * With opts.collective_timeout_s > 0 a wait that long fails with DT_ECOMM and
 * that message, and the group breaks. MPI cannot cancel a collective, so the
 * operation stays with the group (its buffers must stay valid), dt_pg_free
 * and dt_dist_finalize then refuse to tear down (they would wait forever):
 * the caller reports the error and ends the job with MPI_Abort, as the CLI
 * does. The library itself never aborts.
 * opts.debug_collectives: before each collective the ranks compare its
 * fingerprint (op, dtype, count, root, position) on the side communicator;
 * the first divergence fails on every rank, before anything is issued, with
 * DT_ECOMM "collectives diverge on world at collective 7 (--debug-collectives):
 * rank 1 issues broadcast #7 (512 F32, root 0), rank 0 issues allreduce #7
 * (1024 F32)". Costs one small allgather per collective: for debugging only.
 *
 * 10. Many machines
 * -----------------
 * Every group learns its machines when it is made (ranks that share memory;
 * machines numbered by their lowest group rank): dt_pg_topology,
 * dt_pg_topology_describe ("2 machines x 2 ranks", "2 machines (3+1 ranks)").
 * When a group spans machines and some machine has more than one rank, an
 * allreduce runs hierarchically, so bytes cross between machines once per
 * machine, not once per rank:
 *   1. inside each machine, a reduce-scatter: the buffer is cut into lanes
 *      (R per machine of R ranks; uneven machines: see topology.c) and each
 *      rank sums its lanes over the machine's ranks, in rank order;
 *   2. across machines, each lane is all-reduced among its owners (one per
 *      machine): R exchanges of S/R bytes side by side;
 *   3. inside each machine, an allgather of the lanes.
 * Per machine that moves 2(n-1)/n * S bytes over the network for n machines
 * (MPI's ring), independent of R; flat, each of the R ranks would move it.
 * Deterministic (section 5): the sum stays in rank order, ((x0 + x1) + x2) +
 * ..., bitwise the flat deterministic result and one process adding the
 * contributions in rank order, at any number of machines: step 2 becomes a
 * chain that carries each lane's running float32 sum from machine to
 * machine in machine order (each adds its ranks' values in rank order) and
 * a broadcast of the total from the last machine. That needs machines that
 * hold consecutive ranks (Open MPI's default --map-by slot/core fills one
 * machine after another) and F32; otherwise the deterministic allreduce
 * stays flat. The chain moves at most 2S per machine (S at 2 machines, like
 * the ring), with n hops of latency.
 * Without it, the order is: each machine in rank order, then MPI's order
 * across machines (exact for 2 machines: a + b == b + a).
 * Reduce-scatter and allgather likewise (src/dist/hier_shard.c): rank k's
 * chunk is summed inside a machine by the rank with k's local index (mod the
 * machine's rank count) and crosses into or out of each machine once:
 * (n-1)/n * S per machine, where flat every rank's copy crosses. Plain
 * reduce-scatter then sums each machine in rank order, then the machines in
 * machine order (reproducible, but not section 5's rank order); with
 * DT_RED_DETERMINISTIC (or a deterministic group) it keeps rank order through
 * the same chain as the allreduce (F32, consecutive machines; else flat).
 * Broadcast, reduce and point-to-point stay flat.
 * DT_RED_CROSS_BF16 / DT_RED_CROSS_F16 on an F32 allreduce: each machine's
 * float32 lane sum is rounded once to 16 bits, summed across machines by MPI's
 * 16-bit sum, widened back (then / size for AVG): the bytes between machines
 * halve and the sums inside machines lose nothing (DDP's --compress does this
 * on groups that span machines).
 * dt_dist_opts.collectives = DT_COLL_FLAT (or DTRAIN_COLLECTIVES=flat) keeps
 * every collective flat.
 *
 * One buffer per machine: dt_pg_alloc_machine gives the ranks of each
 * machine of a group one shared buffer (the same bytes at the same address
 * range in each of them; each machine has its own). dt_allgather_machine
 * fills it: rank k has written its chunk k itself; each chunk crosses into
 * every other machine once (to the rank handling it there, which writes it
 * into that machine's buffer), then the machine's ranks meet in a barrier,
 * so on completion every rank may read every chunk. (n-1)/n * S per machine
 * and one copy per machine, where a plain allgather keeps R copies. A rank
 * must not write its chunk while the previous fill of that range may still
 * be read by a rank of its machine: callers order that (ZeRO writes a
 * parameter shard only after the gradient reduce-scatter of its bucket,
 * which every rank joins after its last read of it).
 */
#ifndef DTRAIN_DIST_H
#define DTRAIN_DIST_H

#include <stddef.h>
#include <stdint.h>
#include "dtrain/error.h"
#include "dtrain/tensor.h"
#include "dtrain/trace.h"

/* ---- start / stop ---- */
typedef enum dt_progress_mode {
    DT_PROGRESS_DEFAULT = 0,   /* DTRAIN_PROGRESS env var, else the built-in default */
    DT_PROGRESS_POLL = 1,
    DT_PROGRESS_THREAD = 2,
} dt_progress_mode;

typedef enum dt_collectives_mode {
    DT_COLL_DEFAULT = 0,       /* DTRAIN_COLLECTIVES=flat|hierarchical, else hierarchical */
    DT_COLL_HIERARCHICAL = 1,  /* across machines: inside, across, inside (section 10) */
    DT_COLL_FLAT = 2,          /* one MPI collective over every rank */
} dt_collectives_mode;

typedef struct dt_dist_opts {
    dt_progress_mode progress;
    double tick_ms;            /* dt_pg_tick poll interval; <= 0: 0.5 ms */
    size_t segment_bytes;      /* MPI reductions are issued in pieces of at most this; 0: 4 MiB */
    int deterministic;         /* default for new groups (dt_pg_set_deterministic) */
    int keep_mpi_env;          /* 1: do not set the tuned OMPI_MCA_* defaults */
    /* the watchdog (section 9) */
    double stall_warn_s;       /* a wait this long logs a warning naming the collective and the
                                  ranks that have not joined it; 0: 60 s; < 0: off */
    double collective_timeout_s;   /* a wait this long fails with that message; <= 0: off (default) */
    int debug_collectives;     /* 1: every collective's fingerprint compared across ranks first */
    dt_collectives_mode collectives;   /* section 10 */
} dt_dist_opts;

/* opts may be NULL (defaults). Calling it twice is DT_ESTATE. */
dt_status dt_dist_init(int *argc, char ***argv, const dt_dist_opts *opts);
/* Frees every remaining group (completing their in-flight work; their handles
 * become invalid), then MPI_Finalize if dt_dist_init initialised MPI. */
dt_status dt_dist_finalize(void);
int dt_dist_initialized(void);            /* 1 between init and finalize */
/* 1 once a wait of this process failed by opts.collective_timeout_s (its
 * DT_ECOMM is first-hand: a peer made no progress), not by a peer's error */
int dt_dist_collective_timed_out(void);
/* after such a timeout: the lowest world rank it found alive (heartbeat
 * within half the wait), -1 when not known (only a collective of the whole
 * world, with the watchdog's view of every rank, knows) */
int dt_dist_timeout_first_live(void);
dt_progress_mode dt_dist_progress_mode(void);   /* the mode in effect (never DEFAULT) */
int dt_dist_world_rank(void);
int dt_dist_world_size(void);

/* ---- process groups ---- */
typedef struct dt_pg dt_pg;
#define DT_PG_NO_COLOR (-1)   /* dt_pg_split color: this rank joins no group (*out = NULL) */

dt_status dt_pg_world(dt_pg **out);                                   /* collective (world) */
dt_status dt_pg_split(dt_pg *parent, int color, int key, dt_pg **out); /* collective (parent) */
/* Completes in-flight work, frees unwaited handles (they become invalid) and
 * the communicator. Collective. NULL is a no-op. */
dt_status dt_pg_free(dt_pg *pg);
int dt_pg_rank(const dt_pg *pg);
int dt_pg_size(const dt_pg *pg);
int dt_pg_world_rank(const dt_pg *pg, int r);     /* group rank r's world rank (-1: out of range) */
const char *dt_pg_name(const dt_pg *pg);          /* "world", "world/3" (color 3), ... */
void dt_pg_set_deterministic(dt_pg *pg, int on);  /* same value on every rank */
int dt_pg_deterministic(const dt_pg *pg);
void dt_pg_set_trace(dt_pg *pg, dt_trace *t);     /* NULL: off */

/* ---- collectives ----
 * op: DT_RED_SUM or DT_RED_AVG, optionally | DT_RED_DETERMINISTIC. */
typedef enum dt_redop {
    DT_RED_SUM = 0,
    DT_RED_AVG = 1,
    DT_RED_DETERMINISTIC = 0x100,
    /* dt_allreduce of F32 where it runs hierarchically (section 10): the sums
     * cross between machines as bf16 / fp16 (half the bytes on the network);
     * inside each machine they stay float32. No effect where the allreduce is
     * not hierarchical; not with DT_RED_DETERMINISTIC. */
    DT_RED_CROSS_BF16 = 0x200,
    DT_RED_CROSS_F16 = 0x400,
} dt_redop;

typedef struct dt_work dt_work;

/* in, out: count elements. in == out is in place; other overlap is EINVAL. */
dt_status dt_allreduce(dt_pg *pg, const void *in, void *out, int64_t count, dt_dtype dtype,
                       int op, dt_work **w);
/* An F32 allreduce for a small group whose ranks share one machine (a
 * tensor-parallel group; section 6): in and out may be private memory (in ==
 * out is in place). Each rank copies its count floats into its slot of a
 * node-shared staging window the group allocates on first use (collectively,
 * grown when a call needs more), the ranks meet on flags in that window, and
 * every rank sums all slots in rank order into its out: the same bits on every
 * rank, bitwise the deterministic sum of section 5 at any group size. A rank
 * returns as soon as its own sum is done; the next call's copy waits until
 * every peer has read this call's slots. Where the group spans machines, or
 * the window does not fit, it runs dt_allreduce with DT_RED_DETERMINISTIC
 * (the same bits).
 * op: DT_RED_SUM or DT_RED_AVG (| DT_RED_DETERMINISTIC, always true here).
 * Every rank passes the same count (a growth is collective). */
dt_status dt_allreduce_node(dt_pg *pg, const float *in, float *out, int64_t count, int op, dt_work **w);
/* in: size * count elements (chunk r goes to rank r); out: count elements.
 * out may point anywhere, including inside in (e.g. out = in + rank * count).
 * Summed in rank order (see 5) on one machine; across machines see 10. */
dt_status dt_reduce_scatter(dt_pg *pg, const void *in, void *out, int64_t count, dt_dtype dtype,
                            int op, dt_work **w);
/* in: count elements; out: size * count, rank r's chunk at r * count.
 * In place: in == out + rank * count elements. Other overlap is EINVAL. */
dt_status dt_allgather(dt_pg *pg, const void *in, void *out, int64_t count, dt_dtype dtype,
                       dt_work **w);
/* buf: count elements, read at root, written elsewhere. */
dt_status dt_broadcast(dt_pg *pg, void *buf, int64_t count, dt_dtype dtype, int root,
                       dt_work **w);
/* Sum (or average) to root. out is used only at root (may be NULL elsewhere);
 * in == out at root is in place. */
dt_status dt_reduce(dt_pg *pg, const void *in, void *out, int64_t count, dt_dtype dtype, int op,
                    int root, dt_work **w);
/* Point to point inside the group; 0 <= tag <= 32767. A receive buffer
 * shorter than the message is DT_ECOMM (MPI_ERR_TRUNCATE). Point-to-point
 * errors do not break the group. */
dt_status dt_send(dt_pg *pg, const void *buf, int64_t count, dt_dtype dtype, int peer, int tag,
                  dt_work **w);
dt_status dt_recv(dt_pg *pg, void *buf, int64_t count, dt_dtype dtype, int peer, int tag,
                  dt_work **w);
dt_status dt_barrier(dt_pg *pg, dt_work **w);

/* node[r] for every rank r of the group = the lowest group rank on r's
 * machine (ranks that can share memory), so equal values mean one machine.
 * Local (the group learnt its machines when it was made: section 10). node
 * has room for dt_pg_size(pg) ints. */
dt_status dt_pg_node_of(dt_pg *pg, int *node);

/* ---- machines (section 10) ---- */
typedef struct dt_pg_topo {
    int machines;            /* machines under the group */
    int machine, local_rank; /* this rank's machine (0 = the one with group rank 0) and index on it */
    int min_ranks, max_ranks;   /* ranks per machine */
    int local_size;          /* ranks on this rank's machine */
    int contiguous;          /* each machine holds consecutive group ranks */
    int hierarchical;        /* allreduce runs inside -> across -> inside */
    int lanes;               /* (hierarchical) slices a buffer is cut into */
} dt_pg_topo;
void dt_pg_topology(const dt_pg *pg, dt_pg_topo *out);
/* "1 machine x 4 ranks", "2 machines x 2 ranks", "2 machines (3+1 ranks)" */
void dt_pg_topology_describe(const dt_pg *pg, char *buf, size_t n);
/* Group rank r's host name (MPI_Get_processor_name at dt_dist_init); "?" if unknown. */
const char *dt_pg_host_name(const dt_pg *pg, int r);
/* One buffer of count floats per machine of the group (section 10),
 * collective (blocking). init (may be NULL: zeros): the values, which the
 * machine's lowest rank copies in (every rank passes the same values).
 * *out = NULL (and DT_OK) when it cannot be shared: the machines' ranks are
 * not known to share memory the hierarchical way (DTRAIN_COLLECTIVES=flat
 * with several ranks on a machine) or the backing directory (/dev/shm) is too
 * small; dt_pg_shared_unavailable says which. */
dt_status dt_pg_alloc_machine(dt_pg *pg, size_t count, const float *init, float **out);
/* Collective: waits for the group's in-flight work, then frees. NULL: no-op. */
dt_status dt_pg_free_machine(dt_pg *pg, float *p);
/* Fill buf (in a dt_pg_alloc_machine buffer of pg, the same offset on every
 * rank) with every rank's chunk of count elements; chunk k lies at
 * buf + k * count and rank k has written its own before the call. */
dt_status dt_allgather_machine(dt_pg *pg, void *buf, int64_t count, dt_dtype dtype, dt_work **w);

/* ---- node-shared memory (section 6) ----
 * Collective (blocking): count floats (zeroed) per rank, the same count on
 * every rank. *out = NULL (and DT_OK) when the group spans machines or the
 * window would not fit in the free space of Open MPI's backing directory
 * (osc_sm_backing_directory, /dev/shm: small in containers); then
 * dt_pg_shared_unavailable says which. */
dt_status dt_pg_alloc_shared(dt_pg *pg, size_t count, float **out);
const char *dt_pg_shared_unavailable(const dt_pg *pg);   /* "" after a success */
/* Collective: waits for the group's in-flight work, then frees. NULL: no-op.
 * dt_pg_free frees what is left. */
dt_status dt_pg_free_shared(dt_pg *pg, float *p);

/* ---- handles ---- */
/* Waits for completion, frees w, returns the operation's status (the error
 * message is set on the calling thread). NULL: DT_OK. */
dt_status dt_work_wait(dt_work *w);
/* *done = 1 once w has completed (POLL mode: polls w's group first). Does not
 * free w. */
dt_status dt_work_test(dt_work *w, int *done);
/* Completes every in-flight operation of pg; returns the first failure.
 * Handles stay valid and must still be passed to dt_work_wait. */
dt_status dt_pg_wait_all(dt_pg *pg);

/* ---- progress (DT_PROGRESS_POLL; no-ops in THREAD mode) ---- */
void dt_pg_poll(dt_pg *pg);     /* test in-flight work now */
void dt_pg_tick(dt_pg *pg);     /* poll if >= tick_ms since this group's last poll */
void dt_dist_poll(void);        /* dt_pg_poll on every live group */
void dt_dist_tick(void);        /* dt_pg_tick on every live group */

/* ---- configuration agreement (section 8) ----
 * A list of (name, value) strings. dt_agree_add copies both; an allocation
 * failure is remembered and reported by dt_pg_agree on every rank. */
typedef struct dt_agree {
    char *buf;      /* "name\0value\0name\0value\0..." */
    size_t len, cap;
    int n;          /* fields */
    int oom;
} dt_agree;
void dt_agree_init(dt_agree *a);
void dt_agree_add(dt_agree *a, const char *name, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void dt_agree_free(dt_agree *a);
/* Collective: DT_OK when every rank's list equals this one, else DT_EINVAL on
 * every rank: "configuration differs between ranks: NAME: rank 1 has X,
 * ranks 0, 2-3 have Y". */
dt_status dt_pg_agree(dt_pg *pg, const dt_agree *a);

#endif
