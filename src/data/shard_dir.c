/* llm.c token shards from a file or a directory: every file named *.bin, in
 * strcmp order of names (train_000.bin, train_001.bin, ...), one mapped piece
 * each of one token stream (list_dir.c: links to files count, each file once,
 * never the validation file). */
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

dt_status dt_token_shard_open(const char *path, const char *hold_out, dt_token_store *st, dt_token_stream *out) {
    memset(out, 0, sizeof *out);
    struct stat sb;
    dt_status s;
    if (stat(path, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        s = dt_token_shard_map(path, st, out);   /* (names a missing path) */
    } else {
        char **names;
        int n;
        DT_TRY(list_shards(path, hold_out, &names, &n));
        s = DT_OK;
        for (int i = 0; i < n && s == DT_OK; i++) s = dt_token_shard_map(names[i], st, out);
        dt_data_names_free(names, n);
    }
    if (s != DT_OK) dt_token_stream_free(out);
    return s;
}
