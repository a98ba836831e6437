/* Byte-level text datasets: every byte of a file (or of every regular file in a
 * directory, sorted by name) becomes one token in [0, 256).
 *
 * Directory rules: only regular files are read; symlinks are skipped (fortune
 * dirs link foo.u8 -> foo, which would duplicate data), as are names ending in
 * ".dat" (fortune index files) and ".u8". Subdirectories are not descended.
 * Also here: the generic token-dataset helpers (free, windows, batch). */
#include <dirent.h>
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

static int cmp_names(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
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

/* Append every eligible file of dir, in strcmp order of names; files (may be
 * NULL) gets where each one ends in b. */
static dt_status text_append_dir(tokbuf *b, const char *dir, dt_text_files *files) {
    DIR *d = opendir(dir);
    if (!d) return DT_ERR(DT_EIO, "%s: cannot open directory: %s", dir, strerror(errno));
    char **names = NULL;
    size_t n = 0, cap = 0;
    dt_status st = DT_OK;
    struct dirent *e;
    char path[4096];
    while ((e = readdir(d)) != NULL) {
        const char *nm = e->d_name;
        if (strcmp(nm, ".") == 0 || strcmp(nm, "..") == 0) continue;
        if (ends_with(nm, ".dat") || ends_with(nm, ".u8")) continue;
        int len = snprintf(path, sizeof path, "%s/%s", dir, nm);
        if (len < 0 || (size_t)len >= sizeof path) {
            st = DT_ERR(DT_EINVAL, "%s/%s: path too long", dir, nm);
            break;
        }
        struct stat sb;
        if (lstat(path, &sb) != 0) {
            st = DT_ERR(DT_EIO, "%s: cannot stat: %s", path, strerror(errno));
            break;
        }
        if (!S_ISREG(sb.st_mode)) continue;   /* skips symlinks, dirs, devices */
        if (n == cap) {
            size_t ncap = cap ? cap * 2 : 64;
            char **nn = realloc(names, ncap * sizeof *nn);
            if (!nn) { st = DT_ERR(DT_ENOMEM, "%s: out of memory listing directory", dir); break; }
            names = nn;
            cap = ncap;
        }
        names[n] = strdup(nm);
        if (!names[n]) { st = DT_ERR(DT_ENOMEM, "%s: out of memory listing directory", dir); break; }
        n++;
    }
    closedir(d);
    if (st == DT_OK) {
        if (n > 1) qsort(names, n, sizeof *names, cmp_names);
        int cap = 0;
        for (size_t i = 0; i < n && st == DT_OK; i++) {
            snprintf(path, sizeof path, "%s/%s", dir, names[i]);
            st = text_append_file(b, path);
            if (st == DT_OK) st = files_reserve(files, &cap, dir);
            if (st == DT_OK && files) files->end[files->n++] = b->n;
        }
    }
    for (size_t i = 0; i < n; i++) free(names[i]);
    free(names);
    return st;
}

dt_status dt_text_load(const char *path, dt_token_dataset *out) {
    if (!path || !out) return DT_ERR(DT_EINVAL, "dt_text_load: NULL argument");
    memset(out, 0, sizeof *out);
    struct stat sb;
    if (stat(path, &sb) != 0) return DT_ERR(DT_EIO, "%s: cannot stat: %s", path, strerror(errno));
    tokbuf b = {0};
    dt_status st;
    if (S_ISDIR(sb.st_mode)) st = text_append_dir(&b, path, NULL);
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

dt_status dt_text_load_files(const char *dir, dt_token_dataset *out, dt_text_files *files) {
    memset(out, 0, sizeof *out);
    memset(files, 0, sizeof *files);
    struct stat sb;
    if (stat(dir, &sb) != 0) return DT_ERR(DT_EIO, "%s: cannot stat: %s", dir, strerror(errno));
    if (!S_ISDIR(sb.st_mode))
        return DT_ERR(DT_EINVAL, "%s: not a directory (an uneven split gives each rank whole files of a directory)", dir);
    tokbuf b = {0};
    dt_status st = text_append_dir(&b, dir, files);
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
