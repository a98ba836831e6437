/* ZeRO checkpoints, built only on zero.h's introspection API and dist.h
 * (and the layer's shared dt_par_agree).
 *
 * Geometry: bucket b covers the padded layout range [begin, begin + numel);
 * rank r owns [begin + r*shard, begin + (r+1)*shard) — its compact shard
 * buffers (values, optimizer states) hold exactly that. params[i] occupies
 * [offsets[i], offsets[i] + numel) inside one bucket; the rest is padding,
 * which is never saved and reads back as 0.
 *
 * Sharded: every rank writes the intersections of each parameter with its
 * shards (dt_ckpt_write_shard), rank 0 the buffers and the index.
 * Consolidated: rank 0 streams one ordinary dtrain checkpoint; for each
 * bucket the other ranks send their shard (one bucket-shard temp buffer).
 * Load (either kind, any world size / stage): each rank reads the ranges it
 * owns through dt_ckpt. Every outcome is agreed over the group, so a failure
 * on one rank is an error on all of them, never a hang. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dtrain/zero.h"
#include "zero_internal.h"   /* dt_par_agree, dt_zero_read_owned_states */

#define ZC_TAG 7301   /* consolidated save: shard transfers to rank 0 */

typedef struct zc {
    dt_zero *z;
    dt_run *r;
    dt_model *m;
    dt_pg *pg;
    int rank, world, nb, ns;
    const dt_optim_cfg *cfg;
    int *bk;             /* bucket indices by ascending begin */
    char (*sname)[192];  /* sname[k * n_params + i]: "optim.<state k>.<params[i]>" */
} zc;


/* The strategy a checkpoint records: "zero-<stage>". */
static const char *zero_name(const dt_zero *z) {
    static const char *names[4] = {"zero", "zero-1", "zero-2", "zero-3"};
    int st = dt_zero_stage(z);
    return names[st >= 1 && st <= 3 ? st : 0];
}

static const dt_zero_bucket *bucket(const zc *c, int j) { return dt_zero_bucket_at(c->z, c->bk[j]); }

static dt_status zc_init(zc *c, dt_zero *z, dt_run *r) {
    memset(c, 0, sizeof *c);
    c->z = z; c->r = r; c->m = r->model; c->pg = dt_zero_pg(z);
    c->rank = dt_pg_rank(c->pg); c->world = dt_pg_size(c->pg);
    c->nb = dt_zero_num_buckets(z);
    c->cfg = dt_zero_optim_cfg(z);
    c->ns = dt_optim_state_per_elem(c->cfg);
    int np = c->m->n_params;
    c->bk = malloc((size_t)(c->nb + 1) * sizeof *c->bk);
    c->sname = calloc((size_t)(c->ns * np + 1), sizeof *c->sname);
    if (!c->bk || !c->sname) return DT_ERR(DT_ENOMEM, "zero checkpoint: out of memory");
    for (int j = 0; j < c->nb; j++) {   /* insertion sort by begin (usually already in order) */
        int k = j;
        while (k > 0 && dt_zero_bucket_at(z, c->bk[k - 1])->begin > dt_zero_bucket_at(z, j)->begin) {
            c->bk[k] = c->bk[k - 1];
            k--;
        }
        c->bk[k] = j;
    }
    for (int k = 0; k < c->ns; k++)
        for (int i = 0; i < np; i++)
            snprintf(c->sname[k * np + i], sizeof c->sname[0], "optim.%s.%s", dt_checkpoint_state_name(c->cfg, k),
                     c->m->params[i]->name);
    return DT_OK;
}

static void zc_free(zc *c) {
    free(c->bk);
    free(c->sname);
}

/* Shard buffer of bucket index b: values (k < 0) or optimizer state k. */
static float *shard_buf(const zc *c, int b, int k) {
    return k < 0 ? dt_zero_shard_params(c->z, b) : dt_zero_shard_state(c->z, b, k);
}

static const char *tensor_name(const zc *c, int k, const dt_param *p) {
    return k < 0 ? p->name : c->sname[k * c->m->n_params + p->index];
}

/* p's elements inside the layout range [lo, lo + n): p-relative [*a, *e). */
static int intersect(const zc *c, const dt_param *p, size_t lo, size_t n, size_t *a, size_t *e) {
    size_t off = c->m->offsets[p->index], len = (size_t)p->value.numel;
    size_t x = off > lo ? off : lo, y = off + len < lo + n ? off + len : lo + n;
    if (x >= y) return 0;
    *a = x - off;
    *e = y - off;
    return 1;
}

/* Every rank learns whether every rank succeeded: one allreduce of
 * {failures, sum of (rank + 1) over failures}, no allocation. A local failure
 * keeps its own message; the others name the failing rank (or count). */
/* Rank 0's status to everyone (rank 0's own status keeps its message). */
static dt_status zc_from_root(const zc *c, dt_status s0, float *extra, int n_extra, const char *what) {
    float v[4] = {s0 != DT_OK ? 1.0f : 0.0f, 0, 0, 0};
    for (int i = 0; i < n_extra; i++) v[1 + i] = extra[i];
    DT_TRY(dt_broadcast(c->pg, v, 1 + n_extra, DT_F32, 0, NULL));
    for (int i = 0; i < n_extra; i++) extra[i] = v[1 + i];
    if (c->rank == 0) return s0;
    return v[0] != 0.0f ? DT_ERR(DT_ECOMM, "%s: failed on rank 0 (see its error)", what) : DT_OK;
}

static void shape_of(const dt_tensor *v, const char *name, dt_ckpt_shape *out) {
    out->name = name;
    out->ndim = v->ndim;
    memcpy(out->shape, v->shape, sizeof out->shape);
}

/* ---- sharded ---- */

/* Appends to pc[*n ..] (room for cap) the pieces of this rank's owned
 * ranges of values (k < 0) or optimizer state k, for every parameter with
 * !skip[index] (skip may be NULL). Names point into c. */
static void owned_pieces(const zc *c, int k, const unsigned char *skip, dt_ckpt_piece *pc, int *n, int cap) {
    dt_param *const *order = dt_zero_param_order(c->z);
    for (int j = 0; j < c->nb; j++) {
        const dt_zero_bucket *b = bucket(c, j);
        const float *buf = shard_buf(c, b->index, k);
        for (int q = b->first_param; q < b->first_param + b->n_params; q++) {
            size_t a, e;
            const dt_param *p = order[q];
            if (buf && *n < cap && !(skip && skip[p->index]) && intersect(c, p, b->own_begin, b->shard, &a, &e))
                pc[(*n)++] = (dt_ckpt_piece){tensor_name(c, k, p), a, e - a,
                                             buf + (c->m->offsets[p->index] + a - b->own_begin)};
        }
    }
}

static dt_status write_my_shard(const zc *c, const char *dir, const char *set) {
    dt_model *m = c->m;
    int cap = (1 + c->ns) * m->n_params + m->n_buffers + 1, n = 0;
    dt_ckpt_piece *pc = calloc((size_t)cap, sizeof *pc);
    if (!pc) return DT_ERR(DT_ENOMEM, "%s: out of memory", dir);
    for (int k = -1; k < c->ns; k++) owned_pieces(c, k, NULL, pc, &n, cap);
    for (int i = 0; c->rank == 0 && i < m->n_buffers && n < cap; i++)
        pc[n++] = (dt_ckpt_piece){m->buffers[i]->name, 0, (size_t)m->buffers[i]->value.numel,
                                  dt_f32(&m->buffers[i]->value)};
    dt_status s = dt_ckpt_write_shard(dir, set, c->rank, c->world, pc, n);
    free(pc);
    return s;
}

/* Each parameter's own step count (every bucket optimizer has every one of
 * its parameters' segments, owned elements or not: the same on every rank). */
static dt_status meta_steps(const zc *c, dt_ckpt_meta *meta) {
    dt_optimizer **opts = malloc((size_t)(c->z->lay.nb + 1) * sizeof *opts);
    if (!opts) return DT_ERR(DT_ENOMEM, "out of memory");
    int n = dt_zero_optimizers(c->z, opts);
    dt_status s = dt_checkpoint_meta_steps(meta, c->m, opts, n);
    free(opts);
    return s;
}

static dt_status write_index(const zc *c, const char *dir, const char *set) {
    dt_model *m = c->m;
    int n = (1 + c->ns) * m->n_params + m->n_buffers, k = 0;
    dt_ckpt_shape *sh = calloc((size_t)n + 1, sizeof *sh);
    if (!sh) return DT_ERR(DT_ENOMEM, "%s: out of memory", dir);
    for (int i = 0; i < m->n_params; i++) shape_of(&m->params[i]->value, m->params[i]->name, &sh[k++]);
    for (int i = 0; i < m->n_buffers; i++) shape_of(&m->buffers[i]->value, m->buffers[i]->name, &sh[k++]);
    for (int s = 0; s < c->ns; s++)
        for (int i = 0; i < m->n_params; i++) shape_of(&m->params[i]->value, c->sname[s * m->n_params + i], &sh[k++]);
    dt_ckpt_meta meta;
    dt_checkpoint_meta(c->r, zero_name(c->z), dt_zero_optim_step(c->z), &meta);
    dt_status s = meta_steps(c, &meta);
    if (s == DT_OK) s = dt_ckpt_write_index(dir, set, c->world, dt_zero_stage(c->z), sh, k, meta.m, meta.n);
    free(sh);
    return s;
}

static dt_status save_sharded(const zc *c, const char *dir) {
    /* rank 0 picks the set id and creates the directory; the id travels as two 16-bit halves */
    uint32_t nonce = 0;
    dt_status s0 = DT_OK;
    if (c->rank == 0) {
        nonce = dt_ckpt_nonce();
        s0 = dt_ckpt_prepare_dir(dir);
    }
    float half[2] = {(float)(nonce >> 16), (float)(nonce & 0xffffu)};
    DT_TRY(zc_from_root(c, s0, half, 2, dir));
    nonce = ((uint32_t)half[0] << 16) | (uint32_t)half[1];
    char set[DT_CKPT_SET_MAX];
    dt_ckpt_set_id(*c->r->step, nonce, set);
    dt_status s = dt_par_agree(c->pg, write_my_shard(c, dir, set), dir);
    if (s == DT_OK) s = zc_from_root(c, c->rank == 0 ? write_index(c, dir, set) : DT_OK, NULL, 0, dir);
    if (s == DT_OK) return s;
    /* the set did not commit: each rank removes its own shard of it (the previous set stays) */
    char keep[1024];
    snprintf(keep, sizeof keep, "%s", dt_error_message());
    (void)dt_ckpt_discard_shard(dir, set, c->rank);
    return DT_ERR(s, "%s", keep);
}

/* ---- consolidated ---- */

static dt_st_entry entry_of(const char *name, const dt_tensor *like) {
    dt_st_entry e = {.name = name, .dtype = DT_F32, .ndim = like->ndim};
    memcpy(e.shape, like->shape, sizeof e.shape);
    return e;
}

/* Entries in the order data is streamed: params by layout, buffers, then each
 * state by layout. Names point into the model / c->sname. */
static dt_status consolidated_entries(const zc *c, dt_st_entry **out, int *n_out) {
    dt_model *m = c->m;
    dt_param *const *order = dt_zero_param_order(c->z);
    int k = 0;
    dt_st_entry *e = calloc((size_t)((1 + c->ns) * m->n_params + m->n_buffers + 1), sizeof *e);
    if (!e) return DT_ERR(DT_ENOMEM, "zero checkpoint: out of memory");
    for (int s = -1; s < c->ns; s++) {
        size_t next = 0;   /* streaming needs params in ascending layout offsets */
        for (int j = 0; j < c->nb; j++) {
            const dt_zero_bucket *b = bucket(c, j);
            for (int q = b->first_param; q < b->first_param + b->n_params; q++) {
                size_t off = m->offsets[order[q]->index];
                if (off < next) {
                    free(e);
                    return DT_ERR(DT_ESTATE, "zero checkpoint: parameter '%s' is out of layout order", order[q]->name);
                }
                next = off + (size_t)order[q]->value.numel;
                e[k++] = entry_of(tensor_name(c, s, order[q]), &order[q]->value);
            }
        }
        for (int i = 0; s < 0 && i < m->n_buffers; i++) e[k++] = entry_of(m->buffers[i]->name, &m->buffers[i]->value);
    }
    *out = e;
    *n_out = k;
    return DT_OK;
}

/* Rank 0: the parameter bytes of rank r's shard of bucket b, in layout order. */
static dt_status append_shard(const zc *c, dt_st_writer *w, const dt_zero_bucket *b, int r, const float *buf) {
    dt_param *const *order = dt_zero_param_order(c->z);
    size_t lo = b->begin + (size_t)r * b->shard;
    for (int q = b->first_param; q < b->first_param + b->n_params; q++) {
        size_t a, e;
        if (intersect(c, order[q], lo, b->shard, &a, &e))
            DT_TRY(dt_st_writer_append(w, buf + (c->m->offsets[order[q]->index] + a - lo), (e - a) * sizeof(float)));
    }
    return DT_OK;
}

/* One (state, bucket): everyone's shard to rank 0, appended there. Rank 0
 * keeps receiving after a local failure so no sender is left blocked. */
static dt_status stream_bucket(const zc *c, dt_st_writer *w, const dt_zero_bucket *b, int k, float *tmp,
                               dt_status *sticky) {
    const float *mine = shard_buf(c, b->index, k);
    if (c->rank != 0) return dt_send(c->pg, mine, (int64_t)b->shard, DT_F32, 0, ZC_TAG, NULL);
    for (int r = 0; r < c->world; r++) {
        const float *buf = mine;
        if (r > 0) {
            DT_TRY(dt_recv(c->pg, tmp, (int64_t)b->shard, DT_F32, r, ZC_TAG, NULL));
            buf = tmp;
        }
        if (*sticky == DT_OK) *sticky = append_shard(c, w, b, r, buf);
    }
    return DT_OK;
}

static dt_status save_consolidated(const zc *c, const char *path) {
    dt_model *m = c->m;
    dt_st_writer *w = NULL;
    float *tmp = NULL;
    dt_status s0 = DT_OK;
    if (c->rank == 0) {
        dt_st_entry *e = NULL;
        int n = 0;
        size_t max_shard = 1;
        for (int j = 0; j < c->nb; j++)
            if (bucket(c, j)->shard > max_shard) max_shard = bucket(c, j)->shard;
        dt_ckpt_meta meta;
        dt_checkpoint_meta(c->r, zero_name(c->z), dt_zero_optim_step(c->z), &meta);
        s0 = meta_steps(c, &meta);
        if (s0 == DT_OK) s0 = consolidated_entries(c, &e, &n);
        if (s0 == DT_OK && !(tmp = malloc(max_shard * sizeof *tmp))) s0 = DT_ERR(DT_ENOMEM, "%s: out of memory", path);
        if (s0 == DT_OK) s0 = dt_st_writer_open(&w, path, e, n, meta.m, meta.n);
        free(e);
    }
    dt_status s = zc_from_root(c, s0, NULL, 0, path);
    if (s != DT_OK) {
        free(tmp);
        return s;
    }
    dt_status sticky = DT_OK, comm = DT_OK;
    for (int k = -1; k < c->ns && comm == DT_OK; k++) {
        for (int j = 0; j < c->nb && comm == DT_OK; j++) comm = stream_bucket(c, w, bucket(c, j), k, tmp, &sticky);
        for (int i = 0; k < 0 && c->rank == 0 && i < m->n_buffers && sticky == DT_OK; i++)
            sticky = dt_st_writer_append(w, m->buffers[i]->value.data, (size_t)m->buffers[i]->value.numel * sizeof(float));
    }
    free(tmp);
    if (c->rank == 0) {
        if (comm == DT_OK && sticky == DT_OK) sticky = dt_st_writer_commit(w);
        else dt_st_writer_abort(w);
    }
    return dt_par_agree(c->pg, comm != DT_OK ? comm : sticky, path);
}

dt_status dt_zero_save(dt_zero *z, dt_run *r, const char *path, dt_zero_ckpt_format fmt) {
    if (!z || !r || !path || !*path) return DT_ERR(DT_EINVAL, "dt_zero_save: bad arguments");
    zc c;
    dt_status s = dt_zero_sync_params(z), si = zc_init(&c, z, r);
    if (si == DT_OK) si = dt_zero_state_open(z);   /* bf16 state: written widened to fp32 */
    s = dt_par_agree(c.pg, s != DT_OK ? s : si, path);
    if (s == DT_OK) s = fmt == DT_ZERO_CKPT_CONSOLIDATED ? save_consolidated(&c, path) : save_sharded(&c, path);
    if (si == DT_OK) dt_zero_state_close(z, 0);
    zc_free(&c);
    dt_free(z->zero_state);   /* frozen shards' zeros: only while writing */
    z->zero_state = NULL;
    return s;
}

/* ---- load ---- */

static const char *ckpt_get(const void *src, const char *key) { return dt_ckpt_get_meta(src, key); }

/* Owned ranges of values (k < 0) or state k, padding zeroed, each
 * parameter's range filled by read (from a checkpoint, or from memory:
 * zero/refresh.c). A frozen bucket has no state: skipped. */
static dt_status read_owned_by(const zc *c, int k, dt_zero_range_reader read, void *user) {
    dt_param *const *order = dt_zero_param_order(c->z);
    for (int j = 0; j < c->nb; j++) {
        const dt_zero_bucket *b = bucket(c, j);
        if (k >= 0 && !b->trainable) continue;
        float *buf = shard_buf(c, b->index, k);
        if (!buf) return DT_ERR(DT_ESTATE, "zero checkpoint: no shard buffer for bucket %d", b->index);
        memset(buf, 0, b->shard * sizeof *buf);
        for (int q = b->first_param; q < b->first_param + b->n_params; q++) {
            size_t a, e;
            if (intersect(c, order[q], b->own_begin, b->shard, &a, &e))
                DT_TRY(read(user, k, order[q], tensor_name(c, k, order[q]), a, e - a,
                            buf + (c->m->offsets[order[q]->index] + a - b->own_begin)));
        }
    }
    return DT_OK;
}

/* A load's source: the checkpoint, and the bucket optimizers whose step
 * counts (restored first) say which states may be missing. */
typedef struct zload {
    const dt_ckpt *ck;
    const dt_model *m;
    dt_optimizer **opts;
    int n;
} zload;

static dt_status zload_init(zload *l, const zc *c, const dt_ckpt *ck) {
    *l = (zload){.ck = ck, .m = c->m};
    if (!(l->opts = malloc((size_t)(c->z->lay.nb + 1) * sizeof *l->opts))) return DT_ERR(DT_ENOMEM, "out of memory");
    l->n = dt_zero_optimizers(c->z, l->opts);
    return DT_OK;
}

/* State `name` of p is not in the checkpoint: right only if p never took a
 * step (saved frozen; its zero state, already in the shard, is PyTorch's
 * never-stepped state) or is frozen here (-1: nothing is read). */
static dt_status missing_state(const zload *l, const dt_param *p, const char *name) {
    return dt_checkpoint_state_missing(dt_ckpt_path(l->ck), l->m, p->index, l->opts, l->n, name);
}

/* A tensor-parallel part (p->split.parts > 1: src/parallel/tp/) is a range
 * of this rank's part, while the checkpoint holds the whole tensor: the part
 * is cut from it (dt_checkpoint_read_param, one part of scratch) and the
 * range copied. A parameter lies in one bucket, so each is read once. */
static dt_status ckpt_range(void *user, int k, const dt_param *p, const char *name, size_t start, size_t n, float *dst) {
    const zload *l = user;
    if (k >= 0 && !dt_ckpt_find(l->ck, name, NULL, NULL)) return missing_state(l, p, name);
    if (p->split.parts <= 1) return dt_ckpt_read(l->ck, name, start, n, dst);
    float *part = dt_calloc((size_t)p->value.numel * sizeof *part);   /* padding rows read as 0 */
    if (!part) return DT_ERR(DT_ENOMEM, "zero checkpoint: out of memory reading part of %s", name);
    dt_status s = dt_checkpoint_read_param(l->ck, name, p, part);
    if (s == DT_OK) memcpy(dst, part + start, n * sizeof *dst);
    dt_free(part);
    return s;
}

/* What the checkpoint must hold for p's tensor `name`: the whole tensor's
 * shape (a split parameter's part is cut from it when read). */
static dt_status expect_param(const dt_ckpt *ck, const char *name, const dt_param *p) {
    int64_t full[DT_MAX_DIMS];
    int nd = dt_param_full_shape(p, full);
    return dt_ckpt_expect(ck, name, nd, full);
}

/* Every state's shape, where the checkpoint has it (missing_state: where not). */
static dt_status expect_states(const zc *c, const zload *l) {
    for (int k = 0; k < c->ns; k++)
        for (int i = 0; i < c->m->n_params; i++) {
            const char *nm = c->sname[k * c->m->n_params + i];
            DT_TRY(dt_ckpt_find(l->ck, nm, NULL, NULL) ? expect_param(l->ck, nm, c->m->params[i])
                                                        : missing_state(l, c->m->params[i], nm));
        }
    return DT_OK;
}

static dt_status read_owned(const zc *c, const zload *l, int k) {
    return read_owned_by(c, k, ckpt_range, (void *)l);
}

dt_status dt_zero_read_owned_states(dt_zero *z, dt_model *m, dt_zero_range_reader read, void *user) {
    zc c;
    dt_run r = {.model = m};
    dt_status s = zc_init(&c, z, &r);
    if (s == DT_OK) s = dt_zero_state_open(z);
    for (int k = 0; k < c.ns && s == DT_OK; k++) s = read_owned_by(&c, k, read, user);
    dt_zero_state_close(z, s == DT_OK);   /* bf16 state: rounded as it is stored */
    zc_free(&c);
    return s;
}

/* Step counts first: they say which states a checkpoint may lack. */
static dt_status load_local(const zc *c, const dt_ckpt *ck) {
    dt_model *m = c->m;
    int64_t ostep = 0;
    zload l;
    DT_TRY(dt_checkpoint_apply_meta(c->r, ckpt_get, ck, dt_ckpt_path(ck), &ostep));
    DT_TRY(zload_init(&l, c, ck));
    dt_zero_set_optim_step(c->z, ostep);
    dt_status s = dt_checkpoint_apply_steps(ckpt_get, ck, dt_ckpt_path(ck), m, l.opts, l.n);
    for (int i = 0; i < m->n_params && s == DT_OK; i++) s = expect_param(ck, m->params[i]->name, m->params[i]);
    if (s == DT_OK) s = expect_states(c, &l);
    for (int i = 0; i < m->n_buffers && s == DT_OK; i++) {
        const dt_tensor *v = &m->buffers[i]->value;
        s = dt_ckpt_expect(ck, m->buffers[i]->name, v->ndim, v->shape);
        if (s == DT_OK) s = dt_ckpt_read(ck, m->buffers[i]->name, 0, (size_t)v->numel, dt_f32(v));
    }
    for (int k = -1; k < c->ns && s == DT_OK; k++) s = read_owned(c, &l, k);
    free(l.opts);
    return s;
}

/* ---- for a caller writing its own set (a pipeline stage) ---- */

int dt_zero_state_pieces(dt_zero *z, dt_run *r, const unsigned char *skip, dt_ckpt_piece *pc, char (*names)[192]) {
    zc c;
    if (zc_init(&c, z, r) != DT_OK) { zc_free(&c); return -1; }
    int n = 0, cap = c.ns * c.m->n_params;
    for (int k = 0; k < c.ns; k++) owned_pieces(&c, k, skip, pc, &n, cap);
    for (int i = 0; i < n; i++) {   /* the names outlive c: into the caller's buffer */
        snprintf(names[i], sizeof names[0], "%s", pc[i].tensor);
        pc[i].tensor = names[i];
    }
    zc_free(&c);
    return n;
}

int dt_zero_value_pieces(dt_zero *z, dt_run *r, const unsigned char *skip, dt_ckpt_piece *pc) {
    zc c;
    if (zc_init(&c, z, r) != DT_OK) { zc_free(&c); return -1; }
    int n = 0;
    if (dt_zero_values_sharded(z)) owned_pieces(&c, -1, skip, pc, &n, c.m->n_params);   /* names: the parameters' own */
    zc_free(&c);
    return n;
}

dt_status dt_zero_read_states(dt_zero *z, dt_run *r, const dt_ckpt *ck, int64_t optim_step, const int *local_of,
                             int n_listed) {
    zc c;
    zload l = {0};
    dt_status s = zc_init(&c, z, r);
    if (s == DT_OK) s = zload_init(&l, &c, ck);
    if (s == DT_OK) {
        dt_zero_set_optim_step(z, optim_step);
        s = dt_checkpoint_apply_steps_of(ckpt_get, ck, dt_ckpt_path(ck), c.m, l.opts, l.n, local_of,
                                         local_of ? n_listed : c.m->n_params);
    }
    int open = s == DT_OK && (s = dt_zero_state_open(z)) == DT_OK;
    /* stage 3 (or a 16-bit param_dtype): the owned values too (the caller
     * read no whole tensors into the model) */
    if (s == DT_OK && dt_zero_values_sharded(z)) s = read_owned(&c, &l, -1);
    if (s == DT_OK) s = expect_states(&c, &l);
    for (int k = 0; k < c.ns && s == DT_OK; k++) s = read_owned(&c, &l, k);
    if (open) dt_zero_state_close(z, s == DT_OK);   /* bf16 state: rounded as it is stored */
    free(l.opts);
    zc_free(&c);
    return s;
}

dt_status dt_zero_load(dt_zero *z, dt_run *r, const char *path) {
    if (!z || !r || !path || !*path) return DT_ERR(DT_EINVAL, "dt_zero_load: bad arguments");
    zc c;
    dt_ckpt *ck = NULL;
    /* no all-gather may still read the shards we overwrite */
    dt_status s = dt_zero_sync_params(z), si = zc_init(&c, z, r);
    if (s == DT_OK) s = si;
    if (s == DT_OK) s = dt_ckpt_open(path, &ck);
    int open = s == DT_OK && (s = dt_zero_state_open(z)) == DT_OK;
    if (s == DT_OK) s = load_local(&c, ck);
    if (open) dt_zero_state_close(z, s == DT_OK);   /* bf16 state: rounded as it is stored */
    dt_ckpt_close(ck);
    s = dt_par_agree(c.pg, s, path);
    if (s == DT_OK) s = dt_zero_gather_params(z);
    zc_free(&c);
    return s;
}

/* ---- for a caller writing whole tensors of its own (tensor parallelism) ---- */

dt_status dt_zero_gather_local(dt_zero *z, int k, float *flat) {
    for (int i = 0; i < z->lay.nb; i++) {
        const dt_zero_bucket *b = &z->lay.b[i].pub;
        if (k >= 0 && !b->trainable) {   /* frozen: no state (the same buckets on every rank) */
            memset(flat + b->begin, 0, b->numel * sizeof *flat);
            continue;
        }
        const float *mine = k < 0 ? dt_zero_shard_param_ptr(z, i) : z->lay.b[i].opt.state[k];
        dt_work *w = NULL;
        /* rank r's shard is [begin + r * shard, + shard): the ranks' shards in rank order are the bucket */
        dt_status s = dt_allgather(z->pg, mine, flat + b->begin, (int64_t)b->shard, DT_F32, &w);
        if (s == DT_OK) s = dt_work_wait(w);
        DT_TRY(s);
    }
    return DT_OK;
}
