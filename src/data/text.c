/* Byte-level text datasets: every byte of a file (or of every regular file in a
 * directory, sorted by name) becomes one token in [0, 256).
 *
 * Directory rules (list_dir.c): regular files and links to one, each file
 * once, in name order, but not names ending in ".dat" (fortune index files)
 * or ".u8" (fortune dirs' UTF-8 twins); subdirectories are not descended.
 * Also here: the generic token-dataset helpers (free, windows, batch). */
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

/* files (may be NULL): room for one more end offset */
static dt_status files_reserve(dt_text_files *f, int *cap, const char *dir) {
    if (!f || f->n < *cap) return DT_OK;
    int nc = *cap ? 2 * *cap : 64;
    int64_t *e = realloc(f->end, (size_t)nc * sizeof *e);
    if (!e) return DT_ERR(DT_ENOMEM, "%s: out of memory listing directory", dir);
    f->end = e;
    *cap = nc;
    return DT_OK;
}

static int text_name(const char *nm) { return !ends_with(nm, ".dat") && !ends_with(nm, ".u8"); }

/* Append every eligible file of dir (not hold_out), in strcmp order of
 * names; files (may be NULL) gets where each one ends in b. */
static dt_status text_append_dir(tokbuf *b, const char *dir, const char *hold_out, dt_text_files *files) {
    char **names;
    int n;
    DT_TRY(dt_data_list_dir(dir, text_name, hold_out, &names, &n, NULL));
    dt_status st = DT_OK;
    int cap = 0;
    for (int i = 0; i < n && st == DT_OK; i++) {
        st = text_append_file(b, names[i]);
        if (st == DT_OK) st = files_reserve(files, &cap, dir);
        if (st == DT_OK && files) files->end[files->n++] = b->n;
    }
    dt_data_names_free(names, n);
    return st;
}

dt_status dt_text_load(const char *path, dt_token_dataset *out) { return dt_text_load_path(path, NULL, out); }

dt_status dt_text_load_path(const char *path, const char *hold_out, dt_token_dataset *out) {
    if (!path || !out) return DT_ERR(DT_EINVAL, "dt_text_load: NULL argument");
    memset(out, 0, sizeof *out);
    struct stat sb;
    if (stat(path, &sb) != 0) return DT_ERR(DT_EIO, "%s: cannot stat: %s", path, strerror(errno));
    tokbuf b = {0};
    dt_status st;
    if (S_ISDIR(sb.st_mode)) st = text_append_dir(&b, path, hold_out, NULL);
    else if (S_ISREG(sb.st_mode)) st = text_append_file(&b, path);
    else st = DT_ERR(DT_EINVAL, "%s: not a regular file or directory", path);
    if (st == DT_OK && b.n == 0)
        st = DT_ERR(DT_EFORMAT, "%s: no text data (empty file or no eligible files)", path);
    if (st != DT_OK) {
        free(b.v);
        return st;
    }
    out->tokens = b.v;
    out->n_tokens = b.n;
    out->vocab = 256;
    return DT_OK;
}

dt_status dt_text_load_files(const char *dir, const char *hold_out, dt_token_dataset *out, dt_text_files *files) {
    memset(out, 0, sizeof *out);
    memset(files, 0, sizeof *files);
    struct stat sb;
    if (stat(dir, &sb) != 0) return DT_ERR(DT_EIO, "%s: cannot stat: %s", dir, strerror(errno));
    if (!S_ISDIR(sb.st_mode))
        return DT_ERR(DT_EINVAL, "%s: not a directory (an uneven split gives each rank whole files of a directory)", dir);
    tokbuf b = {0};
    dt_status st = text_append_dir(&b, dir, hold_out, files);
    if (st == DT_OK && b.n == 0) st = DT_ERR(DT_EFORMAT, "%s: no text data (no eligible files)", dir);
    if (st != DT_OK) {
        free(b.v);
        dt_text_files_free(files);
        return st;
    }
    out->tokens = b.v;
    out->n_tokens = b.n;
    out->vocab = 256;
    return DT_OK;
}

void dt_text_files_free(dt_text_files *f) {
    free(f->end);
    memset(f, 0, sizeof *f);
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
