/* Random-access safetensors: only the header is read at open and validated
 * by the safetensors reader's own parser (st_internal.h); tensor bytes are
 * read later with pread (checkpoint loads read just the ranges they need,
 * never the whole file) and checked against their CRC-32 when one is recorded. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "ckpt_internal.h"
#include "st_internal.h"

#define HEADER_MAX ((uint64_t)1 << 30)   /* refuse absurd header lengths before allocating */
#define VERIFY_CHUNK ((size_t)1 << 20)    /* bytes per read when checking a whole entry */

static dt_status read_full(int fd, const char *path, uint64_t off, void *dst, size_t n) {
    unsigned char *p = dst;
    while (n > 0) {
        ssize_t k = pread(fd, p, n, (off_t)off);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) return DT_ERR(DT_EIO, "%s: read failed: %s", path, strerror(errno));
        if (k == 0) return DT_ERR(DT_EFORMAT, "%s: unexpected end of file at byte %" PRIu64, path, off);
        p += k; off += (uint64_t)k; n -= (size_t)k;
    }
    return DT_OK;
}

/* The entry table over the parsed header (data section starts at data_start). */
static dt_status fill_entries(dt_ckpt_file *f, uint64_t data_start) {
    f->e = calloc((size_t)f->hdr.n_tensors + 1, sizeof *f->e);
    if (!f->e) return DT_ERR(DT_ENOMEM, "%s: out of memory", f->path);
    for (int i = 0; i < f->hdr.n_tensors; i++) {
        const dt_st_tensor *t = &f->hdr.tensors[i];
        dt_ckpt_entry *e = &f->e[i];
        e->name = t->name;
        e->dtype = t->dtype;
        e->ndim = t->ndim;
        memcpy(e->shape, t->shape, sizeof e->shape);
        e->numel = t->nbytes / dt_dtype_size(t->dtype);
        e->off = data_start + t->offset;
        e->has_crc = t->has_crc;
        e->crc = t->crc;
    }
    f->n = f->hdr.n_tensors;
    return DT_OK;
}

dt_status dt_ckpt_file_open(const char *path, dt_ckpt_file *f) {
    memset(f, 0, sizeof *f);
    f->fd = -1;
    if (!(f->path = dt_ckpt_strdup(path))) return DT_ERR(DT_ENOMEM, "%s: out of memory", path);
    dt_status s = DT_OK;
    char *text = NULL;
    struct stat sb;
    unsigned char lb[8];
    uint64_t n = 0;
    s = dt_io_open_regular(path, &f->fd, &sb);   /* (a FIFO: refused, not waited on) */
    if (s == DT_OK && (f->size = (uint64_t)sb.st_size) < 8)
        s = DT_ERR(DT_EFORMAT, "%s: %" PRIu64 " bytes, too short for a safetensors file", path, f->size);
    if (s == DT_OK) s = read_full(f->fd, path, 0, lb, 8);
    if (s == DT_OK) {
        for (int i = 7; i >= 0; i--) n = (n << 8) | lb[i];
        if (n > f->size - 8 || n > HEADER_MAX)
            s = DT_ERR(DT_EFORMAT, "%s: header length %" PRIu64 " exceeds the file (%" PRIu64 " bytes)",
                       path, n, f->size);
    }
    if (s == DT_OK && !(text = malloc((size_t)n + 1))) s = DT_ERR(DT_ENOMEM, "%s: out of memory", path);
    if (s == DT_OK) s = read_full(f->fd, path, 8, text, (size_t)n);
    if (s == DT_OK) s = dt_st_parse_header(path, text, n, f->size - 8 - n, &f->hdr);
    if (s == DT_OK) s = fill_entries(f, 8 + n);
    free(text);
    if (s != DT_OK) dt_ckpt_file_close(f);
    return s;
}

void dt_ckpt_file_close(dt_ckpt_file *f) {
    if (!f) return;
    if (f->fd >= 0) close(f->fd);
    dt_safetensors_free(&f->hdr);
    free(f->e);
    free(f->path);
    memset(f, 0, sizeof *f);
    f->fd = -1;
}

const char *dt_ckpt_file_meta(const dt_ckpt_file *f, const char *key) {
    return dt_safetensors_meta(&f->hdr, key);
}

dt_status dt_ckpt_file_pread(const dt_ckpt_file *f, uint64_t off, void *dst, size_t n) {
    if (off > f->size || n > f->size - off)
        return DT_ERR(DT_EFORMAT, "%s: read of %zu bytes at %" PRIu64 " beyond the file", f->path, n, off);
    return read_full(f->fd, f->path, off, dst, n);
}

dt_status dt_ckpt_file_verify(dt_ckpt_file *f, int k) {
    dt_ckpt_entry *e = &f->e[k];
    if (!e->has_crc || e->verified) return DT_OK;
    size_t left = (size_t)(e->numel * dt_dtype_size(e->dtype)), cap = left < VERIFY_CHUNK ? left : VERIFY_CHUNK;
    unsigned char *buf = malloc(cap ? cap : 1);
    if (!buf) return DT_ERR(DT_ENOMEM, "%s: out of memory", f->path);
    uint32_t crc = 0;
    uint64_t off = e->off;
    dt_status s = DT_OK;
    while (s == DT_OK && left > 0) {
        size_t m = left < cap ? left : cap;
        s = dt_ckpt_file_pread(f, off, buf, m);
        if (s == DT_OK) crc = dt_st_crc_update(crc, buf, m);
        off += m;
        left -= m;
    }
    free(buf);
    if (s == DT_OK) s = dt_st_crc_verify(f->path, e->name, e->crc, crc);
    if (s == DT_OK) e->verified = 1;
    return s;
}
