/* DDP buckets: cut in layout order, in place in the flat gradient buffer
 * (dt_bucket_plan), or staged in a given order (static_graph).
 *
 * Staged buckets: the order a static graph's gradients become ready is in
 * general not the layout order, so a bucket's parameters are scattered over
 * grad_flat. Re-laying out the model (dt_model_set_layout) would move the
 * parameters under the caller's optimizer, whose state is positional in the
 * layout, so instead each staged bucket gets a contiguous buffer of its own:
 * its gradients are copied in when it launches (every one is final then)
 * and copied back once its reduction finished. The reduction sees the same
 * elements as in place, so each element is summed the same way: numerics are
 * unchanged. The copies cost one read and one write of the gradient per
 * step; when the gradients are in node-shared memory the staging buffer is
 * too, so the reduction still runs without messages. */
#include <stdlib.h>
#include <string.h>
#include "ddp_internal.h"

static dt_status alloc_tables(dt_ddp *d) {
    int n = d->model->n_params;
    size_t n1 = (size_t)(n ? n : 1);
    d->param_bucket = malloc(n1 * sizeof *d->param_bucket);
    d->bucket_params = malloc(n1 * sizeof *d->bucket_params);
    d->stage_pos = malloc(n1 * sizeof *d->stage_pos);
    d->buckets = calloc(n1 + 1, sizeof *d->buckets);
    if (!d->param_bucket || !d->bucket_params || !d->stage_pos || !d->buckets) return DT_ERR(DT_ENOMEM, "out of memory");
    for (int i = 0; i < n; i++) d->param_bucket[i] = -1;
    return DT_OK;
}

/* Bucket b's parameters are order[k] for the items k of cut c. */
static void fill_bucket(dt_ddp *d, int bi, const dt_bucket_cut *c, const int *order, const int *bucket_of, int *next) {
    dt_ddp_bucket *b = &d->buckets[bi];
    b->index = bi;
    b->params = d->bucket_params + *next;
    for (int k = c->first; b->n_params < c->n; k++) {
        if (bucket_of[k] != bi) continue;
        dt_param *p = d->model->params[order[k]];
        d->bucket_params[(*next)++] = p->index;
        b->n_params++;
        d->param_bucket[p->index] = bi;
        p->on_grad_ready = dt_ddp_on_grad_ready;
        p->on_grad_ready_user = d;
    }
    b->pending = b->n_params;
}

dt_status dt_ddp_build_buckets(dt_ddp *d) {
    dt_model *m = d->model;
    dt_bucket_rule rule = {d->opts.dp.first_bucket_bytes, d->opts.dp.bucket_bytes, 0};
    dt_param_plan plan;
    DT_TRY(alloc_tables(d));
    DT_TRY(dt_par_plan_params(m, &rule, DT_PLAN_FROZEN_SKIP, d->ignored, &plan));
    int next = 0;
    d->n_buckets = plan.nb;
    for (int i = 0; i < plan.nb; i++) {
        dt_ddp_bucket *b = &d->buckets[i];
        fill_bucket(d, i, &plan.cuts[i], plan.order, plan.bucket_of, &next);
        b->begin = plan.cuts[i].begin;
        b->end = b->begin + plan.cuts[i].used;
        b->numel = b->end - b->begin;
        b->grad = m->grad_flat.data + dt_model_grad_offset(m, b->begin);   /* (no frozen parameter inside) */
    }
    dt_par_plan_free(&plan);
    return DT_OK;
}

dt_status dt_ddp_build_staged(dt_ddp *d, const int *order, int n) {
    dt_model *m = d->model;
    dt_bucket_rule rule = {d->opts.dp.first_bucket_bytes, d->opts.dp.bucket_bytes, 1};   /* pad 1: packed from 0 */
    size_t n1 = (size_t)(n ? n : 1);
    dt_bucket_item *items = malloc(n1 * sizeof *items);
    dt_bucket_cut *cuts = malloc(n1 * sizeof *cuts);
    int *bucket_of = malloc(n1 * sizeof *bucket_of);
    size_t *pos = malloc(n1 * sizeof *pos);
    dt_status s = items && cuts && bucket_of && pos ? DT_OK : DT_ERR(DT_ENOMEM, "out of memory");
    int nb = 0;
    size_t total = 0;
    if (s == DT_OK) {
        for (int k = 0; k < n; k++) items[k] = (dt_bucket_item){(size_t)m->params[order[k]]->value.numel, 0, 0, 0};
        nb = dt_bucket_plan(&rule, items, n, cuts, bucket_of, pos);
        total = nb ? cuts[nb - 1].begin + cuts[nb - 1].numel : 0;
    }
    /* the old buckets go first: their staging may be node-shared (collective on every rank alike) */
    dt_ddp_free_buckets(d);
    if (s == DT_OK) s = alloc_tables(d);
    if (s == DT_OK && d->shm_grads) {
        d->stage_shm = 1;
        s = dt_pg_alloc_shared(d->pg, total ? total : 1, &d->stage);   /* collective */
        if (s == DT_OK && !d->stage) d->stage_shm = 0;   /* the window did not fit: private memory */
    }
    if (s == DT_OK && !d->stage && !(d->stage = calloc(total ? total : 1, sizeof *d->stage)))
        s = DT_ERR(DT_ENOMEM, "ddp: out of memory for %zu staged gradient elements", total);
    int next = 0;
    for (int i = 0; s == DT_OK && i < nb; i++) {
        dt_ddp_bucket *b = &d->buckets[i];
        fill_bucket(d, i, &cuts[i], order, bucket_of, &next);
        b->staged = 1;
        b->begin = cuts[i].begin;
        b->end = b->begin + cuts[i].used;
        b->numel = b->end - b->begin;
        b->grad = d->stage + b->begin;
    }
    for (int k = 0; s == DT_OK && k < n; k++) d->stage_pos[order[k]] = pos[k];
    if (s == DT_OK) d->n_buckets = nb;
    free(items);
    free(cuts);
    free(bucket_of);
    free(pos);
    return s;
}

void dt_ddp_free_buckets(dt_ddp *d) {
    for (int i = 0; d->buckets && i < d->n_buckets; i++) {
        if (d->buckets[i].work) dt_work_wait(d->buckets[i].work);
        free(d->buckets[i].scratch);
    }
    for (int i = 0; d->model && i < d->model->n_params; i++)
        if (d->model->params[i]->on_grad_ready_user == d) {
            d->model->params[i]->on_grad_ready = NULL;
            d->model->params[i]->on_grad_ready_user = NULL;
        }
    if (d->stage_shm) dt_pg_free_shared(d->pg, d->stage);
    else free(d->stage);
    d->stage = NULL;
    d->stage_shm = 0;
    free(d->buckets);
    free(d->param_bucket);
    free(d->bucket_params);
    free(d->stage_pos);
    d->buckets = NULL;
    d->param_bucket = d->bucket_params = NULL;
    d->stage_pos = NULL;
    d->n_buckets = 0;
    d->next_launch = 0;
}

void dt_ddp_stage_in(dt_ddp *d, dt_ddp_bucket *b) {
    for (int k = 0; k < b->n_params; k++) {
        const dt_param *p = d->model->params[b->params[k]];
        memcpy(d->stage + d->stage_pos[p->index], p->grad.data, (size_t)p->value.numel * sizeof(float));
    }
}

void dt_ddp_stage_out(dt_ddp *d, dt_ddp_bucket *b) {
    for (int k = 0; k < b->n_params; k++) {
        dt_param *p = d->model->params[b->params[k]];
        memcpy(p->grad.data, d->stage + d->stage_pos[p->index], (size_t)p->value.numel * sizeof(float));
    }
}

/* DDP refresh_trainable: after requires_grad changed between steps, cut the
 * buckets again over the trainable (and not ignored) parameters, in layout
 * order. Collective: the ranks first agree they have the same trainable set
 * (common/agree.c). The gradients are laid out again for the new set
 * (dt_model_refresh_grads: kept values carried over, in place when
 * node-shared, frozen parameters holding none); a static graph is recorded again in the next backward, as
 * its ready order now covers other parameters. */
dt_status dt_ddp_refresh_trainable(dt_ddp *d) {
    if (!d) return DT_ERR(DT_EINVAL, "dt_ddp_refresh_trainable: no DDP");
    int busy = 0;
    for (int i = 0; i < d->n_buckets; i++) busy |= d->buckets[i].launched || d->buckets[i].work != NULL;
    /* local misuse, but the refresh is collective: agree before failing so no rank waits alone */
    dt_status s = busy ? DT_ERR(DT_ESTATE, "ddp: refresh_trainable while a reduction is in flight (call it between steps)") : DT_OK;
    DT_TRY(dt_par_agree(d->pg, s, "ddp refresh_trainable"));
    DT_TRY(dt_par_agree_trainable(d->model, d->pg, "ddp refresh_trainable"));
    dt_ddp_free_buckets(d);   /* collective if static_graph staged them in node-shared memory */
    d->recording = d->recorded = d->rebuilt = 0;
    /* gradient memory for the trainable set of now (a node-shared window
     * sized for it: the old one goes, the new one is made after the buckets) */
    int shared = d->shm_grads != NULL;
    dt_ddp_unshare_grads(d);
    DT_TRY(dt_model_refresh_grads(d->model));
    DT_TRY(dt_ddp_build_buckets(d));
    return shared ? dt_ddp_share_grads(d) : DT_OK;
}
