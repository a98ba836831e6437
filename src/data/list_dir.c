/* The files of a data directory, as text.c and shard_dir.c read them.
 *
 * Rules: the entries whose name `want` accepts and that are regular files or
 * symbolic links to one (a directory of links to shards elsewhere is a
 * common way to pick data), in strcmp order of names; each file once (of
 * names for one file, as a link beside its target, the file's own name
 * stays, else the first link in that order); a dangling link is an error,
 * not data silently missing; never the held-out
 * file (train.val_path inside the training directory is the validation
 * split, not training data). Subdirectories are not descended. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "dataset_internal.h"

typedef struct entry { char *path; dev_t dev; ino_t ino; int link; } entry;

static int by_path(const void *a, const void *b) { return strcmp(((const entry *)a)->path, ((const entry *)b)->path); }

void dt_data_names_free(char **names, int n) {
    for (int i = 0; i < n; i++) free(names[i]);
    free(names);
}

dt_status dt_data_list_dir(const char *dir, int (*want)(const char *name), const char *hold_out, char ***out,
                           int *n_out) {
    *out = NULL;
    *n_out = 0;
    struct stat hs;
    int hold = hold_out && stat(hold_out, &hs) == 0 && S_ISREG(hs.st_mode);
    DIR *d = opendir(dir);
    if (!d) return DT_ERR(DT_EIO, "%s: cannot open directory: %s", dir, strerror(errno));
    entry *v = NULL;
    int n = 0, cap = 0;
    dt_status st = DT_OK;
    char path[4096];
    struct dirent *e;
    while (st == DT_OK && (e = readdir(d)) != NULL) {
        const char *nm = e->d_name;
        if (!strcmp(nm, ".") || !strcmp(nm, "..") || !want(nm)) continue;
        int len = snprintf(path, sizeof path, "%s/%s", dir, nm);
        if (len < 0 || (size_t)len >= sizeof path) { st = DT_ERR(DT_EINVAL, "%s/%s: path too long", dir, nm); break; }
        struct stat sb;
        if (stat(path, &sb) != 0) {   /* follows a link: a dangling one is an error, not skipped data */
            st = DT_ERR(DT_EIO, "%s: cannot stat: %s", path, strerror(errno));
            break;
        }
        if (!S_ISREG(sb.st_mode)) continue;   /* directories, devices, links to them */
        if (hold && sb.st_dev == hs.st_dev && sb.st_ino == hs.st_ino) continue;
        if (n == cap) {
            int nc = cap ? 2 * cap : 64;
            entry *nv = realloc(v, (size_t)nc * sizeof *nv);
            if (!nv) { st = DT_ERR(DT_ENOMEM, "%s: out of memory listing directory", dir); break; }
            v = nv;
            cap = nc;
        }
        struct stat ls;
        int link = lstat(path, &ls) == 0 && S_ISLNK(ls.st_mode);
        v[n] = (entry){strdup(path), sb.st_dev, sb.st_ino, link};
        if (!v[n].path) st = DT_ERR(DT_ENOMEM, "%s: out of memory listing directory", dir);
        else n++;
    }
    closedir(d);
    char **names = st == DT_OK ? malloc((size_t)(n ? n : 1) * sizeof *names) : NULL;
    if (st == DT_OK && !names) st = DT_ERR(DT_ENOMEM, "%s: out of memory listing directory", dir);
    int k = 0;
    if (st == DT_OK) {
        if (n > 1) qsort(v, (size_t)n, sizeof *v, by_path);
        for (int i = 0; i < n; i++) {   /* i stays unless another name of its file is preferred */
            int other = 0;
            for (int j = 0; j < n && !other; j++)
                other = j != i && v[j].dev == v[i].dev && v[j].ino == v[i].ino &&
                        (v[j].link < v[i].link || (v[j].link == v[i].link && j < i));
            if (other) free(v[i].path);
            else names[k++] = v[i].path;
        }
    } else {
        for (int i = 0; i < n; i++) free(v[i].path);
    }
    free(v);
    *out = names;
    *n_out = k;
    return st;
}
