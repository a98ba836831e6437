/* Internal: write a file through a temp file in the same directory, then
 * fsync + rename + directory fsync. Shared by every writer (io, data). */
#ifndef DTRAIN_UTIL_ATOMIC_FILE_H
#define DTRAIN_UTIL_ATOMIC_FILE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include "dtrain/error.h"

typedef struct dt_atomic_file {
    FILE *f;          /* open temp file; NULL once closed */
    char *path;       /* final destination */
    char *tmp_path;   /* path + ".tmp.<pid>.<n>" */
} dt_atomic_file;

/* Create the temp file next to path. On failure nothing is left behind.
 * First removes path's temp files whose writer process is dead (killed
 * saves); a live writer's are kept. */
dt_status dt_atomic_open(dt_atomic_file *af, const char *path);
/* Append n bytes to the temp file. On failure the temp file stays open: call
 * dt_atomic_discard. */
dt_status dt_atomic_write(dt_atomic_file *af, const void *bytes, size_t n);
/* fflush, fsync, close, rename over path, fsync the directory. On failure the
 * temp file is removed and an existing file at path is left untouched.
 * Always releases af. */
dt_status dt_atomic_commit(dt_atomic_file *af);
/* Overwrite n bytes at file offset off (already written) of the temp file. */
dt_status dt_atomic_pwrite(dt_atomic_file *af, uint64_t off, const void *bytes, size_t n);
/* Close and remove the temp file; releases af. Safe on a zeroed af. */
void dt_atomic_discard(dt_atomic_file *af);
/* The whole file in one call (also public in io.h). */
dt_status dt_write_file_atomic(const char *path, const void *bytes, size_t n);

#endif
