/* Dataset implementations behind dt_dataset_open (one file each). */
#ifndef DT_DATASET_INTERNAL_H
#define DT_DATASET_INTERNAL_H
#include <sys/types.h>
#include "dtrain/data.h"

typedef dt_status (*dt_dataset_open_fn)(const dt_dataset_opts *o, dt_dataset *out);
dt_status dt_dataset_open_fashion_mnist(const dt_dataset_opts *o, dt_dataset *out);
dt_status dt_dataset_open_text(const dt_dataset_opts *o, dt_dataset *out);
dt_status dt_dataset_open_shard(const dt_dataset_opts *o, dt_dataset *out);

/* ---- token streams (token_stream.c) ----
 * A split of a token dataset: ids laid end to end in pieces, one per file of
 * a directory (name order) or one for a file. A piece is a view into memory
 * a dt_token_store owns, mapped read-only where it can be (the page cache
 * holds it once per machine, shared by its ranks, so a rank's own memory
 * does not grow with the data): an llm.c shard's uint16 ids (width 2), or a
 * text file's bytes (width 1, widened as a batch copies them). Sample i is
 * the window of T+1 tokens at i*T, which may span pieces as the stream spans
 * files. Streams made by slicing share the store. */
typedef struct dt_token_piece {
    const void *ids;         /* n ids of `width` bytes (little-endian uint16 at width 2) */
    int64_t n;
    int width;               /* 1: bytes (text), 2: uint16 (shards) */
} dt_token_piece;
typedef struct dt_token_stream {
    dt_token_piece *piece;   /* [n], owned (the ids are not) */
    int64_t *end;            /* [n]: tokens in pieces 0..k */
    int n, cap;
    int64_t n_tokens;        /* end[n-1], 0 when empty */
    int vocab;               /* ids lie in [0, vocab): 256 for bytes, max id + 1 for shards */
} dt_token_stream;
/* Appends a piece of n ids of `width` bytes (n may be 0: an empty file still counts as one). */
dt_status dt_token_stream_push(dt_token_stream *s, const void *ids, int width, int64_t n, const char *path);
void dt_token_stream_free(dt_token_stream *s);
/* out = tokens [a, b) of s (0 <= a <= b <= s->n_tokens) as views, s's vocab. */
dt_status dt_token_stream_slice(const dt_token_stream *s, int64_t a, int64_t b, dt_token_stream *out,
                                const char *path);
/* (n_tokens - 1) / T windows of T+1 tokens (0 below two tokens). */
int64_t dt_token_stream_windows(const dt_token_stream *s, int T);
/* windows idx[0..n) (each < windows) -> x[n, T], y[n, T] = x shifted by one */
void dt_token_stream_batch(const dt_token_stream *s, const int64_t *idx, int64_t n, int T, int32_t *x, int32_t *y);

typedef struct dt_token_region {
    void *base;
    size_t mapped;           /* 0: malloc'd */
    dev_t dev;               /* the file's identity (0, 0: not known) */
    ino_t ino;
} dt_token_region;
typedef struct dt_token_store { dt_token_region *region; int n, cap; } dt_token_store;
/* The store takes base: munmap(base, mapped) or free(base) at dt_token_store_free
 * (also when adding fails). */
struct stat;
/* id: the file's fstat (its identity; NULL: not known) */
dt_status dt_token_store_add(dt_token_store *st, void *base, size_t mapped, const char *path, const struct stat *id);
void dt_token_store_free(dt_token_store *st);

/* ---- opening token data into a store and a stream ----
 * A file is one piece; a directory is one piece per eligible file (list_dir.c:
 * name order, links to files read, each file once, never hold_out). */
typedef dt_status (*dt_token_open_fn)(const char *path, const char *hold_out, dt_token_store *st,
                                      dt_token_stream *out);
dt_status dt_text_open(const char *path, const char *hold_out, dt_token_store *st, dt_token_stream *out);
dt_status dt_token_shard_open(const char *path, const char *hold_out, dt_token_store *st, dt_token_stream *out);
/* shard_map.c: one llm.c shard mapped read-only, its ids one piece of out
 * (out->vocab raised to cover them: every id is read once, here). */
dt_status dt_token_shard_map(const char *path, dt_token_store *st, dt_token_stream *out);
/* shard_map.c: fd's bytes [0, len) read-only into the store, *base their
 * address; *base NULL where the file system cannot map (FUSE direct_io), and
 * for len 0. Advised random access: windows are drawn at random. */
dt_status dt_token_map_fd(int fd, size_t len, const char *path, dt_token_store *st, const void **base);
/* token_shard.c: checks an llm.c shard's header (hdr: its first 1024 bytes)
 * against the file's size; *n = its token count. */
#define DT_SHARD_HDR_BYTES 1024
dt_status dt_token_shard_header(const char *path, const uint8_t *hdr, int64_t size, int64_t *n);
/* list_dir.c: the files of a data directory whose names `want` accepts:
 * regular files and links to one (not another user's links), in name order,
 * each file once, never the file hold_out names (may be NULL; *held, may be
 * NULL: 1 when it was among them); full paths, freed by dt_data_names_free. */
dt_status dt_data_list_dir(const char *dir, int (*want)(const char *name), const char *hold_out, char ***names,
                           int *n, int *held);
void dt_data_names_free(char **names, int n);

/* token_part.c: the training split of part `rank` of `world` from all (the
 * whole stream; its first n_tr tokens are for training). By file (keep_part:
 * file k -> part k % world, each clipped to n_tr) or by range (keep_range:
 * dt_part_range of the n_tr tokens). Both fail on every part alike, naming
 * the part, when some part would get fewer than T + 1 tokens. */
dt_status dt_tokens_keep_part(const dt_token_stream *all, int64_t n_tr, int rank, int world, int T, const char *path,
                              dt_token_stream *out);
dt_status dt_tokens_keep_range(const dt_token_stream *all, int64_t n_tr, int rank, int world, int T,
                               const char *path, dt_token_stream *out);
/* part.c: part `rank` of `world` of n items in one sequence, [*a, *b):
 * contiguous, sized in proportion to rank + 1 (data.h's uneven split). */
void dt_part_range(int64_t n, int rank, int world, int64_t *a, int64_t *b);

/* Token-window datasets (text, shard): opens path (and o->val_path) with
 * open, holds out the last 10% when there is no val_path, and checks there
 * is at least one training window of o->seq + 1 tokens. With o->part_world
 * > 1 the training split of a directory is cut by file, that of one file
 * into ranges. A val_path inside the training directory is held out of
 * training; one that is the training directory or file itself is refused. */
dt_status dt_dataset_open_tokens(const char *path, const dt_dataset_opts *o, dt_token_open_fn open,
                                 dt_dataset *out);
#endif
