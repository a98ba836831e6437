/* Byte-level text datasets: every byte of a file (or of every regular file in a
 * directory, sorted by name) becomes one token in [0, 256).
 *
 * Directory rules (list_dir.c): regular files and links to one, each file
 * once, in name order, but not names ending in ".dat" (fortune index files)
 * or ".u8" (fortune dirs' UTF-8 twins); subdirectories are not descended.
 * Also here: the public one-buffer token-dataset helpers (free, windows, batch). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "dataset_internal.h"

/* Growable uint16 token buffer. */
typedef struct tokbuf {
    uint16_t *v;
    int64_t n, cap;
} tokbuf;

static dt_status tokbuf_reserve(tokbuf *b, int64_t extra, const char *path) {
    if (b->n + extra <= b->cap) return DT_OK;
    int64_t cap = b->cap ? b->cap : 4096;
    while (cap < b->n + extra) cap *= 2;
    uint16_t *nv = realloc(b->v, (size_t)cap * sizeof(uint16_t));
    if (!nv) return DT_ERR(DT_ENOMEM, "%s: out of memory (%lld tokens)", path, (long long)cap);
    b->v = nv;
    b->cap = cap;
    return DT_OK;
}

/* Append the bytes of one file to b. */
static dt_status text_append_file(tokbuf *b, const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return DT_ERR(DT_EIO, "%s: cannot open: %s", path, strerror(errno));
    unsigned char chunk[65536];
    dt_status st = DT_OK;
    for (;;) {
        size_t r = fread(chunk, 1, sizeof chunk, f);
        if (r > 0) {
            st = tokbuf_reserve(b, (int64_t)r, path);
            if (st != DT_OK) break;
            for (size_t i = 0; i < r; i++) b->v[b->n + (int64_t)i] = chunk[i];
            b->n += (int64_t)r;
        }
        if (r < sizeof chunk) {
            if (ferror(f)) st = DT_ERR(DT_EIO, "%s: read failed: %s", path, strerror(errno));
            break;
        }
    }
    fclose(f);
    return st;
}

static int ends_with(const char *s, const char *suffix) {
    size_t ls = strlen(s), lx = strlen(suffix);
    return ls >= lx && memcmp(s + ls - lx, suffix, lx) == 0;
}

/* ends (may be NULL): room for one more end offset */
static dt_status ends_reserve(int64_t **ends, int n, int *cap, const char *dir) {
    if (!ends || n < *cap) return DT_OK;
    int nc = *cap ? 2 * *cap : 64;
    int64_t *e = realloc(*ends, (size_t)nc * sizeof *e);
    if (!e) return DT_ERR(DT_ENOMEM, "%s: out of memory listing directory", dir);
    *ends = e;
    *cap = nc;
    return DT_OK;
}

static int text_name(const char *nm) { return !ends_with(nm, ".dat") && !ends_with(nm, ".u8"); }

/* Append every eligible file of dir (not hold_out), in strcmp order of
 * names; ends (may be NULL) gets where each one ends in b, *n_files of them. */
static dt_status text_append_dir(tokbuf *b, const char *dir, const char *hold_out, int64_t **ends, int *n_files) {
    char **names;
    int n;
    DT_TRY(dt_data_list_dir(dir, text_name, hold_out, &names, &n, NULL));
    dt_status st = DT_OK;
    int cap = 0;
    for (int i = 0; i < n && st == DT_OK; i++) {
        st = text_append_file(b, names[i]);
        if (st == DT_OK) st = ends_reserve(ends, *n_files, &cap, dir);
        if (st == DT_OK && ends) (*ends)[(*n_files)++] = b->n;
    }
    dt_data_names_free(names, n);
    return st;
}

dt_status dt_text_read(const char *path, const char *hold_out, uint16_t **ids, int64_t *n, int64_t **ends,
                       int *n_files) {
    *ids = NULL;
    *n = 0;
    if (ends) *ends = NULL;
    *n_files = 0;
    struct stat sb;
    if (stat(path, &sb) != 0) return DT_ERR(DT_EIO, "%s: cannot stat: %s", path, strerror(errno));
    tokbuf b = {0};
    dt_status st;
    if (S_ISDIR(sb.st_mode)) {
        st = text_append_dir(&b, path, hold_out, ends, n_files);
    } else if (S_ISREG(sb.st_mode)) {
        st = text_append_file(&b, path);
        if (st == DT_OK && ends) st = (*ends = malloc(sizeof **ends)) ? DT_OK : DT_ERR(DT_ENOMEM, "out of memory");
        if (st == DT_OK && ends) (*ends)[(*n_files)++] = b.n;
    } else {
        st = DT_ERR(DT_EINVAL, "%s: not a regular file or directory", path);
    }
    if (st == DT_OK && b.n == 0)
        st = DT_ERR(DT_EFORMAT, "%s: no text data (empty file or no eligible files)", path);
    if (st != DT_OK) {
        free(b.v);
        if (ends) { free(*ends); *ends = NULL; }
        *n_files = 0;
        return st;
    }
    *ids = b.v;
    *n = b.n;
    return DT_OK;
}

dt_status dt_text_load(const char *path, dt_token_dataset *out) {
    if (!path || !out) return DT_ERR(DT_EINVAL, "dt_text_load: NULL argument");
    memset(out, 0, sizeof *out);
    int n_files;
    DT_TRY(dt_text_read(path, NULL, &out->tokens, &out->n_tokens, NULL, &n_files));
    out->vocab = 256;
    return DT_OK;
}

/* the text as one owned buffer, one piece per file */
dt_status dt_text_open(const char *path, const char *hold_out, dt_token_store *st, dt_token_stream *out) {
    memset(out, 0, sizeof *out);
    uint16_t *ids;
    int64_t n, *ends;
    int n_files;
    DT_TRY(dt_text_read(path, hold_out, &ids, &n, &ends, &n_files));
    dt_status s = dt_token_store_add(st, ids, 0, path);
    for (int k = 0; k < n_files && s == DT_OK; k++) {
        int64_t a = k ? ends[k - 1] : 0;
        s = dt_token_stream_push(out, ids + a, ends[k] - a, path);
    }
    free(ends);
    out->vocab = 256;
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
