/* Checks and simulates a pipe/pipe_internal.h schedule. One engine for both: it
 * runs every rank's list in order, an action starting when its rank is free
 * and its inputs have arrived (a message to another rank takes lat after the
 * end of the producing action; on the same rank it is there at once). When
 * no rank can start its next action before all lists are done, the lists
 * deadlock. The check runs the engine with unit costs after the per-rank
 * rules (each action exactly once, B's of a chunk in increasing micro-batch
 * order, W's in the order of the B's). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "pipe_internal.h"

static const char *act_text(const dt_pipe_action *a, char *buf, size_t n) {
    static const char ops[] = "FBW";
    snprintf(buf, n, "%c mb=%d chunk=%d", a->op <= DT_PIPE_W ? ops[a->op] : '?', (int)a->mb, a->chunk);
    return buf;
}

static int per_rank(const dt_pipe_schedule *s) { return s->M * s->V * (s->split_w ? 3 : 2); }

static dt_status check_shape(const dt_pipe_schedule *s) {
    if (s->P < 1 || s->P > DT_PIPE_MAX_RANKS)
        return DT_ERR(DT_EINVAL, "pipeline schedule: P=%d ranks (1..%d)", s->P, DT_PIPE_MAX_RANKS);
    if (s->M < 1 || s->V < 1 || s->V > 255 || (int64_t)s->M * s->V > (1 << 24))
        return DT_ERR(DT_EINVAL, "pipeline schedule: M=%d micro-batches, V=%d chunks out of range", s->M, s->V);
    if (!s->n || !s->act) return DT_ERR(DT_EINVAL, "pipeline schedule: not built (no action lists)");
    for (int r = 0; r < s->P; r++)
        if (s->n[r] < 0 || (s->n[r] && !s->act[r]))
            return DT_ERR(DT_EINVAL, "pipeline schedule: rank %d has no action list (n=%d)", r, s->n[r]);
    return DT_OK;
}

/* seen: per_rank ints; b_at, w_at: M*V ints (action index of the k-th B / W). */
static dt_status check_rank(const dt_pipe_schedule *s, int r, int *seen, int *b_at, int *w_at) {
    const dt_pipe_action *a = s->act[r];
    int M = s->M, V = s->V, nb = 0, nw = 0, last_b[256];
    char t[48], u[48];
    memset(seen, 0, (size_t)per_rank(s) * sizeof *seen);
    for (int c = 0; c < V; c++) last_b[c] = -1;
    for (int i = 0; i < s->n[r]; i++) {
        int op = a[i].op, c = a[i].chunk, mb = a[i].mb;
        if (op > DT_PIPE_W || (op == DT_PIPE_W && !s->split_w) || c >= V || mb < 0 || mb >= M)
            return DT_ERR(DT_EINVAL, "pipeline schedule: rank %d action %d (%s) is not an action of this schedule "
                          "(M=%d, V=%d, split W %s)", r, i, act_text(&a[i], t, sizeof t), M, V,
                          s->split_w ? "yes" : "no");
        if (seen[(op * V + c) * M + mb]++)
            return DT_ERR(DT_EINVAL, "pipeline schedule: rank %d action %d (%s) runs twice", r, i,
                          act_text(&a[i], t, sizeof t));
        if (op == DT_PIPE_B && mb < last_b[c])
            return DT_ERR(DT_EINVAL, "pipeline schedule: rank %d action %d (%s) runs after B of mb %d: chunk %d's "
                          "B's must run in increasing micro-batch order", r, i, act_text(&a[i], t, sizeof t),
                          last_b[c], c);
        if (op == DT_PIPE_B) last_b[c] = mb, b_at[nb++] = i;
        if (op == DT_PIPE_W) w_at[nw++] = i;
    }
    for (int k = 0; k < per_rank(s); k++)
        if (!seen[k]) {
            dt_pipe_action m = {(uint8_t)(k / (M * V)), (uint8_t)(k / M % V), k % M};
            return DT_ERR(DT_EINVAL, "pipeline schedule: rank %d never runs %s", r, act_text(&m, t, sizeof t));
        }
    for (int k = 0; k < nw; k++)
        if (a[w_at[k]].mb != a[b_at[k]].mb || a[w_at[k]].chunk != a[b_at[k]].chunk)
            return DT_ERR(DT_EINVAL, "pipeline schedule: rank %d action %d (%s) is W number %d but B number %d is "
                          "%s: W's must run in the order of their B's", r, w_at[k],
                          act_text(&a[w_at[k]], t, sizeof t), k, k, act_text(&a[b_at[k]], u, sizeof u));
    return DT_OK;
}

static dt_status check_lists(const dt_pipe_schedule *s) {
    DT_TRY(check_shape(s));
    size_t mv = (size_t)s->M * (size_t)s->V;
    int *seen = malloc((size_t)per_rank(s) * sizeof *seen), *b_at = malloc(mv * sizeof *b_at),
        *w_at = malloc(mv * sizeof *w_at);
    dt_status st = seen && b_at && w_at ? DT_OK : DT_ERR(DT_ENOMEM, "pipeline schedule check: out of memory");
    for (int r = 0; st == DT_OK && r < s->P; r++) st = check_rank(s, r, seen, b_at, w_at);
    free(seen);
    free(b_at);
    free(w_at);
    return st;
}

/* ---- the engine ---- */

typedef struct engine {
    const dt_pipe_schedule *s;
    double cost[3], lat;
    double *done_f, *done_b;   /* [v * M + mb]: end time, < 0 not yet */
    double free_at[DT_PIPE_MAX_RANKS];
    int next[DT_PIPE_MAX_RANKS], open[DT_PIPE_MAX_RANKS];
} engine;

/* Arrival on rank r of the output of virtual stage v's (F or B) for mb;
 * < 0 when it has not run yet. *miss names it. */
static double arrival(const engine *e, const double *done, int v, int mb, int r, dt_pipe_action *miss, int *miss_rank) {
    const dt_pipe_schedule *s = e->s;
    double t = done[(size_t)v * s->M + mb];
    if (t < 0) {
        *miss = (dt_pipe_action){(uint8_t)(done == e->done_f ? DT_PIPE_F : DT_PIPE_B), (uint8_t)(v / s->P), mb};
        *miss_rank = v % s->P;
        return -1;
    }
    return v % s->P == r ? t : t + e->lat;
}

/* When a's inputs are all on rank r, or -1 (miss: an input not produced yet). */
static double ready_at(const engine *e, int r, const dt_pipe_action *a, dt_pipe_action *miss, int *miss_rank) {
    const dt_pipe_schedule *s = e->s;
    int v = a->chunk * s->P + r, last = s->P * s->V - 1;
    double t = 0, u = 0;
    if (a->op == DT_PIPE_F) return v ? arrival(e, e->done_f, v - 1, a->mb, r, miss, miss_rank) : 0;
    if (a->op == DT_PIPE_W) return arrival(e, e->done_b, v, a->mb, r, miss, miss_rank);
    if ((t = arrival(e, e->done_f, v, a->mb, r, miss, miss_rank)) < 0) return -1;
    if (v < last && (u = arrival(e, e->done_b, v + 1, a->mb, r, miss, miss_rank)) < 0) return -1;
    return t > u ? t : u;
}

/* Runs rank r's list as far as its inputs allow; returns actions run. */
static int advance(engine *e, int r, dt_pipe_sim *out) {
    const dt_pipe_schedule *s = e->s;
    int ran = 0;
    for (; e->next[r] < s->n[r]; e->next[r]++, ran++) {
        const dt_pipe_action *a = &s->act[r][e->next[r]];
        dt_pipe_action miss;
        int miss_rank;
        double ready = ready_at(e, r, a, &miss, &miss_rank);
        if (ready < 0) break;
        double start = ready > e->free_at[r] ? ready : e->free_at[r], end = start + e->cost[a->op];
        size_t at = (size_t)(a->chunk * s->P + r) * s->M + a->mb;
        if (a->op == DT_PIPE_F) e->done_f[at] = end;
        if (a->op == DT_PIPE_B) e->done_b[at] = end;
        e->free_at[r] = end;
        out->busy[r] += e->cost[a->op];
        e->open[r] += a->op == DT_PIPE_F ? 1 : a->op == DT_PIPE_B ? -1 : 0;
        if (e->open[r] > out->peak_outstanding[r]) out->peak_outstanding[r] = e->open[r];
    }
    return ran;
}

/* No rank can go on: follow who waits for whom from the first unfinished
 * rank to a rank waiting on itself (an input later in its own list) or back
 * to a rank already seen (a cycle), and name that rank's stuck action. */
static dt_status deadlock(const engine *e) {
    const dt_pipe_schedule *s = e->s;
    int r = 0, seen[DT_PIPE_MAX_RANKS] = {0};
    while (r < s->P && e->next[r] == s->n[r]) r++;
    if (r == s->P) return DT_OK;
    dt_pipe_action miss = {0};
    int miss_rank = r;
    for (;;) {
        seen[r] = 1;
        ready_at(e, r, &s->act[r][e->next[r]], &miss, &miss_rank);
        if (miss_rank == r || seen[miss_rank] || e->next[miss_rank] == s->n[miss_rank]) break;
        r = miss_rank;
    }
    if (miss_rank != r && seen[miss_rank]) {   /* report the cycle from the rank it closes on */
        r = miss_rank;
        ready_at(e, r, &s->act[r][e->next[r]], &miss, &miss_rank);
    }
    char t[48], u[48];
    return DT_ERR(DT_EINVAL, "pipeline %s deadlocks: rank %d action %d (%s) waits for %s of rank %d, which "
                  "cannot run first", dt_pipe_kind_name(s->kind), r, e->next[r],
                  act_text(&s->act[r][e->next[r]], t, sizeof t), act_text(&miss, u, sizeof u), miss_rank);
}

static dt_status run(const dt_pipe_schedule *s, const double cost[3], double lat, dt_pipe_sim *out) {
    size_t cells = (size_t)s->P * s->V * s->M;
    engine e = {.s = s, .cost = {cost[0], cost[1], cost[2]}, .lat = lat};
    e.done_f = malloc(cells * sizeof *e.done_f);
    e.done_b = malloc(cells * sizeof *e.done_b);
    *out = (dt_pipe_sim){0};
    if (!e.done_f || !e.done_b) {
        free(e.done_f);
        free(e.done_b);
        return DT_ERR(DT_ENOMEM, "pipeline schedule simulation: out of memory");
    }
    for (size_t i = 0; i < cells; i++) e.done_f[i] = e.done_b[i] = -1;
    int progress = 1;
    while (progress) {
        progress = 0;
        for (int r = 0; r < s->P; r++) progress += advance(&e, r, out);
    }
    dt_status st = deadlock(&e);
    free(e.done_f);
    free(e.done_b);
    if (st != DT_OK) return st;
    for (int r = 0; r < s->P; r++)
        if (e.free_at[r] > out->makespan) out->makespan = e.free_at[r];
    for (int r = 0; r < s->P; r++)
        out->bubble[r] = out->makespan > 0 ? (out->makespan - out->busy[r]) / out->makespan : 0;
    return DT_OK;
}

dt_status dt_pipe_schedule_check(const dt_pipe_schedule *s) {
    static const double unit[3] = {1, 1, 1};
    dt_pipe_sim sim;
    DT_TRY(check_lists(s));
    return run(s, unit, 0, &sim);
}

dt_status dt_pipe_schedule_simulate(const dt_pipe_schedule *s, double tf, double tb, double tw, double lat,
                                    dt_pipe_sim *out) {
    const double cost[3] = {tf, tb, tw};
    *out = (dt_pipe_sim){0};
    if (!(tf >= 0 && tb >= 0 && tw >= 0 && lat >= 0))
        return DT_ERR(DT_EINVAL, "pipeline simulation: costs and latency must be >= 0 (got tf=%g tb=%g tw=%g lat=%g)",
                      tf, tb, tw, lat);
    DT_TRY(check_lists(s));
    return run(s, cost, lat, out);
}
