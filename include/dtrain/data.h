/* dtrain/data.h — datasets and the distributed sampler.
 *
 * Readers treat every length and offset in a file as hostile and fail with
 * a message naming the file and what is wrong.
 */
#ifndef DTRAIN_DATA_H
#define DTRAIN_DATA_H

#include <stddef.h>
#include <stdint.h>
#include "dtrain/error.h"

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

/* Images as float [N, 1, H, W] normalised to (x/255 - mean)/std, labels int32[N]. */
typedef struct dt_image_dataset {
    float *images;          /* owned, count * rows * cols */
    int32_t *labels;        /* owned */
    int64_t count;
    int rows, cols, n_classes;
} dt_image_dataset;
/* dir holds {train,t10k}-images-idx3-ubyte.gz and -labels-idx1-ubyte.gz.
 * split: "train" or "test". Default dir: DT_FASHION_MNIST_DIR. */
#define DT_FASHION_MNIST_DIR "/usr/share/datasets/fashion-mnist"
dt_status dt_fashion_mnist_load(const char *dir, const char *split, dt_image_dataset *out);
void dt_image_dataset_free(dt_image_dataset *d);
/* Copy samples idx[0..n) into x[n, 1, rows, cols], y[n]. */
void dt_image_batch(const dt_image_dataset *d, const int64_t *idx, int64_t n, float *x, int32_t *y);

/* ---- token datasets (language modelling) ---- */
typedef struct dt_token_dataset {
    uint16_t *tokens;       /* owned */
    int64_t n_tokens;
    int vocab;              /* 256 for bytes; from the data for shards (max id + 1 lower bound) */
} dt_token_dataset;
/* Bytes of a text file, or of every regular file in a directory (sorted by name,
 * fortune index files *.dat skipped), each byte one token (vocab 256). */
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
