/* Internal to src/io: the one safetensors header parser and the per-tensor
 * checksums every reader and writer share. */
#ifndef DT_IO_ST_INTERNAL_H
#define DT_IO_ST_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include "dtrain/io.h"

#define DT_ST_CRC_PREFIX "crc32."   /* metadata key of a tensor's checksum: prefix + name */

/* Parses and validates the n-byte header raw (not NUL-terminated) of a file
 * whose data section has data_size bytes: JSON, dtypes, shapes, offsets in
 * range, element-aligned, covering the data section exactly without overlap,
 * no duplicate names or metadata keys, well-formed checksums naming a tensor.
 * Fills st's tensors (offset, nbytes, crc; data NULL), metadata and nothing
 * else; on error the caller frees st (dt_safetensors_free). */
dt_status dt_st_parse_header(const char *path, const char *raw, uint64_t n, uint64_t data_size,
                             dt_safetensors *st);
/* 1 if the JSON text escapes a NUL ("\u0000"): a C string from it would end
 * there, so "fc1.bias\u0000x" would read as another tensor's name "fc1.bias" */
int dt_json_escapes_nul(const char *text);

/* Opens path for reading, refusing anything but a regular file (a FIFO,
 * device, socket or directory: DT_EIO naming path and what it is) without
 * blocking on it: a FIFO is opened O_NONBLOCK, then the flag is cleared.
 * *fd and *sb filled on DT_OK; nothing left open otherwise. */
struct stat;
dt_status dt_io_open_regular(const char *path, int *fd, struct stat *sb);

/* zlib CRC-32 continued over n bytes (any n). */
uint32_t dt_st_crc_update(uint32_t crc, const void *p, size_t n);
/* DT_OK if crc is the one recorded for tensor `name`, else an error naming both. */
dt_status dt_st_crc_verify(const char *path, const char *name, uint32_t want, uint32_t got);

#endif
