/* DDP static_graph (PyTorch's static_graph=True, its bucket rebuilding):
 * the first synchronising backward records the order in which the bucketed
 * parameters' gradients become ready (unused ones, found after backward,
 * last). After its reductions every rank compares the order with rank 0's
 * (one gather of a count and a hash; a rank that differs is named), then the
 * buckets are cut again in that order, once: the first bucket then holds the
 * first gradients backward produces and launches while backward still runs.
 * The re-cut buckets are staged (ddp/buckets.c), so numerics are those of
 * the in-place buckets. If the order is the layout order nothing changes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ddp_internal.h"

dt_status dt_ddp_static_begin(dt_ddp *d) {
    if (!d->opts.static_graph || d->recorded) return DT_OK;
    if (!d->ready_order && !(d->ready_order = malloc((size_t)(d->model->n_params ? d->model->n_params : 1) * sizeof *d->ready_order)))
        return DT_ERR(DT_ENOMEM, "out of memory");
    d->recording = 1;
    d->n_ready = 0;
    return DT_OK;
}

void dt_ddp_static_note(dt_ddp *d, int param) {
    if (d->recording && d->n_ready < d->model->n_params) d->ready_order[d->n_ready++] = param;
}

static int bucketed_count(const dt_ddp *d) {
    int n = 0;
    for (int i = 0; i < d->n_buckets; i++) n += d->buckets[i].n_params;
    return n;
}

/* The recorded order is the current bucket order (buckets hold params in order). */
static int same_as_buckets(const dt_ddp *d) {
    return d->n_ready == bucketed_count(d) && memcmp(d->ready_order, d->bucket_params, (size_t)d->n_ready * sizeof(int)) == 0;
}

static dt_status order_error(const dt_ddp *d, int r) {
    char head[160] = "";
    size_t at = 0;
    for (int k = 0; k < d->n_ready && k < 3 && at < sizeof head; k++)
        at += (size_t)snprintf(head + at, sizeof head - at, "%s'%s'", k ? ", " : "", d->model->params[d->ready_order[k]]->name);
    return DT_ERR(DT_EINVAL, "ddp static_graph: gradients became ready in another order on rank %d than on rank 0 in the "
                  "first iteration (rank %d's order begins %s%s): static_graph needs the same graph on every rank",
                  r, d->rank, head, d->n_ready > 3 ? ", ..." : "");
}

dt_status dt_ddp_static_end(dt_ddp *d, int ok) {
    if (!d->recording) return DT_OK;
    d->recording = 0;
    uint32_t mine[3] = {ok && d->n_ready == bucketed_count(d), (uint32_t)d->n_ready,
                        dt_par_hash_ints(2166136261u, d->ready_order, d->n_ready)};
    uint32_t *all = malloc((size_t)d->world * sizeof mine);
    if (!all) return DT_ERR(DT_ENOMEM, "out of memory");
    dt_status s = dt_par_gather_words(d->pg, mine, 3, all);
    int failed = 0, differs = -1;
    for (int r = 0; s == DT_OK && r < d->world; r++) {
        failed |= !all[3 * r];
        if (differs < 0 && (all[3 * r + 1] != all[1] || all[3 * r + 2] != all[2])) differs = r;
    }
    free(all);
    DT_TRY(s);
    if (failed) return DT_OK;   /* some rank's step failed (its own error): record the next one */
    if (differs >= 0) return order_error(d, differs);
    d->recorded = 1;
    if (same_as_buckets(d)) return DT_OK;   /* registered in execution order: nothing to gain */
    DT_TRY(dt_ddp_build_staged(d, d->ready_order, d->n_ready));   /* same on every rank (agreed) */
    d->rebuilt = 1;
    if (d->trace) dt_trace_instant(d->trace, "ddp buckets rebuilt (static_graph)", 0);
    return DT_OK;
}

int dt_ddp_buckets_rebuilt(const dt_ddp *d) { return d->rebuilt; }
