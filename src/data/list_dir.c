/* The files of a data directory, as text.c and shard_dir.c read them.
 *
 * Rules: the entries whose name `want` accepts and that are regular files or
 * symbolic links to one (a directory of links to shards elsewhere is a
 * common way to pick data), in strcmp order of names; each file once (of
 * names for one file, as a link beside its target, the file's own name
 * stays, else the first link in that order); a dangling link is an error,
 * not data silently missing; a link owned by another user (not root) is an
 * error too, as checkpoint paths are (io.h): whoever can plant a link in a
 * shared directory could make the run read a file only its owner may;
 * never the held-out file (train.val_path inside the training directory is
 * the validation split, not training data); never a hidden file (a name
 * starting with '.': a desktop's or an editor's, not data). Subdirectories
 * are not descended. Sorting by name, then by file identity: O(n log n). */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "dataset_internal.h"

typedef struct entry { char *path; dev_t dev; ino_t ino; int link, drop; } entry;

static int by_path(const void *a, const void *b) { return strcmp(((const entry *)a)->path, ((const entry *)b)->path); }

/* one file's names together, the one that stays first: not a link, then name
 * order (the entries are sorted by name already: their addresses are that order) */
static int by_file(const void *pa, const void *pb) {
    const entry *a = *(entry *const *)pa, *b = *(entry *const *)pb;
    if (a->dev != b->dev) return a->dev < b->dev ? -1 : 1;
    if (a->ino != b->ino) return a->ino < b->ino ? -1 : 1;
    if (a->link != b->link) return a->link - b->link;
    return (a > b) - (a < b);
}

void dt_data_names_free(char **names, int n) {
    for (int i = 0; i < n; i++) free(names[i]);
    free(names);
}

dt_status dt_data_list_dir(const char *dir, int (*want)(const char *name), const char *hold_out, char ***out,
                           int *n_out, int *held) {
    *out = NULL;
    *n_out = 0;
    if (held) *held = 0;
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
        if (nm[0] == '.' || !want(nm)) continue;   /* hidden files (".DS_Store", "._x.bin", editors' swap files) are not data */
        int len = snprintf(path, sizeof path, "%s/%s", dir, nm);
        if (len < 0 || (size_t)len >= sizeof path) { st = DT_ERR(DT_EINVAL, "%s/%s: path too long", dir, nm); break; }
        struct stat ls, sb;
        if (lstat(path, &ls) != 0) { st = DT_ERR(DT_EIO, "%s: cannot stat: %s", path, strerror(errno)); break; }
        int link = S_ISLNK(ls.st_mode);
        if (link && ls.st_uid != geteuid() && ls.st_uid != 0) {
            st = DT_ERR(DT_EINVAL, "%s: a link owned by another user (uid %u): not followed (a link in a shared "
                        "directory could point the run at any file it may read); copy or link the data yourself",
                        path, (unsigned)ls.st_uid);
            break;
        }
        if (stat(path, &sb) != 0) {   /* follows a link: a dangling one is an error, not skipped data */
            st = DT_ERR(DT_EIO, "%s: cannot stat: %s", path, strerror(errno));
            break;
        }
        if (!S_ISREG(sb.st_mode)) continue;   /* directories, devices, links to them */
        if (hold && sb.st_dev == hs.st_dev && sb.st_ino == hs.st_ino) {
            if (held) *held = 1;
            continue;
        }
        if (n == cap) {
            int nc = cap ? 2 * cap : 64;
            entry *nv = realloc(v, (size_t)nc * sizeof *nv);
            if (!nv) { st = DT_ERR(DT_ENOMEM, "%s: out of memory listing directory", dir); break; }
            v = nv;
            cap = nc;
        }
        v[n] = (entry){strdup(path), sb.st_dev, sb.st_ino, link, 0};
        if (!v[n].path) st = DT_ERR(DT_ENOMEM, "%s: out of memory listing directory", dir);
        else n++;
    }
    closedir(d);
    entry **byf = st == DT_OK ? malloc((size_t)(n ? n : 1) * sizeof *byf) : NULL;
    char **names = st == DT_OK ? malloc((size_t)(n ? n : 1) * sizeof *names) : NULL;
    if (st == DT_OK && (!byf || !names)) st = DT_ERR(DT_ENOMEM, "%s: out of memory listing directory", dir);
    int k = 0;
    if (st == DT_OK) {
        if (n > 1) qsort(v, (size_t)n, sizeof *v, by_path);
        for (int i = 0; i < n; i++) byf[i] = &v[i];
        if (n > 1) qsort(byf, (size_t)n, sizeof *byf, by_file);
        for (int i = 1; i < n; i++)   /* all but the first name of each file */
            byf[i]->drop = byf[i]->dev == byf[i - 1]->dev && byf[i]->ino == byf[i - 1]->ino;
        for (int i = 0; i < n; i++) {
            if (v[i].drop) free(v[i].path);
            else names[k++] = v[i].path;
        }
    } else {
        for (int i = 0; i < n; i++) free(v[i].path);
        free(names);
        names = NULL;
    }
    free(byf);
    free(v);
    *out = names;
    *n_out = k;
    return st;
}
