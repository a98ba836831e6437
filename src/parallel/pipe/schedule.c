/* Builds the static pipeline schedules of pipe/pipe_internal.h: per rank, the
 * list of F, B (and W) actions. The rules per schedule are in the header;
 * every one keeps each chunk's B's (and W's) in increasing micro-batch order,
 * which is what makes the gradients equal to sequential accumulation.
 * Checking and simulating a schedule: pipe/schedule_sim.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "pipe_internal.h"

static const char *const kind_names[] = {"gpipe", "1f1b", "interleaved", "zb-h1"};
#define N_KINDS ((int)(sizeof kind_names / sizeof kind_names[0]))

const char *dt_pipe_kind_name(dt_pipe_kind k) {
    return (int)k >= 0 && (int)k < N_KINDS ? kind_names[k] : "?";
}

int dt_pipe_kind_parse(const char *name, dt_pipe_kind *out) {
    for (int k = 0; name && k < N_KINDS; k++)
        if (!strcmp(name, kind_names[k])) {
            *out = (dt_pipe_kind)k;
            return 0;
        }
    DT_ERR(DT_EINVAL, "unknown pipeline schedule '%s' (gpipe, 1f1b, interleaved, zb-h1)", name ? name : "(null)");
    return -1;
}

/* ---- argument rules ---- */

static dt_status check_args(dt_pipe_kind kind, int P, int M, int V, int max_outstanding) {
    const char *k = dt_pipe_kind_name(kind);
    if ((int)kind < 0 || (int)kind >= N_KINDS)
        return DT_ERR(DT_EINVAL, "unknown pipeline schedule kind %d", (int)kind);
    if (P < 1 || P > DT_PIPE_MAX_RANKS)
        return DT_ERR(DT_EINVAL, "pipeline %s needs 1 <= pipe.stages <= %d (got P=%d)", k, DT_PIPE_MAX_RANKS, P);
    if (M < 1 || M > (1 << 24))
        return DT_ERR(DT_EINVAL, "pipeline %s needs 1 <= micro-batches <= %d (got M=%d)", k, 1 << 24, M);
    if (V < 1 || V > 255)
        return DT_ERR(DT_EINVAL, "pipeline %s needs 1 <= pipe.virtual_stages <= 255 (got V=%d)", k, V);
    if ((int64_t)M * V > (1 << 24))
        return DT_ERR(DT_EINVAL, "pipeline %s: micro-batches x pipe.virtual_stages too large (got M=%d, V=%d)", k, M, V);
    if (kind != DT_PIPE_INTERLEAVED && V != 1)
        return DT_ERR(DT_EINVAL, "pipeline %s runs one chunk per rank (got V=%d); use interleaved for virtual stages",
                      k, V);
    if (kind == DT_PIPE_INTERLEAVED && V < 2)
        return DT_ERR(DT_EINVAL, "pipeline interleaved needs pipe.virtual_stages >= 2 (got V=%d); use 1f1b for one", V);
    if (kind == DT_PIPE_INTERLEAVED && M % P)
        return DT_ERR(DT_EINVAL, "pipeline interleaved needs micro-batches to be a multiple of pipe.stages "
                      "(P, 2P, ...; got M=%d, P=%d)", M, P);
    if (max_outstanding < 0)
        return DT_ERR(DT_EINVAL, "pipeline %s: max outstanding micro-batches must be >= 0 (got %d)", k,
                      max_outstanding);
    if (kind != DT_PIPE_GPIPE && max_outstanding)
        return DT_ERR(DT_EINVAL, "pipeline %s: max outstanding micro-batches is for gpipe only (got %d)", k,
                      max_outstanding);
    return DT_OK;
}

/* ---- one rank's list ---- */

typedef struct rank_list { dt_pipe_action *a; int n; } rank_list;

static void put(rank_list *r, dt_pipe_op op, int mb, int chunk) {
    r->a[r->n++] = (dt_pipe_action){(uint8_t)op, (uint8_t)chunk, mb};
}

/* Fill-drain in groups of L micro-batches: F's of the group, then its B's. */
static void build_gpipe(rank_list *r, int M, int L) {
    for (int g = 0; g < M; g += L) {
        int end = g + L < M ? g + L : M;
        for (int i = g; i < end; i++) put(r, DT_PIPE_F, i, 0);
        for (int i = g; i < end; i++) put(r, DT_PIPE_B, i, 0);
    }
}

/* B(i), and when split the W's due after it: W(i - lag) (W's stay in B order). */
static void put_b(rank_list *r, int i, int split, int lag, int *next_w) {
    put(r, DT_PIPE_B, i, 0);
    while (split && *next_w <= i - lag) put(r, DT_PIPE_W, (*next_w)++, 0);
}

/* 1F1B; split: zb-h1 (W(i - s) right after B(i), the rest at the end). */
static void build_1f1b(rank_list *r, int P, int M, int s, int split) {
    int warm = P - s - 1 < M ? P - s - 1 : M, next_w = 0;
    for (int i = 0; i < warm; i++) put(r, DT_PIPE_F, i, 0);
    for (int i = 0; i < M - warm; i++) {
        put(r, DT_PIPE_F, warm + i, 0);
        put_b(r, i, split, s, &next_w);
    }
    for (int i = M - warm; i < M; i++) put_b(r, i, split, s, &next_w);
    while (split && next_w < M) put(r, DT_PIPE_W, next_w++, 0);
}

/* Megatron's k-th forward / backward of a rank: groups of P micro-batches
 * per chunk, chunks ascending (forward) or descending (backward). */
static void put_virtual(rank_list *r, dt_pipe_op op, int k, int P, int V) {
    int in_group = k % (P * V), chunk = in_group / P;
    put(r, op, k / (P * V) * P + in_group % P, op == DT_PIPE_F ? chunk : V - 1 - chunk);
}

static void build_interleaved(rank_list *r, int P, int M, int V, int s) {
    int total = M * V, warm = (P - s - 1) * 2 + (V - 1) * P;
    if (warm > total) warm = total;
    for (int k = 0; k < warm; k++) put_virtual(r, DT_PIPE_F, k, P, V);
    for (int k = 0; k < total - warm; k++) {
        put_virtual(r, DT_PIPE_F, warm + k, P, V);
        put_virtual(r, DT_PIPE_B, k, P, V);
    }
    for (int k = total - warm; k < total; k++) put_virtual(r, DT_PIPE_B, k, P, V);
}

dt_status dt_pipe_schedule_build(dt_pipe_kind kind, int P, int M, int V, int max_outstanding,
                                 dt_pipe_schedule *out) {
    *out = (dt_pipe_schedule){0};
    DT_TRY(check_args(kind, P, M, V, max_outstanding));
    int split = kind == DT_PIPE_ZBH1, per_rank = M * V * (split ? 3 : 2);
    *out = (dt_pipe_schedule){.kind = kind, .P = P, .M = M, .V = V, .split_w = split};
    if (kind == DT_PIPE_GPIPE) out->max_outstanding = max_outstanding && max_outstanding < M ? max_outstanding : M;
    out->n = calloc((size_t)P, sizeof *out->n);
    out->act = calloc((size_t)P, sizeof *out->act);
    for (int s = 0; out->act && s < P; s++)
        if (!(out->act[s] = malloc((size_t)per_rank * sizeof **out->act))) break;
    if (!out->n || !out->act || !out->act[P - 1]) {
        dt_pipe_schedule_free(out);
        return DT_ERR(DT_ENOMEM, "pipeline %s: out of memory for %d ranks x %d actions", dt_pipe_kind_name(kind), P,
                      per_rank);
    }
    for (int s = 0; s < P; s++) {
        rank_list r = {out->act[s], 0};
        switch (kind) {
        case DT_PIPE_GPIPE: build_gpipe(&r, M, out->max_outstanding); break;
        case DT_PIPE_1F1B: build_1f1b(&r, P, M, s, 0); break;
        case DT_PIPE_ZBH1: build_1f1b(&r, P, M, s, 1); break;
        case DT_PIPE_INTERLEAVED: build_interleaved(&r, P, M, V, s); break;
        }
        out->n[s] = r.n;
    }
    return DT_OK;
}

void dt_pipe_schedule_free(dt_pipe_schedule *s) {
    for (int i = 0; s->act && i < s->P; i++) free(s->act[i]);
    free(s->act);
    free(s->n);
    *s = (dt_pipe_schedule){0};
}

int dt_pipe_schedule_format(const dt_pipe_schedule *s, int rank, char *buf, size_t n) {
    if (rank < 0 || rank >= s->P) return -1;
    static const char ops[] = "FBW";
    size_t len = 0;
    if (n) buf[0] = 0;
    for (int i = 0; i < s->n[rank]; i++) {
        const dt_pipe_action *a = &s->act[rank][i];
        char tok[48];
        int t = s->V > 1 ? snprintf(tok, sizeof tok, "%s%c%dc%d", i ? " " : "", ops[a->op % 3], (int)a->mb, a->chunk)
                         : snprintf(tok, sizeof tok, "%s%c%d", i ? " " : "", ops[a->op % 3], (int)a->mb);
        if (len + (size_t)t < n) memcpy(buf + len, tok, (size_t)t + 1);
        else if (len < n) { memcpy(buf + len, tok, n - 1 - len); buf[n - 1] = 0; }
        len += (size_t)t;
    }
    return (int)len;
}

double dt_pipe_bubble_formula(dt_pipe_kind kind, int P, int M, int V) {
    if (P < 1 || M < 1 || V < 1) return 0;
    double fill = (double)(P - 1);
    switch (kind) {
    case DT_PIPE_GPIPE:
    case DT_PIPE_1F1B: return fill / (M + fill);
    case DT_PIPE_INTERLEAVED: return fill / (M + fill) / V;
    case DT_PIPE_ZBH1: return fill / (3.0 * M + fill);
    }
    return 0;
}
