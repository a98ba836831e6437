/* dtrain/io.h — safetensors files, sharded checkpoint sets, atomic writes, metrics JSONL
 * (Chrome traces: trace.h, included here).
 *
 * safetensors layout: u64 little-endian header length N, N bytes of JSON
 * {"name": {"dtype": "F32", "shape": [..], "data_offsets": [b, e]}, ...,
 *  "__metadata__": {"key": "string value"}}, then the data section.
 * Files are written atomically: temp file in the same directory, fsync,
 * rename, fsync of the directory — a crash leaves the old file intact.
 */
#ifndef DTRAIN_IO_H
#define DTRAIN_IO_H

#include <stdint.h>
#include <stdio.h>
#include "dtrain/tensor.h"
#include "dtrain/trace.h"

/* ---- writing ---- */
typedef struct dt_st_entry {
    const char *name;
    dt_dtype dtype;
    int ndim;
    int64_t shape[DT_MAX_DIMS];
    const void *data;           /* numel * dtype size bytes */
} dt_st_entry;
typedef struct dt_st_meta { const char *key, *value; } dt_st_meta;

/* Write entries (in the given order) and metadata atomically to path. */
dt_status dt_safetensors_write(const char *path, const dt_st_entry *entries, int n_entries,
                               const dt_st_meta *meta, int n_meta);

/* Streaming writer for data that is produced piece by piece (consolidated
 * ZeRO checkpoints): the header is declared up front, then tensors' bytes are
 * appended in entry order, possibly in several chunks. */
typedef struct dt_st_writer dt_st_writer;
dt_status dt_st_writer_open(dt_st_writer **w, const char *path, const dt_st_entry *entries,
                            int n_entries, const dt_st_meta *meta, int n_meta);
dt_status dt_st_writer_append(dt_st_writer *w, const void *bytes, size_t n);
dt_status dt_st_writer_commit(dt_st_writer *w);   /* checks sizes, fsync, rename; frees w */
void dt_st_writer_abort(dt_st_writer *w);         /* removes the temp file; frees w */

/* ---- reading ---- */
typedef struct dt_st_tensor {
    char *name;
    dt_dtype dtype;
    int ndim;
    int64_t shape[DT_MAX_DIMS];
    const void *data;           /* into the file's data section */
    size_t nbytes;
    uint64_t offset;            /* of the first byte, in the data section */
    int has_crc;                /* 1: the header records crc (CRC-32 of the nbytes) */
    uint32_t crc;
} dt_st_tensor;
typedef struct dt_safetensors {
    char *path;
    void *file_bytes; size_t file_size;
    dt_st_tensor *tensors; int n_tensors;
    char **meta_keys, **meta_values; int n_meta;
} dt_safetensors;
/* Reads and validates the whole file: header length within file, valid JSON,
 * known dtypes, shapes <= 4-D, offsets in range, contiguous non-overlapping,
 * nbytes == numel * dtype size, and each tensor's CRC-32 where the metadata
 * records one. Error names the file and the tensor. Every safetensors reader
 * (dt_ckpt included) parses headers with this code.
 *
 * Checksums: every dtrain writer records metadata "crc32.<tensor>" = 8 lower-case
 * hex digits, the zlib CRC-32 of the tensor's bytes (files without them, e.g.
 * from other tools, load unchecked). */
dt_status dt_safetensors_load(const char *path, dt_safetensors *st);
void dt_safetensors_free(dt_safetensors *st);
const dt_st_tensor *dt_safetensors_find(const dt_safetensors *st, const char *name);
const char *dt_safetensors_meta(const dt_safetensors *st, const char *key);  /* NULL if absent */
/* Find `name` and check dtype and shape equal the expectation; message names the tensor. */
dt_status dt_safetensors_expect(const dt_safetensors *st, const char *name, dt_dtype dtype,
                                int ndim, const int64_t *shape, const dt_st_tensor **out);

/* ---- checkpoint sources: one safetensors file or a sharded set ----
 * A sharded set is a directory written by every rank of a job:
 *   shard-<set>-r<R>.safetensors   rank R's pieces: 1-D F32 tensors named
 *                                  "<tensor>@<start>" holding elements
 *                                  [start, start + n) of the flattened tensor;
 *                                  metadata "set" = <set>, "rank" = R, "world"
 *   index.json                     written last by rank 0 (the commit point):
 *     {"format": "dtrain-zero-sharded-1", "world": W, "stage": S, "set": "<set>",
 *      "files": [{"name": "shard-<set>-r0.safetensors", "bytes": B}, ...],  (one per rank)
 *      "tensors": {"<tensor>": [shape], ...},
 *      "metadata": {"<key>": "<value>", ...}}                             (the checkpoint's)
 * <set> ("<step>-<8 hex nonce>") differs for every save, so a crash mid-save
 * never mixes sets and the previous set stays loadable until the new index
 * lands; files of other sets are removed after it has.
 *
 * dt_ckpt reads either kind the same way: whole-tensor shapes and ranges of
 * flattened F32 elements, from whichever pieces hold them. Only headers are
 * read at open; data is read on demand. */
typedef struct dt_ckpt dt_ckpt;
/* path: a safetensors file, or a directory with index.json. A sharded set is
 * validated completely: index format, every file present with the listed size
 * and the set's id, pieces F32 and tiling [0, numel) of every tensor exactly. */
dt_status dt_ckpt_open(const char *path, dt_ckpt **out);
void dt_ckpt_close(dt_ckpt *c);
const char *dt_ckpt_path(const dt_ckpt *c);
int dt_ckpt_is_sharded(const dt_ckpt *c);
/* The checkpoint's metadata (file __metadata__ / index "metadata"); NULL if absent.
 * (Not dt_ckpt_meta: train.h names the trainer's metadata block so.) */
const char *dt_ckpt_get_meta(const dt_ckpt *c, const char *key);
/* 1 and the full shape if the tensor exists, else 0. shape: DT_MAX_DIMS slots. */
int dt_ckpt_find(const dt_ckpt *c, const char *name, int *ndim, int64_t *shape);
/* Present with exactly this shape, else an error naming tensor and file. */
dt_status dt_ckpt_expect(const dt_ckpt *c, const char *name, int ndim, const int64_t *shape);
/* Elements [start, start + n) of the flattened F32 tensor into dst. */
dt_status dt_ckpt_read(const dt_ckpt *c, const char *name, size_t start, size_t n, float *dst);

/* ---- inspecting a checkpoint (dtrain inspect) ----
 * Everything dt_ckpt_open read, by position: metadata in the file's (or
 * index's) order, tensors in name order, a set's files in rank order; and
 * the recorded checksums checked against the bytes on disk, tensor by tensor
 * (every piece of a sharded tensor), so every bad tensor can be named. */
int dt_ckpt_meta_count(const dt_ckpt *c);
/* Key of metadata entry i (NULL past the end), its value into *value. A
 * single file's "crc32.<tensor>" keys are listed too. */
const char *dt_ckpt_meta_at(const dt_ckpt *c, int i, const char **value);
typedef struct dt_ckpt_info {
    const char *name;            /* the whole tensor's name (valid while c is open) */
    dt_dtype dtype;
    int ndim;
    int64_t shape[DT_MAX_DIMS];
    uint64_t bytes;              /* numel * dtype size */
    int pieces;                  /* where it is stored: 1 for a file, the pieces of a sharded set */
    int checksummed;             /* pieces whose CRC-32 is recorded */
    uint64_t offset;             /* a file: absolute offset of its first byte (0 for a sharded set) */
} dt_ckpt_info;
int dt_ckpt_tensor_count(const dt_ckpt *c);
dt_status dt_ckpt_tensor_at(const dt_ckpt *c, int i, dt_ckpt_info *out);   /* DT_EINVAL past the end */
int dt_ckpt_file_count(const dt_ckpt *c);   /* 1 for a file; a set's shard files */
/* Path and size of file i (NULL past the end). */
const char *dt_ckpt_file_at(const dt_ckpt *c, int i, uint64_t *bytes);
/* Tensor i's recorded checksums against its bytes on disk (each piece read
 * once): DT_OK when all match or none is recorded (*checked: how many pieces
 * had one), DT_EFORMAT naming the file, the tensor (piece) and both CRCs on
 * the first mismatch; DT_EIO when its bytes cannot be read. */
dt_status dt_ckpt_verify_tensor(dt_ckpt *c, int i, int *checked);

/* ---- writing a sharded set (the caller synchronises the ranks) ----
 *   rank 0: dt_ckpt_set_id, dt_ckpt_prepare_dir;  share the id;  barrier
 *   every rank: dt_ckpt_write_shard;  agree that all succeeded
 *   rank 0: dt_ckpt_write_index (commit, then removes other sets' files) */
#define DT_CKPT_SET_MAX 40
typedef struct dt_ckpt_piece {
    const char *tensor;          /* full tensor name */
    size_t start, n;             /* element range of the flattened tensor */
    const float *data;           /* n floats */
} dt_ckpt_piece;
typedef struct dt_ckpt_shape { const char *name; int ndim; int64_t shape[DT_MAX_DIMS]; } dt_ckpt_shape;
/* "<step>-<nonce as 8 hex digits>" into out[DT_CKPT_SET_MAX]. */
void dt_ckpt_set_id(int64_t step, uint32_t nonce, char *out);
uint32_t dt_ckpt_nonce(void);    /* from the clock and pid; differs between saves */
/* A directory a checkpoint may be written into (missing is fine): DT_EINVAL
 * naming the path, the owner's uid and why, when it is a symbolic link owned
 * by another user (not this one, not root), a directory owned by another
 * user, or one every user can write (o+w without the sticky bit). */
dt_status dt_ckpt_check_dir(const char *dir);
/* dt_ckpt_check_dir, then creates dir if missing (mode 0775 & ~umask: never
 * o+w); an existing non-directory is an error. */
dt_status dt_ckpt_prepare_dir(const char *dir);
/* Removes rank's shard file of set (a save the ranks agreed failed); a file
 * already gone is not an error, and a set dir/index.json commits is kept.
 * While capturing (background writes) it does nothing: the writer removes
 * what it wrote (dt_bg_writer_abandon). */
dt_status dt_ckpt_discard_shard(const char *dir, const char *set, int rank);
/* One writer per directory: creates dir if missing and locks its lock file
 * (DT_CKPT_LOCK_NAME, fcntl write lock) for as long as *fd stays open; the
 * file records "pid <pid> host <host>". Held by another process: DT_ESTATE
 * naming the directory and the holder's pid and host. Unlock: close (or
 * dt_ckpt_unlock_dir); a process that dies releases it. */
#define DT_CKPT_LOCK_NAME ".dtrain.lock"
dt_status dt_ckpt_lock_dir(const char *dir, int *fd);
void dt_ckpt_unlock_dir(int fd);
/* Rank's file of the set (its id from dt_ckpt_set_id; another is refused),
 * written atomically. Zero-length pieces are skipped. */
dt_status dt_ckpt_write_shard(const char *dir, const char *set, int rank, int world,
                              const dt_ckpt_piece *pieces, int n_pieces);
/* Rank 0, after every shard was written: index.json (file sizes from the
 * directory) atomically, then removes the files of any other set. */
dt_status dt_ckpt_write_index(const char *dir, const char *set, int world, int stage,
                              const dt_ckpt_shape *tensors, int n_tensors,
                              const dt_st_meta *meta, int n_meta);

/* ---- background writes ----
 * A writer thread that takes checkpoint files off the training loop. While a
 * thread captures into it, that thread's dt_safetensors_write, dt_st_writer
 * and dt_ckpt_write_index check their arguments, copy what they would write
 * into memory and return; the writer thread writes the same bytes (checksums,
 * temp file + rename) in the order queued. A sharded set's index waits until
 * every rank's shard file of the set is visible in the directory, so the set
 * commits once all ranks' writes are done and never before (ranks on other
 * machines need a shared directory, as for any sharded set). The thread
 * blocks every signal and never calls MPI.
 *   dt_bg_writer_capture(w) ... save ... dt_bg_writer_capture(NULL);
 *   ... training goes on ...
 *   dt_bg_writer_wait(w, 0)   this rank's files written (first error since
 *                             the last wait); the caller agrees across ranks,
 *                             then (all ok) waits with_index = 1, else
 *                             cancels the index (the set is not committed). */
typedef struct dt_bg_writer dt_bg_writer;
dt_status dt_bg_writer_create(dt_bg_writer **out);
void dt_bg_writer_capture(dt_bg_writer *w);   /* the calling thread's writes; NULL: write directly */
dt_status dt_bg_writer_wait(dt_bg_writer *w, int with_index);
void dt_bg_writer_cancel_index(dt_bg_writer *w);   /* pending indexes give up; returns when they have */
/* A save the ranks agreed failed: pending indexes give up, queued files are
 * written, then every shard file of a sharded set this writer wrote since
 * the capture began is removed (its set never commits) and the writer's
 * error is cleared. Returns when done. */
void dt_bg_writer_abandon(dt_bg_writer *w);
int dt_bg_writer_busy(dt_bg_writer *w);              /* jobs queued or running */
size_t dt_bg_writer_peak_bytes(dt_bg_writer *w);     /* most copy bytes held at once */
/* Files still queued are written; an index still waiting for shards gives up. */
void dt_bg_writer_free(dt_bg_writer *w);

/* ---- atomic whole-file write helper ---- */
dt_status dt_write_file_atomic(const char *path, const void *bytes, size_t n);

/* ---- metrics JSONL: one JSON object per line, flushed ---- */
typedef struct dt_jsonl { FILE *f; char path[1024]; /* for messages */ } dt_jsonl;
/* Append mode. A final symbolic link that another user planted in a sticky,
 * world-writable directory (/tmp) is refused (DT_EINVAL naming it). */
dt_status dt_jsonl_open(dt_jsonl *j, const char *path);
/* Would dt_jsonl_open succeed? (Creates nothing; a missing file is DT_OK.) */
dt_status dt_jsonl_check(const char *path);
/* fields as alternating key / double value pairs, e.g. ("step", 3.0, "loss", 2.1). */
dt_status dt_jsonl_write(dt_jsonl *j, int n_fields, const char *const *keys, const double *values);
dt_status dt_jsonl_close(dt_jsonl *j);   /* the close's result (buffered data is written); idempotent */
/* Removes the lines of steps after `step` (a resumed run logs them again)
 * of the file's last run (from where its training steps last went down:
 * another run appended before it keeps its lines); a missing file is
 * DT_OK. Same link rule as dt_jsonl_open. */
dt_status dt_jsonl_drop_after(const char *path, int64_t step);

#endif
