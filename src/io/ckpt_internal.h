/* Internal to src/io/ckpt_*.c: header-only safetensors files and the
 * dt_ckpt piece table. */
#ifndef DT_IO_CKPT_INTERNAL_H
#define DT_IO_CKPT_INTERNAL_H

#include <stdint.h>
#include "dtrain/io.h"

#define DT_CKPT_INDEX_FORMAT "dtrain-zero-sharded-1"
#define DT_CKPT_INDEX_NAME "index.json"

/* One tensor of a safetensors file: where its bytes are, not the bytes. */
typedef struct dt_ckpt_entry {
    const char *name;           /* points into the file's hdr */
    dt_dtype dtype;
    int ndim;
    int64_t shape[DT_MAX_DIMS];
    uint64_t numel;
    uint64_t off;               /* absolute file offset of the first byte */
    int has_crc;                /* the header records crc for the entry's bytes */
    uint32_t crc;
    int verified;               /* crc checked against the bytes on disk */
} dt_ckpt_entry;

/* A safetensors file opened for random access (header parsed, fd kept). */
typedef struct dt_ckpt_file {
    char *path;
    int fd;                     /* -1 when closed */
    uint64_t size;
    dt_safetensors hdr;         /* the parsed header: tensors (no data) and metadata */
    dt_ckpt_entry *e; int n;    /* e[i] is hdr.tensors[i] */
} dt_ckpt_file;

/* Reads the header and validates it with the safetensors reader's parser
 * (dt_st_parse_header: offsets in range, aligned, covering the data section
 * exactly, checksums well-formed); the data stays on disk. On error f is
 * released. */
dt_status dt_ckpt_file_open(const char *path, dt_ckpt_file *f);
void dt_ckpt_file_close(dt_ckpt_file *f);
const char *dt_ckpt_file_meta(const dt_ckpt_file *f, const char *key);
/* n bytes at absolute offset off (inside the file) into dst. */
dt_status dt_ckpt_file_pread(const dt_ckpt_file *f, uint64_t off, void *dst, size_t n);
/* Entry k's checksum against its bytes on disk (once; no-op without one). */
dt_status dt_ckpt_file_verify(dt_ckpt_file *f, int k);

/* Elements [start, start + n) of a tensor live in file `file` at byte off,
 * entry `entry` of that file. */
typedef struct dt_ckpt_span { uint64_t start, n, off; int file, entry; } dt_ckpt_span;

typedef struct dt_ckpt_tensor {
    char *name;
    dt_dtype dtype;             /* sharded sets: always F32 */
    int ndim;
    int64_t shape[DT_MAX_DIMS];
    uint64_t numel;
    dt_ckpt_span *sp; int n_sp, cap_sp;   /* sorted by start, tiling [0, numel) */
} dt_ckpt_tensor;

struct dt_ckpt {
    char *path;
    int sharded;
    dt_ckpt_file *files; int n_files;
    dt_ckpt_tensor *t; int n_t;           /* sorted by name */
    char **mk, **mv; int n_meta;          /* sharded: the index's metadata */
};

/* Sharded open (ckpt_index.c): fills a zeroed c from dir/index.json. */
dt_status dt_ckpt_open_sharded(const char *dir, dt_ckpt *c);
/* Tests only: called once the index is read, before its files are opened
 * (where a save into the directory can remove them). NULL in the library. */
extern void (*dt__ckpt_after_index_read)(const char *dir);
/* Sorted tensor table helpers (ckpt_source.c). */
int dt_ckpt_tensor_cmp(const void *a, const void *b);
dt_ckpt_tensor *dt_ckpt_lookup(const dt_ckpt *c, const char *name);
dt_status dt_ckpt_add_span(dt_ckpt *c, dt_ckpt_tensor *t, dt_ckpt_span s);
char *dt_ckpt_strdup(const char *s);
void dt_ckpt_fmt_shape(int ndim, const int64_t *shape, char *buf, size_t cap);

#endif
