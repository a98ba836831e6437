/* Metrics JSONL: one compact JSON object per line, appended and flushed.
 *
 * The file is appended to in place (a run that resumes continues it), so it
 * cannot be written to a temporary file and renamed like checkpoints. A final
 * symbolic link is followed only when the kernel's protected_symlinks rule
 * would follow it: not when it sits in a sticky, world-writable directory
 * (/tmp) and belongs neither to that directory's owner nor to us -- else a
 * local user's planted link makes a root job append to any file. */
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cjson/cJSON.h>
#include "dtrain/io.h"

#ifndef S_ISVTX   /* (XSI; not declared under plain POSIX) */
#define S_ISVTX 01000
#endif

/* open(2) for appending, following a final symbolic link only under the rule
 * above; -1 with errno, or -2 when the link is refused (msg set). */
static int open_append(const char *path, int create, char *msg, size_t n) {
    int fl = O_WRONLY | O_APPEND | O_CLOEXEC | (create ? O_CREAT : 0);
    int fd = open(path, fl | O_NOFOLLOW, 0666);
    if (fd >= 0 || (errno != ELOOP && errno != EACCES)) return fd;
    int e = errno;
    struct stat ls, ds;
    if (lstat(path, &ls) != 0 || !S_ISLNK(ls.st_mode)) {   /* EACCES on a plain file: that is the answer */
        errno = e;
        return -1;
    }
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash) snprintf(dir, sizeof dir, ".");
    else if (slash == dir) dir[1] = 0;
    else *slash = 0;
    if (stat(dir, &ds) == 0 && (ds.st_mode & S_ISVTX) && (ds.st_mode & S_IWOTH) && ls.st_uid != ds.st_uid &&
        ls.st_uid != geteuid()) {
        snprintf(msg, n, "%s: a symbolic link owned by uid %u in the shared directory %s; metrics are not written "
                 "through another user's link (give a path in a directory of your own)", path, (unsigned)ls.st_uid, dir);
        return -2;
    }
    return open(path, fl, 0666);
}

dt_status dt_jsonl_open(dt_jsonl *j, const char *path) {
    if (!j) return DT_ERR(DT_EINVAL, "dt_jsonl_open: NULL handle");
    j->f = NULL;
    if (!path || !*path) return DT_ERR(DT_EINVAL, "dt_jsonl_open: empty path");
    char msg[1400];
    int fd = open_append(path, 1, msg, sizeof msg);
    if (fd == -2) return DT_ERR(DT_EINVAL, "%s", msg);
    j->f = fd >= 0 ? fdopen(fd, "a") : NULL;
    if (!j->f) {
        int e = errno;
        if (fd >= 0) close(fd);
        return DT_ERR(DT_EIO, "%s: cannot open for appending: %s", path, strerror(e));
    }
    snprintf(j->path, sizeof j->path, "%s", path);
    return DT_OK;
}

dt_status dt_jsonl_check(const char *path) {
    if (!path || !*path) return DT_ERR(DT_EINVAL, "dt_jsonl_check: empty path");
    char msg[1400];
    int fd = open_append(path, 0, msg, sizeof msg);
    if (fd == -2) return DT_ERR(DT_EINVAL, "%s", msg);
    if (fd < 0 && errno == ENOENT) return DT_OK;   /* created by dt_jsonl_open */
    if (fd < 0) return DT_ERR(DT_EIO, "%s: cannot open for appending: %s", path, strerror(errno));
    close(fd);
    return DT_OK;
}

/* Integral values (|v| < 1e15) print as integers, others with 9 significant
 * digits (enough for float32); NaN and infinities have no JSON spelling: null. */
static void fmt_number(double v, char *buf, size_t cap) {
    if (!isfinite(v)) snprintf(buf, cap, "null");
    else if (v == trunc(v) && fabs(v) < 1e15) snprintf(buf, cap, "%.0f", v);
    else snprintf(buf, cap, "%.9g", v);
    /* A locale with a decimal comma would produce invalid JSON. */
    for (char *p = buf; *p; p++)
        if (*p == ',') *p = '.';
}

dt_status dt_jsonl_write(dt_jsonl *j, int n_fields, const char *const *keys, const double *values) {
    if (!j || !j->f) return DT_ERR(DT_ESTATE, "dt_jsonl_write: file is not open");
    if (n_fields < 0 || (n_fields > 0 && (!keys || !values)))
        return DT_ERR(DT_EINVAL, "dt_jsonl_write: bad field list (n_fields = %d)", n_fields);
    cJSON *obj = cJSON_CreateObject();
    int ok = obj != NULL;
    for (int i = 0; ok && i < n_fields; i++) {
        if (!keys[i]) {
            cJSON_Delete(obj);
            return DT_ERR(DT_EINVAL, "dt_jsonl_write: field %d has a NULL key", i);
        }
        char num[40];
        fmt_number(values[i], num, sizeof num);
        cJSON *v = cJSON_CreateRaw(num);
        ok = v && cJSON_AddItemToObject(obj, keys[i], v);
        if (!ok) cJSON_Delete(v);
    }
    char *line = ok ? cJSON_PrintUnformatted(obj) : NULL;
    cJSON_Delete(obj);
    if (!line) return DT_ERR(DT_ENOMEM, "dt_jsonl_write: out of memory");
    size_t n = strlen(line);
    line[n] = '\n';   /* replace the terminator; write exactly n + 1 bytes */
    int bad = fwrite(line, 1, n + 1, j->f) != n + 1 || fflush(j->f) != 0;
    int e = errno;
    cJSON_free(line);
    if (bad) return DT_ERR(DT_EIO, "%s: metrics write failed: %s", j->path, strerror(e));
    return DT_OK;
}

dt_status dt_jsonl_close(dt_jsonl *j) {
    if (!j || !j->f) return DT_OK;
    int bad = fclose(j->f) != 0;
    int e = errno;
    j->f = NULL;
    if (bad) return DT_ERR(DT_EIO, "%s: metrics close failed: %s", j->path, strerror(e));
    return DT_OK;
}

/* A line's "step" (-1: none) and whether it is a training step's ("loss") */
static double line_step(const char *line, int *training) {
    cJSON *o = cJSON_Parse(line);
    const cJSON *st = o ? cJSON_GetObjectItemCaseSensitive(o, "step") : NULL;
    double v = cJSON_IsNumber(st) ? st->valuedouble : -1;
    *training = v >= 0 && cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(o, "loss"));
    cJSON_Delete(o);
    return v;
}

/* A resumed run recomputes the steps after its checkpoint: their lines go.
 * The file may hold earlier runs too (appended to by another run, which
 * starts again at a lower step): only the last run's lines are its own, so
 * the cut is the first line past `step` from where the training steps last
 * went down (an evaluation's line never starts a run). Opened for writing
 * under the same link rule as appending. */
dt_status dt_jsonl_drop_after(const char *path, int64_t step) {
    FILE *f = fopen(path, "r");
    if (!f) return errno == ENOENT ? DT_OK : DT_ERR(DT_EIO, "metrics file %s: %s", path, strerror(errno));
    char line[4096];
    long cut = -1, at = 0, run = 0;
    double last = -1;
    while (fgets(line, sizeof line, f)) {   /* where the last run starts */
        int training;
        double v = line_step(line, &training);
        if (training && v < last) run = at;
        if (training) last = v;
        at = ftell(f);
    }
    if (fseek(f, run, SEEK_SET) != 0) {
        fclose(f);
        return DT_ERR(DT_EIO, "metrics file %s: %s", path, strerror(errno));
    }
    at = run;
    while (cut < 0 && fgets(line, sizeof line, f)) {
        int training;
        if (line_step(line, &training) > (double)step) cut = at;
        at = ftell(f);
    }
    fclose(f);
    if (cut < 0) return DT_OK;
    char msg[512] = "";
    int fd = open_append(path, 0, msg, sizeof msg);
    if (fd == -2) return DT_ERR(DT_EINVAL, "%s", msg);
    if (fd < 0) return DT_ERR(DT_EIO, "metrics file %s: %s", path, strerror(errno));
    int rc = ftruncate(fd, (off_t)cut);
    int e = errno;
    close(fd);
    if (rc != 0) return DT_ERR(DT_EIO, "metrics file %s: cannot drop the lines past step %lld: %s", path, (long long)step, strerror(e));
    return DT_OK;
}
