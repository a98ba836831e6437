/* ZeRO refresh_trainable (fairscale OSS / ShardedDDP's refresh_trainable):
 * after requires_grad changed between steps, re-partition for the new
 * trainable set and carry the optimizer state over by parameter name and
 * element range, wherever a shard now lives.
 *
 *   1. agree: no step in progress, the same trainable set on every rank.
 *   2. gather: this rank's owned state ranges as the checkpoint writer sees
 *      them (dt_zero_state_pieces: "optim.<state>.<param>", element range,
 *      data) into a zeroed by-name image: state k of params[i] at
 *      k * n_elem + elem_off[i]. Every element has exactly one owner, so one
 *      sum over the group completes the image on every rank (x + 0 = x; a
 *      -0.0 state reads back as +0.0, which no update can tell apart).
 *      Frozen buckets have no state: they contribute zeros.
 *      Per parameter also its own step count (optimizer.c's skipped),
 *      identical on every rank (has_grad is agreed before each step).
 *   3. re-partition in place: dt_zero_fini + dt_zero_init (the model is made
 *      whole first at stage 3; frozen parameters get buckets without state).
 *   4. scatter: the checkpoint loader's owned-range read
 *      (dt_zero_read_owned_states) from the image instead of a file; the
 *      step count restored, and each segment's skipped = step - its own
 *      count: a parameter that was trainable keeps its moments and step
 *      exactly, a newly trainable one starts at zero state and step 0.
 * Memory: the image is a transient full-size copy of the states (refreshes
 * are rare). Statistics, trace and LR survive the refresh. A failure in step
 * 3 leaves z only fit for dt_zero_free. */
#include <stdlib.h>
#include <string.h>
#include "zero_internal.h"

typedef struct image {
    float *data;           /* ns * n_elem floats */
    size_t n_elem;
    size_t *elem_off;      /* per params[] index */
    int64_t *own_steps;    /* per params[] index: steps it was stepped in */
} image;

static void image_free(image *im) {
    dt_free(im->data);
    free(im->elem_off);
    free(im->own_steps);
}

/* "optim.<state k>.<name>" -> k and the parameter, else -1. */
static int parse_state_name(const dt_model *m, const dt_optim_cfg *cfg, int ns, const char *t, const dt_param **p) {
    if (strncmp(t, "optim.", 6) != 0) return -1;
    for (int k = 0; k < ns; k++) {
        const char *sn = dt_checkpoint_state_name(cfg, k);
        size_t l = strlen(sn);
        if (strncmp(t + 6, sn, l) == 0 && t[6 + l] == '.' && (*p = dt_model_find_param(m, t + 7 + l))) return k;
    }
    return -1;
}

/* Own step counts from the old optimizers: a trainable bucket's segments are
 * its parameters in layout order (both sorted by offset). */
static dt_status read_own_steps(dt_zero *z, int64_t *own) {
    for (int i = 0; i < z->lay.nb; i++) {
        const zbucket *b = &z->lay.b[i];
        if (!b->pub.trainable) continue;
        if (b->opt.n_segs != b->pub.n_params)
            return DT_ERR(DT_ESTATE, "zero refresh: bucket %d has %d segments for %d parameters", i, b->opt.n_segs, b->pub.n_params);
        for (int j = 0; j < b->opt.n_segs; j++) {
            const dt_param *p = z->lay.order[b->pub.first_param + j];
            if (b->opt.segs[j].offset != z->m->offsets[p->index])
                return DT_ERR(DT_ESTATE, "zero refresh: bucket %d's segment %d is not parameter '%s'", i, j, p->name);
            own[p->index] = dt_optimizer_segment_steps(&b->opt, j);
        }
    }
    return DT_OK;
}

static dt_status gather_image(dt_zero *z, image *im) {
    dt_model *m = z->m;
    int np = m->n_params, ns = dt_optim_state_per_elem(&z->cfg);
    size_t np1 = (size_t)(np ? np : 1);
    im->elem_off = malloc(np1 * sizeof *im->elem_off);
    im->own_steps = calloc(np1, sizeof *im->own_steps);
    if (!im->elem_off || !im->own_steps) return DT_ERR(DT_ENOMEM, "zero refresh: out of memory");
    for (int i = 0; i < np; i++) {
        im->elem_off[i] = im->n_elem;
        im->n_elem += (size_t)m->params[i]->value.numel;
    }
    DT_TRY(read_own_steps(z, im->own_steps));
    size_t total = (size_t)ns * im->n_elem;
    if (!(im->data = dt_calloc((total ? total : 1) * sizeof(float))))
        return DT_ERR(DT_ENOMEM, "zero refresh: out of memory for a %zu-float state image", total);
    if (!ns) return DT_OK;
    dt_ckpt_piece *pc = calloc((size_t)ns * np1, sizeof *pc);
    char (*names)[192] = calloc((size_t)ns * np1, sizeof *names);
    dt_run run = {.model = m};
    dt_status s = dt_zero_state_open(z);   /* bf16 state: the pieces are its fp32 copies */
    if (s != DT_OK) { free(pc); free(names); return s; }
    int n = pc && names ? dt_zero_state_pieces(z, &run, NULL, pc, names) : -1;
    if (n < 0) s = DT_ERR(DT_ENOMEM, "zero refresh: out of memory");
    for (int q = 0; q < n && s == DT_OK; q++) {
        const dt_param *p = NULL;
        int k = parse_state_name(m, &z->cfg, ns, pc[q].tensor, &p);
        if (k < 0 || pc[q].start + pc[q].n > (size_t)p->value.numel) {
            s = DT_ERR(DT_ESTATE, "zero refresh: unexpected state piece '%s'", pc[q].tensor);
            break;
        }
        memcpy(im->data + (size_t)k * im->n_elem + im->elem_off[p->index] + pc[q].start, pc[q].data, pc[q].n * sizeof(float));
    }
    dt_zero_state_close(z, 0);
    free(pc);
    free(names);
    DT_TRY(dt_par_agree(z->pg, s, "zero refresh_trainable"));
    return dt_allreduce(z->pg, im->data, im->data, (int64_t)total, DT_F32, DT_RED_SUM, NULL);   /* one owner per element */
}

static dt_status image_range(void *user, int k, const dt_param *p, const char *name, size_t start, size_t n, float *dst) {
    (void)name;
    const image *im = user;
    memcpy(dst, im->data + (size_t)k * im->n_elem + im->elem_off[p->index] + start, n * sizeof(float));
    return DT_OK;
}

/* Step counts: every optimizer at the global step; a segment's own count
 * from the image (0 for a parameter that had no state). */
static void restore_steps(dt_zero *z, const image *im, int64_t step) {
    dt_zero_set_optim_step(z, step);
    for (int i = 0; i < z->lay.nb; i++) {
        zbucket *b = &z->lay.b[i];
        for (int j = 0; b->pub.trainable && j < b->opt.n_segs; j++) {
            const dt_param *p = z->lay.order[b->pub.first_param + j];
            b->opt.skipped[j] = step - im->own_steps[p->index];
        }
    }
}

dt_status dt_zero_refresh_trainable(dt_zero *z) {
    if (!z) return DT_ERR(DT_EINVAL, "dt_zero_refresh_trainable: no ZeRO");
    int busy = z->rd.reduced || z->rd.next_launch > 0;
    dt_status s = busy ? DT_ERR(DT_ESTATE, "zero: refresh_trainable during a step (call it between steps)") : DT_OK;
    if (s == DT_OK) s = dt_zero_sync_params(z);   /* no all-gather may still read a shard */
    DT_TRY(dt_par_agree(z->pg, s, "zero refresh_trainable"));
    DT_TRY(dt_par_agree_trainable(z->m, z->pg, "zero refresh_trainable"));
    image im = {0};
    s = gather_image(z, &im);
    if (s != DT_OK) { image_free(&im); return s; }
    int64_t step = dt_zero_optim_step(z);
    dt_model *m = z->m;
    dt_pg *pg = z->pg;
    dt_optim_cfg cfg = z->cfg;
    dt_zero_opts opts = z->opts;
    dt_zero_stats stats = z->stats;
    dt_trace *trace = z->trace;
    float lr = z->lr;
    dt_zero_fini(z);
    s = dt_zero_init(z, m, pg, &cfg, &opts);
    z->stats = stats;
    z->trace = trace;
    z->lr = lr;
    if (s == DT_OK) s = dt_zero_read_owned_states(z, m, image_range, &im);
    if (s == DT_OK) restore_steps(z, &im, step);
    /* the parameters as a step (or a load) leaves them under the new
     * sharding: a 16-bit wire's other shards rounded, the own exact */
    s = dt_par_agree(z->pg, s, "zero refresh_trainable");   /* (a rank short of memory: every rank fails) */
    if (s == DT_OK) s = dt_zero_gather_params(z);
    image_free(&im);
    return s;
}
