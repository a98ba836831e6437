/* Tied parameters across pipeline ranks (GPT-2's wte: the embedding on the
 * first stage, the lm-head on the last).
 *
 * One process accumulates such a gradient per micro-batch j as
 *   G = G + (the last-used block's contribution) + ... + (the first's)
 * (backward reaches the later block first). To get the same bits here, the
 * authority (rank of the last virtual stage using it) runs the sequence:
 *   own W(0), fold(0), own W(1), fold(1), ...
 * where own W(j) is the deferred weight gradient of its own use on j's tape
 * and fold(j) adds each holder's micro-batch-j contribution, received as the
 * non-zero rows of a buffer the holder's backward accumulated into from zero.
 * That equals adding in place because every contribution is added to its
 * buffer once per row (an embedding sums repeated ids first: ops.h), so
 * G + (0 + s) == G + s. The holder's rows are small (the tokens of one
 * micro-batch); the total G goes back to the holders once per step.
 *
 * Tags (enum dt_pipe_tag): rows of (tie id t, micro-batch j) TIE_ROWS + t*M + j,
 * the step's total TIE_TOTAL + t; ties are handled in id order on every rank. */
#include <stdlib.h>
#include <string.h>
#include "pipe_internal.h"

void dt_pipe_ties_free(dt_pipe *p) {
    for (int t = 0; t < p->ties.n; t++) {
        dt_pipe_tie *e = &p->ties.list[t];
        if (e->saved_grad) e->p->grad.data = e->saved_grad;
        if (p->comm.broken) continue;   /* (pipe/pipe_internal.h: its messages may never complete) */
        for (int h = 0; h < DT_PIPE_MAX_STAGES; h++) dt_work_wait(e->work[h]);
        free(e->e);
        free(e->msg);
    }
    free(p->ties.list);
    free(p->ties.of);
    p->ties.list = NULL;
    p->ties.of = NULL;
    p->ties.n = 0;
}

/* Holders of global parameter k other than the authority, by descending
 * virtual stage (each rank once, at its last use). */
static int find_holders(const dt_pipe *p, const dt_pipe_probe *pr, int k, int auth, int *out) {
    int n = 0;
    for (int v = p->lay.S - 1; v >= 0; v--) {
        int r = dt_pipe_rank_of(p, v);
        if (r == auth || !dt_pipe_chunk_uses(p, pr, k, v)) continue;
        int seen = 0;
        for (int i = 0; i < n; i++) seen |= out[i] == r;
        if (!seen) out[n++] = r;
    }
    return n;
}

/* The chunk of this rank using k; two chunks of one rank are not supported. */
static dt_status my_chunk(const dt_pipe *p, const dt_pipe_probe *pr, int k, const char *name, int *chunk) {
    *chunk = -1;
    for (int c = 0; c < p->lay.V; c++) {
        if (!dt_pipe_chunk_uses(p, pr, k, dt_pipe_vstage(p, c))) continue;
        if (*chunk >= 0)
            return DT_ERR(DT_EINVAL, "pipeline: parameter %s is used by two chunks of rank %d (virtual stages %d and %d); "
                          "tied parameters must sit in one chunk per rank (choose another pipe.split)", name, p->lay.stage,
                          dt_pipe_vstage(p, *chunk), dt_pipe_vstage(p, c));
        *chunk = c;
    }
    return DT_OK;
}

static dt_status setup_one(dt_pipe *p, const dt_pipe_probe *pr, dt_param *q, int k, dt_pipe_tie *t) {
    int last = dt_pipe_last_user(p, pr, k);
    memset(t, 0, sizeof *t);
    t->p = q;
    t->authority = dt_pipe_rank_of(p, last);
    t->is_authority = t->authority == p->lay.stage;
    DT_TRY(my_chunk(p, pr, k, q->name, &t->chunk));
    if (t->is_authority) {
        t->n_holders = find_holders(p, pr, k, t->authority, t->holders);
    } else {
        t->n_holders = 1;
        t->holders[0] = t->authority;
    }
    t->rows = q->value.ndim >= 2 ? q->value.shape[0] : q->value.numel;
    t->cols = q->value.numel / (t->rows ? t->rows : 1);
    t->msg_len = (size_t)(1 + t->rows + t->rows * t->cols);
    t->msg = malloc((size_t)t->n_holders * t->msg_len * sizeof(float));
    if (!t->is_authority) t->e = calloc((size_t)q->value.numel, sizeof(float));
    if (!t->msg || (!t->is_authority && !t->e)) return DT_ERR(DT_ENOMEM, "out of memory for tied parameter %s", q->name);
    return DT_OK;
}

static int tied(const dt_pipe *p, const dt_pipe_probe *pr, int k) {
    int users = 0;
    for (int r = 0; r < p->lay.P; r++) users += dt_pipe_rank_uses(p, pr, k, r);
    return users >= 2;
}

dt_status dt_pipe_ties_setup(dt_pipe *p, const dt_pipe_probe *pr, const int *global_index_of) {
    dt_model *m = p->m;
    p->ties.of = malloc((size_t)(m->n_params ? m->n_params : 1) * sizeof *p->ties.of);
    p->ties.list = calloc((size_t)(m->n_params ? m->n_params : 1), sizeof *p->ties.list);
    if (!p->ties.of || !p->ties.list) return DT_ERR(DT_ENOMEM, "out of memory");
    p->ties.auth_chunk = -1;
    int id = 0, next_global = 0;
    for (int i = 0; i < m->n_params; i++) {
        int k = global_index_of[i];
        p->ties.of[i] = -1;
        for (; next_global < k; next_global++) id += tied(p, pr, next_global);   /* ids count every rank's ties */
        if (!tied(p, pr, k) || !m->params[i]->requires_grad) continue;
        dt_pipe_tie *t = &p->ties.list[p->ties.n];
        DT_TRY(setup_one(p, pr, m->params[i], k, t));
        t->id = id;
        if (t->is_authority) {
            if (p->ties.auth_chunk >= 0 && p->ties.auth_chunk != t->chunk)
                return DT_ERR(DT_EINVAL, "pipeline: tied parameters of rank %d sit in two of its chunks", p->lay.stage);
            p->ties.auth_chunk = t->chunk;
        }
        p->ties.of[i] = p->ties.n++;
    }
    for (; next_global < pr->n_params; next_global++) id += tied(p, pr, next_global);
    if (id * p->step.M >= DT_PIPE_TAG_SHAPES - DT_PIPE_TAG_TIE_ROWS || id > DT_PIPE_TAG_NOTICE - DT_PIPE_TAG_TIE_TOTAL)
        return DT_ERR(DT_EINVAL, "pipeline: %d tied parameters x %d micro-batches is too many messages", id, p->step.M);
    return DT_OK;
}

void dt_pipe_ties_redirect(dt_pipe *p, int c) {
    for (int t = 0; t < p->ties.n; t++) {
        dt_pipe_tie *e = &p->ties.list[t];
        if (e->is_authority || e->chunk != c) continue;
        e->saved_grad = e->p->grad.data;
        e->p->grad.data = e->e;
    }
}

/* [count, row ids..., rows...] of e's non-zero rows; those rows are zeroed. */
static size_t pack_rows(dt_pipe_tie *e) {
    int64_t n = 0, C = e->cols;
    float *ids = e->msg + 1;
    for (int64_t r = 0; r < e->rows; r++) {
        float *x = e->e + r * C;
        int64_t c = 0;
        while (c < C && x[c] == 0.f) c++;
        if (c == C) continue;
        ids[n] = (float)r;
        n++;
    }
    /* rows right after the ids actually sent, so the message is contiguous */
    float *rows = e->msg + 1 + n;
    for (int64_t i = 0; i < n; i++) {
        float *x = e->e + (int64_t)ids[i] * C;
        memcpy(rows + i * C, x, (size_t)C * sizeof(float));
        memset(x, 0, (size_t)C * sizeof(float));
    }
    e->msg[0] = (float)n;
    return (size_t)(1 + n + n * C);
}

dt_status dt_pipe_ties_export(dt_pipe *p, int c, int j) {
    for (int t = 0; t < p->ties.n; t++) {
        dt_pipe_tie *e = &p->ties.list[t];
        if (e->is_authority || e->chunk != c) continue;
        e->p->grad.data = e->saved_grad;
        e->saved_grad = NULL;
        DT_TRY(dt_work_wait(e->work[0]));   /* the previous micro-batch's rows are out of msg */
        e->work[0] = NULL;
        size_t len = pack_rows(e);
        DT_TRY(dt_send(p->comm.pp, e->msg, (int64_t)len, DT_F32, e->authority, DT_PIPE_TAG_TIE_ROWS + e->id * p->step.M + j,
                       &e->work[0]));
    }
    return DT_OK;
}

dt_status dt_pipe_ties_post(dt_pipe *p, int j) {
    for (int t = 0; t < p->ties.n; t++) {
        dt_pipe_tie *e = &p->ties.list[t];
        if (!e->is_authority) continue;
        for (int h = 0; h < e->n_holders; h++)
            DT_TRY(dt_recv(p->comm.pp, e->msg + (size_t)h * e->msg_len, (int64_t)e->msg_len, DT_F32, e->holders[h],
                           DT_PIPE_TAG_TIE_ROWS + e->id * p->step.M + j, &e->work[h]));
    }
    return DT_OK;
}

int dt_pipe_ties_arrived(dt_pipe *p) {
    for (int t = 0; t < p->ties.n; t++) {
        dt_pipe_tie *e = &p->ties.list[t];
        if (!e->is_authority) continue;
        for (int h = 0; h < e->n_holders; h++) {
            int done = 1;
            if (e->work[h] && dt_work_test(e->work[h], &done) != DT_OK) return 1;   /* fold reports it */
            if (!done) return 0;
        }
    }
    return 1;
}

/* ZeRO-2 keeps a bucket's gradient buffer only while it is in use: ask for
 * it before writing into a tied gradient outside a backward. */
static dt_status grad_buffer(dt_param *q) {
    if (q->grad.data) return DT_OK;
    if (!q->on_grad_alloc || q->on_grad_alloc(q, q->on_grad_ready_user) != DT_OK || !q->grad.data)
        return DT_ERR(DT_ESTATE, "pipeline: tied parameter %s has no gradient buffer", q->name);
    return DT_OK;
}

dt_status dt_pipe_ties_fold(dt_pipe *p, int j) {
    for (int t = 0; t < p->ties.n; t++) {
        dt_pipe_tie *e = &p->ties.list[t];
        if (!e->is_authority) continue;
        DT_TRY(grad_buffer(e->p));
        float *g = dt_f32(&e->p->grad);
        for (int h = 0; h < e->n_holders; h++) {   /* descending virtual stage: backward's order */
            dt_status s = dt_work_wait(e->work[h]);
            e->work[h] = NULL;
            if (s != DT_OK) {
                char why[512];
                snprintf(why, sizeof why, "%s", dt_error_message());
                return DT_ERR(s, "pipeline: tied parameter %s: rows of micro-batch %d from rank %d: %s", e->p->name, j,
                              e->holders[h], why);
            }
            const float *msg = e->msg + (size_t)h * e->msg_len;
            int64_t n = (int64_t)msg[0], C = e->cols;
            if (n < 0 || n > e->rows)
                return DT_ERR(DT_ECOMM, "pipeline: tied parameter %s: rank %d sent %lld rows (has %lld)", e->p->name,
                              e->holders[h], (long long)n, (long long)e->rows);
            const float *ids = msg + 1, *rows = msg + 1 + n;
            for (int64_t i = 0; i < n; i++) {
                float *dst = g + (int64_t)ids[i] * C;
                const float *src = rows + i * C;
                for (int64_t c = 0; c < C; c++) dst[c] += src[c];
            }
        }
    }
    return DT_OK;
}

dt_status dt_pipe_ties_share(dt_pipe *p) {
    dt_status s = DT_OK;
    for (int t = 0; t < p->ties.n; t++) {
        dt_pipe_tie *e = &p->ties.list[t];
        if (s == DT_OK) s = grad_buffer(e->p);
        if (s != DT_OK) break;
        float *g = dt_f32(&e->p->grad);
        if (e->is_authority) {
            for (int h = 0; h < e->n_holders && s == DT_OK; h++)
                s = dt_send(p->comm.pp, g, e->p->grad.numel, DT_F32, e->holders[h], DT_PIPE_TAG_TIE_TOTAL + e->id, NULL);
        } else {
            dt_status w = dt_work_wait(e->work[0]);
            e->work[0] = NULL;
            if (s == DT_OK) s = w;
            if (s == DT_OK) s = dt_recv(p->comm.pp, g, e->p->grad.numel, DT_F32, e->authority, DT_PIPE_TAG_TIE_TOTAL + e->id, NULL);
        }
    }
    return s;
}
