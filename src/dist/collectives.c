/* Collective entry points (argument checks, work items) and the operations
 * that map directly onto MPI (segmented reductions, allgather, bcast, p2p). */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dist/dist_internal.h"

const char *dt__kind_name(dt_opkind k) {
    switch (k) {
    case DT_OPK_ALLREDUCE: return "allreduce";
    case DT_OPK_ALLREDUCE_DET: return "allreduce(det)";
    case DT_OPK_REDUCE_SCATTER: return "reduce_scatter";
    case DT_OPK_ALLGATHER: return "allgather";
    case DT_OPK_BROADCAST: return "broadcast";
    case DT_OPK_REDUCE: return "reduce";
    case DT_OPK_REDUCE_DET: return "reduce(det)";
    case DT_OPK_SEND: return "send";
    case DT_OPK_RECV: return "recv";
    case DT_OPK_BARRIER: return "barrier";
    case DT_OPK_ALLREDUCE_SHM: return "allreduce(shm)";
    case DT_OPK_REDUCE_SCATTER_SHM: return "reduce_scatter(shm)";
    case DT_OPK_ALLGATHER_SHM: return "allgather(shm)";
    case DT_OPK_ALLREDUCE_HIER: return "allreduce(hier)";
    case DT_OPK_REDUCE_SCATTER_HIER: return "reduce_scatter(hier)";
    case DT_OPK_ALLGATHER_HIER: return "allgather(hier)";
    case DT_OPK_ALLREDUCE_NODE: return "allreduce(node)";
    }
    return "?";
}

int dt__kind_is_det(dt_opkind k) {
    return k == DT_OPK_ALLREDUCE_DET || k == DT_OPK_REDUCE_SCATTER || k == DT_OPK_REDUCE_DET;
}

int dt__req_reserve(dt_work *w, int n) {
    if (n <= w->req_cap) return 0;
    if (n <= 2) {
        w->req = w->req_small;
        w->sts = w->sts_small;
        w->req_cap = 2;
        return 0;
    }
    MPI_Request *r = malloc((size_t)n * sizeof *r);
    MPI_Status *s = malloc((size_t)n * sizeof *s);
    if (!r || !s) {
        free(r);
        free(s);
        dt__work_failf(w, DT_ENOMEM, "out of memory for %d MPI requests", n);
        return -1;
    }
    if (w->req != w->req_small) { free(w->req); free(w->sts); }
    w->req = r;
    w->sts = s;
    w->req_cap = n;
    return 0;
}

/* ---- argument checks (nothing is issued when they fail) ---- */

static dt_status check_common(dt_pg *pg, const char *fn, int64_t count, dt_dtype dtype) {
    DT_TRY(dt__check_init(fn));
    if (!pg) return DT_ERR(DT_EINVAL, "%s: NULL process group", fn);
    if (count < 0) return DT_ERR(DT_EINVAL, "%s on %s: negative count %lld", fn, pg->name, (long long)count);
    if (count > INT_MAX)
        return DT_ERR(DT_EINVAL, "%s on %s: count %lld exceeds INT_MAX elements", fn, pg->name, (long long)count);
    if (dtype != DT_F32 && dtype != DT_BF16 && dtype != DT_F16)
        return DT_ERR(DT_EINVAL, "%s on %s: unknown dtype %d", fn, pg->name, (int)dtype);
    char msg[512];
    if (dt__pg_broken(pg, msg, sizeof msg))
        return DT_ERR(DT_ECOMM, "%s on %s: group unusable after an earlier failure: %s", fn, pg->name, msg);
    return DT_OK;
}

static dt_status check_buf(const dt_pg *pg, const char *fn, const char *what, const void *p, int64_t count) {
    if (!p && count > 0) return DT_ERR(DT_EINVAL, "%s on %s: NULL %s with count %lld", fn, pg->name, what, (long long)count);
    return DT_OK;
}

static dt_status check_op(const dt_pg *pg, const char *fn, int op) {
    int cross = op & (DT_RED_CROSS_BF16 | DT_RED_CROSS_F16);
    if (cross == (DT_RED_CROSS_BF16 | DT_RED_CROSS_F16) || (cross && (op & DT_RED_DETERMINISTIC)))
        return DT_ERR(DT_EINVAL, "%s on %s: reduction op 0x%x combines %s", fn, pg->name, (unsigned)op,
                      cross == (DT_RED_CROSS_BF16 | DT_RED_CROSS_F16) ? "two cross-machine wire types"
                                                                      : "a 16-bit cross-machine wire with deterministic sums");
    int base = op & ~(DT_RED_DETERMINISTIC | DT_RED_CROSS_BF16 | DT_RED_CROSS_F16);
    if (base != DT_RED_SUM && base != DT_RED_AVG)
        return DT_ERR(DT_EINVAL, "%s on %s: unknown reduction op 0x%x", fn, pg->name, (unsigned)op);
    return DT_OK;
}

static dt_status check_rank(const dt_pg *pg, const char *fn, const char *what, int r) {
    if (r < 0 || r >= pg->size)
        return DT_ERR(DT_EINVAL, "%s on %s: %s %d out of range [0, %d)", fn, pg->name, what, r, pg->size);
    return DT_OK;
}

static int overlaps(const void *a, size_t na, const void *b, size_t nb) {
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return na && nb && x < y + nb && y < x + na;
}

static void fmt_bytes(char *o, size_t n, double b) {
    if (b < 1024) snprintf(o, n, "%.0fB", b);
    else if (b < 1048576.0) snprintf(o, n, "%.1fKiB", b / 1024);
    else if (b < 1073741824.0) snprintf(o, n, "%.1fMiB", b / 1048576.0);
    else snprintf(o, n, "%.2fGiB", b / 1073741824.0);
}

static dt_status new_work(dt_pg *pg, dt_opkind kind, int64_t count, dt_dtype dtype, double bytes,
                          dt_work **wp, dt_work **out) {
    dt_work *w = calloc(1, sizeof *w);
    if (!w) return DT_ERR(DT_ENOMEM, "%s on %s: out of memory", dt__kind_name(kind), pg->name);
    w->pg = pg;
    w->kind = kind;
    w->count = count;
    w->dtype = dtype;
    w->nphase = kind == DT_OPK_ALLREDUCE_DET ? 2
              : kind == DT_OPK_ALLREDUCE_HIER || kind == DT_OPK_REDUCE_SCATTER_HIER || kind == DT_OPK_ALLGATHER_HIER ? 4
              : 1;
    w->internal = wp == NULL;
    w->req = w->req_small;
    w->sts = w->sts_small;
    w->req_cap = 2;
    char b[24];
    fmt_bytes(b, sizeof b, bytes);
    const char *kn = dt__kind_name(kind);
    size_t kl = strcspn(kn, "(");   /* trace name without "(det)" */
    snprintf(w->name, sizeof w->name, "%.*s %s", (int)kl, kn, b);
    *out = w;
    return DT_OK;
}

static dt_status issue(dt_work *w, dt_work **wp) {
    dt_pg *pg = w->pg;
    int p2p = w->kind == DT_OPK_SEND || w->kind == DT_OPK_RECV;
    w->seq = pg->seq++;
    if (!p2p) w->coll_idx = pg->ncoll++;
    dt__wd_issued(w);   /* (before the debug exchange: a stall there names the ranks not come) */
    if (dt__dist.debug && !p2p) {
        dt_status s = dt__debug_check(w);
        if (s != DT_OK) { dt__work_free(w); return s; }
    }
    if (!wp) return dt__submit(w);
    dt_status s = dt__submit(w);
    if (s == DT_OK) *wp = w;
    return s;
}

/* ---- public entry points ---- */

/* Decode op: *avg, and whether the rank-ordered (deterministic) path is
 * needed. With <= 2 ranks MPI's sum is already the rank-ordered one
 * (a + b == b + a), except 16-bit AVG, where MPI would round the sum before
 * dividing. */
static int wants_det(const dt_pg *pg, int op, dt_dtype dtype, int *avg) {
    *avg = (op & ~(DT_RED_DETERMINISTIC | DT_RED_CROSS_BF16 | DT_RED_CROSS_F16)) == DT_RED_AVG;
    if (op & (DT_RED_CROSS_BF16 | DT_RED_CROSS_F16)) return 0;   /* (exclusive: check_op) */
    int det = (op & DT_RED_DETERMINISTIC) || pg->deterministic;
    return det && !(pg->size <= 2 && (dtype == DT_F32 || !*avg));
}

/* An allreduce's arguments: the group, count and type, the op, both buffers
 * (in == out, or not overlapping). */
static dt_status check_allreduce(dt_pg *pg, const char *fn, const void *in, const void *out, int64_t count,
                                 dt_dtype dtype, int op) {
    DT_TRY(check_common(pg, fn, count, dtype));
    DT_TRY(check_op(pg, fn, op));
    DT_TRY(check_buf(pg, fn, "input", in, count));
    DT_TRY(check_buf(pg, fn, "output", out, count));
    size_t nb = (size_t)count * dt_dtype_size(dtype);
    if (in != out && overlaps(in, nb, out, nb))
        return DT_ERR(DT_EINVAL, "%s on %s: input and output overlap (only in == out is allowed)", fn, pg->name);
    return DT_OK;
}

dt_status dt_allreduce(dt_pg *pg, const void *in, void *out, int64_t count, dt_dtype dtype, int op,
                       dt_work **wp) {
    if (wp) *wp = NULL;
    DT_TRY(check_allreduce(pg, "dt_allreduce", in, out, count, dtype, op));
    size_t nb = (size_t)count * dt_dtype_size(dtype);
    int avg, det = wants_det(pg, op, dtype, &avg);
    /* in place on node-shared memory: no messages, rank-ordered sum (so also
     * deterministic); every rank must pass the same offset (checked) */
    size_t shm_off = 0;
    dt_shm *shm = dtype == DT_F32 && in == out && count > 0 ? dt__shm_find(pg, out, nb, &shm_off) : NULL;
    /* across machines: inside -> across -> inside (hier.c); its deterministic
     * chain needs float32 and machines of consecutive ranks */
    const dt_topo *t = &pg->topo;
    int hier = !shm && t->hier && count >= t->lanes && count <= INT_MAX / 2 - 256 &&
               (!det || (dtype == DT_F32 && t->contiguous));
    dt_work *w = NULL;
    DT_TRY(new_work(pg, shm ? DT_OPK_ALLREDUCE_SHM : hier ? DT_OPK_ALLREDUCE_HIER : det ? DT_OPK_ALLREDUCE_DET
                                                                                    : DT_OPK_ALLREDUCE,
                    count, dtype, (double)nb, wp, &w));
    w->hier_det = hier && det;
    if (hier && dtype == DT_F32 && (op & (DT_RED_CROSS_BF16 | DT_RED_CROSS_F16)))
        w->cross_dt = op & DT_RED_CROSS_BF16 ? DT_BF16 : DT_F16;
    w->in = in;
    w->out = out;
    w->avg = avg;
    w->shm = shm;
    w->shm_off = shm_off;
    return issue(w, wp);
}

/* Staged through the group's node-shared window (node_allreduce.c, shm.c)
 * when it can be; else the plain allreduce. */
dt_status dt_allreduce_node(dt_pg *pg, const float *in, float *out, int64_t count, int op, dt_work **wp) {
    if (wp) *wp = NULL;
    DT_TRY(check_allreduce(pg, "dt_allreduce_node", in, out, count, DT_F32, op));
    size_t nb = (size_t)count * sizeof(float);
    dt_status st = DT_OK;
    dt_shm *stage = count > 0 && pg->size > 1 ? dt__node_stage(pg, (size_t)count, &st) : NULL;
    DT_TRY(st);
    if (!stage)   /* the same bits as the staged sum: rank order */
        return dt_allreduce(pg, in, out, count, DT_F32, (op & ~(DT_RED_CROSS_BF16 | DT_RED_CROSS_F16)) | DT_RED_DETERMINISTIC, wp);
    dt_work *w = NULL;
    DT_TRY(new_work(pg, DT_OPK_ALLREDUCE_NODE, count, DT_F32, (double)nb, wp, &w));
    w->in = in;
    w->out = out;
    w->avg = (op & 0xff) == DT_RED_AVG;
    w->shm = stage;
    w->shm_off = 0;
    return issue(w, wp);
}

dt_status dt_reduce_scatter(dt_pg *pg, const void *in, void *out, int64_t count, dt_dtype dtype, int op,
                            dt_work **wp) {
    if (wp) *wp = NULL;
    const char *fn = "dt_reduce_scatter";
    DT_TRY(check_common(pg, fn, count, dtype));
    DT_TRY(check_op(pg, fn, op));
    DT_TRY(check_buf(pg, fn, "input", in, count));
    DT_TRY(check_buf(pg, fn, "output", out, count));
    size_t es = dt_dtype_size(dtype), cb = (size_t)count * es, nb = cb * (size_t)pg->size;
    /* input in node-shared memory (the same offset on every rank, checked):
     * each rank sums its chunk straight from every rank's input, rank-ordered
     * like the exchange below, so the same bits. An output over a peer's
     * chunk of the input is written only once every peer has read it. */
    size_t shm_off = 0;
    dt_shm *shm = count > 0 ? dt__shm_find(pg, in, nb, &shm_off) : NULL;
    /* across machines (hier_shard.c): plain = each machine, then the machines
     * in order; rank order (as flat) only deterministic, F32, consecutive */
    const dt_topo *t = &pg->topo;
    int det = (op & DT_RED_DETERMINISTIC) || pg->deterministic;
    /* (MPI's int byte offsets: a handler receives up to rs_recv_chunks chunks,
     * the same bound on every rank, which all must decide the same) */
    int hier = !shm && t->hier && count > 0 && nb <= INT_MAX && (double)t->rs_recv_chunks * (double)cb <= INT_MAX &&
               (!det || (dtype == DT_F32 && t->contiguous));
    dt_work *w = NULL;
    DT_TRY(new_work(pg, shm ? DT_OPK_REDUCE_SCATTER_SHM : hier ? DT_OPK_REDUCE_SCATTER_HIER : DT_OPK_REDUCE_SCATTER,
                    count, dtype, (double)nb, wp, &w));
    w->hier_det = hier && det;
    w->in = in;
    w->out = out;
    w->avg = (op & 0xff) == DT_RED_AVG;
    w->shm = shm;
    w->shm_off = shm_off;
    w->shm_out_staged = shm && (const char *)out != (const char *)in + (size_t)pg->rank * cb && overlaps(out, cb, in, nb);
    return issue(w, wp);
}

dt_status dt_allgather(dt_pg *pg, const void *in, void *out, int64_t count, dt_dtype dtype, dt_work **wp) {
    if (wp) *wp = NULL;
    const char *fn = "dt_allgather";
    DT_TRY(check_common(pg, fn, count, dtype));
    DT_TRY(check_buf(pg, fn, "input", in, count));
    DT_TRY(check_buf(pg, fn, "output", out, count));
    size_t es = dt_dtype_size(dtype), nb = (size_t)count * es;
    const char *mine = out ? (const char *)out + (size_t)pg->rank * nb : NULL;
    if (in != mine && overlaps(in, nb, out, nb * (size_t)pg->size))
        return DT_ERR(DT_EINVAL, "%s on %s: input overlaps output (in place needs in == out + rank * count)",
                      fn, pg->name);
    /* output in node-shared memory (the same offset on every rank, checked):
     * each rank copies the others' chunks straight from their outputs */
    size_t shm_off = 0;
    dt_shm *shm = count > 0 ? dt__shm_find(pg, out, nb * (size_t)pg->size, &shm_off) : NULL;
    int hier = !shm && pg->topo.hier && count > 0 && nb * (size_t)pg->size <= INT_MAX;   /* hier_shard.c */
    dt_work *w = NULL;
    DT_TRY(new_work(pg, shm ? DT_OPK_ALLGATHER_SHM : hier ? DT_OPK_ALLGATHER_HIER : DT_OPK_ALLGATHER, count, dtype,
                    (double)nb * pg->size, wp, &w));
    w->in = (count > 0 && in == mine) ? NULL : in;   /* NULL: in place */
    w->out = out;
    w->shm = shm;
    w->shm_off = shm_off;
    return issue(w, wp);
}

/* Into a machine buffer (machine_buf.c): the hierarchical allgather with a
 * barrier in place of its copy inside the machine; one machine: only the
 * barrier; one rank per machine: a plain allgather in place. */
dt_status dt_allgather_machine(dt_pg *pg, void *buf, int64_t count, dt_dtype dtype, dt_work **wp) {
    if (wp) *wp = NULL;
    const char *fn = "dt_allgather_machine";
    DT_TRY(check_common(pg, fn, count, dtype));
    DT_TRY(check_buf(pg, fn, "buffer", buf, count));
    size_t nb = (size_t)count * dt_dtype_size(dtype);
    if (count > 0 && !dt__mbuf_holds(pg, buf, nb * (size_t)pg->size))
        return DT_ERR(DT_EINVAL, "%s on %s: the buffer is not (all) in a dt_pg_alloc_machine buffer of this group", fn,
                      pg->name);
    const dt_topo *t = &pg->topo;
    dt_opkind kind = t->machines == 1 || count == 0 ? DT_OPK_BARRIER
                   : t->hier ? DT_OPK_ALLGATHER_HIER
                   : DT_OPK_ALLGATHER;
    if (kind == DT_OPK_ALLGATHER && t->max_local > 1)   /* dt_pg_alloc_machine gave no buffer then */
        return DT_ERR(DT_EINVAL, "%s on %s: flat collectives cannot fill a buffer shared by a machine's ranks", fn,
                      pg->name);
    if (kind == DT_OPK_ALLGATHER_HIER && nb * (size_t)pg->size > INT_MAX)
        return DT_ERR(DT_EINVAL, "%s on %s: %zu bytes exceed the 2 GiB of one operation", fn, pg->name,
                      nb * (size_t)pg->size);
    dt_work *w = NULL;
    DT_TRY(new_work(pg, kind, kind == DT_OPK_BARRIER ? 0 : count, dtype, (double)nb * pg->size, wp, &w));
    w->in = NULL;   /* in place: each rank's chunk is already there */
    w->out = kind == DT_OPK_BARRIER ? NULL : buf;
    w->machine_out = kind == DT_OPK_ALLGATHER_HIER;
    return issue(w, wp);
}

dt_status dt_broadcast(dt_pg *pg, void *buf, int64_t count, dt_dtype dtype, int root, dt_work **wp) {
    if (wp) *wp = NULL;
    const char *fn = "dt_broadcast";
    DT_TRY(check_common(pg, fn, count, dtype));
    DT_TRY(check_buf(pg, fn, "buffer", buf, count));
    DT_TRY(check_rank(pg, fn, "root", root));
    dt_work *w = NULL;
    DT_TRY(new_work(pg, DT_OPK_BROADCAST, count, dtype, (double)count * dt_dtype_size(dtype), wp, &w));
    w->out = buf;
    w->root = root;
    return issue(w, wp);
}

dt_status dt_reduce(dt_pg *pg, const void *in, void *out, int64_t count, dt_dtype dtype, int op, int root,
                    dt_work **wp) {
    if (wp) *wp = NULL;
    const char *fn = "dt_reduce";
    DT_TRY(check_common(pg, fn, count, dtype));
    DT_TRY(check_op(pg, fn, op));
    DT_TRY(check_rank(pg, fn, "root", root));
    DT_TRY(check_buf(pg, fn, "input", in, count));
    size_t nb = (size_t)count * dt_dtype_size(dtype);
    if (pg->rank == root) {
        DT_TRY(check_buf(pg, fn, "output (at root)", out, count));
        if (in != out && overlaps(in, nb, out, nb))
            return DT_ERR(DT_EINVAL, "%s on %s: input and output overlap (only in == out is allowed)", fn, pg->name);
    }
    int avg, det = wants_det(pg, op, dtype, &avg);
    dt_work *w = NULL;
    DT_TRY(new_work(pg, det ? DT_OPK_REDUCE_DET : DT_OPK_REDUCE, count, dtype, (double)nb, wp, &w));
    w->in = in;
    w->out = pg->rank == root ? out : NULL;
    w->avg = avg;
    w->root = root;
    return issue(w, wp);
}

static dt_status p2p(dt_pg *pg, const char *fn, dt_opkind kind, void *buf, int64_t count, dt_dtype dtype,
                     int peer, int tag, dt_work **wp) {
    if (wp) *wp = NULL;
    DT_TRY(check_common(pg, fn, count, dtype));
    DT_TRY(check_buf(pg, fn, "buffer", buf, count));
    DT_TRY(check_rank(pg, fn, "peer", peer));
    int ub = dt__dist.tag_ub < 32767 ? dt__dist.tag_ub : 32767;
    if (tag < 0 || tag > ub) return DT_ERR(DT_EINVAL, "%s on %s: tag %d out of range [0, %d]", fn, pg->name, tag, ub);
    dt_work *w = NULL;
    DT_TRY(new_work(pg, kind, count, dtype, (double)count * dt_dtype_size(dtype), wp, &w));
    w->in = buf;
    w->out = buf;
    w->root = peer;
    w->tag = tag;
    return issue(w, wp);
}

dt_status dt_send(dt_pg *pg, const void *buf, int64_t count, dt_dtype dtype, int peer, int tag, dt_work **w) {
    return p2p(pg, "dt_send", DT_OPK_SEND, (void *)buf, count, dtype, peer, tag, w);
}

dt_status dt_recv(dt_pg *pg, void *buf, int64_t count, dt_dtype dtype, int peer, int tag, dt_work **w) {
    return p2p(pg, "dt_recv", DT_OPK_RECV, buf, count, dtype, peer, tag, w);
}

dt_status dt_barrier(dt_pg *pg, dt_work **wp) {
    if (wp) *wp = NULL;
    DT_TRY(check_common(pg, "dt_barrier", 0, DT_F32));
    dt_work *w = NULL;
    DT_TRY(new_work(pg, DT_OPK_BARRIER, 0, DT_F32, 0, wp, &w));
    return issue(w, wp);
}

/* ---- MPI-mapped operations ---- */

static int64_t seg_elems(const dt_work *w) {
    int64_t s = (int64_t)(dt__dist.segment_bytes / dt_dtype_size(w->dtype));
    return s > 0 ? s : 1;
}

static int nsegs(const dt_work *w) {
    int64_t s = seg_elems(w);
    int64_t n = (w->count + s - 1) / s;
    return n > 0 ? (int)n : 1;
}

#define CHECK(rc, name) do { int _rc = (rc); if (_rc != MPI_SUCCESS) { dt__work_fail(w, _rc, (name)); return _rc; } } while (0)

/* Segment k: elements [k*s, min(count, (k+1)*s)). Segments keep Open MPI's
 * internal temporaries small: measured on this machine, a 64 MiB
 * MPI_Allreduce takes 164 ms in one call but 10 ms as 4 MiB pieces (fresh
 * mmap'ed temporaries page-fault on every call above glibc's mmap threshold). */
static void seg_range(const dt_work *w, int k, int64_t *off, int *n) {
    int64_t s = seg_elems(w);
    *off = (int64_t)k * s;
    int64_t e = *off + s < w->count ? *off + s : w->count;
    *n = (int)(e - *off);
}

int dt__op_start(dt_work *w) {
    dt_pg *pg = w->pg;
    MPI_Comm c = pg->comm[0];
    MPI_Datatype t = dt__mpi_type(w->dtype);
    size_t es = dt_dtype_size(w->dtype);
    w->nreq = 0;
    switch (w->kind) {
    case DT_OPK_ALLREDUCE:
    case DT_OPK_REDUCE: {
        int ns = nsegs(w);
        if (dt__req_reserve(w, ns)) return -1;
        w->fn = w->kind == DT_OPK_ALLREDUCE ? "MPI_Iallreduce" : "MPI_Ireduce";
        for (int k = 0; k < ns; k++) {
            int64_t off;
            int n;
            seg_range(w, k, &off, &n);
            const char *in = (const char *)w->in + off * es;
            char *out = w->out ? (char *)w->out + off * es : NULL;
            const void *sb = (w->in == w->out) ? MPI_IN_PLACE : in;
            int rc = w->kind == DT_OPK_ALLREDUCE
                         ? MPI_Iallreduce(sb, out, n, t, dt__mpi_sum(w->dtype), c, &w->req[k])
                         : MPI_Ireduce(pg->rank == w->root ? sb : in, out, n, t, dt__mpi_sum(w->dtype), w->root, c,
                                       &w->req[k]);
            if (rc != MPI_SUCCESS) {
                w->nreq = k;   /* already started pieces stay live; the group is broken anyway */
                dt__work_fail(w, rc, w->fn);
                return rc;
            }
        }
        w->nreq = ns;
        return MPI_SUCCESS;
    }
    case DT_OPK_ALLGATHER:
        w->fn = "MPI_Iallgather";
        CHECK(MPI_Iallgather(w->in ? w->in : MPI_IN_PLACE, (int)w->count, t, w->out, (int)w->count, t, c, &w->req[0]),
              w->fn);
        break;
    case DT_OPK_BROADCAST:
        w->fn = "MPI_Ibcast";
        CHECK(MPI_Ibcast(w->out, (int)w->count, t, w->root, c, &w->req[0]), w->fn);
        break;
    case DT_OPK_SEND:
        w->fn = "MPI_Isend";
        CHECK(MPI_Isend(w->in, (int)w->count, t, w->root, w->tag, c, &w->req[0]), w->fn);
        break;
    case DT_OPK_RECV:
        w->fn = "MPI_Irecv";
        CHECK(MPI_Irecv(w->out, (int)w->count, t, w->root, w->tag, c, &w->req[0]), w->fn);
        break;
    case DT_OPK_BARRIER:
        w->fn = "MPI_Ibarrier";
        CHECK(MPI_Ibarrier(c, &w->req[0]), w->fn);
        break;
    case DT_OPK_ALLREDUCE_SHM:
    case DT_OPK_REDUCE_SCATTER_SHM:
    case DT_OPK_ALLGATHER_SHM:
    case DT_OPK_ALLREDUCE_NODE:
        return dt__shm_start(w);
    case DT_OPK_ALLREDUCE_HIER:
        return dt__hier_start(w);
    case DT_OPK_REDUCE_SCATTER_HIER:
    case DT_OPK_ALLGATHER_HIER:
        return dt__hshard_start(w);
    default:
        return dt__det_start(w);
    }
    w->nreq = 1;
    return MPI_SUCCESS;
}

int dt__op_finish(dt_work *w) {
    if (dt__kind_is_det(w->kind)) return dt__det_finish(w);
    if (w->kind == DT_OPK_ALLREDUCE_HIER) return dt__hier_finish(w);
    if (w->kind == DT_OPK_REDUCE_SCATTER_HIER || w->kind == DT_OPK_ALLGATHER_HIER) return dt__hshard_finish(w);
    if (w->avg && w->out) dt__scale_div(w->out, w->count, w->dtype, w->pg->size);
    return MPI_SUCCESS;
}

/* THREAD mode, multi-phase kinds without blocking forms of their own: every
 * phase started, waited for and finished in turn. */
static int run_phases(dt_work *w) {
    for (w->phase = 0; w->phase < w->nphase; w->phase++) {
        int rc = dt__op_start(w);
        if (rc == MPI_SUCCESS && w->nreq) {
            rc = MPI_Waitall(w->nreq, w->req, w->sts);
            w->nreq = 0;
            if (rc != MPI_SUCCESS) { dt__work_fail(w, rc, w->fn); return rc; }
        }
        if (rc == MPI_SUCCESS) rc = dt__op_finish(w);
        if (rc != MPI_SUCCESS) return rc;
    }
    return MPI_SUCCESS;
}

int dt__op_run(dt_work *w) {
    if (dt__kind_is_det(w->kind)) return dt__det_run(w);
    if (dt__kind_is_shm(w->kind)) return dt__shm_run(w);   /* averages itself */
    if (w->kind == DT_OPK_ALLREDUCE_HIER || w->kind == DT_OPK_REDUCE_SCATTER_HIER || w->kind == DT_OPK_ALLGATHER_HIER)
        return run_phases(w);
    dt_pg *pg = w->pg;
    MPI_Comm c = pg->comm[0];
    MPI_Datatype t = dt__mpi_type(w->dtype);
    size_t es = dt_dtype_size(w->dtype);
    switch (w->kind) {
    case DT_OPK_ALLREDUCE:
    case DT_OPK_REDUCE: {
        int ns = nsegs(w);
        for (int k = 0; k < ns; k++) {
            int64_t off;
            int n;
            seg_range(w, k, &off, &n);
            const char *in = (const char *)w->in + off * es;
            char *out = w->out ? (char *)w->out + off * es : NULL;
            const void *sb = (w->in == w->out) ? MPI_IN_PLACE : in;
            if (w->kind == DT_OPK_ALLREDUCE)
                CHECK(MPI_Allreduce(sb, out, n, t, dt__mpi_sum(w->dtype), c), "MPI_Allreduce");
            else
                CHECK(MPI_Reduce(pg->rank == w->root ? sb : in, out, n, t, dt__mpi_sum(w->dtype), w->root, c),
                      "MPI_Reduce");
        }
        break;
    }
    case DT_OPK_ALLGATHER:
        CHECK(MPI_Allgather(w->in ? w->in : MPI_IN_PLACE, (int)w->count, t, w->out, (int)w->count, t, c),
              "MPI_Allgather");
        break;
    case DT_OPK_BROADCAST:
        CHECK(MPI_Bcast(w->out, (int)w->count, t, w->root, c), "MPI_Bcast");
        break;
    case DT_OPK_SEND:
        CHECK(MPI_Send(w->in, (int)w->count, t, w->root, w->tag, c), "MPI_Send");
        break;
    case DT_OPK_RECV:
        CHECK(MPI_Recv(w->out, (int)w->count, t, w->root, w->tag, c, MPI_STATUS_IGNORE), "MPI_Recv");
        break;
    case DT_OPK_BARRIER:
        CHECK(MPI_Barrier(c), "MPI_Barrier");
        break;
    default:
        break;
    }
    return dt__op_finish(w);
}
