/* The cut of a model's blocks into pipeline stages, from per-block costs:
 * min-max over contiguous ranges (dt_pipe_balance), the interleaved cut that
 * balances ranks (dt_pipe_balance_ranks), and the snapping of noisy costs of
 * blocks of one kind (dt_pipe_snap_costs). Pure functions, no MPI. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "pipe_internal.h"

/* dp[k][i]: the best largest cost cutting blocks [0, i) into k ranges. */
dt_status dt_pipe_balance(const double *cost, int n, int S, int *first) {
    if (S < 1 || n < S) return DT_ERR(DT_EINVAL, "pipeline: cannot cut %d blocks into %d stages", n, S);
    double *pre = malloc((size_t)(n + 1) * sizeof *pre);
    double *dp = malloc((size_t)(S + 1) * (size_t)(n + 1) * sizeof *dp);
    int *cut = malloc((size_t)(S + 1) * (size_t)(n + 1) * sizeof *cut);
    if (!pre || !dp || !cut) {
        free(pre); free(dp); free(cut);
        return DT_ERR(DT_ENOMEM, "pipeline: out of memory balancing %d blocks", n);
    }
    pre[0] = 0;
    for (int i = 0; i < n; i++) pre[i + 1] = pre[i] + (cost[i] > 0 ? cost[i] : 0);
#define DP(k, i) dp[(size_t)(k) * (size_t)(n + 1) + (size_t)(i)]
#define CUT(k, i) cut[(size_t)(k) * (size_t)(n + 1) + (size_t)(i)]
    for (int i = 0; i <= n; i++) DP(1, i) = pre[i];
    for (int k = 2; k <= S; k++)
        for (int i = k; i <= n; i++) {
            double best = DBL_MAX;
            int bj = k - 1;
            for (int j = k - 1; j < i; j++) {   /* last range [j, i) */
                double v = DP(k - 1, j) > pre[i] - pre[j] ? DP(k - 1, j) : pre[i] - pre[j];
                if (v < best) { best = v; bj = j; }
            }
            DP(k, i) = best;
            CUT(k, i) = bj;
        }
    first[S] = n;
    for (int k = S, i = n; k >= 2; k--) { i = CUT(k, i); first[k - 1] = i; }
    first[0] = 0;
#undef DP
#undef CUT
    free(pre); free(dp); free(cut);
    return DT_OK;
}

/* ---- the interleaved cut (dt_pipe_balance_ranks) ----
 * Rank r runs ranges r, r + P, ...: the schedule waits on the busiest rank, so
 * the objective is the largest rank total, then the largest range (a chunk's
 * forward is one step of the schedule). Min-max over the S ranges
 * (dt_pipe_balance) does not see ranks: with costs 1,4,4,4,4,4,11 (embedding,
 * five layers, loss head) at P = V = 2 it may give 5|8|8|11, ranks 13 and 19,
 * where 9|4|8|11 gives 17 and 15 with the same largest range.
 *
 * Costs go to integers first (a power-of-two grid, 2^-50 of the total), so
 * sums are exact and equal costs tie exactly. Then:
 *  1. Heuristic cuts: dt_pipe_balance's, the greedy one at the best largest
 *     range, and a quota cut (range c of rank r takes blocks while r's total
 *     stays within (c + 1) / V of a bound M, the least M for which that
 *     succeeds, by bisection). Each is improved by local search: shift 1..P
 *     consecutive cuts by one block (this moves one block between any two
 *     ranks), accepting strict improvements. The best is the incumbent.
 *  2. Lower bounds: largest rank total >= max(ceil(total / P), Copt) and
 *     largest range >= Copt, Copt the least largest range of any cut
 *     (bisection with the greedy check, exact).
 *  3. Search, only when a bound does not already prove the incumbent: a DP
 *     over (range index, position, every rank's total), the best largest
 *     range kept per state. Phase 1 looks for cuts with every rank total
 *     below the incumbent's, phase 2 (when phase 1 proved there are none) for
 *     cuts at its rank total with every range below its largest. A partial
 *     cut is dropped when the rest cannot fit: each rank still to come can
 *     take at most as many of the remaining blocks as its cheapest ones fit
 *     in its room (and in its remaining ranges at the range bound), and
 *     together they must take all (integrality: with equal layers this
 *     proves "ceil(total / P)"-type optima at once). At most `beam` states
 *     per level live on, the evenest first (rb_prune_level), beam = 64, 128,
 *     ...: a search that never had to drop a state is exact, so finding
 *     nothing proves its phase and finding a cut proves that cut optimal; a
 *     search that dropped states and found a cut makes it the incumbent (the
 *     bound tightens), one that found nothing is retried twice as wide.
 * Cost: O(n^2) memory and time for the cheapest-block sums, O(S n^2) for
 * dt_pipe_balance, the local search is capped at 2^22 element visits and the
 * searches together at 2^16 extensions (each O(P log n); labels at most 2^21
 * words, 16 MiB): a few milliseconds for n = 50, P = V = 4. The exact problem
 * is NP-hard (at P = 2, numbers separated by zero-cost blocks: PARTITION),
 * and with distinct noisy costs
 * the states rarely merge: then the budget runs out and the best cut found
 * is returned unproved. On test sets (n = 20..50, P x V up to 16, costs
 * spread +-8%, or integers 1..3 or 0..9) it was within 1.5% (noisy) / 3.7%
 * (0..9) of the optimum found with a 2^25 budget, and equal to it for most.
 * dt_pipe_snap_costs first makes blocks of one kind equal, which keeps such
 * models (GPT-2) small to search and proved. */
#define RB_NONE INT64_MAX
#define RB_STEPS (1L << 16)
#define RB_WORDS ((size_t)1 << 21)
#define RB_LOCAL_WORK (1L << 22)

typedef struct rb_ctx {
    int n, P, V, S;
    int64_t *pre;             /* pre[i]: blocks [0, i) on the grid */
    int64_t total;
    int64_t *cheap;           /* suffix i: cheap[off[i] + k] = the sum of its k cheapest blocks, k = 0 .. n - i */
    size_t *off;
    long steps;               /* left for the exact search */
    long work;                /* left for the local search */
} rb_ctx;

/* largest rank total and how many ranks reach it; largest range, how many */
typedef struct rb_val { int64_t t, c; int nt, nc; } rb_val;

/* how many blocks of [i, n) can total <= x (-1: x < 0) */
static int rb_fit(const rb_ctx *b, int i, int64_t x) {
    if (x < 0) return -1;
    const int64_t *c = b->cheap + b->off[i];
    int lo = 0, hi = b->n - i;
    while (lo < hi) {
        int mid = lo + (hi - lo + 1) / 2;
        if (c[mid] <= x) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

static rb_val rb_value(const rb_ctx *b, const int64_t *T, const int64_t *ch) {
    rb_val v = {-1, -1, 0, 0};
    for (int r = 0; r < b->P; r++) {
        if (T[r] > v.t) { v.t = T[r]; v.nt = 1; }
        else if (T[r] == v.t) v.nt++;
    }
    for (int k = 0; k < b->S; k++) {
        if (ch[k] > v.c) { v.c = ch[k]; v.nc = 1; }
        else if (ch[k] == v.c) v.nc++;
    }
    return v;
}

/* a before x: (t, c, nt, nc) lexicographically, or (t, nt, c, nc) */
static int rb_better(rb_val a, rb_val x, int counts_first) {
    if (a.t != x.t) return a.t < x.t;
    if (counts_first && a.nt != x.nt) return a.nt < x.nt;
    if (a.c != x.c) return a.c < x.c;
    if (a.nt != x.nt) return a.nt < x.nt;
    return a.nc < x.nc;
}

static rb_val rb_eval(const rb_ctx *b, const int *first, int64_t *T, int64_t *ch) {
    for (int r = 0; r < b->P; r++) T[r] = 0;
    for (int k = 0; k < b->S; k++) {
        ch[k] = b->pre[first[k + 1]] - b->pre[first[k]];
        T[k % b->P] += ch[k];
    }
    return rb_value(b, T, ch);
}

/* Greedy ranges of at most C, each as long as it may be while the later ones
 * still get a block each: it succeeds iff some cut has every range <= C
 * (its k-th cut is never left of any such cut's, by induction). */
static int rb_chunk_cut(const rb_ctx *b, int64_t C, int *first) {
    int n = b->n, S = b->S, i = 0;
    first[0] = 0;
    for (int k = 0; k < S; k++) {
        int e = k == S - 1 ? n : i + 1, lim = n - (S - k - 1);
        if (b->pre[e] - b->pre[i] > C) return 0;
        while (e < lim && b->pre[e + 1] - b->pre[i] <= C) e++;
        first[k + 1] = i = e;
    }
    return 1;
}

/* range k (chunk c = k / P of rank r = k % P) takes blocks while r's total
 * stays within M * (c + 1) / V; succeeds when every rank ends within M */
static int rb_quota_cut(const rb_ctx *b, int64_t M, int *first, int64_t *T) {
    int n = b->n, S = b->S, P = b->P, i = 0;
    for (int r = 0; r < P; r++) T[r] = 0;
    first[0] = 0;
    for (int k = 0; k < S; k++) {
        int r = k % P, e = k == S - 1 ? n : i + 1, lim = n - (S - k - 1);
        int64_t quota = M / b->V * (k / P + 1) + M % b->V * (k / P + 1) / b->V;
        while (e < lim && T[r] + b->pre[e + 1] - b->pre[i] <= quota) e++;
        T[r] += b->pre[e] - b->pre[i];
        if (T[r] > M) return 0;
        first[k + 1] = i = e;
    }
    return 1;
}

/* move cuts j .. j+m-1 by d blocks (ranges j-1 .. j+m-1 change) */
static void rb_shift(const rb_ctx *b, int *first, int64_t *T, int64_t *ch, int j, int m, int d) {
    for (int t = j; t < j + m; t++) first[t] += d;
    for (int a = j - 1; a < j + m; a++) {
        int64_t c = b->pre[first[a + 1]] - b->pre[first[a]];
        T[a % b->P] += c - ch[a];
        ch[a] = c;
    }
}

static rb_val rb_local(rb_ctx *b, int *first, int64_t *T, int64_t *ch, int counts_first) {
    int S = b->S, P = b->P;
    rb_val cur = rb_eval(b, first, T, ch);
    for (int improved = 1; improved && b->work > 0;) {
        improved = 0;
        for (int j = 1; j < S && b->work > 0; j++)
            for (int m = 1; m <= P && j + m <= S; m++)
                for (int d = -1; d <= 1; d += 2) {
                    if (d > 0 ? first[j + m - 1] + 1 >= first[j + m] : first[j] - 1 <= first[j - 1]) continue;
                    rb_shift(b, first, T, ch, j, m, d);
                    rb_val v = rb_value(b, T, ch);
                    b->work -= S + P;
                    if (rb_better(v, cur, counts_first)) { cur = v; improved = 1; }
                    else rb_shift(b, first, T, ch, j, m, -d);
                }
    }
    return cur;
}

/* the search's states: level k = ranges placed, pos = where the next
 * starts, T[P] the rank totals, mc the largest range so far */
typedef struct rb_labels {
    int P;
    size_t n, cap;
    int *pos, *par;
    int64_t *mc, *T;
} rb_labels;

static void rb_labels_free(rb_labels *L) { free(L->pos); free(L->par); free(L->mc); free(L->T); }

static int rb_push(rb_labels *L, int pos, int par, int64_t mc, const int64_t *T) {
    if (L->n == L->cap) {
        size_t cap = L->cap ? 2 * L->cap : 1024;
        int *p = realloc(L->pos, cap * sizeof *p);
        if (p) L->pos = p;
        int *q = realloc(L->par, cap * sizeof *q);
        if (q) L->par = q;
        int64_t *m = realloc(L->mc, cap * sizeof *m);
        if (m) L->mc = m;
        int64_t *t = realloc(L->T, cap * (size_t)L->P * sizeof *t);
        if (t) L->T = t;
        if (!p || !q || !m || !t) return 0;
        L->cap = cap;
    }
    L->pos[L->n] = pos;
    L->par[L->n] = par;
    L->mc[L->n] = mc;
    memcpy(L->T + L->n * (size_t)L->P, T, (size_t)L->P * sizeof *T);
    L->n++;
    return 1;
}

static size_t rb_hash(int pos, const int64_t *T, int P, size_t mask) {
    uint64_t h = 1469598103934665603ull ^ (uint64_t)(unsigned)pos;
    for (int r = 0; r < P; r++) {
        h = (h ^ (uint64_t)T[r]) * 1099511628211ull;
        h ^= h >> 29;
    }
    return (size_t)h & mask;
}

/* beam search: how promising a state is, the sum of squares of its rank
 * totals once the remaining cost is shared out in proportion to the ranges
 * each rank still gets (lower: more even; it did better than the largest
 * such total, which ties too often); then the largest range so far */
typedef struct rb_rank { double sq; int64_t mc; size_t at; } rb_rank;

static int rb_rank_cmp(const void *x, const void *y) {
    const rb_rank *a = x, *b = y;
    if (a->sq != b->sq) return a->sq < b->sq ? -1 : 1;
    if (a->mc != b->mc) return a->mc < b->mc ? -1 : 1;
    return a->at < b->at ? -1 : a->at > b->at;
}

/* keep the `beam` most promising states of the level at [from, L->n) */
static int rb_prune_level(const rb_ctx *b, rb_labels *L, size_t from, const int *rem, size_t beam) {
    size_t cnt = L->n - from, P = (size_t)b->P;
    int remsum = 0;
    for (int r = 0; r < b->P; r++) remsum += rem[r];
    rb_rank *rk = malloc(cnt * sizeof *rk);
    int *pos = malloc(beam * sizeof *pos), *par = malloc(beam * sizeof *par);
    int64_t *mc = malloc(beam * sizeof *mc), *T = malloc(beam * P * sizeof *T);
    int ok = rk && pos && par && mc && T;
    if (ok) {
        for (size_t a = 0; a < cnt; a++) {
            const int64_t *t = L->T + (from + a) * P;
            int64_t R = b->total - b->pre[L->pos[from + a]];
            double sq = 0;
            for (int r = 0; r < b->P; r++) {
                double v = (double)(t[r] + (remsum ? R * rem[r] / remsum : 0));
                sq += v * v;
            }
            rk[a] = (rb_rank){sq, L->mc[from + a], from + a};
        }
        qsort(rk, cnt, sizeof *rk, rb_rank_cmp);
        for (size_t a = 0; a < beam; a++) {
            size_t o = rk[a].at;
            pos[a] = L->pos[o];
            par[a] = L->par[o];
            mc[a] = L->mc[o];
            memcpy(T + a * P, L->T + o * P, P * sizeof *T);
        }
        memcpy(L->pos + from, pos, beam * sizeof *pos);
        memcpy(L->par + from, par, beam * sizeof *par);
        memcpy(L->mc + from, mc, beam * sizeof *mc);
        memcpy(L->T + from * P, T, beam * P * sizeof *T);
        L->n = from + beam;
    }
    free(rk); free(pos); free(par); free(mc); free(T);
    return ok;
}

/* Can blocks [e, n) complete a cut at level k1 with rank totals T, every rank
 * within Mcap and every range within Ccap? (necessary conditions; rem[r]:
 * ranges rank r still gets, kc[i]: blocks of [i, n) one range can hold) */
static int rb_open(const rb_ctx *b, int e, int k1, const int64_t *T, int64_t Mcap, int64_t Ccap, const int *rem,
                   const int *kc) {
    int left = b->n - e, m = b->S - k1;
    if (m == 0) return left == 0;
    int64_t R = b->total - b->pre[e], room = 0, take = 0;
    if (Ccap != RB_NONE && (int64_t)m * Ccap < R) return 0;
    for (int r = 0; r < b->P; r++) {
        if (!rem[r]) continue;
        int fit = rb_fit(b, e, Mcap - T[r]);
        if (fit < rem[r]) return 0;   /* its ranges are non-empty */
        int64_t lim = (int64_t)rem[r] * kc[e];
        take += fit < lim ? fit : lim;
        room += Mcap - T[r];
    }
    return take >= left && room >= R;
}

/* The best cut (lexicographic (largest rank total, largest range)) among those
 * with every rank total <= Mcap and every range <= Ccap: 1 (first, *val), 0
 * none, -1 past the budget, -2 out of memory. Only the `beam` most promising
 * states of a level live on; *cut says whether some level had more (then the
 * answer is a cut, maybe not the best, and 0 proves nothing). */
static int rb_search(rb_ctx *b, int64_t Mcap, int64_t Ccap, size_t beam, int *first, rb_val *val, int *cut) {
    int n = b->n, P = b->P, S = b->S, V = b->V, ret = -2;
    rb_labels L = {.P = P};
    size_t hcap = 1024;
    *cut = 0;
    int *slot = malloc(hcap * sizeof *slot), *kc = malloc((size_t)(n + 1) * sizeof *kc),
        *rem = malloc((size_t)P * sizeof *rem);
    int64_t *Tn = calloc((size_t)P, sizeof *Tn);
    if (!slot || !kc || !rem || !Tn || !rb_push(&L, 0, -1, 0, Tn)) goto done;
    for (int i = 0; i <= n; i++) kc[i] = Ccap == RB_NONE ? n - i : rb_fit(b, i, Ccap);
    size_t lo = 0, hi = 1;
    for (int k = 0; k < S && lo < hi; k++) {
        int r = k % P, after = S - k - 1;
        for (int x = 0; x < P; x++) rem[x] = V - ((k + 1) / P + (x < (k + 1) % P));
        for (size_t s = 0; s < hcap; s++) slot[s] = -1;
        for (size_t a = lo; a < hi; a++) {
            int i = L.pos[a];
            memcpy(Tn, L.T + a * (size_t)P, (size_t)P * sizeof *Tn);
            int64_t base = Tn[r], mc = L.mc[a];
            for (int e = after ? i + 1 : n; e <= n - after; e++) {
                int64_t x = b->pre[e] - b->pre[i];
                if (x > Ccap || base + x > Mcap) break;   /* and so every longer range */
                if (--b->steps < 0 || (L.n + 1) * (size_t)P > RB_WORDS) { ret = -1; goto done; }
                Tn[r] = base + x;
                if (!rb_open(b, e, k + 1, Tn, Mcap, Ccap, rem, kc)) continue;
                int64_t mcx = x > mc ? x : mc;
                size_t s = rb_hash(e, Tn, P, hcap - 1);
                int dup = 0;
                for (; slot[s] >= 0; s = (s + 1) & (hcap - 1)) {
                    int o = slot[s];
                    if (L.pos[o] == e && !memcmp(L.T + (size_t)o * (size_t)P, Tn, (size_t)P * sizeof *Tn)) {
                        if (mcx < L.mc[o]) { L.mc[o] = mcx; L.par[o] = (int)a; }
                        dup = 1;
                        break;
                    }
                }
                if (dup) continue;
                if (!rb_push(&L, e, (int)a, mcx, Tn)) goto done;
                slot[s] = (int)(L.n - 1);
                if (2 * (L.n - hi) > hcap) {   /* grow the table: rehash this level */
                    int *ns = malloc(2 * hcap * sizeof *ns);
                    if (!ns) goto done;
                    free(slot);
                    slot = ns;
                    hcap *= 2;
                    for (size_t t = 0; t < hcap; t++) slot[t] = -1;
                    for (size_t o = hi; o < L.n; o++) {
                        size_t t = rb_hash(L.pos[o], L.T + o * (size_t)P, P, hcap - 1);
                        while (slot[t] >= 0) t = (t + 1) & (hcap - 1);
                        slot[t] = (int)o;
                    }
                }
            }
        }
        if (L.n - hi > beam) {
            *cut = 1;
            if (!rb_prune_level(b, &L, hi, rem, beam)) goto done;
        }
        lo = hi;
        hi = L.n;
    }
    ret = 0;
    if (lo == hi) goto done;
    size_t best = lo;
    rb_val bv = {RB_NONE, RB_NONE, 0, 0};
    for (size_t a = lo; a < hi; a++) {   /* level S: complete cuts */
        int64_t t = 0;
        for (int x = 0; x < P; x++) t = L.T[a * (size_t)P + (size_t)x] > t ? L.T[a * (size_t)P + (size_t)x] : t;
        if (t < bv.t || (t == bv.t && L.mc[a] < bv.c)) { bv.t = t; bv.c = L.mc[a]; best = a; }
    }
    for (int k = S, a = (int)best; k >= 0; k--, a = L.par[a]) first[k] = L.pos[a];
    *val = bv;
    ret = 1;
done:
    rb_labels_free(&L);
    free(slot); free(kc); free(rem); free(Tn);
    return ret;
}

dt_status dt_pipe_balance_ranks(const double *cost, int n, int P, int V, int *first) {
    if (P < 1 || V < 1 || n < P || n / P < V)   /* n / P < V: S = P * V > n */
        return DT_ERR(DT_EINVAL, "pipeline: cannot cut %d blocks into %lld stages (%d ranks x %d virtual stages)", n,
                      (long long)P * V, P, V);
    if (V == 1) return dt_pipe_balance(cost, n, P, first);
    if (P == 1) return dt_pipe_balance(cost, n, V, first);   /* one rank: its total is everything */
    int S = P * V;
    double tot = 0;
    for (int i = 0; i < n; i++) {
        if (!isfinite(cost[i])) return DT_ERR(DT_EINVAL, "pipeline: block %d has no finite cost", i);
        tot += cost[i] > 0 ? cost[i] : 0;
    }
    if (!isfinite(tot)) return DT_ERR(DT_EINVAL, "pipeline: block costs sum to no finite total");
    int shift = tot > 0 ? 50 - ilogb(tot) : 0;   /* total on the grid < 2^51 (per cost: 2^shift may overflow) */
    rb_ctx b = {.n = n, .P = P, .V = V, .S = S, .steps = RB_STEPS, .work = RB_LOCAL_WORK};
    size_t ncheap = (size_t)(n + 1) * (size_t)(n + 2) / 2;
    int64_t *q = malloc((size_t)n * sizeof *q), *sorted = malloc((size_t)n * sizeof *sorted);
    int64_t *T = malloc((size_t)P * sizeof *T), *ch = malloc((size_t)S * sizeof *ch);
    double *dcost = malloc((size_t)n * sizeof *dcost);
    int *cand = malloc((size_t)(S + 1) * sizeof *cand), *inc = malloc((size_t)(S + 1) * sizeof *inc);
    b.pre = malloc((size_t)(n + 1) * sizeof *b.pre);
    b.cheap = malloc(ncheap * sizeof *b.cheap);
    b.off = malloc((size_t)(n + 1) * sizeof *b.off);
    dt_status s = DT_OK;
    if (!q || !sorted || !T || !ch || !dcost || !cand || !inc || !b.pre || !b.cheap || !b.off) {
        s = DT_ERR(DT_ENOMEM, "pipeline: out of memory balancing %d blocks", n);
        goto done;
    }
    b.pre[0] = 0;
    int64_t maxq = 0;
    for (int i = 0; i < n; i++) {
        dcost[i] = cost[i] > 0 ? cost[i] : 0;
        q[i] = (int64_t)llround(ldexp(dcost[i], shift));
        b.pre[i + 1] = b.pre[i] + q[i];
        if (q[i] > maxq) maxq = q[i];
    }
    b.total = b.pre[n];
    /* the cheapest-block sums of every suffix, sorting it from the back */
    for (int i = 0; i <= n; i++) b.off[i] = i ? b.off[i - 1] + (size_t)(n - i + 2) : 0;
    for (int i = n; i >= 0; i--) {
        int len = n - i;
        if (len) {   /* insert q[i] into sorted[0 .. len-1) */
            int at = len - 1;
            while (at > 0 && sorted[at - 1] > q[i]) { sorted[at] = sorted[at - 1]; at--; }
            sorted[at] = q[i];
        }
        int64_t *row = b.cheap + b.off[i];
        row[0] = 0;
        for (int k = 1; k <= len; k++) row[k] = row[k - 1] + sorted[k - 1];
    }
    /* Copt: the least largest range of any cut */
    int64_t lo = maxq, hi = b.total;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (rb_chunk_cut(&b, mid, cand)) hi = mid;
        else lo = mid + 1;
    }
    int64_t copt = lo, lb_t = b.total / P + (b.total % P != 0);
    if (lb_t < copt) lb_t = copt;
    /* the incumbent: the best of three heuristic cuts after local search */
    rb_val iv = {RB_NONE, RB_NONE, 0, 0};
    for (int c = 0; c < 3; c++) {
        if (c == 0) {
            s = dt_pipe_balance(dcost, n, S, cand);
            if (s != DT_OK) goto done;
        } else if (c == 1) {
            rb_chunk_cut(&b, copt, cand);
        } else {
            int64_t mlo = lb_t, mhi = b.total;   /* the quota cut succeeds at M = total */
            while (mlo < mhi) {
                int64_t mid = mlo + (mhi - mlo) / 2;
                if (rb_quota_cut(&b, mid, cand, T)) mhi = mid;
                else mlo = mid + 1;
            }
            rb_quota_cut(&b, mlo, cand, T);
        }
        rb_local(&b, cand, T, ch, 1);
        rb_val v = rb_local(&b, cand, T, ch, 0);
        if (rb_better(v, iv, 0)) { iv = v; memcpy(inc, cand, (size_t)(S + 1) * sizeof *inc); }
    }
    /* prove or improve it: search below its rank total, then at it with every
     * range below its largest; a beam that never had to drop a state is exact
     * (nothing found proves that phase), one that did is widened (found
     * nothing) or its bound tightened (found a better cut: the new incumbent) */
    size_t beam = 64;
    for (int phase = 0, cut; phase < 2;) {
        if (phase == 0 ? iv.t <= lb_t : iv.c <= copt) { phase++; continue; }   /* proved by a bound */
        rb_val sv;
        int r = rb_search(&b, phase ? iv.t : iv.t - 1, phase ? iv.c - 1 : RB_NONE, beam, cand, &sv, &cut);
        if (r == -2) {
            s = DT_ERR(DT_ENOMEM, "pipeline: out of memory balancing %d blocks", n);
            goto done;
        }
        if (r == -1) break;   /* budget spent: the incumbent, unproved */
        if (r == 1) {
            iv = sv;
            memcpy(inc, cand, (size_t)(S + 1) * sizeof *inc);
            if (!cut) break;   /* the best of every cut better than the old incumbent: optimal */
        } else if (cut) beam *= 2;
        else phase++;
    }
    memcpy(first, inc, (size_t)(S + 1) * sizeof *first);
done:
    free(q); free(sorted); free(T); free(ch); free(dcost); free(cand); free(inc);
    free(b.pre); free(b.cheap); free(b.off);
    return s;
}

/* Snapping. The probe times each block once (the faster of two passes), so
 * blocks of one kind (GPT-2's h.0 .. h.N: the same shapes, the same kernels)
 * come back a few percent apart from noise alone. Cutting on those numbers
 * trades real balance for noise: the search can put the embedding beside a
 * 13-layer rank because those layers happened to time low, a choice worth
 * nothing (or a loss) on the next step, and the cut differs from run to run.
 * Snapping makes such blocks cost exactly the same, so ties are ties and the
 * cut follows the model's structure (and the exact search stays small).
 * Costs 5% apart or less are taken as one kind; a group is snapped only if
 * its largest is within 5% of its smallest (a spread-out chain such as 1,
 * 1.04, 1.08 is left as measured), so the cut can misjudge a block by at
 * most 5%, the size of the noise it removes. The mean keeps the group's sum.
 * Costs <= 0 or not finite are left alone; without memory for the sort
 * nothing is snapped. cut_blocks applies it to the automatic cut only
 * (an explicit --pp-split never looks at costs). */
#define SNAP_TOL 0.05

double *dt_pipe_snap_costs(double *cost, int n) {
    if (!cost || n < 2) return cost;
    int *ix = malloc((size_t)n * sizeof *ix), m = 0;
    if (!ix) return cost;
    for (int i = 0; i < n; i++) {   /* positive finite costs, sorted ascending (insertion, stable) */
        if (!(cost[i] > 0) || !isfinite(cost[i])) continue;
        int at = m++;
        while (at > 0 && cost[ix[at - 1]] > cost[i]) { ix[at] = ix[at - 1]; at--; }
        ix[at] = i;
    }
    for (int a = 0, z; a < m; a = z) {
        for (z = a + 1; z < m && cost[ix[z]] <= cost[ix[z - 1]] * (1 + SNAP_TOL); z++) {}
        double lo = cost[ix[a]], hi = cost[ix[z - 1]];
        if (z - a < 2 || lo == hi || hi > lo * (1 + SNAP_TOL)) continue;
        double sum = 0;
        for (int t = a; t < z; t++) sum += cost[ix[t]];
        double mean = sum / (z - a);
        for (int t = a; t < z; t++) cost[ix[t]] = mean;
    }
    free(ix);
    return cost;
}
