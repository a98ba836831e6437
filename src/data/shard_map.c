/* One llm.c shard mapped read-only as a piece of a token stream.
 *
 * The ids are read where the file is: the kernel's page cache holds each
 * page once per machine, shared by every rank that maps it, and can evict
 * it under pressure, so a 10B-token directory (20 GB) costs a rank views,
 * not 20 GB of its own memory. Each id is read once at open, to find the
 * vocabulary (hostile ids are caught again by the embedding, which checks
 * every id it looks up). That scan reads the file through a small buffer,
 * not through the mapping, so it leaves nothing in this process's resident
 * set and a file shrinking under it is an error, not a fault; training then
 * touches the mapping window by window.
 *
 * A shard must not be truncated in place while it is mapped (reading past a
 * file's new end raises SIGBUS); replacing it by rename, as
 * dt_token_shard_write does, is safe: the mapping keeps the old file.
 * Big-endian hosts, and file systems that cannot map (FUSE with direct_io),
 * read the file into memory instead (the ids are little-endian). One
 * mapping per shard: vm.max_map_count (65530 by default) bounds a
 * directory's shards. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include "dataset_internal.h"

/* the shard read into memory the store owns (where it cannot be mapped) */
static dt_status read_whole(const char *path, dt_token_store *st, dt_token_stream *out) {
    dt_token_dataset d;
    struct stat sb;   /* the file's identity (this reader goes by path: no descriptor to ask) */
    int known = stat(path, &sb) == 0;
    DT_TRY(dt_token_shard_load(path, &d));
    DT_TRY(dt_token_store_add(st, d.tokens, 0, path, known ? &sb : NULL));
    DT_TRY(dt_token_stream_push(out, d.tokens, 2, d.n_tokens, path));
    if (d.vocab > out->vocab) out->vocab = d.vocab;
    return DT_OK;
}

dt_status dt_token_map_fd(int fd, size_t len, const char *path, dt_token_store *st, const void **base) {
    *base = NULL;
    if (len == 0) return DT_OK;   /* (mmap refuses 0 bytes; there is nothing to view) */
    /* private: read-only pages are the page cache's own, shared all the same */
    void *b = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    if (b == MAP_FAILED) {
        if (errno == ENODEV) return DT_OK;   /* FUSE direct_io: the caller reads the file */
        return DT_ERR(errno == ENOMEM ? DT_ENOMEM : DT_EIO, "%s: cannot map %lld bytes: %s%s", path, (long long)len,
                      strerror(errno), errno == ENOMEM ? " (one mapping per file: see vm.max_map_count)" : "");
    }
    /* windows are drawn at random: fault in the pages a window touches, not
     * the read-around block (matters once the data outgrows the page cache) */
    (void)posix_madvise(b, len, POSIX_MADV_RANDOM);   /* advice: failure costs only speed */
    struct stat sb;   /* the mapped file's identity, from its descriptor */
    DT_TRY(dt_token_store_add(st, b, len, path, fstat(fd, &sb) == 0 ? &sb : NULL));
    *base = b;
    return DT_OK;
}

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define SCAN_IDS (1 << 16)   /* ids per read of the vocabulary scan (128 KiB, on the stack) */

/* *vocab = the largest of the n ids after the header + 1, read with pread */
static dt_status scan_vocab(int fd, const char *path, int64_t n, int *vocab) {
    uint16_t buf[SCAN_IDS];
    uint16_t m = 0;
    for (int64_t i = 0; i < n;) {
        size_t want = (size_t)(n - i < SCAN_IDS ? n - i : SCAN_IDS) * sizeof *buf;
        ssize_t r = pread(fd, buf, want, (off_t)(DT_SHARD_HDR_BYTES + 2 * i));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return DT_ERR(DT_EIO, "%s: read failed: %s", path, strerror(errno));
        if (r == 0 || r % 2)   /* the file shrank under us */
            return DT_ERR(DT_EFORMAT, "%s: truncated: expected %lld tokens, got %lld", path, (long long)n,
                          (long long)i);
        for (ssize_t k = 0; k < r / 2; k++) m = buf[k] > m ? buf[k] : m;
        i += r / 2;
    }
    *vocab = m + 1;
    return DT_OK;
}

dt_status dt_token_shard_map(const char *path, dt_token_store *st, dt_token_stream *out) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);   /* (a FIFO must not block the open) */
    if (fd < 0) return DT_ERR(DT_EIO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    uint8_t hdr[DT_SHARD_HDR_BYTES];
    int64_t n = 0;
    int vocab = 0;
    dt_status s = DT_OK;
    if (fstat(fd, &sb) != 0) s = DT_ERR(DT_EIO, "%s: cannot stat: %s", path, strerror(errno));
    else if (!S_ISREG(sb.st_mode)) s = DT_ERR(DT_EINVAL, "%s: not a regular file", path);
    else if (sb.st_size < DT_SHARD_HDR_BYTES)
        s = DT_ERR(DT_EFORMAT, "%s: truncated: %lld bytes, smaller than the %d-byte header", path,
                   (long long)sb.st_size, DT_SHARD_HDR_BYTES);
    else if (pread(fd, hdr, sizeof hdr, 0) != (ssize_t)sizeof hdr)
        s = DT_ERR(DT_EIO, "%s: cannot read header", path);
    else s = dt_token_shard_header(path, hdr, (int64_t)sb.st_size, &n);
    if (s == DT_OK) s = scan_vocab(fd, path, n, &vocab);
    const void *base = NULL;
    if (s == DT_OK) s = dt_token_map_fd(fd, (size_t)sb.st_size, path, st, &base);
    close(fd);
    if (s != DT_OK) return s;
    if (!base) return read_whole(path, st, out);   /* a file system without mmap */
    DT_TRY(dt_token_stream_push(out, (const uint8_t *)base + DT_SHARD_HDR_BYTES, 2, n, path));
    if (vocab > out->vocab) out->vocab = vocab;
    return DT_OK;
}
#else
dt_status dt_token_shard_map(const char *path, dt_token_store *st, dt_token_stream *out) {
    return read_whole(path, st, out);
}
#endif
