/* ZeRO's wire: what the gradient reduce-scatters and parameter all-gathers
 * carry (zero.h, "16-bit wire" and "Node-shared memory").
 *
 * Payload per bucket b (numel = N x shard elements, layout range
 * [begin, begin + numel)):
 *   float32, private memory  the float32 data itself (reduce-scatter from the
 *                            full gradient into the owned shard; all-gather
 *                            in place in the flat parameters / a stage-3
 *                            bucket buffer)
 *   otherwise                a wire buffer of numel elements of the wire
 *                            dtype: a region [begin*es, (begin+numel)*es) of a
 *                            node-shared window, or a pool buffer for the time
 *                            the collective is in flight
 * Gradients travel in dp.wire's type; parameters in param_dtype's when it
 * is 16-bit (the working copy: the gathered values are the rounded masters
 * on every rank, the own chunk included, so the 16-bit wire loses nothing),
 * else in dp.wire's. A 16-bit working copy keeps 1-D parameters exact (nn.h
 * dt_param_copy_exact), so each rank's chunk of a parameter all-gather is
 *   [S elements of param_dtype][xn float32s: the exact elements of the shard,
 *                               in layout order, zero-padded]
 * (pchunk elements in all; xn the most any chunk of the bucket holds, fixed
 * at create from the layout: a sliver -- biases and LayerNorm's vectors).
 * Invariants: the owned shards (gradient after reduction, master parameters)
 * are float32 and are never written from a 16-bit value except the reduced
 * gradient itself; with a float32 param_dtype a rank's own chunk of a
 * gathered bucket is its float32 master shard, the other chunks are the
 * owners' values through the wire. Padding is 0 and stays 0 through any
 * rounding. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include "zero_internal.h"

/* floats holding n wire elements of es bytes (windows and the pool count floats) */
static size_t wire_floats(size_t es, size_t n) { return (n * es + sizeof(float) - 1) / sizeof(float); }

static char *win_at(void *win, size_t es, const zbucket *b) { return (char *)win + b->pub.begin * es; }

/* The exact elements of bucket b inside [lo, lo + n) of the layout, in
 * order: counted (vals NULL), packed from x (x[0] is element lo) into vals
 * (unpack 0), or unpacked from vals into x (unpack 1). vals may be unaligned. */
static size_t exact_elems(const dt_zero *z, const zbucket *b, size_t lo, size_t n, float *x, char *vals, int unpack) {
    size_t k = 0;
    for (int j = 0; j < b->pub.n_params; j++) {
        const dt_param *p = z->lay.order[b->pub.first_param + j];
        if (!dt_param_copy_exact(p)) continue;
        size_t a = z->m->offsets[p->index], e = a + (size_t)p->value.numel;
        if (a < lo) a = lo;
        if (e > lo + n) e = lo + n;
        if (a >= e) continue;
        if (vals && unpack) memcpy(x + (a - lo), vals + k * sizeof(float), (e - a) * sizeof(float));
        else if (vals) memcpy(vals + k * sizeof(float), x + (a - lo), (e - a) * sizeof(float));
        k += e - a;
    }
    return k;
}

/* Each bucket's parameter payload: its exact floats per chunk and where it
 * sits in a node-shared window. */
static void param_payload_layout(dt_zero *z) {
    zwire *W = &z->wire;
    int copy16 = z->opts.param_dtype != DT_F32;
    W->ptotal = 0;
    for (int i = 0; i < z->lay.nb; i++) {
        zbucket *b = &z->lay.b[i];
        size_t S = b->pub.shard;
        b->xn = 0;
        for (int q = 0; copy16 && q < z->world; q++) {
            size_t c = exact_elems(z, b, b->pub.begin + (size_t)q * S, S, NULL, NULL, 0);
            if (c > b->xn) b->xn = c;
        }
        b->pchunk = S + b->xn * sizeof(float) / W->pes;
        b->pbegin = W->ptotal;
        W->ptotal += (size_t)z->world * b->pchunk;
    }
}

dt_status dt_zero_wire_setup(dt_zero *z) {
    zwire *W = &z->wire;
    W->dt = z->opts.dp.wire;
    W->es = dt_dtype_size(W->dt);
    W->pdt = z->opts.param_dtype != DT_F32 ? z->opts.param_dtype : W->dt;
    W->pes = dt_dtype_size(W->pdt);
    param_payload_layout(z);
    /* every rank takes the same branches: options are agreed, and
     * dt_pg_alloc_shared's answer is the group's */
    if (z->opts.dp.shm == DT_DP_SHM_OFF || z->world < 2 || z->stage > 2 || z->lay.total == 0) return DT_OK;
    /* nothing trains (evaluation; every parameter frozen): no gradient to
     * reduce and no step's gather, so no window (a W2 evaluation under
     * ZeRO-1 held 2 x its parameters in them per rank) */
    int trains = 0;
    for (int i = 0; i < z->lay.nb; i++) trains |= z->lay.b[i].pub.trainable;
    if (!trains) return DT_OK;
    if (z->stage == 1 && W->dt == DT_F32) {   /* the gradients themselves, as DDP */
        DT_TRY(dt_pg_alloc_shared(z->pg, z->lay.total, &W->shm_grads));
        if (W->shm_grads) {
            DT_TRY(dt_model_set_grad_buffer(z->m, W->shm_grads));
            dt_zero_point_full_grads(z);
        }
    } else if (z->stage == 1) {
        float *win = NULL;
        DT_TRY(dt_pg_alloc_shared(z->pg, wire_floats(W->es, z->lay.total), &win));
        W->rs_win = win;
        if (win) W->shm_bytes += wire_floats(W->es, z->lay.total) * sizeof(float);
    }
    if (W->mparams) return DT_OK;   /* gathers land in the machine's parameters themselves */
    float *win = NULL;
    DT_TRY(dt_pg_alloc_shared(z->ag_pg, wire_floats(W->pes, W->ptotal), &win));
    W->ag_win = win;
    if (win) W->shm_bytes += wire_floats(W->pes, W->ptotal) * sizeof(float);
    return DT_OK;
}

/* The model's parameters move into one copy per machine. The values are
 * equal on every rank (broadcast at create): the machine's lowest rank
 * copies them in. Stage 3 then keeps whole parameters like stage 2: the
 * copy is already there, per machine. */
dt_status dt_zero_wire_node_params(dt_zero *z) {
    zwire *W = &z->wire;
    float *buf = NULL;
    DT_TRY(dt_pg_alloc_machine(z->ag_pg, z->lay.total ? z->lay.total : 1, z->m->param_flat.data, &buf));
    if (!buf) {
        snprintf(W->mparams_why, sizeof W->mparams_why, "%s", dt_pg_shared_unavailable(z->ag_pg));
        return DT_OK;
    }
    dt_status s = dt_model_set_param_buffer(z->m, buf, 1);
    if (s != DT_OK) {
        if (dt_pg_free_machine(z->ag_pg, buf) != DT_OK) dt_error_clear();
        return s;
    }
    W->mparams = buf;
    if (z->stage == 3) z->stage = 2;
    return DT_OK;
}

void dt_zero_wire_free(dt_zero *z) {
    zwire *W = &z->wire;
    if (W->mparams) {   /* parameters back into private memory before the machine's copy goes */
        if (z->m->param_flat.data == W->mparams && dt_model_set_param_buffer(z->m, NULL, 0) != DT_OK) dt_error_clear();
        if (dt_pg_free_machine(z->ag_pg, W->mparams) != DT_OK) dt_error_clear();
        W->mparams = NULL;
    }
    if (W->shm_grads) {   /* gradients back into private memory before the window goes */
        if (z->m->grad_flat.data == W->shm_grads && dt_model_set_grad_buffer(z->m, NULL) != DT_OK) dt_error_clear();
        dt_zero_point_full_grads(z);
        if (dt_pg_free_shared(z->pg, W->shm_grads) != DT_OK) dt_error_clear();
        W->shm_grads = NULL;
    }
    if (W->rs_win && dt_pg_free_shared(z->pg, W->rs_win) != DT_OK) dt_error_clear();
    if (W->ag_win && z->ag_pg && dt_pg_free_shared(z->ag_pg, W->ag_win) != DT_OK) dt_error_clear();
    W->rs_win = W->ag_win = NULL;
}

/* A wire buffer of es-byte elements for bucket b: its window region, else one from the pool. */
static void *wire_buf(dt_zero *z, const zbucket *b, void *win, size_t es, int *pooled) {
    *pooled = !win;
    if (win) return win_at(win, es, b);
    return dt_zero_pool_get(z, wire_floats(es, b->pub.numel));
}

static void wire_put(dt_zero *z, const zbucket *b, void *buf, size_t es, int pooled) {
    if (buf && pooled) dt_zero_pool_put(z, buf, wire_floats(es, b->pub.numel));
}

/* ---- gradients ---- */

dt_status dt_zero_wire_reduce(dt_zero *z, int i, dt_work **w) {
    zbucket *b = &z->lay.b[i];
    size_t n = b->pub.numel, S = b->pub.shard;
    float *out = dt_zero_shard_grad_ptr(z, i);   /* stage 1: inside full_grad (its own chunk) */
    z->stats.bytes_reduced += n * z->wire.es;
    if (z->wire.dt == DT_F32)   /* shared when full_grad lies in wire.shm_grads */
        return dt_reduce_scatter(z->pg, b->full_grad, out, (int64_t)S, DT_F32, z->rd.op, w);
    void *buf = wire_buf(z, b, z->wire.rs_win, z->wire.es, &b->rs_pooled);
    if (!buf) return DT_ERR(DT_ENOMEM, "zero: out of memory for a %zu-element %s gradient bucket", n, dt_dtype_name(z->wire.dt));
    dt_convert(buf, z->wire.dt, b->full_grad, DT_F32, n);   /* round to nearest even */
    b->rs_wire = buf;
    /* in place: this rank's reduced chunk lands on its own chunk of the input */
    char *mine = (char *)buf + (size_t)z->rank * S * z->wire.es;
    dt_status s = dt_reduce_scatter(z->pg, buf, mine, (int64_t)S, z->wire.dt, z->rd.op, w);
    if (s != DT_OK) {   /* nothing issued: give the buffer back */
        wire_put(z, b, buf, z->wire.es, b->rs_pooled);
        b->rs_wire = NULL;
    }
    return s;
}

void dt_zero_wire_reduced(dt_zero *z, int i) {
    zbucket *b = &z->lay.b[i];
    if (!b->rs_wire) return;
    size_t S = b->pub.shard;
    const char *mine = (const char *)b->rs_wire + (size_t)z->rank * S * z->wire.es;
    dt_convert(dt_zero_shard_grad_ptr(z, i), DT_F32, mine, z->wire.dt, S);   /* exact widening */
    wire_put(z, b, b->rs_wire, z->wire.es, b->rs_pooled);
    b->rs_wire = NULL;
}

/* ---- parameters ---- */

/* bucket b's all-gather payload: its window region, else a pool buffer */
static void *param_buf(dt_zero *z, zbucket *b) {
    const zwire *W = &z->wire;
    b->ag_pooled = !W->ag_win;
    if (W->ag_win) return (char *)W->ag_win + b->pbegin * W->pes;
    return dt_zero_pool_get(z, wire_floats(W->pes, (size_t)z->world * b->pchunk));
}

static void param_buf_put(dt_zero *z, zbucket *b) {
    if (b->ag_wire && b->ag_pooled) dt_zero_pool_put(z, b->ag_wire, wire_floats(z->wire.pes, (size_t)z->world * b->pchunk));
    b->ag_wire = NULL;
    b->ag_dest = NULL;
}

dt_status dt_zero_wire_gather(dt_zero *z, int i, float *dest, dt_work **w) {
    zbucket *b = &z->lay.b[i];
    size_t n = b->pub.numel, S = b->pub.shard;
    float *shard = dt_zero_shard_param_ptr(z, i);
    float *own = dest + (size_t)z->rank * S;
    const zwire *W = &z->wire;
    int copy16 = z->opts.param_dtype != DT_F32;   /* the working copy: the own chunk rounded too */
    z->stats.bytes_gathered += (size_t)z->world * b->pchunk * W->pes;
    if (W->mparams)   /* dest is in the machine's copy; the own shard is in place there */
        return dt_allgather_machine(z->ag_pg, dest, (int64_t)S, DT_F32, w);
    if (own != shard && !copy16) memcpy(own, shard, S * sizeof(float));   /* stage 3: the exact master values */
    if (W->pdt == DT_F32 && !W->ag_win)   /* in place in dest */
        return dt_allgather(z->ag_pg, own, dest, (int64_t)S, DT_F32, w);
    char *buf = param_buf(z, b);
    if (!buf) return DT_ERR(DT_ENOMEM, "zero: out of memory for a %zu-element %s parameter bucket", n, dt_dtype_name(W->pdt));
    char *mine = buf + (size_t)z->rank * b->pchunk * W->pes;
    dt_convert(mine, W->pdt, shard, DT_F32, S);   /* f32 -> f32 is a copy */
    if (b->xn) {   /* the exact floats after the rounded ones */
        char *x = mine + S * W->pes;
        size_t k = exact_elems(z, b, b->pub.own_begin, S, shard, x, 0);
        memset(x + k * sizeof(float), 0, (b->xn - k) * sizeof(float));
    }
    b->ag_wire = buf;
    b->ag_dest = dest;
    dt_status s = dt_allgather(z->ag_pg, mine, buf, (int64_t)b->pchunk, W->pdt, w);
    if (s != DT_OK) param_buf_put(z, b);   /* nothing issued */
    return s;
}

/* the first inf among n floats (an fp16 payload element beyond 65504), or -1 */
static int64_t first_inf(const float *x, size_t n) {
    for (size_t k = 0; k < n; k++)
        if (isinf(x[k])) return (int64_t)k;
    return -1;
}

static dt_status refuse_overflow(const dt_zero *z, const zbucket *b, int q, size_t at) {
    for (int j = 0; j < b->pub.n_params; j++) {
        const dt_param *p = z->lay.order[b->pub.first_param + j];
        size_t a = z->m->offsets[p->index];
        if (at >= a && at < a + (size_t)p->value.numel)   /* (fp16 on the wire: a working copy, or dp.wire's) */
            return DT_ERR(DT_EINVAL, "parameter %s: element %zu is beyond fp16's range (65504) in rank %d's master "
                          "shard (%s gathers as inf): use %s", p->name, at - a, dt_pg_world_rank(z->ag_pg, q),
                          z->opts.param_dtype == DT_F16 ? "its fp16 working copy" : "dp.wire fp16",
                          z->opts.param_dtype == DT_F16 ? "train.param_dtype bf16 or fp32" : "dp.wire bf16, or dp.wire f32");
    }
    return DT_ERR(DT_EINVAL, "zero: bucket %d: a padding element gathered as inf from rank %d", b->pub.index,
                  dt_pg_world_rank(z->ag_pg, q));
}

dt_status dt_zero_wire_gathered(dt_zero *z, int i, int check) {
    zbucket *b = &z->lay.b[i];
    if (!b->ag_wire) return DT_OK;
    size_t S = b->pub.shard, pes = z->wire.pes;
    int copy16 = z->opts.param_dtype != DT_F32;
    dt_status s = DT_OK;
    for (int q = 0; q < z->world; q++) {   /* float32 param_dtype: the own chunk stays the exact master copy */
        float *d = b->ag_dest + (size_t)q * S;
        if (q == z->rank && !copy16) {   /* the peers see it as inf: refuse with them */
            int64_t k = check && s == DT_OK && z->wire.pdt == DT_F16 ? dt_f16_first_overflow(d, S) : -1;
            if (k >= 0) s = refuse_overflow(z, b, q, b->pub.begin + (size_t)q * S + (size_t)k);
            continue;
        }
        const char *chunk = (const char *)b->ag_wire + (size_t)q * b->pchunk * pes;
        dt_convert(d, DT_F32, chunk, z->wire.pdt, S);
        if (b->xn) exact_elems(z, b, b->pub.begin + (size_t)q * S, S, d, (char *)chunk + S * pes, 1);
        int64_t k = check && s == DT_OK && z->wire.pdt == DT_F16 ? first_inf(d, S) : -1;
        if (k >= 0) s = refuse_overflow(z, b, q, b->pub.begin + (size_t)q * S + (size_t)k);
    }
    param_buf_put(z, b);
    return s;
}
