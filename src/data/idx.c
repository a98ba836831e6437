/* IDX reader (MNIST / Fashion-MNIST), gzip or raw.
 *
 * Layout: magic 0x00 0x00 <dtype> <ndim>, ndim big-endian uint32 dims, then
 * prod(dims) bytes. Only dtype 0x08 (unsigned byte) and ndim 1..4 are accepted.
 * Every length is hostile: the dims product is overflow-checked and capped,
 * the buffer grows with the data actually read (a tiny file cannot make us
 * allocate its claimed size up front), short data is "truncated", and bytes
 * after the declared data are rejected as trailing garbage ("trailing data").
 * gzread passes non-gzip files through unchanged, so raw files work the same
 * way. Note zlib itself ignores non-gzip bytes after the last gzip member, so
 * those are accepted; a bad CRC or corrupt deflate data is DT_EFORMAT.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>
#include "dtrain/data.h"

#define IDX_MAX_BYTES ((int64_t)1 << 36)   /* 64 GiB: far above any real IDX file */
#define IDX_CHUNK ((int64_t)1 << 24)       /* read / growth step */

/* Read up to len bytes; returns bytes read, or -1 with *st set (message names path). */
static int64_t idx_read(gzFile gz, const char *path, void *buf, int64_t len, dt_status *st) {
    int64_t got = 0;
    while (got < len) {
        int64_t want = len - got;
        if (want > IDX_CHUNK) want = IDX_CHUNK;
        int r = gzread(gz, (uint8_t *)buf + got, (unsigned)want);
        if (r < 0) {
            int zerr = 0;
            const char *msg = gzerror(gz, &zerr);
            if (zerr == Z_ERRNO)
                *st = DT_ERR(DT_EIO, "%s: read failed: %s", path, strerror(errno));
            else if (zerr == Z_BUF_ERROR)   /* gzip stream cut short */
                *st = DT_ERR(DT_EFORMAT, "%s: truncated gzip stream after %lld bytes of output",
                             path, (long long)got);
            else {
                /* zlib prefixes its message with the path; drop that copy */
                size_t pl = strlen(path);
                if (msg && strncmp(msg, path, pl) == 0 && msg[pl] == ':') {
                    msg += pl + 1;
                    if (*msg == ' ') msg++;
                }
                *st = DT_ERR(DT_EFORMAT, "%s: corrupt gzip stream: %s", path, msg ? msg : "unknown error");
            }
            return -1;
        }
        if (r == 0) break;
        got += r;
    }
    return got;
}

static uint32_t be32(const uint8_t *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

/* Parse header + data from an open stream into out (out zeroed by caller). */
static dt_status idx_parse(gzFile gz, const char *path, dt_idx *out) {
    dt_status st = DT_OK;
    uint8_t hdr[4 + 4 * 4];
    int64_t n = idx_read(gz, path, hdr, 4, &st);
    if (n < 0) return st;
    if (n < 4)
        return DT_ERR(DT_EFORMAT, "%s: truncated: file has %lld bytes, too short for an IDX header",
                      path, (long long)n);
    if (hdr[0] != 0 || hdr[1] != 0)
        return DT_ERR(DT_EFORMAT, "%s: bad magic %02x %02x %02x %02x (expected 00 00 08 <ndim>)",
                      path, hdr[0], hdr[1], hdr[2], hdr[3]);
    if (hdr[2] != 0x08)
        return DT_ERR(DT_EFORMAT, "%s: unsupported IDX element type 0x%02x (only 0x08 unsigned byte)",
                      path, hdr[2]);
    int ndim = hdr[3];
    if (ndim < 1 || ndim > 4)
        return DT_ERR(DT_EFORMAT, "%s: unsupported ndim %d (expected 1..4)", path, ndim);

    n = idx_read(gz, path, hdr + 4, 4 * (int64_t)ndim, &st);
    if (n < 0) return st;
    if (n < 4 * ndim)
        return DT_ERR(DT_EFORMAT, "%s: truncated: header declares %d dims but only %lld dim bytes follow",
                      path, ndim, (long long)n);

    /* total = prod(dims) <= IDX_MAX_BYTES; each dim <= 2^32-1 so the check
     * before each multiply keeps the product inside int64. */
    int64_t total = 1, item = 1;
    for (int i = 0; i < ndim; i++) {
        int64_t d = be32(hdr + 4 + 4 * i);
        if (d == 0)
            return DT_ERR(DT_EFORMAT, "%s: dimension %d is zero", path, i);
        if (total > IDX_MAX_BYTES / d)
            return DT_ERR(DT_EFORMAT, "%s: dims product overflows the %lld-byte limit", path,
                          (long long)IDX_MAX_BYTES);
        total *= d;
        if (i > 0) item *= d;
        out->dims[i] = d;
    }

    /* Grow the buffer as data arrives: capacity never exceeds what was read + one chunk. */
    uint8_t *buf = NULL;
    int64_t have = 0, cap = 0;
    while (have < total) {
        if (have == cap) {
            int64_t ncap = cap ? cap * 2 : IDX_CHUNK;
            if (ncap > total) ncap = total;
            uint8_t *nb = realloc(buf, (size_t)ncap);
            if (!nb) {
                free(buf);
                return DT_ERR(DT_ENOMEM, "%s: out of memory reading %lld bytes", path, (long long)ncap);
            }
            buf = nb;
            cap = ncap;
        }
        int64_t want = cap - have;
        n = idx_read(gz, path, buf + have, want, &st);
        if (n < 0) { free(buf); return st; }
        have += n;
        if (n < want) break;   /* short read: end of input */
    }
    if (have < total) {
        free(buf);
        return DT_ERR(DT_EFORMAT, "%s: truncated: expected %lld bytes of data, got %lld",
                      path, (long long)total, (long long)have);
    }
    uint8_t extra;
    n = idx_read(gz, path, &extra, 1, &st);
    if (n < 0) { free(buf); return st; }
    if (n > 0) {
        free(buf);
        return DT_ERR(DT_EFORMAT, "%s: trailing data after the declared %lld bytes", path,
                      (long long)total);
    }

    out->data = buf;
    out->ndim = ndim;
    for (int i = ndim; i < 4; i++) out->dims[i] = 1;
    out->count = out->dims[0];
    out->item_size = item;
    return DT_OK;
}

dt_status dt_idx_load(const char *path, dt_idx *out) {
    if (!path || !out) return DT_ERR(DT_EINVAL, "dt_idx_load: NULL argument");
    memset(out, 0, sizeof *out);
    errno = 0;
    gzFile gz = gzopen(path, "rb");
    if (!gz)
        return DT_ERR(DT_EIO, "%s: cannot open: %s", path, errno ? strerror(errno) : "gzopen failed");
    dt_status st = idx_parse(gz, path, out);
    gzclose(gz);
    if (st != DT_OK) memset(out, 0, sizeof *out);
    return st;
}

void dt_idx_free(dt_idx *x) {
    if (!x) return;
    free(x->data);
    memset(x, 0, sizeof *x);
}
