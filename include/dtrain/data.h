/* dtrain/data.h — datasets and the distributed sampler.
 *
 * Readers treat every length and offset in a file as hostile and fail with
 * a message naming the file and what is wrong.
 *
 * The trainer sees every dataset through one interface (dt_dataset, at the
 * end of the readers below): open one by name, ask its sizes and sample
 * shape, copy chosen samples into batch buffers.
 */
#ifndef DTRAIN_DATA_H
#define DTRAIN_DATA_H

#include <stddef.h>
#include <stdint.h>
#include "dtrain/error.h"
#include "dtrain/nn.h"

/* ---- IDX (MNIST / Fashion-MNIST), gzip or raw ---- */
typedef struct dt_idx {
    uint8_t *data;          /* owned */
    int ndim;               /* 1 (labels) or 3 (images) */
    int64_t dims[4];
    int64_t count;          /* dims[0] */
    int64_t item_size;      /* product of dims[1..] */
} dt_idx;
dt_status dt_idx_load(const char *path, dt_idx *out);   /* .gz decompressed via zlib */
void dt_idx_free(dt_idx *x);

/* Images kept as the file stores them, uint8 [N, H, W] (a quarter of
 * float32's memory: 47 MB for Fashion-MNIST's training split, not 188), and
 * handed out by dt_image_batch as float [n, 1, H, W] normalised to
 * (x/255 - mean)/std; labels int32[N]. */
typedef struct dt_image_dataset {
    uint8_t *pixels;        /* owned, count * rows * cols */
    int32_t *labels;        /* owned */
    int64_t count;
    int rows, cols, n_classes;
} dt_image_dataset;
/* dir holds {train,t10k}-images-idx3-ubyte.gz and -labels-idx1-ubyte.gz.
 * split: "train" or "test". Default dir: DT_FASHION_MNIST_DIR. */
#define DT_FASHION_MNIST_DIR "/usr/share/datasets/fashion-mnist"
dt_status dt_fashion_mnist_load(const char *dir, const char *split, dt_image_dataset *out);
void dt_image_dataset_free(dt_image_dataset *d);
/* Samples idx[0..n) into x[n, 1, rows, cols] (normalised floats), y[n]. */
void dt_image_batch(const dt_image_dataset *d, const int64_t *idx, int64_t n, float *x, int32_t *y);

/* ---- token datasets (language modelling) ---- */
typedef struct dt_token_dataset {
    uint16_t *tokens;       /* owned */
    int64_t n_tokens;
    int vocab;              /* 256 for bytes; from the data for shards (max id + 1 lower bound) */
} dt_token_dataset;
/* Bytes of a text file, or of every file in a directory (sorted by name; links
 * to files read, each file once, a dangling link an error; hidden files
 * (".name"), fortune index files *.dat and UTF-8 twins *.u8 skipped;
 * subdirectories not read), each byte one
 * token (vocab 256). */
#define DT_FORTUNES_DIR "/usr/share/games/fortunes"
dt_status dt_text_load(const char *path, dt_token_dataset *out);
/* llm.c token shard: header of 256 int32 (magic 20240520, version 1, n_tokens),
 * then n_tokens uint16. Validates magic, version, size. */
dt_status dt_token_shard_load(const char *path, dt_token_dataset *out);
dt_status dt_token_shard_write(const char *path, const uint16_t *tokens, int64_t n); /* atomic */
void dt_token_dataset_free(dt_token_dataset *d);
/* Number of non-overlapping windows of T+1 tokens usable as samples: (n_tokens-1)/T. */
int64_t dt_token_windows(const dt_token_dataset *d, int T);
/* Sample i -> x[T] = tokens[i*T .. i*T+T), y[T] = shifted by one. */
void dt_token_batch(const dt_token_dataset *d, const int64_t *idx, int64_t n, int T, int32_t *x, int32_t *y);

/* ---- the dataset interface ----
 * Two splits of samples of one shape (nn.h's dt_sample_shape): TRAIN, which
 * the sampler shuffles, and EVAL, read in order. Open one by its registry
 * name; each implementation is one file (src/data/dataset_*.c) plus one line
 * in the registry (src/data/dataset.c), so the trainer and CLI never ask
 * which kind of data they hold.
 *
 *   dt_dataset d;
 *   dt_dataset_opts o = {.path = "corpus.txt", .seq = 64};
 *   DT_TRY(dt_dataset_open("text", &o, &d));      // loads and validates
 *   void *x[1] = {buffer of B * dt_input_bytes(&d.sample.in[0])};   // one per input
 *   int32_t y[B * d.sample.targets];
 *   dt_batch b = dt_dataset_batch(&d, DT_SPLIT_TRAIN, idx, B, x, y);   // b.in[0]: "ids" [B, T]
 *   dt_dataset_close(&d);
 */
typedef enum dt_split { DT_SPLIT_TRAIN = 0, DT_SPLIT_EVAL = 1 } dt_split;

typedef struct dt_dataset_opts {
    const char *path;        /* file or directory; NULL: the dataset's default */
    const char *val_path;    /* token data: held-out file; NULL: the last 10% of path */
    int64_t seq;             /* token data: tokens per sample T */
    /* Uneven split (part_world <= 1: no split) of the training split; the
     * eval split stays the same on every part. Token data from a directory
     * (text files, *.bin shards) keeps the files (sorted by name) k with
     * k % part_world == part_rank, each clipped to the training tokens; token
     * data from one file and Fashion-MNIST keep a contiguous range sized in
     * proportion to part_rank + 1 (2 parts: the first third, then the other
     * two thirds; 4 parts: 1/10, 2/10, 3/10, 4/10). Every part must hold at
     * least one window (one image), else every part fails naming the short one. */
    int part_rank, part_world;
    /* 1: only the validation split is read (evaluation): val_path may then
     * be, or hold, the training data (token data refuses that when training) */
    int eval_only;
} dt_dataset_opts;

typedef struct dt_dataset {
    const char *name;        /* registry name: "fashion-mnist", "text", "shard" */
    char source[512];        /* what was read (directory or file): the training data, for messages */
    char classes_source[512];/* what sets sample.classes (a vocabulary: the split with the largest id),
                                for messages about it; "" = source */
    dt_sample_shape sample;  /* every sample of both splits */
    int64_t size[2];         /* samples in [DT_SPLIT_TRAIN], [DT_SPLIT_EVAL] */
    /* how results read: throughput counts targets ("samples" / "tokens",
     * rate "samples/s" / "tok/s"); evaluation reports the loss and the
     * fraction of targets predicted right (metric) on the eval split */
    const char *unit, *rate_unit;
    const char *eval_name;   /* "test" | "validation" */
    const char *metric;      /* "accuracy" | "token accuracy" */
    int headline_loss;       /* 1: the loss is the headline result (LM); 0: the metric is */
    int eval_limited;        /* 1: evaluation may stop after --eval-batches; 0: whole split */
    /* implementation */
    void *self;
    /* samples idx[0..n) of split (each < size[split]) -> x[k]: n samples of
     * input k (dt_input_bytes(&sample.in[k]) each), y: n * sample.targets int32 */
    void (*fill)(const void *self, dt_split split, const int64_t *idx, int64_t n, void *const *x, int32_t *y);
    void (*destroy)(void *self);
} dt_dataset;

/* Names of the built-in datasets (any registered name is accepted). */
#define DT_DATA_FASHION_MNIST "fashion-mnist"   /* IDX dir: {train,t10k}-{images,labels}; test split = t10k */
#define DT_DATA_TEXT "text"                     /* bytes of a file or directory, vocab 256 */
#define DT_DATA_SHARD "shard"                   /* llm.c token shard (needs path) */

/* Open by registry name; on error *out is empty and the message names the
 * file (or the unknown name and the known ones). */
dt_status dt_dataset_open(const char *name, const dt_dataset_opts *o, dt_dataset *out);
int dt_dataset_exists(const char *name);
/* DT_OK for a registered name, else DT_EINVAL naming it and the known ones:
 * "--data: unknown dataset 'x' (fashion-mnist, text, shard)". */
dt_status dt_dataset_check_name(const char *name);
/* "fashion-mnist, text, shard" into buf (for messages); returns buf. */
const char *dt_dataset_names(char *buf, size_t n);
void dt_dataset_close(dt_dataset *d);
/* fill + the dt_batch (nn.h) whose named inputs view x[k] and targets y. */
dt_batch dt_dataset_batch(const dt_dataset *d, dt_split split, const int64_t *idx, int64_t n, void *const *x,
                          int32_t *y);

/* ---- sampler: seeded, epoch-aware shuffle, split across ranks ----
 * Each epoch is a permutation of [0, n) from (seed, epoch). Rank r of world W
 * takes positions r, r+W, r+2W, ... of it; every rank gets the same number of
 * samples per epoch (the tail that does not divide evenly is dropped, unless
 * pad = 1, in which case it is padded by wrapping around) so all ranks agree
 * on epoch boundaries. Position (epoch, cursor) is checkpointable. */
typedef struct dt_sampler {
    int64_t n;               /* dataset size */
    uint64_t seed;
    int shuffle;
    int rank, world;
    int pad;
    int64_t epoch;           /* current epoch */
    int64_t cursor;          /* next local position within the epoch */
    int64_t per_rank;        /* samples per rank per epoch */
    int64_t *perm;           /* owned, n entries, permutation for `epoch` */
} dt_sampler;
dt_status dt_sampler_init(dt_sampler *s, int64_t n, uint64_t seed, int shuffle, int rank, int world, int pad);
void dt_sampler_free(dt_sampler *s);
/* Next `batch` local sample indices into out. Returns number written; at the
 * end of an epoch returns fewer (possibly 0) and the next call starts epoch+1. */
int64_t dt_sampler_next(dt_sampler *s, int64_t batch, int64_t *out);
/* Jump to (epoch, cursor) e.g. after resume. */
dt_status dt_sampler_seek(dt_sampler *s, int64_t epoch, int64_t cursor);

#endif
