/* Fused causal multi-head self-attention.
 *
 * qkv[B, T, 3C] holds [q | k | v] per token, each C = H * hs wide; head h of
 * q is columns h*hs .. (h+1)*hs of the q part (row stride 3C). Per (b, h):
 *   S = q k^T / sqrt(hs)   [T, T], causal: only j <= i
 *   P = softmax_rows(S),   y = P v -> y[b, :, h*hs : (h+1)*hs]  (row stride C)
 * backward (a = 1 / sqrt(hs)):
 *   dP = dy v^T,  dv += P^T dy,  dS = P (dP - rowsum(dP P)),
 *   dq += a dS k,  dk += a dS^T q
 *
 * The products use two register-blocked micro-kernels (8 x 32 output tiles,
 * att_tiles.h: AVX-512 or AVX2 + FMA where the build has it, portable C
 * elsewhere; the tiles give the same bits on all, though the op as a whole
 * does not, as its omp simd sums and exp follow the vector width) on per-head packed
 * copies of q, k, v and dy, so every tile skips the masked upper triangle
 * at 8-row / 32-column granularity. Padded sizes: Tp = T rounded up to 32,
 * HSp = hs rounded up to 32; padding rows/columns of the packed copies are
 * zero.
 *
 * Saved: each row's softmax max and 1 / sum (stats[B*H][T][2]). No [T, T]
 * block is held per head for the whole batch: forward computes P eight rows
 * at a time and uses them at once (y = P v), and backward recomputes a
 * head's P into its thread's [Tp][Tp] workspace from the same tiles and the
 * saved statistics, in one exp pass, hence with the same bits as forward's.
 * (Inside dt_graph_pack16, q and k come back rounded to 16 bits while the
 * statistics stay exact, so the recomputed P is forward's up to that
 * rounding -- measured closer to fp32's gradient than saving P in bf16 was,
 * and half the error that rounding q, k, v in forward too gave: PERFORMANCE.md.)
 * Memory: O(threads x T^2) instead of O(B x H x T^2) (GPT-2 small at T 1024,
 * B 8: 4.8 GB of probabilities no longer kept); the price is one more q k^T
 * product per head in backward. Invariant of a head's P for row i < T:
 * P[i][j] is the probability for j <= i and 0 for i < j < round_up(i + 1,
 * ATT_R); nothing else is read.
 *
 * (b, h) pairs are independent (disjoint columns of y and dqkv), so they run
 * in an OpenMP loop, each thread with its own packing workspace. */
#include <omp.h>
#include "att_tiles.h"
#include "ops_internal.h"

static int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

typedef struct att_dims {
    int64_t T, C, hs, Tp, HSp;
    float scale;
} att_dims;

/* The packs read one head's hs columns of T rows that lie 3C floats apart
 * (dy's: C): a stride the hardware prefetchers follow late, so each pack
 * asks for the row PF_ROWS ahead itself. n floats from p, p[n - 1]'s line
 * included (an unaligned row spans one line more than n / 16). */
#define PF_ROWS 8
static inline void prefetch_row(const float *p, int64_t n) {
    for (int64_t c = 0; c < n; c += 16) __builtin_prefetch(p + c, 0, 3);
    __builtin_prefetch(p + n - 1, 0, 3);
}
static inline void prefetch_row_w(float *p, int64_t n) {
    for (int64_t c = 0; c < n; c += 16) __builtin_prefetch(p + c, 1, 3);
    __builtin_prefetch(p + n - 1, 1, 3);
}

/* dst[Tp][HSp] = alpha * src[i, c] (row stride ld) for i < T, c < hs; zero padding. */
static void pack_rows(float *dst, const float *src, int64_t ld, const att_dims *d, float alpha) {
    for (int64_t i = 0; i < d->Tp; i++) {
        float *o = dst + i * d->HSp;
        int64_t c = 0;
        if (i + PF_ROWS < d->T) prefetch_row(src + (i + PF_ROWS) * ld, d->hs);
        if (i < d->T)
            for (; c < d->hs; c++) o[c] = alpha * src[i * ld + c];
        for (; c < d->HSp; c++) o[c] = 0.0f;
    }
}

/* dst[hs][Tp] = src^T: dst[c][j] = src[j, c] for j < T; zero for j >= T. */
static void pack_cols(float *dst, const float *src, int64_t ld, const att_dims *d) {
    const int64_t T = d->T, Tp = d->Tp;
    for (int64_t j0 = 0; j0 < Tp; j0 += ATT_R) {   /* ATT_R source rows at a time, read along the row */
        for (int64_t j = j0 + PF_ROWS; j < j0 + PF_ROWS + ATT_R && j < T; j++) prefetch_row(src + j * ld, d->hs);
        const int64_t n = T - j0 >= ATT_R ? ATT_R : (T > j0 ? T - j0 : 0);   /* rows < T in this block */
        int64_t c = 0;
        if (n == ATT_R)   /* a full block, 8 columns at a time (att_transpose8 moves 8 rows: ATT_R is 8) */
            for (; c + 8 <= d->hs; c += 8) att_transpose8(src + j0 * ld + c, ld, dst + c * Tp + j0, Tp);
        for (; c < d->hs; c++)   /* the columns left, or a block reaching past row T */
            for (int64_t j = 0; j < ATT_R; j++) dst[c * Tp + j0 + j] = j < n ? src[(j0 + j) * ld + c] : 0.0f;
    }
}

/* dst[i, c0 + c] (+)= alpha * tile[r][c] for rows i = i0 + r < T, columns < hs. */
static void unpack_tile(float *dst, int64_t ld, const float *tile, int64_t i0, int64_t c0, const att_dims *d,
                        float alpha, int accumulate) {
    int64_t w = d->hs - c0 < ATT_C ? d->hs - c0 : ATT_C;
    for (int r = 0; r < ATT_R && i0 + r < d->T; r++) {
        float *o = dst + (i0 + r) * ld + c0;
        if (i0 + r + ATT_R < d->T) prefetch_row_w(o + ATT_R * ld, w);   /* the next tile's row */
        const float *t = tile + r * ATT_C;
        if (accumulate)
            for (int64_t c = 0; c < w; c++) o[c] += alpha * t[c];
        else
            for (int64_t c = 0; c < w; c++) o[c] = alpha * t[c];
    }
}

static size_t fwd_ws_floats(const att_dims *d) { return (size_t)(2 * d->Tp * d->HSp + d->hs * d->Tp + ATT_R * d->Tp); }
static size_t bwd_ws_floats(const att_dims *d) {
    return (size_t)(3 * d->Tp * d->HSp + 2 * d->hs * d->Tp + 2 * d->Tp * d->Tp);
}

/* Rows i0 .. i0+7 of a head's P into Pt (stride Tp), columns 0 .. i0+7:
 * S = Qp · Kt (Qp holds a q), then each row's softmax over j <= i, zeros up
 * to the tile's end (rows >= T all zero). stats[2i], [2i+1]: row i's max and
 * 1 / sum of exp -- written (recompute 0; NULL: not kept) or read back
 * (recompute 1: P = exp(S - max) x inv in one pass, forward's bits exactly,
 * ops_internal.h dt_ops_softmax_row_stats). */
static void head_probs_rows(const att_dims *d, const float *Qp, const float *Kt, float *Pt, int64_t i0, float *stats,
                            int recompute) {
    const int64_t T = d->T, Tp = d->Tp, HSp = d->HSp, kend = i0 + ATT_R;   /* columns 0 .. kend-1 cover j <= i */
    for (int64_t j0 = 0; j0 < kend; j0 += ATT_C) att_tile_nn(Qp + i0 * HSp, HSp, Kt + j0, Tp, d->hs, Pt + j0, Tp);
    for (int64_t r = 0; r < ATT_R; r++) {
        float *row = Pt + r * Tp;
        int64_t i = i0 + r, j = 0;
        if (i < T && recompute) {
            float m = stats[2 * i], inv = stats[2 * i + 1];
#pragma omp simd
            for (int64_t t = 0; t <= i; t++) row[t] = dt_ops_expf(row[t] - m) * inv;
            j = i + 1;
        } else if (i < T) {
            dt_ops_softmax_row_stats(row, row, i + 1, stats ? stats + 2 * i : NULL);
            j = i + 1;
        }
        for (; j < kend; j++) row[j] = 0.0f;
    }
}

/* One (b, h). q points at the head's q columns in qkv (k, v at +C, +2C), y at
 * its columns of the output. */
static void att_head_forward(const att_dims *d, const float *q, float *y, float *stats, float *ws) {
    const int64_t T = d->T, Tp = d->Tp, HSp = d->HSp, ld = 3 * d->C;
    float *Qp = ws, *Vp = Qp + Tp * HSp, *Kt = Vp + Tp * HSp, *Pt = Kt + d->hs * Tp;   /* [Tp][HSp] x2, [hs][Tp], [ATT_R][Tp] */
    pack_rows(Qp, q, ld, d, d->scale);
    pack_rows(Vp, q + 2 * d->C, ld, d, 1.0f);
    pack_cols(Kt, q + d->C, ld, d);
    float tile[ATT_R * ATT_C];
    for (int64_t i0 = 0; i0 < T; i0 += ATT_R) {
        head_probs_rows(d, Qp, Kt, Pt, i0, stats, 0);
        /* y[i0:i0+8, :] = P[i0:i0+8, 0:kend] · v[0:kend, :] */
        for (int64_t c0 = 0; c0 < d->hs; c0 += ATT_C) {
            att_tile_nn(Pt, Tp, Vp + c0, HSp, i0 + ATT_R, tile, ATT_C);
            unpack_tile(y, d->C, tile, i0, c0, d, 1.0f, 0);
        }
    }
}

/* One (b, h) backward; dq points at the head's q columns in dqkv. */
static void att_head_backward(const att_dims *d, const float *q, float *dq, const float *dy, float *stats,
                              float *ws) {
    const int64_t T = d->T, Tp = d->Tp, HSp = d->HSp, ld = 3 * d->C;
    float *Qp = ws, *Kp = Qp + Tp * HSp, *dYp = Kp + Tp * HSp, *Vt = dYp + Tp * HSp, *Kt = Vt + d->hs * Tp;
    float *dS = Kt + d->hs * Tp, *P = dS + Tp * Tp;   /* [Tp][Tp] each */
    pack_rows(Qp, q, ld, d, d->scale);
    pack_rows(Kp, q + d->C, ld, d, 1.0f);
    pack_rows(dYp, dy, d->C, d, 1.0f);
    pack_cols(Vt, q + 2 * d->C, ld, d);
    pack_cols(Kt, q + d->C, ld, d);
    float tile[ATT_R * ATT_C];
    for (int64_t i0 = 0; i0 < T; i0 += ATT_R) {
        float *St = dS + i0 * Tp, *Pt = P + i0 * Tp;
        int64_t kend = i0 + ATT_R;
        head_probs_rows(d, Qp, Kt, Pt, i0, stats, 1);   /* forward's P, rows i0 .. i0+7 */
        /* dP[i0:i0+8, 0:kend] = dy · v^T */
        for (int64_t j0 = 0; j0 < kend; j0 += ATT_C) att_tile_nn(dYp + i0 * HSp, HSp, Vt + j0, Tp, d->hs, St + j0, Tp);
        /* dS = P (dP - sum_j dP P) on j <= i, 0 up to kend */
        for (int64_t r = 0; r < ATT_R; r++) {
            const float *pr = Pt + r * Tp;
            float *sr = St + r * Tp;
            int64_t i = i0 + r, j = 0;
            if (i < T) {
                float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
                for (int64_t t = 0; t <= i; t++) dot += pr[t] * sr[t];
#pragma omp simd
                for (int64_t t = 0; t <= i; t++) sr[t] = pr[t] * (sr[t] - dot);
                j = i + 1;
            }
            for (; j < kend; j++) sr[j] = 0.0f;
        }
        /* dq[i0:i0+8, :] += a dS[i0:i0+8, 0:kend] · k */
        for (int64_t c0 = 0; c0 < d->hs; c0 += ATT_C) {
            att_tile_nn(St, Tp, Kp + c0, HSp, kend, tile, ATT_C);
            unpack_tile(dq, ld, tile, i0, c0, d, d->scale, 1);
        }
    }
    /* rows j0 .. j0+7 of dv and dk sum over i >= j0 (the causal lower part) */
    for (int64_t j0 = 0; j0 < T; j0 += ATT_R) {
        for (int64_t c0 = 0; c0 < d->hs; c0 += ATT_C) {
            /* dv[j, :] += sum_i P[i, j] dy[i, :] */
            att_tile_tn(P + j0 * Tp + j0, Tp, dYp + j0 * HSp + c0, HSp, T - j0, tile, ATT_C);
            unpack_tile(dq + 2 * d->C, ld, tile, j0, c0, d, 1.0f, 1);
            /* dk[j, :] += sum_i dS[i, j] (a q[i, :]) */
            att_tile_tn(dS + j0 * Tp + j0, Tp, Qp + j0 * HSp + c0, HSp, T - j0, tile, ATT_C);
            unpack_tile(dq + d->C, ld, tile, j0, c0, d, 1.0f, 1);
        }
    }
}

static int att_threads(int64_t tasks) {
    int nthr = tasks > 1 ? omp_get_max_threads() : 1;
    if (nthr > tasks) nthr = (int)tasks;
    return nthr < 1 ? 1 : nthr;
}

static void attention_backward(dt_graph *g, dt_node *n) {
    dt_tensor *qkv = n->in[0];
    float *dqkv = dt_grad_of(g, qkv);
    if (!dqkv) return;
    int64_t B = n->i[0], H = n->i[3];
    att_dims d = {.T = n->i[1], .C = n->i[2], .hs = n->i[2] / H, .scale = n->f[0]};
    d.Tp = round_up(d.T, ATT_C);
    d.HSp = round_up(d.hs, ATT_C);
    const float *x = dt_f32(qkv), *dy = dt_f32(n->out->grad);
    float *stats = n->saved;
    int64_t tasks = B * H;
    int nthr = att_threads(tasks);
    size_t wsf = bwd_ws_floats(&d);
    float *ws = dt_graph_scratch(g, (size_t)nthr * wsf * sizeof(float) + 1);
    if (!ws) return;   /* ENOMEM recorded; backward aborts */
#pragma omp parallel num_threads(nthr) if (nthr > 1)
    {
        float *wt = ws + (size_t)omp_get_thread_num() * wsf;
#pragma omp for schedule(static)
        for (int64_t t = 0; t < tasks; t++) {
            int64_t b = t / H, h = t % H, qo = b * d.T * 3 * d.C + h * d.hs;
            att_head_backward(&d, x + qo, dqkv + qo, dy + b * d.T * d.C + h * d.hs, stats + t * 2 * d.T, wt);
        }
    }
}

dt_tensor *dt_op_attention(dt_graph *g, dt_tensor *qkv, int n_head) {
    static const char *op = "attention";
    if (dt_ops_check_graph(op, g) || dt_ops_check_tensor(op, "qkv", qkv)) return NULL;
    if (qkv->ndim != 3 || qkv->shape[2] % 3 != 0 || qkv->shape[2] == 0) {
        DT_ERR(DT_EINVAL, "attention: qkv must be [B, T, 3C] with C > 0, got %s", DT_OPS_SHAPE(qkv));
        return NULL;
    }
    int64_t B = qkv->shape[0], T = qkv->shape[1], C = qkv->shape[2] / 3, H = n_head;
    if (H <= 0 || C % H != 0) {
        DT_ERR(DT_EINVAL, "attention: n_head=%d does not divide C=%lld (qkv %s)", n_head, (long long)C,
               DT_OPS_SHAPE(qkv));
        return NULL;
    }
    att_dims d = {.T = T, .C = C, .hs = C / H, .Tp = round_up(T, ATT_C), .HSp = round_up(C / H, ATT_C)};
    d.scale = 1.0f / sqrtf((float)d.hs);
    int64_t tasks = B * H, shape[3] = {B, T, C};
    int nthr = att_threads(tasks);
    /* each row's softmax max and 1 / sum, only when backward will need them */
    int keep = dt_graph_grad_enabled(g) && qkv->requires_grad;
    size_t wsf = fwd_ws_floats(&d);
    dt_tensor *y = dt_graph_tensor(g, 3, shape);
    float *stats = keep ? dt_graph_scratch(g, (size_t)(tasks * 2 * T) * sizeof(float) + 1) : NULL;
    float *ws = dt_graph_scratch(g, (size_t)nthr * wsf * sizeof(float) + 1);
    if (!y || (keep && !stats) || !ws) return NULL;
    const float *x = dt_f32(qkv);
    float *yd = dt_f32(y);
#pragma omp parallel num_threads(nthr) if (nthr > 1)
    {
        float *wt = ws + (size_t)omp_get_thread_num() * wsf;
#pragma omp for schedule(static)
        for (int64_t t = 0; t < tasks; t++) {
            int64_t b = t / H, h = t % H;
            att_head_forward(&d, x + b * T * 3 * C + h * d.hs, yd + b * T * C + h * d.hs,
                             keep ? stats + t * 2 * T : NULL, wt);
        }
    }
    dt_node *n = dt_graph_record(g, op, attention_backward, y, 1, &qkv);
    if (n) {
        n->saved = stats;
        n->i[0] = B;
        n->i[1] = T;
        n->i[2] = C;
        n->i[3] = H;
        n->f[0] = d.scale;
    }
    return y;
}
