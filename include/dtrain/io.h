/* dtrain/io.h — safetensors files, atomic writes, metrics JSONL, Chrome traces.
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
} dt_st_tensor;
typedef struct dt_safetensors {
    char *path;
    void *file_bytes; size_t file_size;
    dt_st_tensor *tensors; int n_tensors;
    char **meta_keys, **meta_values; int n_meta;
} dt_safetensors;
/* Reads and validates the whole file: header length within file, valid JSON,
 * known dtypes, shapes <= 4-D, offsets in range, contiguous non-overlapping,
 * nbytes == numel * dtype size. Error names the file and the tensor. */
dt_status dt_safetensors_load(const char *path, dt_safetensors *st);
void dt_safetensors_free(dt_safetensors *st);
const dt_st_tensor *dt_safetensors_find(const dt_safetensors *st, const char *name);
const char *dt_safetensors_meta(const dt_safetensors *st, const char *key);  /* NULL if absent */
/* Find `name` and check dtype and shape equal the expectation; message names the tensor. */
dt_status dt_safetensors_expect(const dt_safetensors *st, const char *name, dt_dtype dtype,
                                int ndim, const int64_t *shape, const dt_st_tensor **out);

/* ---- atomic whole-file write helper ---- */
dt_status dt_write_file_atomic(const char *path, const void *bytes, size_t n);

/* ---- metrics JSONL: one JSON object per line, flushed ---- */
typedef struct dt_jsonl { FILE *f; } dt_jsonl;
dt_status dt_jsonl_open(dt_jsonl *j, const char *path);   /* append mode */
/* fields as alternating key / double value pairs, e.g. ("step", 3.0, "loss", 2.1). */
dt_status dt_jsonl_write(dt_jsonl *j, int n_fields, const char *const *keys, const double *values);
void dt_jsonl_close(dt_jsonl *j);

/* ---- Chrome trace (Perfetto-compatible) ----
 * Complete events ("ph":"X") with microsecond timestamps relative to
 * dt_trace_open; pid = rank, tid = lane (0 compute, 1 communication). Events
 * are buffered in memory and written (atomically) by dt_trace_close. */
typedef struct dt_trace dt_trace;
dt_status dt_trace_open(dt_trace **t, const char *path, int rank);
double dt_trace_now_us(const dt_trace *t);          /* 0 if t is NULL */
void dt_trace_event(dt_trace *t, const char *name, const char *cat, int lane,
                    double begin_us, double end_us);   /* no-op if t is NULL; name copied */
void dt_trace_instant(dt_trace *t, const char *name, int lane);
dt_status dt_trace_close(dt_trace *t);              /* writes file; frees */

#endif
