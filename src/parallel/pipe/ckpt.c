/* Pipeline checkpoints: a sharded set (io.h) under the parameters' global
 * names, so any layout — other (P, D), ZeRO, one process — reads it.
 *
 * Replica 0 of every stage writes, as whole-tensor pieces, the parameters it
 * is the saver of (a tied parameter: its authority only), their optimizer
 * states, and the buffers its blocks use; the other replicas write nothing
 * (an empty shard: the set has one file per rank) — under ZeRO every replica
 * writes its owned ranges of the states instead (dt_zero_state_pieces). Rank 0 writes the index with every
 * tensor of the whole model (captured before the stage dropped the others)
 * and each parameter's own step count ("optim_steps", by global index,
 * gathered from the stages: gather_steps), so a parameter saved frozen
 * (zeros for its state) starts from step 0 wherever it is unfrozen.
 * Loading reads every parameter the rank holds (tied holders too: they step
 * their copy with the same state), its step counts, its states (one a file
 * lacks: a parameter saved frozen, zero state if it took no step) and all
 * buffers. Outcomes are
 * agreed over the world, so a failure on one rank is an error on all.
 * ZeRO-3 keeps values only as shards: every replica writes its owned ranges
 * of the values as of the states (a tied copy: on its authority only), and
 * a load reads each replica's owned ranges (dt_zero_read_states), never a
 * whole stage.
 * Tensor-parallel stages (pipe/tp.c): a split parameter and its states are
 * gathered whole over the stage's tp group and written by tp rank 0 (the
 * others of the group write nothing), the index holds whole shapes, and a
 * load reads the whole tensor and keeps this rank's part
 * (dt_checkpoint_read_param): a set is the same for any T.
 * ZeRO in tensor-parallel stages: each replica's owned ranges are of its
 * parts, not of whole tensors, so the replicas' shards are first put
 * together (dt_zero_gather_local: values and states, over the stage's
 * replicas) and then written as without ZeRO (replica 0, gathered over the
 * tp group); a load reads owned ranges as ZeRO does, each cut from this
 * rank's part of the whole tensor (zero/checkpoint.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "pipe_internal.h"
#include "parallel/zero/zero_internal.h"

dt_status dt_pipe_ckpt_capture(dt_pipe *p, const dt_pipe_probe *pr, const int *global, int n_kept) {
    dt_model *m = p->m;
    p->ck.n_global = m->n_params;
    p->ck.gname = calloc((size_t)(m->n_params + 1), sizeof *p->ck.gname);
    p->ck.gshape = calloc((size_t)(m->n_params + 1), sizeof *p->ck.gshape);
    p->ck.local_of = malloc((size_t)(m->n_params + 1) * sizeof *p->ck.local_of);
    p->ck.saver = calloc((size_t)(n_kept + 1), 1);
    p->ck.buffer_mine = calloc((size_t)(m->n_buffers + 1), 1);
    if (!p->ck.gname || !p->ck.gshape || !p->ck.local_of || !p->ck.saver || !p->ck.buffer_mine)
        return DT_ERR(DT_ENOMEM, "out of memory");
    for (int i = 0; i < m->n_params; i++) p->ck.local_of[i] = -1;
    for (int j = 0; j < n_kept; j++) {
        int last = dt_pipe_last_user(p, pr, global[j]);   /* a virtual stage; < 0: unused, kept on stage 0 */
        p->ck.local_of[global[j]] = j;
        p->ck.saver[j] = (unsigned char)(last < 0 ? p->lay.stage == 0 : dt_pipe_rank_of(p, last) == p->lay.stage);
    }
    for (int i = 0; i < m->n_params; i++) {
        snprintf(p->ck.gname[i], sizeof p->ck.gname[i], "%s", m->params[i]->name);
        p->ck.gshape[i] = (dt_ckpt_shape){.name = p->ck.gname[i]};
        p->ck.gshape[i].ndim = dt_param_full_shape(m->params[i], p->ck.gshape[i].shape);   /* whole under tp */
    }
    for (int i = 0; i < m->n_buffers; i++)
        p->ck.buffer_mine[i] = (unsigned char)(dt_pipe_buffer_owner(p, pr, m, m->buffers[i]->name) == p->lay.stage);
    return DT_OK;
}

void dt_pipe_ckpt_free(dt_pipe *p) {
    free(p->ck.gname); free(p->ck.gshape); free(p->ck.local_of); free(p->ck.saver); free(p->ck.buffer_mine);
    p->ck.gname = NULL; p->ck.gshape = NULL; p->ck.local_of = NULL; p->ck.saver = NULL; p->ck.buffer_mine = NULL;
}

/* Values only in ZeRO's owned shards: stage 3, or a 16-bit param_dtype (the
 * model's tensors hold the rounded copy). The stage in effect: --node-params
 * makes stage 3 keep whole parameters, as stage 2. */
static int zero3(const dt_pipe *p) { return p->dp.zero && dt_zero_values_sharded(p->dp.zero); }

/* ZeRO in tensor-parallel stages: saved from the replicas' shards put together */
static int zero_tp(const dt_pipe *p) { return p->dp.zero && p->lay.T > 1; }

/* Writes parameter i whole: replica 0 of its saver stage (a tied one: its
 * authority; frozen and held by several stages: the last that uses it);
 * none at ZeRO-3 (owned ranges instead) but in tensor-parallel stages. */
static int saver_of(const dt_pipe *p, int i) {
    return (zero_tp(p) || !zero3(p)) && p->lay.replica == 0 && p->ck.saver[i];
}

/* ZeRO in tensor-parallel stages: flat[0] the values, flat[1 + k] state k of
 * this rank's parts, whole over the replicas (collective over them) */
static dt_status gather_flats(dt_pipe *p, int ns, float **flat) {
    size_t total = p->dp.zero->lay.total ? p->dp.zero->lay.total : 1;
    if (ns > 2) return DT_ERR(DT_EINVAL, "pipeline checkpoint: %d optimizer states per element (at most 2)", ns);
    for (int k = -1; k < ns; k++) {
        if (!(flat[k + 1] = malloc(total * sizeof **flat))) return DT_ERR(DT_ENOMEM, "pipeline checkpoint: out of memory");
        DT_TRY(dt_zero_gather_local(p->dp.zero, k, flat[k + 1]));
    }
    return DT_OK;
}

/* A piece of tensor q (its value or a state, `local` this rank's part):
 * whole on the writer; tensor-parallel parts gathered (collective over the
 * stage's tp group, whose ranks all come here in the same order), written by
 * tp rank 0 only (*n unchanged elsewhere). whole[*nw] keeps what was gathered. */
static dt_status add_piece(dt_pipe *p, const char *name, const dt_param *q, const float *local, dt_ckpt_piece *pc,
                           int *n, float **whole, int *nw) {
    float *w = NULL;
    DT_TRY(dt_pipe_tp_whole(p, q, local, &w));
    if (p->lay.tp_rank != 0) return DT_OK;
    if (w) whole[(*nw)++] = w;
    int64_t full[DT_MAX_DIMS];
    size_t numel = w ? (size_t)dt_shape_numel(dt_param_full_shape(q, full), full)   /* whole: no padding rows */
                     : (size_t)q->value.numel;
    pc[(*n)++] = (dt_ckpt_piece){name, 0, numel, w ? w : local};
    return DT_OK;
}

static dt_status write_my_shard_open(dt_pipe *p, dt_run *r, const char *dir, const char *set);

/* bf16 optimizer state (optim.h) is written widened to fp32: the pieces point
 * at fp32 copies that live until the shard is written. */
static dt_status write_my_shard(dt_pipe *p, dt_run *r, const char *dir, const char *set) {
    dt_status s = p->dp.zero ? dt_zero_state_open(p->dp.zero) : dt_optimizer_state_open(&p->upd.optim);
    if (s != DT_OK) return s;
    s = write_my_shard_open(p, r, dir, set);
    if (p->dp.zero) dt_zero_state_close(p->dp.zero, 0);
    else dt_optimizer_state_close(&p->upd.optim, 0);
    return s;
}

static dt_status write_my_shard_open(dt_pipe *p, dt_run *r, const char *dir, const char *set) {
    dt_model *m = p->m;
    const dt_optim_cfg *cfg = r->optim;
    int ns = dt_optim_state_per_elem(cfg), np = m->n_params, nw = 0;
    dt_ckpt_piece *pc = calloc((size_t)((1 + ns) * np + m->n_buffers + 1), sizeof *pc);
    char (*sname)[192] = calloc((size_t)(ns * np + 1), sizeof *sname);
    float **whole = calloc((size_t)((1 + ns) * np + 1), sizeof *whole);   /* gathered tensor-parallel tensors */
    if (!pc || !sname || !whole) { free(pc); free(sname); free(whole); return DT_ERR(DT_ENOMEM, "%s: out of memory", dir); }
    /* a frozen parameter has no state (compact optimizer): the index lists
     * every parameter's, so it is written as zeros */
    size_t zn = 0;
    int own_states = !p->dp.zero || zero_tp(p);   /* written here as whole tensors (else ZeRO's ranges) */
    float *flat[3] = {NULL, NULL, NULL};   /* zero_tp: values, states (ns <= 2) */
    for (int i = 0; i < np && own_states; i++)
        if ((zero_tp(p) ? !m->params[i]->requires_grad : !dt_optimizer_state_of(&p->upd.optim, 0, m->offsets[i])) &&
            (size_t)m->params[i]->value.numel > zn)
            zn = (size_t)m->params[i]->value.numel;
    float *zeros = zn ? calloc(zn, sizeof *zeros) : NULL;
    if (zn && !zeros) { free(pc); free(sname); free(whole); return DT_ERR(DT_ENOMEM, "%s: out of memory", dir); }
    int n = 0;
    dt_status s = zero_tp(p) ? gather_flats(p, ns, flat) : DT_OK;
    if (p->dp.zero && !zero_tp(p)) {   /* every replica: its owned ranges of the states (stage 3: and values; a tied copy:
                           on its authority only) */
        n = dt_zero_state_pieces(p->dp.zero, r, p->upd.norm_skip, pc, sname);
        int nv = n < 0 ? -1 : dt_zero_value_pieces(p->dp.zero, r, p->upd.norm_skip, pc + n);
        if (n < 0 || nv < 0) {
            free(pc); free(sname); free(zeros); free(whole);
            return dt_error_code() ? dt_error_code() : DT_ENOMEM;
        }
        n += nv;
    }
    for (int i = 0; i < np && s == DT_OK; i++) {
        if (!saver_of(p, i)) continue;
        dt_param *q = m->params[i];
        s = add_piece(p, q->name, q, flat[0] ? flat[0] + m->offsets[i] : dt_f32(&q->value), pc, &n, whole, &nw);
        for (int k = 0; k < ns && own_states && s == DT_OK; k++) {
            snprintf(sname[k * np + i], sizeof sname[0], "optim.%s.%s", dt_checkpoint_state_name(cfg, k), q->name);
            float *st = !zero_tp(p) ? dt_optimizer_state_of(&p->upd.optim, k, m->offsets[i])
                      : q->requires_grad ? flat[1 + k] + m->offsets[i] : NULL;
            s = add_piece(p, sname[k * np + i], q, st ? st : zeros, pc, &n, whole, &nw);
        }
    }
    for (int i = 0; p->lay.replica == 0 && p->lay.tp_rank == 0 && i < m->n_buffers; i++)
        if (p->ck.buffer_mine[i])
            pc[n++] = (dt_ckpt_piece){m->buffers[i]->name, 0, (size_t)m->buffers[i]->value.numel,
                                      dt_f32(&m->buffers[i]->value)};
    if (s == DT_OK) s = dt_ckpt_write_shard(dir, set, dt_pg_rank(p->comm.world), dt_pg_size(p->comm.world), pc, n);
    for (int k = 0; k < nw; k++) free(whole[k]);
    for (int k = 0; k < 3; k++) free(flat[k]);
    free(whole);
    free(pc);
    free(sname);
    free(zeros);
    return s;
}

/* The stage's optimizers: ZeRO's buckets' or the stage's one; *ostep their step. */
static int stage_optimizers(dt_pipe *p, dt_optimizer ***opts, int64_t *ostep) {
    if (!p->dp.zero) {
        *opts = malloc(sizeof **opts);
        if (*opts) (*opts)[0] = &p->upd.optim;
        *ostep = p->upd.optim.step;
        return *opts ? 1 : -1;
    }
    *opts = malloc((size_t)(p->dp.zero->lay.nb + 1) * sizeof **opts);
    *ostep = dt_zero_optim_step(p->dp.zero);
    return *opts ? dt_zero_optimizers(p->dp.zero, *opts) : -1;
}

/* own[global index]: each parameter's own step count, -1 for every step
 * (strategy.h: dt_checkpoint_meta_steps_list), put together from the stages
 * that hold them: one allreduce over the world, in which replica 0's tp rank
 * 0 of the parameter's one saver stage (ck.saver) adds count + 2 as two
 * exact float halves; every other rank adds 0.
 * Collective; every rank gets own. */
static dt_status gather_steps(dt_pipe *p, int64_t *own) {
    dt_model *m = p->m;
    int ng = p->ck.n_global;
    dt_optimizer **opts = NULL;
    int64_t ostep = 0;
    int n = stage_optimizers(p, &opts, &ostep);
    float *v = calloc((size_t)(2 * ng + 1), sizeof *v);
    dt_status s = dt_par_agree(p->comm.world, n < 0 || !v ? DT_ERR(DT_ENOMEM, "pipeline checkpoint: out of memory") : DT_OK,
                               "pipeline checkpoint");
    for (int g = 0; g < ng && s == DT_OK; g++) {
        int i = p->ck.local_of[g];
        if (i < 0 || p->lay.replica != 0 || p->lay.tp_rank != 0 || !p->ck.saver[i]) continue;
        int64_t st = dt_checkpoint_param_steps(m, i, opts, n);   /* -1: frozen here, recorded as 0 steps */
        int64_t e = (st < 0 ? 0 : st == ostep ? -1 : st) + 2;
        v[2 * g] = (float)(e >> 20);
        v[2 * g + 1] = (float)(e & 0xfffff);
    }
    if (s == DT_OK) s = dt_allreduce(p->comm.world, v, v, 2 * (int64_t)ng, DT_F32, DT_RED_SUM, NULL);
    for (int g = 0; g < ng && s == DT_OK; g++) {
        int64_t e = ((int64_t)v[2 * g] << 20) + (int64_t)v[2 * g + 1];
        own[g] = e >= 2 ? e - 2 : -1;   /* (every parameter has one saver; none: as all-stepped) */
    }
    free(v);
    free(opts);
    return s;
}

static dt_status write_index(dt_pipe *p, dt_run *r, const char *dir, const char *set, const int64_t *own) {
    dt_model *m = p->m;
    int ns = dt_optim_state_per_elem(r->optim), np = p->ck.n_global, k = 0;
    dt_ckpt_shape *sh = calloc((size_t)((1 + ns) * np + m->n_buffers + 1), sizeof *sh);
    char (*sname)[192] = calloc((size_t)(ns * np + 1), sizeof *sname);
    if (!sh || !sname) { free(sh); free(sname); return DT_ERR(DT_ENOMEM, "%s: out of memory", dir); }
    for (int i = 0; i < np; i++) sh[k++] = p->ck.gshape[i];
    for (int i = 0; i < m->n_buffers; i++) {
        sh[k] = (dt_ckpt_shape){.name = m->buffers[i]->name, .ndim = m->buffers[i]->value.ndim};
        memcpy(sh[k++].shape, m->buffers[i]->value.shape, sizeof sh[0].shape);
    }
    for (int s = 0; s < ns; s++)
        for (int i = 0; i < np; i++) {
            snprintf(sname[s * np + i], sizeof sname[0], "optim.%s.%s", dt_checkpoint_state_name(r->optim, s), p->ck.gname[i]);
            sh[k] = p->ck.gshape[i];
            sh[k++].name = sname[s * np + i];
        }
    dt_ckpt_meta meta;
    dt_checkpoint_meta(r, p->dp.zero ? "pipeline+zero" : "pipeline",
                       p->dp.zero ? dt_zero_optim_step(p->dp.zero) : p->upd.optim.step, &meta);
    dt_status s = dt_checkpoint_meta_steps_list(&meta, own, np, "the pipeline's model");
    if (s == DT_OK) s = dt_ckpt_write_index(dir, set, dt_pg_size(p->comm.world), 0, sh, k, meta.m, meta.n);
    free(sh);
    free(sname);
    return s;
}

dt_status dt_pipe_save(dt_pipe *p, dt_run *r, const char *dir) {
    int me = dt_pg_rank(p->comm.world);
    DT_TRY(dt_par_agree(p->comm.world, dt_pipe_dp_sync(p), dir));   /* ZeRO: no gather in flight */
    uint32_t nonce = 0;
    dt_status s0 = DT_OK;
    if (me == 0) {
        nonce = dt_ckpt_nonce();
        s0 = dt_ckpt_prepare_dir(dir);
    }
    /* rank 0's outcome and the set id (two 16-bit halves) to everyone */
    float v[3] = {s0 != DT_OK ? 1.0f : 0.0f, (float)(nonce >> 16), (float)(nonce & 0xffffu)};
    DT_TRY(dt_broadcast(p->comm.world, v, 3, DT_F32, 0, NULL));
    if (me == 0 && s0 != DT_OK) return s0;
    if (v[0] != 0.0f) return DT_ERR(DT_EIO, "%s: failed on rank 0 (see its error)", dir);
    nonce = ((uint32_t)v[1] << 16) | (uint32_t)v[2];
    char set[DT_CKPT_SET_MAX];
    dt_ckpt_set_id(*r->step, nonce, set);
    int64_t *own = malloc((size_t)(p->ck.n_global + 1) * sizeof *own);
    /* agreed before the shard, whose writing has collectives of its own (tp, replicas) */
    dt_status s = dt_par_agree(p->comm.world, own ? DT_OK : DT_ERR(DT_ENOMEM, "%s: out of memory", dir), dir);
    if (s == DT_OK) s = dt_par_agree(p->comm.world, write_my_shard(p, r, dir, set), dir);
    if (s == DT_OK) s = gather_steps(p, own);
    if (s == DT_OK) s = dt_par_agree(p->comm.world, me == 0 ? write_index(p, r, dir, set, own) : DT_OK, dir);
    free(own);
    if (s == DT_OK) return s;
    /* the set did not commit: each rank removes its own shard of it (the previous set stays) */
    char keep[1024];
    snprintf(keep, sizeof keep, "%s", dt_error_message());
    (void)dt_ckpt_discard_shard(dir, set, me);
    return DT_ERR(s, "%s", keep);
}

static const char *ckpt_get(const void *src, const char *key) { return dt_ckpt_get_meta(src, key); }

/* Parameter values (whole tensors; a tensor-parallel part keeps its slice)
 * and, without ZeRO, the optimizer states of every parameter (after the step
 * counts: a state the checkpoint lacks is a parameter saved frozen, right
 * only if it took no step; it starts from zero state). */
static dt_status load_values_states(dt_pipe *p, dt_run *r, const dt_ckpt *ck, int ns) {
    dt_model *m = p->m;
    dt_optimizer *o = &p->upd.optim;
    for (int i = 0; i < m->n_params; i++) {
        dt_param *q = m->params[i];
        int64_t full[DT_MAX_DIMS];
        int nd = dt_param_full_shape(q, full);
        DT_TRY(dt_ckpt_expect(ck, q->name, nd, full));
        if (!zero3(p)) DT_TRY(dt_checkpoint_read_param(ck, q->name, q, dt_f32(&q->value)));   /* (stage 3: ZeRO's ranges) */
        for (int k = 0; k < ns && !p->dp.zero; k++) {
            char nm[192];
            snprintf(nm, sizeof nm, "optim.%s.%s", dt_checkpoint_state_name(r->optim, k), q->name);
            float *st = dt_optimizer_state_of(o, k, m->offsets[i]);   /* frozen here: none */
            if (!dt_ckpt_find(ck, nm, NULL, NULL)) {
                DT_TRY(dt_checkpoint_state_missing(dt_ckpt_path(ck), m, i, &o, 1, nm));
                if (st) memset(st, 0, (size_t)q->value.numel * sizeof *st);
                continue;
            }
            DT_TRY(dt_ckpt_expect(ck, nm, nd, full));
            if (st) DT_TRY(dt_checkpoint_read_param(ck, nm, q, st));
        }
    }
    return DT_OK;
}

static dt_status load_local(dt_pipe *p, dt_run *r, const dt_ckpt *ck) {
    dt_model *m = p->m;
    int64_t ostep = 0;
    int ns = dt_optim_state_per_elem(r->optim);
    DT_TRY(dt_checkpoint_apply_meta(r, ckpt_get, ck, dt_ckpt_path(ck), &ostep));
    if (!p->dp.zero) {   /* the step counts first (ZeRO: dt_zero_read_states) */
        dt_optimizer *o = &p->upd.optim;
        o->step = ostep;
        DT_TRY(dt_checkpoint_apply_steps_of(ckpt_get, ck, dt_ckpt_path(ck), m, &o, 1, p->ck.local_of, p->ck.n_global));
    }
    /* bf16 state (optim.h): read into its fp32 copy, rounded as it is stored */
    DT_TRY(dt_optimizer_state_open(&p->upd.optim));
    dt_status s = load_values_states(p, r, ck, ns);
    dt_optimizer_state_close(&p->upd.optim, s == DT_OK);
    DT_TRY(s);
    for (int i = 0; i < m->n_buffers; i++) {
        const dt_tensor *b = &m->buffers[i]->value;
        DT_TRY(dt_ckpt_expect(ck, m->buffers[i]->name, b->ndim, b->shape));
        DT_TRY(dt_ckpt_read(ck, m->buffers[i]->name, 0, (size_t)b->numel, dt_f32(b)));
    }
    /* owned ranges; values read whole above (stage 3: owned ranges too) */
    if (p->dp.zero) return dt_zero_read_states(p->dp.zero, r, ck, ostep, p->ck.local_of, p->ck.n_global);
    return DT_OK;
}

dt_status dt_pipe_load(dt_pipe *p, dt_run *r, const char *path) {
    dt_ckpt *ck = NULL;
    dt_status s = dt_pipe_dp_sync(p);   /* ZeRO: no gather may still write the values read here */
    if (s == DT_OK) s = dt_ckpt_open(path, &ck);
    if (s == DT_OK) s = load_local(p, r, ck);
    dt_ckpt_close(ck);
    s = dt_par_agree(p->comm.world, s, path);
    /* values read as shards: ZeRO-3's buckets kept gathered (parameters no
     * module owns), a 16-bit param_dtype's rounded flat copy, from the new shards */
    return s == DT_OK && zero3(p) ? dt_par_agree(p->comm.world, dt_zero_gather_params(p->dp.zero), path) : s;
}
