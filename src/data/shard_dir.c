/* llm.c token shards from a directory: every regular file named *.bin, in
 * strcmp order of names (train_000.bin, train_001.bin, ...), concatenated
 * into one token stream; a path that is a file is that one shard. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "dataset_internal.h"

static int cmp_names(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int is_bin(const char *nm) {
    size_t n = strlen(nm);
    return n > 4 && !strcmp(nm + n - 4, ".bin");
}

/* the directory's *.bin regular files, sorted; *n of them */
static dt_status list_shards(const char *dir, char ***out, int *n) {
    *out = NULL;
    *n = 0;
    DIR *d = opendir(dir);
    if (!d) return DT_ERR(DT_EIO, "%s: cannot open directory: %s", dir, strerror(errno));
    char **v = NULL, path[4096];
    int cap = 0;
    dt_status st = DT_OK;
    struct dirent *e;
    while (st == DT_OK && (e = readdir(d)) != NULL) {
        struct stat sb;
        if (!is_bin(e->d_name)) continue;
        int len = snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (len < 0 || (size_t)len >= sizeof path) { st = DT_ERR(DT_EINVAL, "%s/%s: path too long", dir, e->d_name); break; }
        if (lstat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) continue;   /* skips links, directories, devices */
        if (*n == cap) {
            int nc = cap ? 2 * cap : 16;
            char **nv = realloc(v, (size_t)nc * sizeof *nv);
            if (!nv) { st = DT_ERR(DT_ENOMEM, "%s: out of memory listing directory", dir); break; }
            v = nv;
            cap = nc;
        }
        if (!(v[*n] = strdup(path))) st = DT_ERR(DT_ENOMEM, "%s: out of memory listing directory", dir);
        else (*n)++;
    }
    closedir(d);
    if (st == DT_OK && *n == 0) st = DT_ERR(DT_EINVAL, "%s: no token shards (*.bin files) in the directory", dir);
    if (st != DT_OK) {
        for (int i = 0; i < *n; i++) free(v[i]);
        free(v);
        *n = 0;
        return st;
    }
    qsort(v, (size_t)*n, sizeof *v, cmp_names);
    *out = v;
    return DT_OK;
}

dt_status dt_token_shard_load_files(const char *dir, dt_token_dataset *out, dt_text_files *files) {
    memset(out, 0, sizeof *out);
    memset(files, 0, sizeof *files);
    char **names;
    int n;
    DT_TRY(list_shards(dir, &names, &n));
    dt_status st = (files->end = malloc((size_t)n * sizeof *files->end)) ? DT_OK
                 : DT_ERR(DT_ENOMEM, "%s: out of memory", dir);
    for (int i = 0; i < n && st == DT_OK; i++) {
        dt_token_dataset one;
        st = dt_token_shard_load(names[i], &one);
        if (st != DT_OK) break;
        uint16_t *t = realloc(out->tokens, (size_t)(out->n_tokens + one.n_tokens) * sizeof *t);
        if (!t) {
            st = DT_ERR(DT_ENOMEM, "%s: out of memory (%lld tokens)", names[i], (long long)(out->n_tokens + one.n_tokens));
        } else {
            memcpy(t + out->n_tokens, one.tokens, (size_t)one.n_tokens * sizeof *t);
            out->tokens = t;
            out->n_tokens += one.n_tokens;
            if (one.vocab > out->vocab) out->vocab = one.vocab;
            files->end[files->n++] = out->n_tokens;
        }
        dt_token_dataset_free(&one);
    }
    for (int i = 0; i < n; i++) free(names[i]);
    free(names);
    if (st != DT_OK) {
        dt_token_dataset_free(out);
        dt_text_files_free(files);
    }
    return st;
}

dt_status dt_token_shard_load_path(const char *path, dt_token_dataset *out) {
    struct stat sb;
    if (stat(path, &sb) != 0 || !S_ISDIR(sb.st_mode)) return dt_token_shard_load(path, out);
    dt_text_files files;
    dt_status st = dt_token_shard_load_files(path, out, &files);
    dt_text_files_free(&files);
    return st;
}
