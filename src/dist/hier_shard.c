/* Hierarchical reduce-scatter and allgather (dist.h section 10): rank k's
 * chunk crosses into (or out of) each machine once, through the rank that
 * handles k's chunk there (dt__chunk_handler: local index of k mod the
 * machine's rank count, so ranks with equal local index pair up).
 * H(me) = the chunks this rank handles, ascending (its own among them).
 *
 * reduce-scatter, plain
 *   phase 0  node[0]   alltoallv: each local rank's copy of the chunks in
 *                      H(l) goes to l (packed); summed in local rank order
 *   phase 2  cross[0]  each handled chunk's machine sum goes to its owner;
 *                      the owner receives one from every other machine and
 *                      sums them in machine order (/ size for AVG)
 * reduce-scatter, deterministic (F32, machines of consecutive ranks): rank
 * order, bitwise the flat result. Phase 0 as above without the sum, then
 *   phase 1  cross[1]  receive each handled chunk's running sum from its
 *                      handler on the previous machine; add this machine's
 *                      copies in local rank order
 *   phase 2  cross[1]  send it on to the next machine's handler, or (last
 *            cross[0]  machine) deliver the total to the chunk's owner
 * allgather (no arithmetic: the same in both modes)
 *   phase 2  cross[0]  own chunk to its handler on every other machine;
 *                      handled chunks from their owners, into out
 *   phase 3  node[1]   allgatherv of the handled chunks (packed), unpacked
 *                      into out
 * Into a machine buffer (machine_buf.c), phase 3 is a barrier of node[1]:
 * the handlers wrote the chunks into the one buffer of their machine.
 * The phases a kind does not use issue nothing. Messages between one pair on
 * one communicator go in ascending chunk order on both sides, so they match.
 *
 * stage (pool): [send pack: |H(l)| chunks for every local l = size chunks]
 * [receive rows: R x |H(me)| chunks] [running sums / machine partials:
 * max(|H(me)|, machines) chunks].
 */
#include <stdlib.h>
#include <string.h>
#include "dist/dist_internal.h"

#define CHECK(rc, name) do { int _rc = (rc); if (_rc != MPI_SUCCESS) { dt__work_fail(w, _rc, (name)); return _rc; } } while (0)

typedef struct shard_ctx {
    const dt_topo *t;
    int size, me, R, nh;   /* group size, rank, ranks here, |H(me)| */
    const int *mine;        /* H(me): t->hand + t->hand_off[local rank] */
    size_t cb;              /* chunk bytes */
    char *pack, *rows, *acc;
} shard_ctx;

static void ctx_of(dt_work *w, shard_ctx *c) {
    dt_pg *pg = w->pg;
    c->t = &pg->topo;
    c->size = pg->size;
    c->me = pg->rank;
    c->R = c->t->local_size;
    c->mine = c->t->hand + c->t->hand_off[c->t->local_rank];
    c->nh = c->t->hand_off[c->t->local_rank + 1] - c->t->hand_off[c->t->local_rank];
    c->cb = (size_t)w->count * dt_dtype_size(w->dtype);
    c->pack = w->stage;
    c->rows = c->pack ? c->pack + (size_t)c->size * c->cb : NULL;
    c->acc = c->rows ? c->rows + (size_t)c->R * (size_t)c->nh * c->cb : NULL;
}

static size_t stage_bytes(const shard_ctx *c) {
    int nacc = c->nh > c->t->machines ? c->nh : c->t->machines;
    return ((size_t)c->size + (size_t)c->R * (size_t)c->nh + (size_t)nacc) * c->cb;
}

/* Byte counts and offsets per local rank q: each rank's handled chunks,
 * packed in local rank order (recv < 0), or recv bytes from every q. */
static void counts(const shard_ctx *c, int *len, int *off, int recv) {
    const int *ho = c->t->hand_off;
    for (int q = 0; q < c->R; q++) {
        len[q] = recv >= 0 ? recv : (int)((size_t)(ho[q + 1] - ho[q]) * c->cb);
        off[q] = recv >= 0 ? q * recv : (int)((size_t)ho[q] * c->cb);
    }
}

static int shard_phase(dt_work *w) {
    const dt_topo *t = &w->pg->topo;
    int rs = w->kind == DT_OPK_REDUCE_SCATTER_HIER, det = w->hier_det;
    shard_ctx c;
    ctx_of(w, &c);
    int need = 2 * (c.size + t->machines) + 2;
    if (dt__req_reserve(w, need)) return -1;
    w->nreq = 0;
    if (w->phase == 0 && !w->stage) {
        size_t bytes = stage_bytes(&c);
        w->stage = dt__pool_get(w->pg, bytes ? bytes : 64, &w->stage_cap);
        if (!w->stage) {
            dt__work_failf(w, DT_ENOMEM, "out of memory for a %zu-byte staging buffer", bytes);
            return -1;
        }
        ctx_of(w, &c);
    }
    if (!w->counts) {
        w->counts = malloc((size_t)4 * (size_t)c.R * sizeof(int));
        if (!w->counts) {
            dt__work_failf(w, DT_ENOMEM, "out of memory for %d counts", 4 * c.R);
            return -1;
        }
    }
    int *len = w->counts, *off = len + c.R, *rl = off + c.R, *ro = rl + c.R;
    const char *in = w->in ? (const char *)w->in : (const char *)w->out + (size_t)c.me * c.cb;
    char *out = w->out;
    int m = t->machine, last = m + 1 == t->machines;
    /* the counts are in bytes (MPI_BYTE): one datatype for every payload */
    switch (w->phase) {
    case 0: {
        if (!rs) break;
        counts(&c, len, off, -1);   /* what each local rank handles, packed in its order */
        for (int p = 0; p < c.size; p++) memcpy(c.pack + (size_t)p * c.cb, in + (size_t)t->hand[p] * c.cb, c.cb);
        counts(&c, rl, ro, (int)((size_t)c.nh * c.cb));
        w->fn = "MPI_Ialltoallv";
        CHECK(MPI_Ialltoallv(c.pack, len, off, MPI_BYTE, c.rows, rl, ro, MPI_BYTE, t->node[0], &w->req[w->nreq++]),
              w->fn);
        break;
    }
    case 1:
        if (!rs || !det || m == 0) break;
        w->fn = "MPI_Irecv";
        for (int i = 0; i < c.nh; i++) {
            int k = c.mine[i];
            CHECK(MPI_Irecv(c.acc + (size_t)i * c.cb, (int)c.cb, MPI_BYTE, dt__chunk_handler(t, m - 1, k), 0,
                            t->cross[1], &w->req[w->nreq++]), w->fn);
        }
        break;
    case 2:
        if (rs && det) {
            for (int i = 0; i < c.nh; i++) {
                int k = c.mine[i];
                if (!last) {
                    w->fn = "MPI_Isend";
                    CHECK(MPI_Isend(c.acc + (size_t)i * c.cb, (int)c.cb, MPI_BYTE, dt__chunk_handler(t, m + 1, k), 0,
                                    t->cross[1], &w->req[w->nreq++]), w->fn);
                } else if (k != c.me) {
                    w->fn = "MPI_Isend";
                    CHECK(MPI_Isend(c.acc + (size_t)i * c.cb, (int)c.cb, MPI_BYTE, k, 0, t->cross[0],
                                    &w->req[w->nreq++]), w->fn);
                }
            }
            if (!last) {
                w->fn = "MPI_Irecv";
                CHECK(MPI_Irecv(out, (int)c.cb, MPI_BYTE, dt__chunk_handler(t, t->machines - 1, c.me), 0, t->cross[0],
                                &w->req[w->nreq++]), w->fn);
            }
        } else if (rs) {
            /* machine sums to their owners; the owner's from every other machine */
            for (int i = 0; i < c.nh; i++) {
                int k = c.mine[i];
                if (k == c.me) continue;
                w->fn = "MPI_Isend";
                CHECK(MPI_Isend(c.rows + (size_t)i * c.cb, (int)c.cb, MPI_BYTE, k, 0, t->cross[0], &w->req[w->nreq++]),
                      w->fn);
            }
            for (int mm = 0; mm < t->machines; mm++) {
                if (mm == m) continue;
                w->fn = "MPI_Irecv";
                CHECK(MPI_Irecv(c.acc + (size_t)mm * c.cb, (int)c.cb, MPI_BYTE, dt__chunk_handler(t, mm, c.me), 0,
                                t->cross[0], &w->req[w->nreq++]), w->fn);
            }
        } else {   /* allgather: own chunk out, handled chunks in */
            char *mine = out + (size_t)c.me * c.cb;
            if (in != mine) memcpy(mine, in, c.cb);
            for (int mm = 0; mm < t->machines; mm++) {
                if (mm == m) continue;
                w->fn = "MPI_Isend";
                CHECK(MPI_Isend(mine, (int)c.cb, MPI_BYTE, dt__chunk_handler(t, mm, c.me), 0, t->cross[0],
                                &w->req[w->nreq++]), w->fn);
            }
            for (int i = 0; i < c.nh; i++) {
                int k = c.mine[i];
                if (t->machine_of[k] == m) continue;
                w->fn = "MPI_Irecv";
                CHECK(MPI_Irecv(out + (size_t)k * c.cb, (int)c.cb, MPI_BYTE, k, 0, t->cross[0], &w->req[w->nreq++]),
                      w->fn);
            }
        }
        break;
    default: {
        if (rs) break;
        if (w->machine_out) {   /* one buffer per machine: every chunk is in it once all have landed */
            w->fn = "MPI_Ibarrier";
            CHECK(MPI_Ibarrier(t->node[1], &w->req[w->nreq++]), w->fn);
            break;
        }
        /* allgather inside: every local rank's handled chunks, packed */
        for (int i = 0; i < c.nh; i++) memcpy(c.acc + (size_t)i * c.cb, out + (size_t)c.mine[i] * c.cb, c.cb);
        counts(&c, len, off, -1);
        w->fn = "MPI_Iallgatherv";
        CHECK(MPI_Iallgatherv(c.acc, (int)((size_t)c.nh * c.cb), MPI_BYTE, c.pack, len, off, MPI_BYTE, t->node[1],
                              &w->req[w->nreq++]), w->fn);
        break;
    }
    }
    return MPI_SUCCESS;
}

int dt__hshard_start(dt_work *w) { return shard_phase(w); }

int dt__hshard_finish(dt_work *w) {
    const dt_topo *t = &w->pg->topo;
    int rs = w->kind == DT_OPK_REDUCE_SCATTER_HIER, det = w->hier_det, m = t->machine;
    int last = m + 1 == t->machines;
    shard_ctx c;
    ctx_of(w, &c);
    int64_t n = w->count;
    int nsrc = (c.R > t->machines ? c.R : t->machines) + 1;
    const void **src = malloc((size_t)nsrc * sizeof *src);
    if (!src) {
        dt__work_failf(w, DT_ENOMEM, "out of memory for %d pointers", nsrc);
        return -1;
    }
    if (rs && w->phase == 0 && !det) {
        /* machine sum of each handled chunk, in local rank order, into row 0 */
        for (int i = 0; i < c.nh; i++) {
            for (int q = 0; q < c.R; q++) src[q] = c.rows + ((size_t)q * (size_t)c.nh + (size_t)i) * c.cb;
            dt__sum_ptrs(c.rows + (size_t)i * c.cb, src, n, c.R, w->dtype, 0);
        }
    } else if (rs && w->phase == 1 && det) {
        for (int i = 0; i < c.nh; i++) {
            int ns = 0;
            if (m > 0) src[ns++] = c.acc + (size_t)i * c.cb;
            for (int q = 0; q < c.R; q++) src[ns++] = c.rows + ((size_t)q * (size_t)c.nh + (size_t)i) * c.cb;
            dt__sum_ptrs(c.acc + (size_t)i * c.cb, src, n, ns, w->dtype, last && w->avg ? c.size : 0);
        }
    } else if (rs && w->phase == 2) {
        if (det) {
            if (last)
                for (int i = 0; i < c.nh; i++)
                    if (c.mine[i] == c.me) memcpy(w->out, c.acc + (size_t)i * c.cb, c.cb);
        } else {
            /* the machines' sums of the own chunk, in machine order */
            int own = 0;
            while (c.mine[own] != c.me) own++;
            for (int mm = 0; mm < t->machines; mm++)
                src[mm] = mm == m ? (const void *)(c.rows + (size_t)own * c.cb) : (const void *)(c.acc + (size_t)mm * c.cb);
            dt__sum_ptrs(w->out, src, n, t->machines, w->dtype, w->avg ? c.size : 0);
        }
    } else if (!rs && w->phase == 3 && !w->machine_out) {
        /* unpack every other local rank's handled chunks */
        const int *ho = t->hand_off;
        for (int p = 0; p < c.size; p++)
            if (p < ho[t->local_rank] || p >= ho[t->local_rank + 1])
                memcpy((char *)w->out + (size_t)t->hand[p] * c.cb, c.pack + (size_t)p * c.cb, c.cb);
    }
    free(src);
    return MPI_SUCCESS;
}
