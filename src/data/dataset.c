/* The dataset registry: the one place a --data name becomes a dataset. */
#include <stdio.h>
#include <string.h>
#include "dataset_internal.h"

static const struct { const char *name; dt_dataset_open_fn open; } registry[] = {
    {DT_DATA_FASHION_MNIST, dt_dataset_open_fashion_mnist},
    {DT_DATA_TEXT, dt_dataset_open_text},
    {DT_DATA_SHARD, dt_dataset_open_shard},
};
#define N_DATASETS ((int)(sizeof registry / sizeof registry[0]))

static int find(const char *name) {
    for (int i = 0; name && i < N_DATASETS; i++)
        if (!strcmp(registry[i].name, name)) return i;
    return -1;
}

int dt_dataset_exists(const char *name) { return find(name) >= 0; }

const char *dt_dataset_names(char *buf, size_t n) {
    size_t k = 0;
    if (n) buf[0] = 0;
    for (int i = 0; i < N_DATASETS && k < n; i++) {
        int w = snprintf(buf + k, n - k, "%s%s", i ? ", " : "", registry[i].name);
        if (w < 0) break;
        k += (size_t)w;
    }
    return buf;
}

dt_status dt_dataset_check_name(const char *name) {
    if (find(name) >= 0) return DT_OK;
    char known[256];
    return DT_ERR(DT_EINVAL, "train.data: unknown dataset '%s' (%s)", name ? name : "(none)",
                  dt_dataset_names(known, sizeof known));
}

dt_status dt_dataset_open(const char *name, const dt_dataset_opts *o, dt_dataset *out) {
    memset(out, 0, sizeof *out);
    DT_TRY(dt_dataset_check_name(name));
    int i = find(name);
    dt_dataset_opts none = {0};
    DT_TRY(registry[i].open(o ? o : &none, out));
    out->name = registry[i].name;
    return DT_OK;
}

void dt_dataset_close(dt_dataset *d) {
    if (!d) return;
    if (d->destroy) d->destroy(d->self);
    memset(d, 0, sizeof *d);
}

dt_batch dt_dataset_batch(const dt_dataset *d, dt_split split, const int64_t *idx, int64_t n, void *const *x,
                          int32_t *y) {
    d->fill(d->self, split, idx, n, x, y);
    return dt_batch_of(&d->sample, n, x, y);
}
