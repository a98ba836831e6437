/* Fashion-MNIST as a dt_dataset: train = train-*, eval = t10k-* of one IDX
 * directory; samples float [1, rows, cols], one label in [0, 10). Under
 * an uneven split (part_world > 1) a rank keeps only its share of the
 * training images. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dataset_internal.h"

typedef struct fmnist { dt_image_dataset split[2]; } fmnist;   /* [DT_SPLIT_TRAIN], [DT_SPLIT_EVAL] */

static void fm_fill(const void *self, dt_split sp, const int64_t *idx, int64_t n, void *const *x, int32_t *y) {
    dt_image_batch(&((const fmnist *)self)->split[sp], idx, n, x[0], y);
}

static void fm_destroy(void *self) {
    fmnist *f = self;
    if (!f) return;
    dt_image_dataset_free(&f->split[0]);
    dt_image_dataset_free(&f->split[1]);
    free(f);
}

dt_status dt_dataset_open_fashion_mnist(const dt_dataset_opts *o, dt_dataset *out) {
    const char *dir = o->path ? o->path : DT_FASHION_MNIST_DIR;
    if (o->val_path)
        return DT_ERR(DT_EINVAL, "train.val_path %s: fashion-mnist evaluates on its own test split (t10k-* in %s)",
                      o->val_path, dir);
    fmnist *f = calloc(1, sizeof *f);
    if (!f) return DT_ERR(DT_ENOMEM, "out of memory");
    dt_status s = dt_fashion_mnist_load(dir, "train", &f->split[DT_SPLIT_TRAIN]);
    if (s == DT_OK) s = dt_fashion_mnist_load(dir, "test", &f->split[DT_SPLIT_EVAL]);
    const dt_image_dataset *tr = &f->split[DT_SPLIT_TRAIN], *te = &f->split[DT_SPLIT_EVAL];
    if (s == DT_OK && (tr->rows != te->rows || tr->cols != te->cols))   /* the batch buffers hold one shape */
        s = DT_ERR(DT_EFORMAT, "%s: test images (t10k-images-idx3-ubyte) are %dx%d but training images are %dx%d",
                   dir, te->rows, te->cols, tr->rows, tr->cols);
    if (s == DT_OK && o->part_world > 1) {   /* uneven: this rank's contiguous share (part.c); test split whole */
        dt_image_dataset *t = &f->split[DT_SPLIT_TRAIN];
        int64_t a, b, px = (int64_t)t->rows * t->cols;
        for (int r = 0; r < o->part_world && s == DT_OK; r++) {   /* every part checked on every part */
            dt_part_range(t->count, r, o->part_world, &a, &b);
            if (b <= a)
                s = DT_ERR(DT_EINVAL, "%s: uneven split: rank %d's share of the %lld training images is empty", dir, r,
                           (long long)t->count);
        }
        dt_part_range(t->count, o->part_rank, o->part_world, &a, &b);
        if (s == DT_OK) {
            memmove(t->pixels, t->pixels + a * px, (size_t)((b - a) * px) * sizeof *t->pixels);
            memmove(t->labels, t->labels + a, (size_t)(b - a) * sizeof *t->labels);
            t->count = b - a;
            uint8_t *kept = realloc(t->pixels, (size_t)((b - a) * px));   /* the other shares' pages back */
            if (kept) t->pixels = kept;
        }
    }
    if (s != DT_OK) { fm_destroy(f); return s; }
    snprintf(out->source, sizeof out->source, "%s", dir);
    out->sample = (dt_sample_shape){.n_inputs = 1, .targets = 1, .classes = tr->n_classes};
    out->sample.in[0] = (dt_input_spec){.name = "image", .dtype = DT_F32, .ndim = 3, .dims = {1, tr->rows, tr->cols}};
    out->size[DT_SPLIT_TRAIN] = tr->count;
    out->size[DT_SPLIT_EVAL] = te->count;
    out->unit = "samples";
    out->rate_unit = "samples/s";
    out->eval_name = "test";
    out->metric = "accuracy";
    out->headline_loss = 0;
    out->eval_limited = 0;
    out->self = f;
    out->fill = fm_fill;
    out->destroy = fm_destroy;
    return DT_OK;
}
