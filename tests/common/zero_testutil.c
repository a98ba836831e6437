/* Helpers for the multi-rank ZeRO tests; see zero_testutil.h. */
#include "zero_testutil.h"
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void *xcalloc(size_t n, size_t sz) {
    void *p = calloc(n ? n : 1, sz);
    T_CHECK(p != NULL);
    return p;
}

dtz_spec dtz_mk_spec(dt_model_cfg c, int64_t B, int steps) {
    dtz_spec s;
    memset(&s, 0, sizeof s);
    s.cfg = c;
    s.oc = dtt_adamw(1e-2f, 0.01f);
    s.steps = steps;
    s.K = 1;
    s.B = B;
    s.det = t_size() > 2;
    return s;
}

int dtz_k(const dtz_spec *s, int st) { return s->Ks ? s->Ks[st] : s->K; }

float dtz_lr(const dtz_spec *s, int st) { return s->oc.lr * (1.0f - 0.125f * (float)(st % 4)); }

dt_zero_opts dtz_opts(const dtz_spec *s, int stage, dt_zero_overlap ov) {
    dt_zero_opts o;
    dt_zero_opts_default(&o);
    o.stage = stage;
    o.overlap_step = ov;
    o.dp.deterministic = s->det;
    o.clip = s->clip;
    o.dp.find_unused_params = s->find_unused;
    o.dp.broadcast_buffers = !s->no_bcast_buffers;
    return o;
}

void dtz_result_free(dtz_result *r) {
    free(r->params);
    free(r->buffers);
    memset(r, 0, sizeof *r);
}

size_t dtz_param_count(const dt_model *m) {
    size_t n = 0;
    for (int i = 0; i < m->n_params; i++) n += (size_t)m->params[i]->value.numel;
    return n;
}

float *dtz_params(const dt_model *m, const float *layout) {
    float *out = xcalloc(dtz_param_count(m), sizeof *out);
    size_t pos = 0;
    for (int i = 0; i < m->n_params; i++) {
        const dt_param *p = m->params[i];
        size_t n = (size_t)p->value.numel;
        const float *src = layout ? layout + m->offsets[i] : (const float *)p->value.data;
        T_CHECK(src != NULL);
        memcpy(out + pos, src, n * sizeof *out);
        pos += n;
    }
    return out;
}

float *dtz_init_params(const dt_model_cfg *c) {
    dt_model *m;
    T_OK(dt_model_create(c, 1, &m));
    float *p = dtz_params(m, NULL);
    dt_model_free(m);
    return p;
}

float *dtz_buffers(const dt_model *m, size_t *n) {
    size_t tot = 0;
    for (int i = 0; i < m->n_buffers; i++) tot += (size_t)m->buffers[i]->value.numel;
    float *out = xcalloc(tot, sizeof *out);
    size_t pos = 0;
    for (int i = 0; i < m->n_buffers; i++) {
        size_t k = (size_t)m->buffers[i]->value.numel;
        memcpy(out + pos, m->buffers[i]->value.data, k * sizeof *out);
        pos += k;
    }
    *n = tot;
    return out;
}

size_t dtz_layout_len(const dt_zero *z) {
    int nb = dt_zero_num_buckets(z);
    T_CHECK(nb > 0);
    const dt_zero_bucket *b = dt_zero_bucket_at(z, nb - 1);
    return b->begin + b->numel;
}

float *dtz_gather_layout(dt_zero *z) {
    T_CHECK(dt_pg_rank(dt_zero_pg(z)) == t_rank() && dt_pg_size(dt_zero_pg(z)) == t_size());
    float *lay = xcalloc(dtz_layout_len(z), sizeof *lay);
    for (int i = 0; i < dt_zero_num_buckets(z); i++) {
        const dt_zero_bucket *b = dt_zero_bucket_at(z, i);
        const float *mine = dt_zero_shard_params(z, i);
        T_CHECK(mine != NULL && b->shard <= (size_t)INT32_MAX);
        /* a copy: at stages 1/2 the shard lives inside the destination */
        float *tmp = xcalloc(b->shard, sizeof *tmp);
        memcpy(tmp, mine, b->shard * sizeof *tmp);
        MPI_Allgather(tmp, (int)b->shard, MPI_FLOAT, lay + b->begin, (int)b->shard, MPI_FLOAT, MPI_COMM_WORLD);
        free(tmp);
    }
    return lay;
}

void dtz_expect_params(const dt_model *m, const float *got, const float *want, double rtol, const char *what) {
    size_t n = dtz_param_count(m), pos = 0;
    int first_bad = -1;
    size_t bad_at = 0;
    for (int i = 0; i < m->n_params && first_bad < 0; i++) {
        size_t k = (size_t)m->params[i]->value.numel;
        if (rtol == 0 ? memcmp(got + pos, want + pos, k * sizeof(float)) != 0
                      : t_rel_diff(got + pos, want + pos, k) > fmax(rtol, 1e-3)) {   /* one param far off */
            first_bad = i;
            bad_at = pos;
        }
        pos += k;
    }
    double rel = t_rel_diff(got, want, n);
    if (getenv("DTT_VERBOSE") && t_rank() == 0) printf("  %s: rel diff %.3g (tol %.3g)\n", what, rel, rtol);
    if (first_bad < 0 && (rtol == 0 || rel <= rtol)) return;
    if (first_bad >= 0) {
        const dt_param *p = m->params[first_bad];
        size_t k = (size_t)p->value.numel, j = 0;
        while (j < k && !memcmp(&got[bad_at + j], &want[bad_at + j], sizeof(float))) j++;
        if (j == k) j = 0;
        fprintf(stderr, "rank %d: %s: parameter '%s' (%zu elements) differs; element %zu: %.9g vs %.9g "
                "(param rel diff %.3g, overall %.3g, tol %.3g)\n", t_rank(), what, p->name, k, j,
                (double)got[bad_at + j], (double)want[bad_at + j], t_rel_diff(got + bad_at, want + bad_at, k), rel, rtol);
    } else {
        fprintf(stderr, "rank %d: %s: relative difference %.3g > %.3g\n", t_rank(), what, rel, rtol);
    }
    t_fail(__FILE__, __LINE__, what);
}

void dtz_expect_padding_zero(dt_zero *z, const float *layout, const char *what) {
    dt_param *const *ord = dt_zero_param_order(z);
    size_t len = dtz_layout_len(z);
    unsigned char *is_param = xcalloc(len, 1);
    for (int i = 0; i < dt_zero_num_buckets(z); i++) {
        const dt_zero_bucket *b = dt_zero_bucket_at(z, i);
        size_t pos = b->begin;
        for (int k = 0; k < b->n_params; k++) {
            const dt_param *p = ord[b->first_param + k];
            memset(is_param + pos, 1, (size_t)p->value.numel);
            pos += (size_t)p->value.numel;
        }
    }
    for (size_t i = 0; i < len; i++)
        if (!is_param[i] && layout[i] != 0.0f) {
            fprintf(stderr, "rank %d: %s: padding element %zu of the layout is %.9g\n", t_rank(), what, i,
                    (double)layout[i]);
            t_fail(__FILE__, __LINE__, what);
        }
    free(is_param);
}

void dtz_check_geometry(dt_zero *z, const dt_model *m) {
    int N = t_size(), me = t_rank(), nb = dt_zero_num_buckets(z);
    dt_param *const *ord = dt_zero_param_order(z);
    T_CHECK(nb >= 1 && ord != NULL);
    int *seen = xcalloc((size_t)m->n_params, sizeof *seen);
    size_t pos = 0, shard_off = 0;
    int next_param = 0;
    for (int i = 0; i < nb; i++) {
        const dt_zero_bucket *b = dt_zero_bucket_at(z, i);
        T_CHECK(b != NULL && b->index == i);
        T_CHECK(b->begin == pos);                       /* contiguous */
        T_CHECK(b->numel > 0 && b->numel % (size_t)N == 0);
        T_CHECK(b->shard * (size_t)N == b->numel);
        T_CHECK(b->own_begin == b->begin + (size_t)me * b->shard);
        T_CHECK(b->shard_offset == shard_off);
        T_CHECK(b->first_param == next_param && b->n_params >= 1);
        size_t used = 0;
        for (int k = 0; k < b->n_params; k++) {
            const dt_param *p = ord[b->first_param + k];
            T_CHECK(p->index >= 0 && p->index < m->n_params && m->params[p->index] == p);
            seen[p->index]++;
            /* params packed in order from the bucket start */
            T_CHECK(m->offsets[p->index] == b->begin + used);
            used += (size_t)p->value.numel;
        }
        T_CHECK(used == b->used && b->used <= b->numel);
        pos += b->numel;
        shard_off += b->shard;
        next_param += b->n_params;
    }
    T_CHECK(next_param == m->n_params);
    for (int i = 0; i < m->n_params; i++) T_CHECK(seen[i] == 1);
    /* layout order = reverse registration (backward order) */
    for (int k = 0; k < m->n_params; k++) T_CHECK(ord[k]->index == m->n_params - 1 - k);
    free(seen);
}

/* ---- runs ---- */

static int make_micro(const dtz_spec *s, int st, int rank, dtt_batch *mb) {
    int K = dtz_k(s, st);
    T_CHECK(K >= 1 && K <= 16);
    for (int k = 0; k < K; k++) dtt_make_batch(&s->cfg, dtt_key(st, rank, k), s->B, &mb[k]);
    return K;
}

void dtz_ddp_run(const dtz_spec *s, dt_pg *pg, dtz_result *out) {
    memset(out, 0, sizeof *out);
    int me = dt_pg_rank(pg);
    T_CHECK(s->steps <= 64);
    dtt_net n;
    dtt_net_init(&n, &s->cfg, 1 + (uint64_t)me, &s->oc);
    if (s->forward) n.m->forward = s->forward;
    if (s->prepare) s->prepare(n.m);
    dt_ddp_opts o;
    dt_ddp_opts_default(&o);
    o.dp.deterministic = s->det;
    o.dp.find_unused_params = s->find_unused;
    o.dp.broadcast_buffers = !s->no_bcast_buffers;
    if (s->ddp_bucket_bytes) o.dp.first_bucket_bytes = o.dp.bucket_bytes = s->ddp_bucket_bytes;
    dt_ddp *d;
    T_OK(dt_ddp_create(n.m, pg, &o, &d));
    size_t ne = n.m->param_flat.numel;
    for (int st = 0; st < s->steps; st++) {
        dtt_batch mb[16];
        int K = make_micro(s, st, me, mb);
        float sum = 0;
        for (int k = 0; k < K; k++) {
            if (s->before_micro) s->before_micro(st, me, k);
            sum += dtt_fwd_bwd(&n, d, k == K - 1, &mb[k].b, 1.0f / (float)K, NULL);
        }
        T_OK(dt_ddp_finish_backward(d));
        float scale = 1.0f;
        if (s->clip > 0) {
            double norm = sqrt(dt_sumsq(n.m->grad_flat.data, ne));
            out->norms[st] = norm;
            scale = dt_clip_scale(norm, s->clip);
        }
        T_OK(dt_optimizer_step_range(&n.opt, dtz_lr(s, st), n.m->param_flat.data, n.m->grad_flat.data, 0, ne, scale));
        dt_optimizer_finish_step(&n.opt);
        dt_model_zero_grad(n.m);
        out->last_loss = sum / (float)K;
        for (int k = 0; k < K; k++) dtt_batch_free(&mb[k]);
    }
    out->params = dtz_params(n.m, NULL);
    out->n_params = dtz_param_count(n.m);
    out->buffers = dtz_buffers(n.m, &out->n_buffers);
    dt_ddp_free(d);
    dtt_net_free(&n);
}

void dtz_net_init(dtz_net *n, const dtz_spec *s, uint64_t seed, dt_pg *pg, const dt_zero_opts *o) {
    memset(n, 0, sizeof *n);
    T_OK(dt_model_create(&s->cfg, seed, &n->m));
    if (s->forward) n->m->forward = s->forward;
    if (s->prepare) s->prepare(n->m);
    n->g = dt_graph_create();
    T_CHECK(n->g != NULL);
    T_OK(dt_zero_create(n->m, pg, &s->oc, o, &n->z));
    /* node-shared parameters keep stage 3's parameters whole, as stage 2 (zero.h) */
    T_CHECK(dt_zero_stage(n->z) == (o->stage == 3 && dt_zero_node_params(n->z, NULL) ? 2 : o->stage));
}

void dtz_net_free(dtz_net *n) {
    dt_zero_free(n->z);
    dt_graph_free(n->g);
    dt_model_free(n->m);
    memset(n, 0, sizeof *n);
}

float dtz_fwd_bwd(dtz_net *n, int sync, const dt_batch *b, float scale) {
    dt_graph_reset(n->g);
    T_OK(dt_zero_before_forward(n->z, n->g, sync));
    dt_tensor *loss = dt_model_forward(n->m, n->g, b, NULL);
    T_CHECK(loss != NULL);
    float l = dt_f32(loss)[0];
    T_OK(dt_graph_backward_scaled(n->g, loss, scale));
    return l;
}

float dtz_step(dtz_net *n, float lr, const dtt_batch *micro, int K, double *norm) {
    dt_zero_set_lr(n->z, lr);
    float sum = 0;
    for (int k = 0; k < K; k++) sum += dtz_fwd_bwd(n, k == K - 1, &micro[k].b, 1.0f / (float)K);
    T_OK(dt_zero_finish_backward(n->z));
    T_OK(dt_zero_step(n->z, norm));
    return sum / (float)K;
}

void dtz_zero_run(const dtz_spec *s, dt_pg *pg, const dt_zero_opts *o, dtz_result *out) {
    memset(out, 0, sizeof *out);
    int me = dt_pg_rank(pg);
    T_CHECK(s->steps <= 64);
    dtz_net n;
    dtz_net_init(&n, s, 1 + (uint64_t)me, pg, o);
    dtz_check_geometry(n.z, n.m);
    for (int st = 0; st < s->steps; st++) {
        dtt_batch mb[16];
        int K = make_micro(s, st, me, mb);
        dt_zero_set_lr(n.z, dtz_lr(s, st));
        float sum = 0;
        for (int k = 0; k < K; k++) {
            if (s->before_micro) s->before_micro(st, me, k);
            sum += dtz_fwd_bwd(&n, k == K - 1, &mb[k].b, 1.0f / (float)K);
        }
        T_OK(dt_zero_finish_backward(n.z));
        double norm = 0;
        T_OK(dt_zero_step(n.z, &norm));
        if (s->clip > 0) out->norms[st] = norm;
        else T_CHECK(norm == -1);
        out->last_loss = sum / (float)K;
        for (int k = 0; k < K; k++) dtt_batch_free(&mb[k]);
    }
    T_CHECK(dt_zero_optim_step(n.z) == s->steps);
    T_CHECK(dt_zero_get_stats(n.z).steps == s->steps);
    T_OK(dt_zero_sync_params(n.z));
    /* the owned shards, assembled independently of dtrain */
    float *lay = dtz_gather_layout(n.z);
    dtz_expect_padding_zero(n.z, lay, "padding of the gathered parameter layout");
    out->params = dtz_params(n.m, lay);
    out->n_params = dtz_param_count(n.m);
    if (dt_zero_stage(n.z) < 3) {
        /* full parameters in the model == the shards every rank stepped */
        float *full = dtz_params(n.m, NULL);
        dtz_expect_params(n.m, full, out->params, 0, "model parameters after sync_params vs gathered shards");
        free(full);
    }
    free(lay);
    out->buffers = dtz_buffers(n.m, &out->n_buffers);
    /* dt_zero_free leaves a whole model (stage 3: gathered back) */
    dt_model *m = n.m;
    dt_zero_free(n.z);
    n.z = NULL;
    float *after = dtz_params(m, NULL);
    dtz_expect_params(m, after, out->params, 0, "model parameters after dt_zero_free vs gathered shards");
    free(after);
    dt_graph_free(n.g);
    dt_model_free(m);
}
