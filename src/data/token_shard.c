/* llm.c token shards.
 *
 * Layout (all little-endian): int32 header[256] with header[0] = 20240520
 * (magic), header[1] = 1 (version), header[2] = n_tokens; then n_tokens uint16.
 * The file size must be exactly 1024 + 2 * n_tokens. Empty shards
 * (n_tokens == 0) are rejected on load and on write.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "dataset_internal.h"
#include "util/atomic_file.h"

#define SHARD_MAGIC 20240520
#define SHARD_VERSION 1
#define SHARD_HDR_BYTES DT_SHARD_HDR_BYTES   /* 256 int32 */
#define SHARD_CHUNK 65536   /* tokens per read/write chunk */

static int32_t le32(const uint8_t *p) {
    return (int32_t)((uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24));
}

static void put_le32(uint8_t *p, int32_t v) {
    uint32_t u = (uint32_t)v;
    p[0] = (uint8_t)u; p[1] = (uint8_t)(u >> 8); p[2] = (uint8_t)(u >> 16); p[3] = (uint8_t)(u >> 24);
}

dt_status dt_token_shard_header(const char *path, const uint8_t *hdr, int64_t size, int64_t *n) {
    int32_t magic = le32(hdr), version = le32(hdr + 4), n32 = le32(hdr + 8);
    if (magic != SHARD_MAGIC) return DT_ERR(DT_EFORMAT, "%s: bad magic %d (expected %d)", path, magic, SHARD_MAGIC);
    if (version != SHARD_VERSION)
        return DT_ERR(DT_EFORMAT, "%s: unsupported version %d (expected %d)", path, version, SHARD_VERSION);
    if (n32 <= 0) return DT_ERR(DT_EFORMAT, "%s: bad token count %d in header", path, n32);
    int64_t expect = SHARD_HDR_BYTES + 2 * (int64_t)n32;
    if (size != expect)
        return DT_ERR(DT_EFORMAT, "%s: size mismatch: header says %lld tokens (%lld bytes), file has %lld bytes",
                      path, (long long)n32, (long long)expect, (long long)size);
    *n = n32;
    return DT_OK;
}

dt_status dt_token_shard_load(const char *path, dt_token_dataset *out) {
    if (!path || !out) return DT_ERR(DT_EINVAL, "dt_token_shard_load: NULL argument");
    memset(out, 0, sizeof *out);
    FILE *f = fopen(path, "rb");
    if (!f) return DT_ERR(DT_EIO, "%s: cannot open: %s", path, strerror(errno));
    dt_status st = DT_OK;
    uint16_t *tok = NULL;
    uint8_t hdr[SHARD_HDR_BYTES];
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0) {
        st = DT_ERR(DT_EIO, "%s: cannot stat: %s", path, strerror(errno));
        goto done;
    }
    if (!S_ISREG(sb.st_mode)) {
        st = DT_ERR(DT_EINVAL, "%s: not a regular file", path);
        goto done;
    }
    int64_t size = (int64_t)sb.st_size;
    if (size < SHARD_HDR_BYTES) {
        st = DT_ERR(DT_EFORMAT, "%s: truncated: %lld bytes, smaller than the %d-byte header", path,
                    (long long)size, SHARD_HDR_BYTES);
        goto done;
    }
    if (fread(hdr, 1, sizeof hdr, f) != sizeof hdr) {
        st = DT_ERR(DT_EIO, "%s: cannot read header", path);
        goto done;
    }
    int64_t n;
    st = dt_token_shard_header(path, hdr, size, &n);
    if (st != DT_OK) goto done;
    tok = malloc((size_t)n * sizeof *tok);
    if (!tok) {
        st = DT_ERR(DT_ENOMEM, "%s: out of memory for %lld tokens", path, (long long)n);
        goto done;
    }
    uint8_t buf[2 * SHARD_CHUNK];
    int maxid = 0;
    for (int64_t i = 0; i < n;) {
        size_t want = (size_t)(n - i < SHARD_CHUNK ? n - i : SHARD_CHUNK);
        size_t r = fread(buf, 2, want, f);
        if (r != want) {   /* file shrank under us */
            st = DT_ERR(DT_EFORMAT, "%s: truncated: expected %lld tokens, got %lld", path,
                        (long long)n, (long long)(i + (int64_t)r));
            goto done;
        }
        for (size_t k = 0; k < want; k++) {
            uint16_t t = (uint16_t)(buf[2 * k] | (buf[2 * k + 1] << 8));
            tok[i + (int64_t)k] = t;
            if (t > maxid) maxid = t;
        }
        i += (int64_t)want;
    }
    out->tokens = tok;
    out->n_tokens = n;
    out->vocab = maxid + 1;
    tok = NULL;
done:
    free(tok);
    fclose(f);
    return st;
}


/* Serialise the shard through an atomic file (temp, fsync, rename, dir fsync):
 * on any failure path is untouched and no temp file is left. */
static dt_status shard_write_atomic(const char *path, const uint16_t *tokens, int64_t n) {
    dt_atomic_file af;
    DT_TRY(dt_atomic_open(&af, path));
    uint8_t hdr[SHARD_HDR_BYTES] = {0};
    put_le32(hdr, SHARD_MAGIC);
    put_le32(hdr + 4, SHARD_VERSION);
    put_le32(hdr + 8, (int32_t)n);
    dt_status st = dt_atomic_write(&af, hdr, sizeof hdr);
    uint8_t buf[2 * SHARD_CHUNK];
    for (int64_t i = 0; st == DT_OK && i < n;) {
        int64_t m = n - i < SHARD_CHUNK ? n - i : SHARD_CHUNK;
        for (int64_t k = 0; k < m; k++) {   /* little-endian uint16 */
            buf[2 * k] = (uint8_t)tokens[i + k];
            buf[2 * k + 1] = (uint8_t)(tokens[i + k] >> 8);
        }
        st = dt_atomic_write(&af, buf, (size_t)(2 * m));
        i += m;
    }
    if (st != DT_OK) { dt_atomic_discard(&af); return st; }
    return dt_atomic_commit(&af);
}

dt_status dt_token_shard_write(const char *path, const uint16_t *tokens, int64_t n) {
    if (!path || !tokens) return DT_ERR(DT_EINVAL, "dt_token_shard_write: NULL argument");
    if (n <= 0 || n > INT32_MAX)
        return DT_ERR(DT_EINVAL, "%s: token count %lld out of range [1, %d]", path, (long long)n, INT32_MAX);
    return shard_write_atomic(path, tokens, n);
}
