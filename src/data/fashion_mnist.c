/* Fashion-MNIST: IDX images [N, rows, cols] + labels [N], the images kept as
 * uint8 and normalised with the dataset mean/std per batch (float
 * [n, 1, rows, cols]), labels int32 in [0, 10). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "dtrain/data.h"

#define FMNIST_MEAN 0.2860f
#define FMNIST_STD 0.3530f
#define FMNIST_CLASSES 10
#define FMNIST_MAX_SIDE 65535   /* rows / cols must fit an int comfortably */

/* "<dir>/<prefix>-<kind>": prefer the .gz name, fall back to the raw name if
 * only that exists (gzread reads both). */
static dt_status fmnist_path(char *buf, size_t n, const char *dir, const char *prefix,
                             const char *kind) {
    int len = snprintf(buf, n, "%s/%s-%s.gz", dir, prefix, kind);
    if (len < 0 || (size_t)len >= n) return DT_ERR(DT_EINVAL, "%s: path too long", dir);
    if (access(buf, F_OK) != 0) {
        char raw[4096];
        snprintf(raw, sizeof raw, "%s/%s-%s", dir, prefix, kind);
        if (access(raw, F_OK) == 0) memcpy(buf, raw, strlen(raw) + 1);
    }
    return DT_OK;
}

dt_status dt_fashion_mnist_load(const char *dir, const char *split, dt_image_dataset *out) {
    if (!out) return DT_ERR(DT_EINVAL, "dt_fashion_mnist_load: NULL output");
    memset(out, 0, sizeof *out);
    if (!dir) dir = DT_FASHION_MNIST_DIR;
    if (!split) return DT_ERR(DT_EINVAL, "fashion-mnist: split is NULL (expected \"train\" or \"test\")");
    const char *prefix;
    if (strcmp(split, "train") == 0) prefix = "train";
    else if (strcmp(split, "test") == 0) prefix = "t10k";
    else return DT_ERR(DT_EINVAL, "fashion-mnist: unknown split '%s' (expected \"train\" or \"test\")", split);

    char ipath[4096], lpath[4096];
    DT_TRY(fmnist_path(ipath, sizeof ipath, dir, prefix, "images-idx3-ubyte"));
    DT_TRY(fmnist_path(lpath, sizeof lpath, dir, prefix, "labels-idx1-ubyte"));

    dt_idx im, lb;
    DT_TRY(dt_idx_load(ipath, &im));
    dt_status st = dt_idx_load(lpath, &lb);
    if (st != DT_OK) { dt_idx_free(&im); return st; }

    if (im.ndim != 3) {
        st = DT_ERR(DT_EFORMAT, "%s: expected 3 dims [N, rows, cols], got %d", ipath, im.ndim);
    } else if (lb.ndim != 1) {
        st = DT_ERR(DT_EFORMAT, "%s: expected 1 dim [N], got %d", lpath, lb.ndim);
    } else if (im.count != lb.count) {
        st = DT_ERR(DT_EFORMAT, "%s: count mismatch: %lld labels for %lld images in %s", lpath,
                    (long long)lb.count, (long long)im.count, ipath);
    } else if (im.dims[1] > FMNIST_MAX_SIDE || im.dims[2] > FMNIST_MAX_SIDE) {
        st = DT_ERR(DT_EFORMAT, "%s: image size %lldx%lld too large", ipath,
                    (long long)im.dims[1], (long long)im.dims[2]);
    }
    for (int64_t i = 0; st == DT_OK && i < lb.count; i++) {
        if (lb.data[i] >= FMNIST_CLASSES)
            st = DT_ERR(DT_EFORMAT, "%s: label %d at index %lld out of range [0, %d)", lpath,
                        lb.data[i], (long long)i, FMNIST_CLASSES);
    }
    if (st != DT_OK) goto done;

    int64_t n = im.count;
    int32_t *y = malloc((size_t)n * sizeof(int32_t) + 1);
    if (!y) {
        st = DT_ERR(DT_ENOMEM, "%s: out of memory for %lld labels", lpath, (long long)n);
        goto done;
    }
    for (int64_t i = 0; i < n; i++) y[i] = lb.data[i];

    out->pixels = im.data;   /* the file's bytes, kept as they are */
    im.data = NULL;
    out->labels = y;
    out->count = n;
    out->rows = (int)im.dims[1];
    out->cols = (int)im.dims[2];
    out->n_classes = FMNIST_CLASSES;
done:
    dt_idx_free(&im);
    dt_idx_free(&lb);
    return st;
}

void dt_image_dataset_free(dt_image_dataset *d) {
    if (!d) return;
    free(d->pixels);
    free(d->labels);
    memset(d, 0, sizeof *d);
}

/* idx[i] must lie in [0, d->count); x is [n, 1, rows, cols], y is [n].
 * A pixel v becomes v * scale - shift = (v/255 - mean)/std, through a
 * 256-entry table (the same float for the same byte in every batch). */
void dt_image_batch(const dt_image_dataset *d, const int64_t *idx, int64_t n, float *x, int32_t *y) {
    size_t px = (size_t)d->rows * (size_t)d->cols;
    float value[256];
    if (x) {
        const float scale = 1.0f / (255.0f * FMNIST_STD), shift = FMNIST_MEAN / FMNIST_STD;
        for (int v = 0; v < 256; v++) value[v] = (float)v * scale - shift;
    }
    for (int64_t i = 0; i < n; i++) {
        int64_t j = idx[i];
        if (x) {
            const uint8_t *p = d->pixels + (size_t)j * px;
            float *o = x + (size_t)i * px;
            for (size_t k = 0; k < px; k++) o[k] = value[p[k]];
        }
        if (y) y[i] = d->labels[j];
    }
}
