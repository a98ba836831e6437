/* Token-window datasets (shared by text and shard): sample i of a split is
 * x = tokens[i*T .. i*T+T), y = the same shifted by one; int32 [T] each.
 * The splits are streams of views (token_stream.c): nothing is copied to
 * hold out the tail or to keep a rank's part. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "dataset_internal.h"

/* [DT_SPLIT_TRAIN], [DT_SPLIT_EVAL]: views into store */
typedef struct tokens { dt_token_store store; dt_token_stream split[2]; int T; } tokens;

static void tok_fill(const void *self, dt_split sp, const int64_t *idx, int64_t n, void *const *x, int32_t *y) {
    const tokens *t = self;
    dt_token_stream_batch(&t->split[sp], idx, n, t->T, x[0], y);
}

static void tok_destroy(void *self) {
    tokens *t = self;
    if (!t) return;
    dt_token_stream_free(&t->split[0]);
    dt_token_stream_free(&t->split[1]);
    dt_token_store_free(&t->store);
    free(t);
}

/* Training on the validation data would make its loss meaningless: the
 * validation path may not be the training path, nor a directory holding
 * the training file. (A validation file inside the training directory is
 * held out of training instead.) */
static dt_status val_apart(const char *path, const char *val_path) {
    struct stat ds, vs;
    if (stat(path, &ds) != 0 || stat(val_path, &vs) != 0) return DT_OK;   /* (the loads name a missing path) */
    if (ds.st_dev == vs.st_dev && ds.st_ino == vs.st_ino)
        return DT_ERR(DT_EINVAL, "train.val_path %s is the training data (train.data_path %s) itself: give a separate "
                      "validation file or directory", val_path, path);
    if (!S_ISDIR(vs.st_mode) || !S_ISREG(ds.st_mode)) return DT_OK;
    const char *slash = strrchr(path, '/');
    char parent[4096];
    snprintf(parent, sizeof parent, "%.*s", slash ? (int)(slash - path) : 1, slash ? path : ".");
    struct stat ps;
    if (stat(parent[0] ? parent : "/", &ps) == 0 && ps.st_dev == vs.st_dev && ps.st_ino == vs.st_ino)
        return DT_ERR(DT_EINVAL, "train.val_path %s holds the training file train.data_path %s: validate on a "
                      "directory or file without it", val_path, path);
    return DT_OK;
}

static int by_identity(const void *a, const void *b) {
    const dt_token_region *x = a, *y = b;
    if (x->dev != y->dev) return x->dev < y->dev ? -1 : 1;
    return x->ino < y->ino ? -1 : x->ino > y->ino;
}

/* No file is both training and validation data, whatever its names (a
 * link, a hard link, the same file listed in both directories): the
 * store's regions [0, n_train) are the training files, the rest the
 * validation files. */
static dt_status files_apart(const dt_token_store *st, int n_train, const char *path, const char *val_path) {
    if (n_train == 0 || n_train == st->n) return DT_OK;
    dt_token_region *tr = malloc((size_t)n_train * sizeof *tr);
    if (!tr) return DT_ERR(DT_ENOMEM, "out of memory comparing the training and validation files");
    memcpy(tr, st->region, (size_t)n_train * sizeof *tr);
    qsort(tr, (size_t)n_train, sizeof *tr, by_identity);
    dt_status s = DT_OK;
    for (int i = n_train; i < st->n && s == DT_OK; i++)
        if ((st->region[i].dev || st->region[i].ino) && bsearch(&st->region[i], tr, (size_t)n_train, sizeof *tr, by_identity))
            s = DT_ERR(DT_EINVAL, "train.val_path %s holds a file of the training data train.data_path %s (the same "
                       "file under another name or through a link: device %llu, inode %llu); validate on files "
                       "training does not read", val_path, path, (unsigned long long)st->region[i].dev,
                       (unsigned long long)st->region[i].ino);
    free(tr);
    return s;
}

dt_status dt_dataset_open_tokens(const char *path, const dt_dataset_opts *o, dt_token_open_fn open,
                                 dt_dataset *out) {
    if (o->seq <= 0 || o->seq > INT_MAX)
        return DT_ERR(DT_EINVAL, "train.seq %lld: token data needs a positive sequence length", (long long)o->seq);
    int split = o->part_world > 1;
    struct stat sb;
    int by_file = split && stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);   /* else one file: ranges */
    tokens *t = calloc(1, sizeof *t);
    if (!t) return DT_ERR(DT_ENOMEM, "out of memory");
    t->T = (int)o->seq;
    dt_token_stream all = {0};
    dt_status s = o->val_path && !o->eval_only ? val_apart(path, o->val_path) : DT_OK;
    /* a validation file inside the training directory is held out of training */
    if (s == DT_OK) s = open(path, o->val_path, &t->store, &all);
    int64_t n_tr = all.n_tokens;   /* the training split: the first n_tr tokens of all */
    int n_train_files = t->store.n;
    if (s == DT_OK && o->val_path) {
        s = open(o->val_path, NULL, &t->store, &t->split[DT_SPLIT_EVAL]);
        if (s == DT_OK && !o->eval_only) s = files_apart(&t->store, n_train_files, path, o->val_path);
    } else if (s == DT_OK) {   /* the last 10% */
        n_tr = all.n_tokens - all.n_tokens / 10;
        s = dt_token_stream_slice(&all, n_tr, all.n_tokens, &t->split[DT_SPLIT_EVAL], path);
    }
    dt_token_stream *train = &t->split[DT_SPLIT_TRAIN];
    if (s == DT_OK && by_file)   /* the eval split stays whole: the same on every rank */
        s = dt_tokens_keep_part(&all, n_tr, o->part_rank, o->part_world, t->T, path, train);
    else if (s == DT_OK && split)
        s = dt_tokens_keep_range(&all, n_tr, o->part_rank, o->part_world, t->T, path, train);
    else if (s == DT_OK)
        s = dt_token_stream_slice(&all, 0, n_tr, train, path);
    dt_token_stream_free(&all);
    const dt_token_stream *tr = &t->split[DT_SPLIT_TRAIN], *va = &t->split[DT_SPLIT_EVAL];
    if (s == DT_OK && dt_token_stream_windows(tr, t->T) < 1)
        s = DT_ERR(DT_EINVAL, "%s: data too short: %lld training tokens for sequence length %d", path,
                   (long long)tr->n_tokens, t->T);
    if (s != DT_OK) { tok_destroy(t); return s; }
    /* ids of both splits must fit the model's vocabulary; messages about the
     * vocabulary name the file with the largest id */
    snprintf(out->source, sizeof out->source, "%s", path);
    if (o->val_path && va->vocab > tr->vocab)
        snprintf(out->classes_source, sizeof out->classes_source, "train.val_path %s", o->val_path);
    int64_t vocab = tr->vocab > va->vocab ? tr->vocab : va->vocab;
    out->sample = (dt_sample_shape){.n_inputs = 1, .targets = t->T, .classes = vocab};
    out->sample.in[0] = (dt_input_spec){.name = "ids", .dtype = DT_I32, .ndim = 1, .dims = {t->T}};
    out->size[DT_SPLIT_TRAIN] = dt_token_stream_windows(tr, t->T);
    out->size[DT_SPLIT_EVAL] = dt_token_stream_windows(va, t->T);
    out->unit = "tokens";
    out->rate_unit = "tok/s";
    out->eval_name = "validation";
    out->metric = "token accuracy";
    out->headline_loss = 1;
    out->eval_limited = 1;
    out->self = t;
    out->fill = tok_fill;
    out->destroy = tok_destroy;
    return DT_OK;
}
