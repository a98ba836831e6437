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
 * sums are exact and equal costs tie exactly (dt_pipe_snap_costs makes blocks
 * of one kind equal before). Then:
 *  1. Three starting cuts, each improved by local search, the best kept:
 *     dt_pipe_balance's (min-max over the ranges); the greedy cut at Copt, the
 *     least largest range of any cut (bisection with the greedy check,
 *     exact); and the quota cut: range c of rank r takes blocks while r's
 *     total stays within (c + 1) / V of a bound M, at the least M for which
 *     that succeeds (bisection). The local search shifts any run of
 *     consecutive cuts by any number of blocks, accepting strict
 *     improvements, first ranking cuts by how many ranks reach the largest
 *     total (so a plateau can be left), then by the objective itself.
 *  2. A depth-first search for a better cut (rb_search), pruned by the best
 *     so far and by the room the remaining ranks have, within a budget of
 *     2^20 steps: exact on small models and on equal blocks, the heuristic
 *     cut past the budget. The problem is NP-hard (at P = 2, numbers
 *     separated by zero-cost blocks: PARTITION).
 * Cost: O(S n^2) for dt_pipe_balance; the local search capped at 2^22 element
 * visits, the search at 2^20 steps: at most ~20 ms for n = 50, P = V = 4, once
 * at start-up. tests/unit/test_parallel_pipe_probe.c holds it against every
 * cut of small instances. */
#define RB_NONE INT64_MAX
#define RB_LOCAL_WORK (1L << 22)
#define RB_DFS_STEPS (1L << 20)

typedef struct rb_ctx {
    int n, P, V, S;
    int64_t *pre;             /* pre[i]: blocks [0, i) on the grid */
    int64_t total;
    long work;                /* left for the local search */
} rb_ctx;

/* largest rank total and how many ranks reach it; largest range, how many */
typedef struct rb_val { int64_t t, c; int nt, nc; } rb_val;

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

/* may cuts j .. j+m-1 move by d (every range keeps at least one block)? */
static int rb_can_shift(const int *first, int j, int m, int d) {
    return d > 0 ? first[j + m - 1] + d < first[j + m] : first[j] + d > first[j - 1];
}

static rb_val rb_local(rb_ctx *b, int *first, int64_t *T, int64_t *ch, int counts_first) {
    int S = b->S, n = b->n;
    rb_val cur = rb_eval(b, first, T, ch);
    for (int improved = 1; improved && b->work > 0;) {
        improved = 0;
        for (int j = 1; j < S && b->work > 0; j++)
            for (int m = 1; j + m <= S; m++)
                for (int d = -n; d <= n; d++) {
                    if (!d || !rb_can_shift(first, j, m, d)) continue;
                    rb_shift(b, first, T, ch, j, m, d);
                    rb_val v = rb_value(b, T, ch);
                    b->work -= S + b->P;
                    if (rb_better(v, cur, counts_first)) { cur = v; improved = 1; }
                    else rb_shift(b, first, T, ch, j, m, -d);
                }
    }
    return cur;
}

/* Depth-first search over the cuts that beat the best so far (which it
 * replaces as it finds them), range by range: range k of rank k % P ends at
 * e, tried left to right. A branch is dropped when its rank totals already
 * reach the best's (with no smaller largest range), or when the ranks still
 * to get a range lack the room for the cost left. Exact while the budget
 * lasts (small models, or equal blocks where the bound cuts early); past it,
 * the best found so far stands. */
typedef struct rb_dfs {
    rb_ctx *b;
    rb_val best;             /* of cut[] */
    int *cut, *at;           /* the best cut; the one being built */
    int64_t *T;              /* rank totals of at[0..k] */
    long steps;
} rb_dfs;

static void rb_search(rb_dfs *s, int k, int i, int64_t mc) {
    const rb_ctx *b = s->b;
    int S = b->S, P = b->P, n = b->n;
    s->at[k] = i;
    if (k == S) {
        rb_val v = {0, mc, 0, 0};
        for (int r = 0; r < P; r++) v.t = s->T[r] > v.t ? s->T[r] : v.t;
        if (v.t < s->best.t || (v.t == s->best.t && v.c < s->best.c)) {
            s->best = v;
            memcpy(s->cut, s->at, (size_t)(S + 1) * sizeof *s->cut);
        }
        return;
    }
    int r = k % P, after = S - k - 1;
    for (int e = after ? i + 1 : n; e <= n - after && --s->steps > 0; e++) {
        int64_t x = b->pre[e] - b->pre[i], t = s->T[r] + x, c = x > mc ? x : mc;
        if (t > s->best.t || (t == s->best.t && c >= s->best.c)) break;   /* and so every later e */
        if (c >= s->best.c) {   /* only a lower largest rank total can still win */
            int64_t top = 0;
            for (int q = 0; q < P; q++) top = q != r && s->T[q] > top ? s->T[q] : top;
            if (top >= s->best.t) break;
        }
        /* room: ranks with ranges left must take the rest at <= the best's total */
        int64_t room = 0, left = b->total - b->pre[e];
        s->T[r] = t;
        for (int q = 0; q < P; q++)
            if ((k + 1 + ((q - (k + 1) % P + P) % P)) < S) room += s->best.t - s->T[q];
        if (room >= left) rb_search(s, k + 1, e, c);
        s->T[r] = t - x;
    }
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
    rb_ctx b = {.n = n, .P = P, .V = V, .S = S, .work = RB_LOCAL_WORK};
    int64_t *T = malloc((size_t)P * sizeof *T), *ch = malloc((size_t)S * sizeof *ch);
    double *dcost = malloc((size_t)n * sizeof *dcost);
    int *cand = malloc((size_t)(S + 1) * sizeof *cand), *inc = malloc((size_t)(S + 1) * sizeof *inc);
    b.pre = malloc((size_t)(n + 1) * sizeof *b.pre);
    dt_status s = DT_OK;
    if (!T || !ch || !dcost || !cand || !inc || !b.pre) {
        s = DT_ERR(DT_ENOMEM, "pipeline: out of memory balancing %d blocks", n);
        goto done;
    }
    b.pre[0] = 0;
    int64_t maxq = 0;
    for (int i = 0; i < n; i++) {
        dcost[i] = cost[i] > 0 ? cost[i] : 0;
        int64_t q = (int64_t)llround(ldexp(dcost[i], shift));
        b.pre[i + 1] = b.pre[i] + q;
        if (q > maxq) maxq = q;
    }
    b.total = b.pre[n];
    /* Copt: the least largest range of any cut */
    int64_t lo = maxq, hi = b.total;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (rb_chunk_cut(&b, mid, cand)) hi = mid;
        else lo = mid + 1;
    }
    int64_t copt = lo, lb_t = b.total / P + (b.total % P != 0);   /* no rank total below either */
    if (lb_t < copt) lb_t = copt;
    rb_val best = {RB_NONE, RB_NONE, 0, 0};
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
        if (rb_better(v, best, 0)) { best = v; memcpy(inc, cand, (size_t)(S + 1) * sizeof *inc); }
    }
    /* then an exact search below it, within a budget */
    for (int r = 0; r < P; r++) T[r] = 0;
    rb_dfs dfs = {.b = &b, .best = best, .cut = inc, .at = cand, .T = T, .steps = RB_DFS_STEPS};
    rb_search(&dfs, 0, 0, 0);
    memcpy(first, inc, (size_t)(S + 1) * sizeof *first);
done:
    free(T); free(ch); free(dcost); free(cand); free(inc); free(b.pre);
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
