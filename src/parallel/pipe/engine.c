/* The schedule runner: one step's actions on this rank, and evaluation.
 *
 * Design constraints, above the loop:
 *  - Every receive of the step is posted before the first action (buffers
 *    are per (chunk, micro-batch) slot), so a message never waits for its
 *    receiver to reach the action that needs it; sends are non-blocking and
 *    waited before their tape is reused. The tapes' tick polls MPI, so the
 *    messages move while the stage computes.
 *  - Each (chunk, micro-batch) has its own tape from a pool: a micro-batch's
 *    activations live from its F to its B (or W); the pool's peak is the
 *    schedule's in-flight count.
 *  - Gradients of a chunk accumulate in micro-batch order (every schedule's
 *    B and W are in micro-batch order per chunk), as in one process.
 *  - Tied parameters (pipe/tie.c): holders redirect them around each B and
 *    send rows; the authority defers its own use and interleaves own W and
 *    folds in micro-batch order (tie_pump).
 *  - A failure midway never leaves the other stages waiting: the failing rank
 *    sends an abort notice (stage, micro-batch, chunk, world rank) to every
 *    other rank of its pipeline; each rank keeps one receive per peer posted
 *    from its first step to teardown, and every wait here tests those while
 *    it waits, so a stage blocked on the failed one fails too, with "stage F
 *    (rank X) failed at micro-batch K (see its error)". A rank failing that
 *    way passes the first notice on (every peer's receive completes);
 *    teardown completes them with a closing notice (stage -1) to every peer.
 *
 * Message tags: enum dt_pipe_tag (pipe/pipe_internal.h).
 *
 * Test hook: DTRAIN_PIPE_FAULT=RANK:MB[:OP] (world rank, micro-batch, F or B;
 * default F) makes that rank's step fail when it reaches that action, as any
 * failing action does ("injected fault"). Read once per process; a malformed
 * value fails the first step with an error naming the variable. */
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "pipe_internal.h"

#define TAG_ACT(p, v, j) (DT_PIPE_TAG_ACT + (v) * (p)->step.M + (j))
#define TAG_GRAD(p, v, j) (DT_PIPE_TAG_GRAD + (v) * (p)->step.M + (j))

/* Abort notices: 4 floats, stage, micro-batch, chunk, world rank (of the
 * first failure; stage -1: closing at teardown, -1 elsewhere: not in an
 * action). */
typedef struct dt_pipe_notice {
    float in[DT_PIPE_MAX_STAGES][4];   /* from each peer */
    float out[4];
    dt_work *recv[DT_PIPE_MAX_STAGES], *send[DT_PIPE_MAX_STAGES];
    int c, j;                          /* the action under way (-1: none) */
    int next;                          /* the peer whose receive a wait tests next */
    int relay;                         /* out holds a peer's notice to pass on */
    int stopped;                       /* a peer's notice ended the step: waits return at once */
    int sent;
} dt_pipe_notice;

/* Between nodes: MPI progress for every group, and the stage's data-parallel
 * reducer (pipe/dp.c) finishes what completed. */
static void tick(void *user) {
    dt_dist_tick();
    dt_pipe_dp_tick(user);
}

static int defer_pred(const dt_param *q, void *user) {
    const dt_pipe *p = user;
    return q->index >= 0 && q->index < p->m->n_params && p->m->params[q->index] == q && p->tapes.defer[q->index];
}

/* ---- tapes ---- */
static dt_status pool_get(dt_pipe *p, dt_graph **out) {
    dt_graph *g;
    if (p->tapes.n_free) {
        g = p->tapes.free_list[--p->tapes.n_free];
    } else {
        dt_graph **pool = realloc(p->tapes.pool, (size_t)(p->tapes.n_pool + 1) * sizeof *pool);
        if (pool) p->tapes.pool = pool;
        dt_graph **fl = pool ? realloc(p->tapes.free_list, (size_t)(p->tapes.n_pool + 1) * sizeof *fl) : NULL;
        if (fl) p->tapes.free_list = fl;
        if (!pool || !fl || !(g = dt_graph_create())) return DT_ERR(DT_ENOMEM, "pipeline: out of memory for a tape");
        p->tapes.pool[p->tapes.n_pool++] = g;
    }
    dt_graph_reset(g);
    dt_graph_set_grad_enabled(g, 1);
    dt_graph_set_training(g, 1);
    dt_graph_set_tick(g, tick, p);
    dt_graph_defer_weights(g, defer_pred, p);
    if (++p->tapes.live > p->tapes.peak) p->tapes.peak = p->tapes.live;
    *out = g;
    return DT_OK;
}

static void pool_put(dt_pipe *p, dt_graph *g) {
    dt_graph_reset(g);
    p->tapes.free_list[p->tapes.n_free++] = g;
    p->tapes.live--;
}

/* ---- abort notices ---- */
static dt_status notice_post(dt_pipe *p) {
    if (p->comm.notice || p->lay.P < 2) return DT_OK;
    dt_pipe_notice *n = calloc(1, sizeof *n);
    if (!n) return DT_ERR(DT_ENOMEM, "pipeline: out of memory");
    n->c = n->j = -1;
    p->comm.notice = n;
    for (int q = 0; q < p->lay.P; q++)
        if (q != p->lay.stage) DT_TRY(dt_recv(p->comm.pp, n->in[q], 4, DT_F32, q, DT_PIPE_TAG_NOTICE, &n->recv[q]));
    return DT_OK;
}

static void at(dt_pipe *p, int c, int j) {
    if (p->comm.notice) { p->comm.notice->c = c; p->comm.notice->j = j; }
}

/* A peer's notice has come: this rank fails too, naming the first failure. */
static dt_status peer_failed(dt_pipe *p, int q) {
    dt_pipe_notice *n = p->comm.notice;
    dt_status s = dt_work_wait(n->recv[q]);
    n->recv[q] = NULL;
    n->stopped = 1;
    int me = dt_pg_rank(p->comm.world);
    char here[64] = "";
    if (n->j >= 0) snprintf(here, sizeof here, ", micro-batch %d", n->j);
    if (s != DT_OK) {
        char why[512];
        snprintf(why, sizeof why, "%s", dt_error_message());
        return DT_ERR(s, "pipeline stage %d (rank %d)%s: abort notice from stage %d: %s", p->lay.stage, me, here, q, why);
    }
    const float *f = n->in[q];
    if (f[0] < 0)
        return DT_ERR(DT_ECOMM, "pipeline stage %d (rank %d)%s: stage %d (rank %d) left the pipeline mid-step",
                      p->lay.stage, me, here, q, (int)f[3]);
    memcpy(n->out, f, sizeof n->out);
    n->relay = 1;
    char there[64] = "";
    if (f[1] >= 0 && p->lay.V > 1) snprintf(there, sizeof there, " at micro-batch %d, chunk %d", (int)f[1], (int)f[2]);
    else if (f[1] >= 0) snprintf(there, sizeof there, " at micro-batch %d", (int)f[1]);
    return DT_ERR(DT_ECOMM, "pipeline stage %d (rank %d)%s: stage %d (rank %d) failed%s (see its error)", p->lay.stage, me,
                  here, (int)f[0], (int)f[3], there);
}

static int notice_in(dt_pipe *p, int q) {
    int done = 0;
    return p->comm.notice->recv[q] && dt_work_test(p->comm.notice->recv[q], &done) == DT_OK && done;
}

/* One turn of a wait: DT_OK, or this rank's error once a peer's notice has
 * come (after the first, at once, keeping the first's message). One peer per
 * turn, so a turn costs two polls (the awaited request's, this) at any P. */
static dt_status watch(dt_pipe *p, int *idle) {
    dt_pipe_notice *n = p->comm.notice;
    if (n->stopped) return DT_ECOMM;
    int q = n->next;
    n->next = (q + 1) % p->lay.P;
    if (notice_in(p, q)) return peer_failed(p, q);
    if (++*idle > 64) sched_yield();   /* as dt_work_wait: ranks may outnumber cores */
    return DT_OK;
}

/* The step failed here: tell every peer (once). Then wait, at most a second,
 * for the notices to leave and for every peer's notice (its own failure, or
 * this one passed on): the caller may abort the job next, and the peers
 * blocked on this stage should have stopped and be reporting by then. A peer
 * outside the engine (its step done) never answers: hence the bound. */
static void notify(dt_pipe *p) {
    dt_pipe_notice *n = p->comm.notice;
    if (!n || n->sent) return;
    n->sent = 1;
    if (!n->relay) {
        n->out[0] = (float)p->lay.stage;
        n->out[1] = (float)n->j;
        n->out[2] = (float)n->c;
        n->out[3] = (float)dt_pg_rank(p->comm.world);
    }
    dt_status code = dt_error_code();
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", dt_error_message());
    int lost = 0;
    for (int q = 0; q < p->lay.P; q++)
        if (q != p->lay.stage) lost |= dt_send(p->comm.pp, n->out, 4, DT_F32, q, DT_PIPE_TAG_NOTICE, &n->send[q]) != DT_OK;
    if (lost) dt_error_set(code, __FILE__, __LINE__, "%s", msg);   /* the step's error stays the message */
    double t0 = dt_par_now_us();
    for (int q = 0; q < p->lay.P && dt_par_now_us() - t0 < 1e6;) {
        int done = 1;
        if (n->send[q]) dt_work_test(n->send[q], &done);
        if (done && n->recv[q]) dt_work_test(n->recv[q], &done);
        if (done) q++;
        else sched_yield();
    }
    /* (the handles and n stay: the pipeline is broken, see dt_pipe_engine_free) */
}

/* Teardown of a pipeline whose steps went well: a closing notice to every
 * peer completes the receives (every rank of the pipeline tears down). */
static void notice_close(dt_pipe *p) {
    dt_pipe_notice *n = p->comm.notice;
    if (!n) return;
    n->out[0] = -1.0f;
    n->out[1] = n->out[2] = -1.0f;
    n->out[3] = (float)dt_pg_rank(p->comm.world);
    for (int q = 0; q < p->lay.P; q++)
        if (q != p->lay.stage && !n->sent) dt_send(p->comm.pp, n->out, 4, DT_F32, q, DT_PIPE_TAG_NOTICE, &n->send[q]);
    for (int q = 0; q < p->lay.P; q++) {
        dt_work_wait(n->recv[q]);
        dt_work_wait(n->send[q]);
    }
    free(n);
    p->comm.notice = NULL;
}

/* Test hook (file comment): an error when this rank reaches action op of
 * micro-batch j; op 0 (the start of a step) reports a malformed value once. */
static dt_status fault_hook(const dt_pipe *p, char op, int j) {
    static int state = -1, rank, mb;   /* -1: not read yet, 0: off, 1: armed, 2: malformed */
    static char fop;
    if (state < 0) {
        const char *e = getenv("DTRAIN_PIPE_FAULT");
        char *end = NULL;
        state = e && *e ? 2 : 0;
        if (state && *e >= '0' && *e <= '9') {
            long r = strtol(e, &end, 10), m = -1;
            if (*end == ':' && end[1] >= '0' && end[1] <= '9') m = strtol(end + 1, &end, 10);
            fop = 'F';
            if (*end == ':') {
                fop = end[1];
                end += fop ? 2 : 1;
            }
            if (r <= INT_MAX && m >= 0 && m <= INT_MAX && (fop == 'F' || fop == 'B') && !*end) {
                state = 1;
                rank = (int)r;
                mb = (int)m;
            }
        }
    }
    if (state == 2 && op == 0) {
        state = 0;
        return DT_ERR(DT_EINVAL, "DTRAIN_PIPE_FAULT=\"%s\": expected RANK:MB[:F|B] (world rank, micro-batch, op; a test "
                      "hook)", getenv("DTRAIN_PIPE_FAULT") ? getenv("DTRAIN_PIPE_FAULT") : "");
    }
    if (state == 1 && op == fop && j == mb && dt_pg_rank(p->comm.world) == rank)
        return DT_ERR(DT_EINVAL, "injected fault (DTRAIN_PIPE_FAULT=%d:%d:%c)", rank, mb, fop);
    return DT_OK;
}

/* Waits for *w; with notices posted, fails instead once a peer's notice has
 * come (*w then stays pending: the step is broken). */
static dt_status wait_timed(dt_pipe *p, dt_work **w) {
    double t0 = dt_par_now_us();
    dt_status s = DT_OK;
    for (int idle = 0, done = 0; *w && p->comm.notice && s == DT_OK;) {
        if (dt_work_test(*w, &done) != DT_OK || done) break;
        s = watch(p, &idle);
    }
    if (s == DT_OK) {
        s = dt_work_wait(*w);
        *w = NULL;
    }
    p->metrics.wait_us += dt_par_now_us() - t0;
    return s;
}

/* The slot is done: its sends are out, its tape goes back. */
static dt_status release(dt_pipe *p, dt_pipe_slot *s) {
    dt_status a = wait_timed(p, &s->send_act), b = wait_timed(p, &s->send_grad);
    if (s->g) pool_put(p, s->g);
    s->g = NULL;
    return a != DT_OK ? a : b;
}

void dt_pipe_engine_free(dt_pipe *p) {
    if (p->comm.broken) return;   /* (pipe/pipe_internal.h: messages may still use slots, tapes and notices) */
    notice_close(p);
    for (int i = 0; i < p->step.slots_cap; i++) {
        dt_pipe_slot *s = &p->step.slots[i];
        dt_work_wait(s->recv_act); dt_work_wait(s->recv_grad); dt_work_wait(s->send_act); dt_work_wait(s->send_grad);
        free(s->act); free(s->grad);
        free(s->in16); free(s->out16); free(s->gout16);
    }
    free(p->step.slots);
    for (int i = 0; i < p->tapes.n_pool; i++) dt_graph_free(p->tapes.pool[i]);
    free(p->tapes.pool); free(p->tapes.free_list);
    p->step.slots = NULL; p->tapes.pool = p->tapes.free_list = NULL;
    p->step.slots_cap = p->tapes.n_pool = p->tapes.n_free = 0;
}

/* ---- per-step set-up ---- */
static int64_t act_numel(const dt_pipe *p, int block, int in, const dt_batch *b) {
    int64_t sh[DT_MAX_DIMS];
    int nd = dt_model_block_shape(p->m, block, in, b, sh);
    return nd ? dt_shape_numel(nd, sh) : 0;
}

static int wire16(const dt_pipe *p) { return p->o.wire != DT_F32; }

static dt_status grow16(uint16_t **buf, int64_t need) {
    uint16_t *x = realloc(*buf, (size_t)need * sizeof *x);
    if (!x) return DT_ERR(DT_ENOMEM, "pipeline: out of memory for a %lld-element 16-bit message buffer", (long long)need);
    *buf = x;
    return DT_OK;
}

/* The slot's buffers of its input side (in: act, in16) or output side (grad,
 * out16, gout16) hold at least need elements. */
static dt_status grow(dt_pipe *p, dt_pipe_slot *s, int in, int64_t need) {
    int64_t *have = in ? &s->act_n : &s->grad_n;
    if (need <= *have) return DT_OK;
    float **f = in ? &s->act : &s->grad;
    float *x = realloc(*f, (size_t)need * sizeof(float));
    if (!x) return DT_ERR(DT_ENOMEM, "pipeline: out of memory for a %lld-float message buffer", (long long)need);
    *f = x;
    if (wire16(p)) {
        if (in) DT_TRY(grow16(&s->in16, need));
        else {
            DT_TRY(grow16(&s->out16, need));
            DT_TRY(grow16(&s->gout16, need));
        }
    }
    *have = need;
    return DT_OK;
}

/* Sends n floats from x to virtual stage v's rank on tag, as o.wire: rounded
 * into buf16 first when the wire is 16-bit (buf16 then stays in use until the
 * send completes). */
static dt_status send_wire(dt_pipe *p, const float *x, int64_t n, uint16_t *buf16, int v, int tag, dt_work **w) {
    const void *b = x;
    if (wire16(p)) {
        dt_convert(buf16, p->o.wire, x, DT_F32, (size_t)n);
        b = buf16;
    }
    p->metrics.sent_bytes += (size_t)n * dt_dtype_size(p->o.wire);
    return dt_send(p->comm.pp, b, n, p->o.wire, dt_pipe_rank_of(p, v), tag, w);
}

static dt_status prepare_slots(dt_pipe *p, const dt_batch *mb, int M) {
    int n = p->lay.V * M;
    if (n > p->step.slots_cap) {
        dt_pipe_slot *s = realloc(p->step.slots, (size_t)n * sizeof *s);
        if (!s) return DT_ERR(DT_ENOMEM, "pipeline: out of memory");
        memset(s + p->step.slots_cap, 0, (size_t)(n - p->step.slots_cap) * sizeof *s);
        p->step.slots = s;
        p->step.slots_cap = n;
    }
    for (int c = 0; c < p->lay.V; c++) {
        int v = dt_pipe_vstage(p, c);
        for (int j = 0; j < M; j++) {
            dt_pipe_slot *s = &p->step.slots[c * M + j];
            s->x = s->out = NULL;
            s->b_done = 0;
            if (v > 0) DT_TRY(grow(p, s, 1, act_numel(p, p->lay.vfirst[v], 1, &mb[j])));
            if (v + 1 < p->lay.S) DT_TRY(grow(p, s, 0, act_numel(p, p->lay.vfirst[v + 1] - 1, 0, &mb[j])));
        }
    }
    return DT_OK;
}

static dt_status post_receives(dt_pipe *p, const dt_batch *mb, int M) {
    for (int c = 0; c < p->lay.V; c++) {
        int v = dt_pipe_vstage(p, c);
        for (int j = 0; j < M; j++) {
            dt_pipe_slot *s = &p->step.slots[c * M + j];
            int w16 = wire16(p);
            if (v > 0)
                DT_TRY(dt_recv(p->comm.pp, w16 ? (void *)s->in16 : (void *)s->act, act_numel(p, p->lay.vfirst[v], 1, &mb[j]),
                               p->o.wire, dt_pipe_rank_of(p, v - 1), TAG_ACT(p, v, j), &s->recv_act));
            if (v + 1 < p->lay.S)
                DT_TRY(dt_recv(p->comm.pp, w16 ? (void *)s->gout16 : (void *)s->grad,
                               act_numel(p, p->lay.vfirst[v + 1] - 1, 0, &mb[j]), p->o.wire, dt_pipe_rank_of(p, v + 1),
                               TAG_GRAD(p, v, j), &s->recv_grad));
        }
    }
    return DT_OK;
}

/* Which weight gradients wait for a W: all (split schedules) but a holder's
 * tied ones (sent right after B); else only the authority's tied ones. */
static void set_deferral(dt_pipe *p) {
    for (int i = 0; i < p->m->n_params; i++) {
        int t = p->ties.of[i], auth = t >= 0 && p->ties.list[t].is_authority;
        p->tapes.defer[i] = (unsigned char)(p->step.sched.split_w ? (t < 0 || auth) : auth);
    }
}

static dt_status fail(dt_pipe *p, const char *what, int c, int j) {
    if (p->comm.notice && p->comm.notice->stopped) return dt_error_code() ? dt_error_code() : DT_ECOMM;   /* said it */
    at(p, c, j);
    dt_status code = dt_error_code() ? dt_error_code() : DT_EINVAL;
    char msg[768];
    snprintf(msg, sizeof msg, "%s", dt_error_message());
    return DT_ERR(code, "pipeline stage %d (rank %d), micro-batch %d, chunk %d: %s: %s", p->lay.stage,
                  dt_pg_rank(p->comm.world), j, c, what, msg);
}

static void trace_action(dt_pipe *p, char op, int c, int j, double t0) {
    if (!p->metrics.trace) return;
    char name[32];
    if (p->lay.V > 1) snprintf(name, sizeof name, "%c%d.%d", op, j, c);
    else snprintf(name, sizeof name, "%c%d", op, j);
    dt_trace_event(p->metrics.trace, name, op == 'F' ? "forward" : op == 'B' ? "backward" : "weights", 0, t0,
                   dt_trace_now_us(p->metrics.trace));
}

/* ---- the actions ---- */
static dt_status do_forward(dt_pipe *p, int c, int j) {
    int v = dt_pipe_vstage(p, c);
    dt_pipe_slot *s = &p->step.slots[c * p->step.M + j];
    const dt_batch *b = &p->step.mb[j];
    at(p, c, j);
    if (fault_hook(p, 'F', j) != DT_OK) return fail(p, "forward", c, j);
    DT_TRY(pool_get(p, &s->g));
    /* the chunk's last micro-batch completes its gradients: its tape's
     * grad-ready hooks drive the data-parallel buckets */
    dt_graph_set_final(s->g, j == p->step.M - 1);
    if (v > 0) {
        if (wait_timed(p, &s->recv_act) != DT_OK) return fail(p, "receiving the activation", c, j);
        int64_t sh[DT_MAX_DIMS];
        int nd = dt_model_block_shape(p->m, p->lay.vfirst[v], 1, b, sh);
        if (wire16(p)) dt_convert(s->act, DT_F32, s->in16, p->o.wire, (size_t)dt_shape_numel(nd, sh));
        if (!(s->x = dt_graph_input(s->g, nd, sh, s->act, 1))) return fail(p, "activation input", c, j);
    }
    double t0 = dt_par_now_us(), tt = dt_trace_now_us(p->metrics.trace);
    dt_tensor *y = dt_model_run_blocks(p->m, s->g, b, p->lay.vfirst[v], p->lay.vfirst[v + 1], s->x);
    if (!y) return fail(p, "forward", c, j);
    if (v + 1 == p->lay.S) {
        if (!(y = dt_model_loss(p->m, s->g, b, y, NULL))) return fail(p, "loss", c, j);
        p->step.loss_sum += dt_f32(y)[0];
    }
    s->out = y;
    p->metrics.compute_us += dt_par_now_us() - t0;
    trace_action(p, 'F', c, j, tt);
    if (v + 1 < p->lay.S) {   /* what the next stage's receive expects */
        int64_t want = act_numel(p, p->lay.vfirst[v + 1] - 1, 0, b);
        if (y->numel != want) {
            DT_ERR(DT_ESTATE, "blocks %d..%d returned %lld elements, their declared output has %lld", p->lay.vfirst[v],
                   p->lay.vfirst[v + 1] - 1, (long long)y->numel, (long long)want);
            return fail(p, "forward", c, j);
        }
    }
    if (v + 1 < p->lay.S && send_wire(p, y->data, y->numel, s->out16, v + 1, TAG_ACT(p, v + 1, j), &s->send_act) != DT_OK)
        return fail(p, "sending the activation", c, j);
    return DT_OK;
}

static dt_status do_backward(dt_pipe *p, int c, int j) {
    int v = dt_pipe_vstage(p, c);
    dt_pipe_slot *s = &p->step.slots[c * p->step.M + j];
    at(p, c, j);
    if (fault_hook(p, 'B', j) != DT_OK) return fail(p, "backward", c, j);
    if (!s->g || !s->out) return DT_ERR(DT_ESTATE, "pipeline stage %d: B of micro-batch %d before its F", p->lay.stage, j);
    if (v + 1 < p->lay.S && wait_timed(p, &s->recv_grad) != DT_OK) return fail(p, "receiving the gradient", c, j);
    if (v + 1 < p->lay.S && wire16(p)) dt_convert(s->grad, DT_F32, s->gout16, p->o.wire, (size_t)s->out->numel);
    double t0 = dt_par_now_us(), tt = dt_trace_now_us(p->metrics.trace);
    dt_pipe_ties_redirect(p, c);
    dt_status st = v + 1 == p->lay.S ? dt_graph_backward_scaled(s->g, s->out, p->step.loss_scale)
                                 : dt_graph_backward_from(s->g, s->out, s->grad);
    if (st != DT_OK) return fail(p, "backward", c, j);
    p->metrics.compute_us += dt_par_now_us() - t0;
    trace_action(p, 'B', c, j, tt);
    if (v > 0) {
        const float *gx = dt_graph_grad(s->g, s->x);
        if (!gx || send_wire(p, gx, s->x->numel, s->in16, v - 1, TAG_GRAD(p, v - 1, j), &s->send_grad) != DT_OK)
            return fail(p, "sending the input gradient", c, j);
    }
    if (dt_pipe_ties_export(p, c, j) != DT_OK) return fail(p, "sending tied-parameter rows", c, j);
    s->b_done = 1;
    /* the tape waits for its W: split schedules, or the authority's tied use */
    if (p->step.sched.split_w || (c == p->ties.auth_chunk)) return DT_OK;
    return release(p, s);
}

static dt_status run_weights(dt_pipe *p, int c, int j) {
    dt_pipe_slot *s = &p->step.slots[c * p->step.M + j];
    at(p, c, j);
    double t0 = dt_par_now_us(), tt = dt_trace_now_us(p->metrics.trace);
    if (dt_graph_backward_weights(s->g) != DT_OK) return fail(p, "weight gradients", c, j);
    p->metrics.compute_us += dt_par_now_us() - t0;
    trace_action(p, 'W', c, j, tt);
    if (c == p->ties.auth_chunk) p->ties.next_w = j + 1;
    return release(p, s);
}

/* Folds the holders' rows of micro-batch ties.next_fold (waits). */
static dt_status fold_next(dt_pipe *p) {
    double t0 = dt_par_now_us();
    dt_status s = DT_OK;
    for (int idle = 0; p->comm.notice && s == DT_OK && !dt_pipe_ties_arrived(p);) s = watch(p, &idle);
    if (s == DT_OK) s = dt_pipe_ties_fold(p, p->ties.next_fold);
    p->metrics.wait_us += dt_par_now_us() - t0;
    if (s != DT_OK) return s;
    if (++p->ties.next_fold < p->step.M) DT_TRY(dt_pipe_ties_post(p, p->ties.next_fold));
    return DT_OK;
}

/* Authority: advance own-W(j), fold(j), own-W(j+1), ... as far as possible
 * (block: to the end of the step). */
static dt_status tie_pump(dt_pipe *p, int block) {
    if (p->ties.auth_chunk < 0) return DT_OK;
    for (;;) {
        if (p->ties.next_fold < p->ties.next_w) {
            if (!block && !dt_pipe_ties_arrived(p)) return DT_OK;
            DT_TRY(fold_next(p));
        } else if (!p->step.sched.split_w && p->ties.next_w < p->step.M &&
                   p->step.slots[p->ties.auth_chunk * p->step.M + p->ties.next_w].b_done) {
            DT_TRY(run_weights(p, p->ties.auth_chunk, p->ties.next_w));
        } else {
            return DT_OK;
        }
    }
}

static dt_status do_weights(dt_pipe *p, int c, int j) {
    if (c == p->ties.auth_chunk)   /* own W(j) comes after fold(j - 1) */
        while (p->ties.next_fold < j) DT_TRY(fold_next(p));
    return run_weights(p, c, j);
}

dt_status dt_pipe_ensure_schedule(dt_pipe *p, int M) {
    if (M == p->step.M && p->step.sched.n) return DT_OK;
    dt_pipe_schedule_free(&p->step.sched);
    p->step.M = M;
    if (p->lay.S * M >= DT_PIPE_TAG_GRAD - DT_PIPE_TAG_ACT)
        return DT_ERR(DT_EINVAL, "pipeline: %d virtual stages x %d micro-batches is too many (< %d)", p->lay.S, M,
                      DT_PIPE_TAG_GRAD - DT_PIPE_TAG_ACT);
    return dt_pipe_schedule_build(p->o.schedule, p->lay.P, M, p->lay.V, p->o.max_outstanding, &p->step.sched);
}

static dt_status run_step(dt_pipe *p, const dt_batch *mb, int M, double *loss_sum) {
    double start = dt_par_now_us();
    DT_TRY(notice_post(p));
    at(p, -1, -1);
    DT_TRY(fault_hook(p, 0, -1));
    DT_TRY(dt_pipe_ensure_schedule(p, M));
    DT_TRY(prepare_slots(p, mb, M));
    p->step.mb = mb;
    p->step.loss_sum = 0;
    p->step.loss_scale = (p->step.grad_scale > 0 ? p->step.grad_scale : 1.0f) / (float)M;
    p->metrics.compute_us = p->metrics.wait_us = 0;
    p->metrics.sent_bytes = 0;
    p->tapes.peak = p->tapes.live;
    set_deferral(p);
    DT_TRY(post_receives(p, mb, M));
    p->ties.next_w = p->ties.next_fold = 0;
    if (p->ties.auth_chunk >= 0) DT_TRY(dt_pipe_ties_post(p, 0));
    const dt_pipe_action *a = p->step.sched.act[p->lay.stage];
    for (int i = 0; i < p->step.sched.n[p->lay.stage]; i++) {
        int c = a[i].chunk, j = a[i].mb;
        DT_TRY(a[i].op == DT_PIPE_F ? do_forward(p, c, j) : a[i].op == DT_PIPE_B ? do_backward(p, c, j)
                                                                                 : do_weights(p, c, j));
        DT_TRY(tie_pump(p, 0));
    }
    DT_TRY(tie_pump(p, 1));
    for (int i = 0; i < p->lay.V * M; i++)
        if (p->step.slots[i].g) return DT_ERR(DT_ESTATE, "pipeline stage %d: micro-batch %d unfinished after the schedule",
                                         p->lay.stage, i % M);
    for (int q = 0; p->comm.notice && q < p->lay.P; q++)   /* a peer failed after this rank's last wait */
        if (notice_in(p, q)) return peer_failed(p, q);
    *loss_sum = p->step.loss_sum;
    dt_pipe_stats *st = &p->metrics.stats;
    st->schedule_us = dt_par_now_us() - start;
    st->bubble = st->schedule_us > 0 ? 1.0 - p->metrics.compute_us / st->schedule_us : 0;
    st->compute_us = p->metrics.compute_us;
    st->wait_us = p->metrics.wait_us;
    st->sent_bytes = p->metrics.sent_bytes;
    st->graphs = p->tapes.peak;
    size_t arena = 0;
    for (int i = 0; i < p->tapes.n_pool; i++) arena += dt_graph_arena_bytes(p->tapes.pool[i]);
    st->arena_bytes = arena;
    return DT_OK;
}

dt_status dt_pipe_run_step(dt_pipe *p, const dt_batch *mb, int M, double *loss_sum) {
    dt_status s = p->comm.broken ? DT_ERR(DT_ESTATE, "pipeline stage %d: an earlier step failed midway", p->lay.stage)
                            : run_step(p, mb, M, loss_sum);
    if (s != DT_OK) {
        p->comm.broken = 1;
        notify(p);
    }
    return s;
}

/* ---- evaluation: every batch forward through the stages, in order ---- */
typedef struct eval_item { dt_graph *g; dt_work *send; } eval_item;

/* act: the float32 input (widened from act16 with a 16-bit wire); out16: the
 * 16-bit send buffer of this item, out_n elements (two alternate: the
 * previous item's send may still be under way). */
static dt_status eval_blocks(dt_pipe *p, const dt_batch *b, int c, float *act, const uint16_t *act16, uint16_t *out16,
                             int64_t out_n, eval_item *it, double sums[3]);

/* The wait for the input, then the blocks (traced as "evaluate" compute). */
static dt_status eval_one(dt_pipe *p, const dt_batch *b, int c, float *act, const uint16_t *act16, uint16_t *out16,
                          int64_t out_n, dt_work **recv, eval_item *it, double sums[3]) {
    if (dt_pipe_vstage(p, c) > 0) DT_TRY(wait_timed(p, recv));
    double t0 = dt_trace_now_us(p->metrics.trace);
    dt_status s = eval_blocks(p, b, c, act, act16, out16, out_n, it, sums);
    dt_trace_event(p->metrics.trace, "evaluate", "compute", 0, t0, dt_trace_now_us(p->metrics.trace));
    return s;
}

static dt_status eval_blocks(dt_pipe *p, const dt_batch *b, int c, float *act, const uint16_t *act16, uint16_t *out16,
                             int64_t out_n, eval_item *it, double sums[3]) {
    int v = dt_pipe_vstage(p, c);
    DT_TRY(pool_get(p, &it->g));
    dt_graph_set_grad_enabled(it->g, 0);
    dt_graph_set_training(it->g, 0);
    dt_tensor *x = NULL;
    if (v > 0) {
        int64_t sh[DT_MAX_DIMS];
        int nd = dt_model_block_shape(p->m, p->lay.vfirst[v], 1, b, sh);
        if (wire16(p)) dt_convert(act, DT_F32, act16, p->o.wire, (size_t)dt_shape_numel(nd, sh));
        if (!(x = dt_graph_input(it->g, nd, sh, act, 0))) return dt_error_code();
    }
    dt_tensor *y = dt_model_run_blocks(p->m, it->g, b, p->lay.vfirst[v], p->lay.vfirst[v + 1], x);
    if (!y) return dt_error_code() ? dt_error_code() : DT_EINVAL;
    int64_t want = v + 1 < p->lay.S ? act_numel(p, p->lay.vfirst[v + 1] - 1, 0, b) : 0;
    if (v + 1 < p->lay.S && (y->numel != want || want > out_n))
        return DT_ERR(DT_ESTATE, "blocks %d..%d returned %lld elements, their declared output has %lld", p->lay.vfirst[v],
                      p->lay.vfirst[v + 1] - 1, (long long)y->numel, (long long)want);
    if (v + 1 < p->lay.S) return send_wire(p, y->data, y->numel, out16, v + 1, TAG_ACT(p, v + 1, 0), &it->send);
    dt_tensor *logits = NULL, *loss = dt_model_loss(p->m, it->g, b, y, &logits);
    if (!loss) return dt_error_code() ? dt_error_code() : DT_EINVAL;
    double rows = (double)(b->B * b->T);
    sums[0] += dt_f32(loss)[0] * rows;
    sums[1] += (double)dt_model_count_correct(p->m, logits, b->y);
    sums[2] += rows;
    return DT_OK;
}

dt_status dt_pipe_run_eval(dt_pipe *p, const dt_batch *b, int n, double sums[3]) {
    /* one receive buffer per (batch, chunk); activations arrive in batch
     * order on one tag per link, matched in posting order. per: the largest
     * input, per_out: the largest output (16-bit send buffers) */
    int64_t per = 0, per_out = 0;
    for (int i = 0; i < n; i++)
        for (int c = 0; c < p->lay.V; c++) {
            int v = dt_pipe_vstage(p, c);
            int64_t k = v > 0 ? act_numel(p, p->lay.vfirst[v], 1, &b[i]) : 0;
            int64_t o = v + 1 < p->lay.S ? act_numel(p, p->lay.vfirst[v + 1] - 1, 0, &b[i]) : 0;
            if (k > per) per = k;
            if (o > per_out) per_out = o;
        }
    size_t slots = (size_t)(per ? per : 1) * (size_t)n * (size_t)p->lay.V;
    int w16 = wire16(p);
    float *act = malloc(slots * sizeof(float));
    uint16_t *act16 = w16 ? malloc(slots * sizeof *act16) : NULL;
    uint16_t *out16 = w16 ? malloc((size_t)(per_out ? per_out : 1) * 2 * sizeof *out16) : NULL;
    dt_work **recv = calloc((size_t)n * (size_t)p->lay.V, sizeof *recv);
    eval_item prev = {0}, cur = {0};
    dt_status s;
    if (!act || !recv || (w16 && (!act16 || !out16))) {   /* nothing posted yet: freed now; fails below */
        free(act); free(act16); free(out16); free(recv);
        act = NULL; act16 = out16 = NULL; recv = NULL;
        s = DT_ERR(DT_ENOMEM, "pipeline eval: out of memory");
    } else {
        s = notice_post(p);
    }
    at(p, -1, -1);
    for (int i = 0; i < n && s == DT_OK; i++)
        for (int c = 0; c < p->lay.V && s == DT_OK; c++) {
            int v = dt_pipe_vstage(p, c);
            size_t at_k = ((size_t)i * (size_t)p->lay.V + (size_t)c) * (size_t)per;
            if (v > 0)
                s = dt_recv(p->comm.pp, w16 ? (void *)(act16 + at_k) : (void *)(act + at_k),
                            act_numel(p, p->lay.vfirst[v], 1, &b[i]), p->o.wire, dt_pipe_rank_of(p, v - 1), TAG_ACT(p, v, 0),
                            &recv[i * p->lay.V + c]);
        }
    for (int i = 0; i < n && s == DT_OK; i++)
        for (int c = 0; c < p->lay.V && s == DT_OK; c++) {
            size_t k = (size_t)i * (size_t)p->lay.V + (size_t)c;
            s = eval_one(p, &b[i], c, act + k * (size_t)per, w16 ? act16 + k * (size_t)per : NULL,
                         w16 ? out16 + (k % 2) * (size_t)per_out : NULL, per_out, &recv[k], &cur, sums);
            /* the previous item's output is sent by now or soon: its tape can go
             * (after a failure it may never be: the tape stays, unused) */
            dt_status w = s == DT_OK ? wait_timed(p, &prev.send) : DT_OK;
            if (s == DT_OK) s = w;
            if (prev.g) pool_put(p, prev.g);
            prev = cur;
            cur = (eval_item){0};
        }
    dt_status w = s == DT_OK ? wait_timed(p, &prev.send) : DT_OK;
    if (s == DT_OK) s = w;
    if (prev.g) pool_put(p, prev.g);
    if (cur.g) { dt_work_wait(cur.send); pool_put(p, cur.g); }
    if (s != DT_OK) {   /* receives and a send may still be pending: leave their buffers to MPI */
        p->comm.broken = 1;
        s = fail(p, "evaluation", 0, 0);
        at(p, -1, -1);   /* peers: "failed (see its error)" */
        notify(p);
        return s;
    }
    free(act);
    free(act16);
    free(out16);
    free(recv);
    return DT_OK;
}
