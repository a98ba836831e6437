/* Bucket cutting shared by DDP (buckets over the flat gradient, in place) and
 * ZeRO (buckets re-laid out back to back, each padded to a multiple of the
 * shard unit). One rule for both; see dt_bucket_plan in common/common_internal.h. */
#include <stdlib.h>
#include "common_internal.h"

static void layout_order(const dt_model *m, int *order) {
    int n = m->n_params;
    for (int i = 0; i < n; i++) order[i] = i;
    for (int i = 1; i < n; i++) {   /* insertion sort by offset: stable, the model's backward order */
        int x = order[i], j = i - 1;
        while (j >= 0 && m->offsets[order[j]] > m->offsets[x]) { order[j + 1] = order[j]; j--; }
        order[j + 1] = x;
    }
}

static size_t round_up(size_t x, size_t m) { return (x + m - 1) / m * m; }

int dt_bucket_plan(const dt_bucket_rule *r, const dt_bucket_item *items, int n, dt_bucket_cut *cuts,
                   int *bucket_of, size_t *pos) {
    int nb = 0;
    dt_bucket_cut *cur = NULL;
    for (int k = 0; k < n; k++) {
        bucket_of[k] = -1;
        if (items[k].skip) continue;
        size_t bytes = items[k].numel * sizeof(float);
        size_t cap = nb == 1 ? r->first_cap_bytes : r->cap_bytes;   /* cur is bucket 0 */
        /* in place (no pad), a bucket is one range of the buffer: a skipped
         * parameter (frozen, ignored) in between starts a new one, so its
         * elements are never reduced */
        int gap = !r->pad && cur && items[k].offset != cur->begin + cur->used;
        if (!cur || gap || cur->cls != items[k].cls || (cur->used > 0 && cur->used * sizeof(float) + bytes > cap)) {
            size_t begin = !r->pad ? items[k].offset : cur ? cur->begin + round_up(cur->used, r->pad) : 0;
            cur = &cuts[nb++];
            *cur = (dt_bucket_cut){.first = k, .begin = begin, .cls = items[k].cls};
        }
        size_t at = r->pad ? cur->begin + cur->used : items[k].offset;
        if (pos) pos[k] = at;
        cur->used = at + items[k].numel - cur->begin;
        cur->n++;
        bucket_of[k] = nb - 1;
    }
    for (int i = 0; i < nb; i++)
        cuts[i].numel = r->pad ? round_up(cuts[i].used ? cuts[i].used : 1, r->pad) : cuts[i].used;
    return nb;
}

dt_status dt_par_plan_params(const dt_model *m, const dt_bucket_rule *r, dt_plan_frozen frozen,
                             const unsigned char *skip, dt_param_plan *out) {
    int n = m->n_params;
    size_t n1 = (size_t)(n ? n : 1);
    *out = (dt_param_plan){0};
    dt_bucket_item *items = malloc(n1 * sizeof *items);
    out->order = malloc(n1 * sizeof *out->order);
    out->bucket_of = malloc(n1 * sizeof *out->bucket_of);
    out->pos = malloc(n1 * sizeof *out->pos);
    out->cuts = malloc(n1 * sizeof *out->cuts);
    if (!items || !out->order || !out->bucket_of || !out->pos || !out->cuts) {
        free(items);
        dt_par_plan_free(out);
        return DT_ERR(DT_ENOMEM, "out of memory");
    }
    layout_order(m, out->order);
    for (int k = 0; k < n; k++) {
        const dt_param *p = m->params[out->order[k]];
        int fz = !p->requires_grad;
        items[k] = (dt_bucket_item){(size_t)p->value.numel, m->offsets[p->index],
                                    (frozen == DT_PLAN_FROZEN_SKIP && fz) || (skip && skip[p->index]),
                                    frozen == DT_PLAN_FROZEN_APART && fz};
    }
    out->nb = dt_bucket_plan(r, items, n, out->cuts, out->bucket_of, out->pos);
    free(items);
    return DT_OK;
}

void dt_par_plan_free(dt_param_plan *p) {
    free(p->order);
    free(p->bucket_of);
    free(p->pos);
    free(p->cuts);
    *p = (dt_param_plan){0};
}
