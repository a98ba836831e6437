/* Byte-level text datasets: every byte of a file (or of every regular file in a
 * directory, sorted by name) becomes one token in [0, 256).
 *
 * Training data (dt_text_open) is mapped read-only, a piece of bytes per file
 * that batches widen as they copy (shard_map.c's mapping: one copy per
 * machine in the page cache, none in a rank's own memory). Files under
 * 64 KiB, pseudo-files and files that cannot be mapped are read instead (a
 * directory of 65k short documents would exhaust vm.max_map_count). A text
 * file of 64 KiB or more must not be truncated in place while a
 * run maps it (SIGBUS past the new end); an editor's save by rename, or
 * appending, is safe. The public dt_text_load reads into one uint16 buffer.
 *
 * Directory rules (list_dir.c): regular files and links to one, each file
 * once, in name order, but not names ending in ".dat" (fortune index files)
 * or ".u8" (fortune dirs' UTF-8 twins); subdirectories are not descended.
 * Also here: the public one-buffer token-dataset helpers (free, windows, batch). */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "dataset_internal.h"

static int ends_with(const char *s, const char *suffix) {
    size_t ls = strlen(s), lx = strlen(suffix);
    return ls >= lx && memcmp(s + ls - lx, suffix, lx) == 0;
}

static int text_name(const char *nm) { return !ends_with(nm, ".dat") && !ends_with(nm, ".u8"); }

/* one uint16 buffer: the training reader's pieces, widened */
dt_status dt_text_load(const char *path, dt_token_dataset *out) {
    if (!path || !out) return DT_ERR(DT_EINVAL, "dt_text_load: NULL argument");
    memset(out, 0, sizeof *out);
    dt_token_store st = {0};
    dt_token_stream all;
    dt_status s = dt_text_open(path, NULL, &st, &all);
    if (s != DT_OK) {
        dt_token_store_free(&st);   /* (the files read or mapped before the fault) */
        return s;
    }
    int64_t n = all.n_tokens;   /* (> 0: the open checked) */
    uint16_t *ids = malloc((size_t)n * sizeof *ids);
    for (int k = 0; ids && k < all.n; k++) {
        const uint8_t *b = all.piece[k].ids;
        int64_t from = all.end[k] - all.piece[k].n;
        for (int64_t i = 0; i < all.piece[k].n; i++) ids[from + i] = b[i];
    }
    dt_token_stream_free(&all);
    dt_token_store_free(&st);
    if (!ids) return DT_ERR(DT_ENOMEM, "%s: out of memory (%lld tokens)", path, (long long)n);
    out->tokens = ids;
    out->n_tokens = n;
    out->vocab = 256;
    return DT_OK;
}

/* fd's bytes to its end, whatever its size said (a pseudo-file says 0), in
 * a buffer of their size (a directory of many short documents keeps their
 * bytes, not a page each) */
static dt_status read_bytes(int fd, const char *path, size_t hint, uint8_t **out, int64_t *n) {
    size_t cap = hint ? hint + 1 : 4096, len = 0;
    uint8_t *b = malloc(cap);
    for (;;) {
        if (!b) return DT_ERR(DT_ENOMEM, "%s: out of memory (%zu bytes)", path, cap);
        if (len == cap) {
            uint8_t *nb = cap <= SIZE_MAX / 2 ? realloc(b, cap * 2) : NULL;
            if (!nb) { free(b); return DT_ERR(DT_ENOMEM, "%s: out of memory (%zu bytes)", path, cap * 2); }
            b = nb;
            cap *= 2;
        }
        ssize_t r = read(fd, b + len, cap - len);
        if (r < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (r < 0) {
            free(b);
            return DT_ERR(DT_EIO, "%s: read failed: %s", path, strerror(errno));
        }
        if (r == 0) break;
        len += (size_t)r;
    }
    if (cap > len + 1) {   /* (a failed shrink keeps the larger buffer) */
        uint8_t *nb = realloc(b, len + 1);
        if (nb) b = nb;
    }
    *out = b;
    *n = (int64_t)len;
    return DT_OK;
}

/* Files from this size on are mapped; smaller ones are read (a mapping each
 * would run a directory of 65k short documents into vm.max_map_count, and
 * a mapping holds at least a page anyway). */
#define TEXT_MAP_MIN ((size_t)1 << 16)

/* one file's bytes as a piece of out, held by the store: mapped, or read
 * (small, a pseudo-file, or a file system that cannot map) */
static dt_status text_map_file(const char *path, dt_token_store *st, dt_token_stream *out) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);   /* (a FIFO must not block the open) */
    if (fd < 0) return DT_ERR(DT_EIO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    dt_status s = DT_OK;
    const void *base = NULL;
    size_t size = 0;
    if (fstat(fd, &sb) != 0) s = DT_ERR(DT_EIO, "%s: cannot stat: %s", path, strerror(errno));
    else if (!S_ISREG(sb.st_mode)) s = DT_ERR(DT_EINVAL, "%s: not a regular file or directory", path);
    else if ((size = (size_t)sb.st_size) >= TEXT_MAP_MIN) s = dt_token_map_fd(fd, size, path, st, &base);
    if (s == DT_OK && base) {
        close(fd);
        return dt_token_stream_push(out, base, 1, (int64_t)size, path);
    }
    uint8_t *bytes = NULL;
    int64_t n = 0;
    if (s == DT_OK) s = read_bytes(fd, path, size, &bytes, &n);
    close(fd);
    if (s == DT_OK) s = dt_token_store_add(st, bytes, 0, path, &sb);   /* (frees bytes when it fails) */
    return s == DT_OK ? dt_token_stream_push(out, bytes, 1, n, path) : s;
}

/* the text as views of its files, one piece per file */
dt_status dt_text_open(const char *path, const char *hold_out, dt_token_store *st, dt_token_stream *out) {
    memset(out, 0, sizeof *out);
    out->vocab = 256;
    struct stat sb;
    if (stat(path, &sb) != 0) return DT_ERR(DT_EIO, "%s: cannot stat: %s", path, strerror(errno));
    dt_status s = DT_OK;
    if (S_ISDIR(sb.st_mode)) {
        char **names;
        int n;
        DT_TRY(dt_data_list_dir(path, text_name, hold_out, &names, &n, NULL));
        for (int i = 0; i < n && s == DT_OK; i++) s = text_map_file(names[i], st, out);
        dt_data_names_free(names, n);
    } else {
        s = text_map_file(path, st, out);
    }
    if (s == DT_OK && out->n_tokens == 0)
        s = DT_ERR(DT_EFORMAT, "%s: no text data (empty file or no eligible files)", path);
    if (s != DT_OK) dt_token_stream_free(out);
    return s;
}

void dt_token_dataset_free(dt_token_dataset *d) {
    if (!d) return;
    free(d->tokens);
    memset(d, 0, sizeof *d);
}

/* Sample i uses tokens[i*T .. i*T+T] inclusive (T+1 tokens): (n_tokens-1)/T samples. */
int64_t dt_token_windows(const dt_token_dataset *d, int T) {
    if (!d || T <= 0 || d->n_tokens < 2) return 0;
    return (d->n_tokens - 1) / T;
}

/* idx[i] must lie in [0, dt_token_windows(d, T)); x, y are [n, T]. */
void dt_token_batch(const dt_token_dataset *d, const int64_t *idx, int64_t n, int T, int32_t *x, int32_t *y) {
    for (int64_t i = 0; i < n; i++) {
        const uint16_t *src = d->tokens + idx[i] * (int64_t)T;
        int32_t *xr = x + i * (int64_t)T, *yr = y + i * (int64_t)T;
        for (int t = 0; t < T; t++) {
            xr[t] = src[t];
            yr[t] = src[t + 1];
        }
    }
}
