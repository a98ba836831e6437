/* Inverted dropout keyed by position: y = x * keep / (1 - p).
 *
 * Counter-based: nothing is drawn from a running generator. Element e of row
 * b is kept iff dt_dropout_hash(row_keys[b], site, e) >= thr, where
 * thr = round(p * 2^32) (clamped to 2^32 - 1), so the keep probability is
 * 1 - thr / 2^32, within 2^-32 of 1 - p for a uniform hash.
 *
 * The hash: the pair (row key, site) is folded once per row by splitmix64's
 * finaliser (a bijection of 64-bit words with full avalanche) into a stream
 * key k; element e then hashes to h = lowbias32(v), v = (e * 0x9E3779B9 +
 * lo(k)) ^ hi(k) (32-bit arithmetic).
 * e -> v is injective for e < 2^32 (odd multiplier) and lowbias32 is a
 * bijection, so the elements of one row and site get pairwise distinct
 * 32-bit values; lowbias32 (C. Wellons' hash-prospector: xorshift-multiply,
 * bias ~0.17) spreads consecutive counters uniformly. Statistical, not
 * cryptographic. 32-bit lanes only: the inner loop vectorizes (pmulld).
 *
 * The mask depends only on (row key, site, e): not on the thread count,
 * nor on which batch or position in it the row has. The mask (uint8
 * [numel]) is saved for backward: dx += dy * mask * scale with the same float
 * scale as the forward. */
#include <stdint.h>
#include "dtrain/ops.h"

#define GOLDEN64 0x9E3779B97F4A7C15ull
#define GOLDEN32 0x9E3779B9u

static inline uint64_t splitmix64(uint64_t z) {
    z += GOLDEN64;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static inline uint32_t lowbias32(uint32_t x) {
    x ^= x >> 16;
    x *= 0x7FEB352Du;
    x ^= x >> 15;
    x *= 0x846CA68Bu;
    x ^= x >> 16;
    return x;
}

uint64_t dt_dropout_row_key(uint64_t seed, uint64_t step, uint64_t sample) {
    return splitmix64(splitmix64(splitmix64(seed) ^ step) ^ sample);
}

static inline uint64_t stream_key(uint64_t row_key, uint64_t site) { return splitmix64(row_key ^ splitmix64(site)); }

static inline uint32_t elem_hash(uint64_t k, uint32_t e) {
    return lowbias32((e * GOLDEN32 + (uint32_t)k) ^ (uint32_t)(k >> 32));
}

uint32_t dt_dropout_hash(uint64_t row_key, uint64_t site, uint32_t elem) {
    return elem_hash(stream_key(row_key, site), elem);
}

static void dropout_backward(dt_graph *g, dt_node *n) {
    float *dx = dt_grad_of(g, n->in[0]);
    if (!dx) return;
    const uint8_t *mask = n->saved;
    const float scale = n->f[0];
    const float *dy = dt_f32(n->out->grad);
    const int64_t numel = n->out->numel;
    #pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < numel; i++)
        if (mask[i]) dx[i] += dy[i] * scale;
}

/* Elements [e0, e1) of one row with stream key k; element e of x is
 * element off + e of the whole row (sequence parallelism's shard). */
static void drop_span(const float *x, float *y, uint8_t *mask, uint64_t k, uint32_t thr, float scale, int64_t e0,
                      int64_t e1, uint32_t off) {
    for (int64_t e = e0; e < e1; e++) {
        uint8_t keep = elem_hash(k, (uint32_t)e + off) >= thr;
        mask[e] = keep;
        y[e] = keep ? x[e] * scale : 0.f;
    }
}

#define DROP_CHUNK 4096   /* elements per parallel work item */

dt_tensor *dt_op_dropout(dt_graph *g, dt_tensor *x, float p, const uint64_t *row_keys, uint64_t site) {
    return dt_op_dropout_at(g, x, p, row_keys, site, 0);
}

dt_tensor *dt_op_dropout_at(dt_graph *g, dt_tensor *x, float p, const uint64_t *row_keys, uint64_t site,
                            int64_t offset) {
    char sx[64];
    if (!g || !x) { DT_ERR(DT_EINVAL, "dropout: graph and x are required"); return NULL; }
    dt_shape_str(x, sx, sizeof sx);
    if (x->dtype != DT_F32 || !x->data) { DT_ERR(DT_EINVAL, "dropout: x%s must be an F32 tensor with data", sx); return NULL; }
    if (!(p >= 0.f && p < 1.f)) { DT_ERR(DT_EINVAL, "dropout: p = %g must be in [0, 1) (x%s)", p, sx); return NULL; }
    if (!dt_graph_training(g) || p == 0.f) return x;
    if (!row_keys) {
        DT_ERR(DT_EINVAL, "dropout: training with p = %g needs one key per row of x%s (dt_batch.row_keys)", p, sx);
        return NULL;
    }
    if (x->ndim < 1 || x->shape[0] <= 0) { DT_ERR(DT_EINVAL, "dropout: x%s has no rows", sx); return NULL; }
    const int64_t R = x->shape[0], E = x->numel / R;
    if (offset < 0 || E + offset >= ((int64_t)1 << 32)) {
        DT_ERR(DT_EINVAL, "dropout: x%s has %lld elements per row from element %lld: offset must be >= 0 and the "
               "row's end below 2^32", sx, (long long)E, (long long)offset);
        return NULL;
    }

    int64_t shape[DT_MAX_DIMS];
    for (int i = 0; i < x->ndim; i++) shape[i] = x->shape[i];
    dt_tensor *y = dt_graph_tensor(g, x->ndim, shape);
    uint8_t *mask = dt_graph_scratch(g, (size_t)x->numel);
    if (!y || !mask) return NULL;

    double t = (double)p * 4294967296.0 + 0.5;
    const uint32_t thr = t >= 4294967295.0 ? UINT32_MAX : (uint32_t)t;
    const float scale = 1.0f / (1.0f - p);
    const float *xd = dt_f32(x);
    float *yd = dt_f32(y);
    const int64_t per_row = (E + DROP_CHUNK - 1) / DROP_CHUNK, items = R * per_row;
    #pragma omp parallel for schedule(static)
    for (int64_t it = 0; it < items; it++) {
        int64_t b = it / per_row, e0 = (it % per_row) * DROP_CHUNK, e1 = e0 + DROP_CHUNK < E ? e0 + DROP_CHUNK : E;
        int64_t off = b * E;
        drop_span(xd + off, yd + off, mask + off, stream_key(row_keys[b], site), thr, scale, e0, e1, (uint32_t)offset);
    }
    dt_node *n = dt_graph_record(g, "dropout", dropout_backward, y, 1, &x);
    if (n) {
        n->saved = mask;
        n->f[0] = scale;
    }
    return y;
}
