/* Internal to src/io: the writer a thread captures into (bg_write.c), and
 * the queueing the capturing write calls use instead of writing. */
#ifndef DT_IO_BG_INTERNAL_H
#define DT_IO_BG_INTERNAL_H

#include "dtrain/io.h"

/* The calling thread's capture (dt_bg_writer_capture), or NULL. */
dt_bg_writer *dt__bg_capturing(void);
/* A file of these entries, their bytes copied now. */
dt_status dt__bg_queue_copy(dt_bg_writer *w, const char *path, const dt_st_entry *e, int n, const dt_st_meta *meta,
                            int n_meta);
/* The same, the bytes already in data (entries back to back, data_bytes in
 * all, from dt__bg_alloc with capacity data_cap; taken over, freed also on
 * failure). */
dt_status dt__bg_queue_owned(dt_bg_writer *w, const char *path, const dt_st_entry *e, int n, const dt_st_meta *meta,
                             int n_meta, void *data, size_t data_bytes, size_t data_cap);
/* memcpy, on every OpenMP thread when large */
void dt__bg_copy(void *dst, const void *src, size_t n);
/* A copy buffer of at least bytes (*cap: its size): a finished job's, else new. */
void *dt__bg_alloc(dt_bg_writer *w, size_t bytes, size_t *cap);
/* dt_ckpt_write_index's arguments, copied; run once the set's shards are all visible. */
dt_status dt__bg_queue_index(dt_bg_writer *w, const char *dir, const char *set, int world, int stage,
                             const dt_ckpt_shape *tensors, int n_tensors, const dt_st_meta *meta, int n_meta);
/* The calling thread's next queued file is a shard of a sharded set (on) or
 * not: a shard written since the capture began is removed by
 * dt_bg_writer_abandon. */
void dt__bg_next_is_shard(int on);
/* ckpt_write.c: rank's shard file name of set; 0 if it does not fit. */
int dt__ckpt_shard_name(char *buf, size_t cap, const char *set, int rank);
/* 1 when the shard file at path belongs to the set its directory's index.json commits */
int dt__ckpt_shard_committed(const char *shard_path);

#endif
