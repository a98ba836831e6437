/* Dataset implementations behind dt_dataset_open (one file each). */
#ifndef DT_DATASET_INTERNAL_H
#define DT_DATASET_INTERNAL_H
#include "dtrain/data.h"

typedef dt_status (*dt_dataset_open_fn)(const dt_dataset_opts *o, dt_dataset *out);
dt_status dt_dataset_open_fashion_mnist(const dt_dataset_opts *o, dt_dataset *out);
dt_status dt_dataset_open_text(const dt_dataset_opts *o, dt_dataset *out);
dt_status dt_dataset_open_shard(const dt_dataset_opts *o, dt_dataset *out);

/* Where each file of a text directory ends in its token stream: end[k]
 * (cumulative, non-decreasing) for the k-th file in name order. */
typedef struct dt_text_files { int64_t *end; int n; } dt_text_files;
void dt_text_files_free(dt_text_files *f);
/* list_dir.c: the files of a data directory whose names `want` accepts:
 * regular files and links to one (not another user's links), in name order,
 * each file once, never the file hold_out names (may be NULL; *held, may be
 * NULL: 1 when it was among them); full paths, freed by dt_data_names_free. */
dt_status dt_data_list_dir(const char *dir, int (*want)(const char *name), const char *hold_out, char ***names,
                           int *n, int *held);
void dt_data_names_free(char **names, int n);

/* dt_text_load of a file or directory without the held-out file (see
 * dt_data_list_dir); _files: of a directory, also returning the file
 * boundaries (a path that is not a directory fails: nothing to split). */
dt_status dt_text_load_path(const char *path, const char *hold_out, dt_token_dataset *out);
dt_status dt_text_load_files(const char *dir, const char *hold_out, dt_token_dataset *out, dt_text_files *files);
/* token_part.c: keeps in tr (the training tokens, a prefix of the stream f
 * describes) the files of part `rank` of `world` (file k -> part k % world).
 * Fails on every part alike, naming the part, when some part would get
 * fewer than T + 1 tokens. */
dt_status dt_tokens_keep_part(dt_token_dataset *tr, const dt_text_files *f, int rank, int world, int T,
                              const char *path);

/* part.c: part `rank` of `world` of n items in one sequence, [*a, *b):
 * contiguous, sized in proportion to rank + 1 (data.h's uneven split). */
void dt_part_range(int64_t n, int rank, int world, int64_t *a, int64_t *b);
/* token_part.c: keeps in tr (the training tokens of one file) part `rank`
 * of `world` by dt_part_range; fails on every part alike, naming the part,
 * when some part would get fewer than T + 1 tokens. */
dt_status dt_tokens_keep_range(dt_token_dataset *tr, int rank, int world, int T, const char *path);
/* shard_dir.c: llm.c shards from a file or a directory of *.bin shards (name
 * order, concatenated, without the held-out file); _files also returns where
 * each shard ends. */
dt_status dt_token_shard_load_path(const char *path, const char *hold_out, dt_token_dataset *out);
dt_status dt_token_shard_load_files(const char *dir, const char *hold_out, dt_token_dataset *out, dt_text_files *files);

/* Token-window datasets (text, shard): reads path (and o->val_path) with
 * load, holds out the last 10% when there is no val_path, and checks there is
 * at least one training window of o->seq + 1 tokens. With o->part_world > 1
 * the training split of a directory is cut by file (load_files), that of one
 * file into ranges (dt_tokens_keep_range). A val_path inside the training
 * directory is held out of training (hold_out); one that is the training
 * directory or file itself is refused. */
typedef dt_status (*dt_token_load_fn)(const char *path, const char *hold_out, dt_token_dataset *out);
typedef dt_status (*dt_token_load_files_fn)(const char *path, const char *hold_out, dt_token_dataset *out,
                                            dt_text_files *files);
dt_status dt_dataset_open_tokens(const char *path, const dt_dataset_opts *o, dt_token_load_fn load,
                                 dt_token_load_files_fn load_files, dt_dataset *out);
#endif
