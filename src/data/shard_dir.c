/* llm.c token shards from a directory: every file named *.bin, in
 * strcmp order of names (train_000.bin, train_001.bin, ...), concatenated
 * into one token stream (list_dir.c: links to files count, each file once,
 * never the validation file); a path that is a file is that one shard. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "dataset_internal.h"

static int is_bin(const char *nm) {
    size_t n = strlen(nm);
    return n > 4 && !strcmp(nm + n - 4, ".bin");
}

/* the directory's *.bin files (dt_data_list_dir's rules), sorted; *n of them */
static dt_status list_shards(const char *dir, const char *hold_out, char ***out, int *n) {
    int held;
    DT_TRY(dt_data_list_dir(dir, is_bin, hold_out, out, n, &held));
    if (*n > 0) return DT_OK;
    dt_data_names_free(*out, *n);
    *out = NULL;
    return DT_ERR(DT_EINVAL, "%s: no token shards (*.bin files) in the directory%s", dir,
                  held ? " besides the validation file" : "");
}

dt_status dt_token_shard_load_files(const char *dir, const char *hold_out, dt_token_dataset *out, dt_text_files *files) {
    memset(out, 0, sizeof *out);
    memset(files, 0, sizeof *files);
    char **names;
    int n;
    DT_TRY(list_shards(dir, hold_out, &names, &n));
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
    dt_data_names_free(names, n);
    if (st != DT_OK) {
        dt_token_dataset_free(out);
        dt_text_files_free(files);
    }
    return st;
}

dt_status dt_token_shard_load_path(const char *path, const char *hold_out, dt_token_dataset *out) {
    struct stat sb;
    if (stat(path, &sb) != 0 || !S_ISDIR(sb.st_mode)) return dt_token_shard_load(path, out);
    dt_text_files files;
    dt_status st = dt_token_shard_load_files(path, hold_out, out, &files);
    dt_text_files_free(&files);
    return st;
}
