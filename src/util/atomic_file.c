/* Atomic file replacement: temp file in the target's directory, fsync,
 * rename, fsync of the directory. A crash or error never leaves a partially
 * written file at the destination. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "util/atomic_file.h"
#include "util/log_internal.h"

/* Distinguishes temp files of concurrent writers within one process. */
static atomic_uint tmp_counter;

static char *str_dup(const char *s) {
    size_t n = strlen(s) + 1;
    char *p = malloc(n);
    if (p) memcpy(p, s, n);
    return p;
}

static void af_release(dt_atomic_file *af) {
    free(af->path);
    free(af->tmp_path);
    af->path = af->tmp_path = NULL;
    af->f = NULL;
}

/* The pid of name if it is one of path's temp files ("<base>.tmp.<pid>.<n>"), else 0. */
static long temp_pid(const char *name, const char *base) {
    size_t nb = strlen(base);
    if (strncmp(name, base, nb) || strncmp(name + nb, ".tmp.", 5)) return 0;
    const char *p = name + nb + 5;
    char *end;
    if (*p < '0' || *p > '9') return 0;
    long pid = strtol(p, &end, 10);
    if (*end != '.' || end[1] < '0' || end[1] > '9') return 0;
    strtoul(end + 1, &end, 10);
    return *end == 0 && pid > 0 ? pid : 0;
}

/* Removes temp files of path left by writers that died mid-write (killed
 * saves): their pid is not a live process here. A live pid's file may be a
 * save in progress and is kept (so is every file when the pid is alive but
 * another user's: EPERM). Temp files of a writer on another host sharing
 * the directory would look dead; a target written from two hosts at once is
 * not supported anyway. Best effort: failures are ignored. */
static void remove_stale_temps(const char *path) {
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    if (!*base) return;
    char *dir = slash ? malloc((size_t)(slash - path) + 2) : str_dup(".");
    if (!dir) return;
    if (slash) {
        size_t n = slash == path ? 1 : (size_t)(slash - path);
        memcpy(dir, path, n);
        dir[n] = 0;
    }
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            long pid = temp_pid(e->d_name, base);
            if (!pid || pid == (long)getpid() || pid != (long)(pid_t)pid) continue;
            if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue;
            if (unlinkat(dirfd(d), e->d_name, 0) == 0)
                dt_log(DT_LOG_WARN, "%s: removed %s/%s, left by writer %ld which no longer runs (a killed save)\n",
                       path, dir, e->d_name, pid);
        }
        closedir(d);
    }
    free(dir);
}

dt_status dt_atomic_open(dt_atomic_file *af, const char *path) {
    memset(af, 0, sizeof *af);
    if (!path || !*path) return DT_ERR(DT_EINVAL, "atomic write: empty path");
    remove_stale_temps(path);
    af->path = str_dup(path);
    size_t cap = strlen(path) + 64;
    af->tmp_path = malloc(cap);
    if (!af->path || !af->tmp_path) {
        af_release(af);
        return DT_ERR(DT_ENOMEM, "%s: out of memory", path);
    }
    /* the file it replaces keeps its permissions (a checkpoint kept 0600
     * does not become 0644 at the next save): the temp file is created with
     * no more than them, so no one else can open it meanwhile, then given
     * them exactly (umask's bits back; never setuid). lstat: a link is
     * replaced, its target's mode is not ours to copy. */
    struct stat old;
    int keep = lstat(path, &old) == 0 && S_ISREG(old.st_mode) && old.st_uid == geteuid();
    mode_t create = keep ? old.st_mode & 0666 : 0666;
    int fd = -1;
    for (int attempt = 0; attempt < 100 && fd < 0; attempt++) {
        unsigned n = atomic_fetch_add(&tmp_counter, 1u);
        snprintf(af->tmp_path, cap, "%s.tmp.%ld.%u", path, (long)getpid(), n);
        /* O_EXCL: never an existing file, nor a final symbolic link planted
         * under the temp name (O_NOFOLLOW says so for any reader) */
        fd = open(af->tmp_path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, create);
        if (fd < 0 && errno != EEXIST) break;
    }
    if (fd < 0) {
        int e = errno;
        dt_status s = DT_ERR(DT_EIO, "%s: cannot create temp file '%s': %s", path,
                             af->tmp_path, strerror(e));
        af_release(af);
        return s;
    }
    if (keep) (void)fchmod(fd, old.st_mode & 0777);   /* (best effort, like umask's) */
    af->f = fdopen(fd, "wb");
    if (!af->f) {
        int e = errno;
        close(fd);
        unlink(af->tmp_path);
        dt_status s = DT_ERR(DT_EIO, "%s: fdopen failed: %s", path, strerror(e));
        af_release(af);
        return s;
    }
    return DT_OK;
}

dt_status dt_atomic_write(dt_atomic_file *af, const void *bytes, size_t n) {
    if (!af->f) return DT_ERR(DT_ESTATE, "atomic write: file is not open");
    if (n == 0) return DT_OK;
    if (fwrite(bytes, 1, n, af->f) != n) {
        int e = errno;
        return DT_ERR(DT_EIO, "%s: write failed: %s", af->path, strerror(e));
    }
    return DT_OK;
}

dt_status dt_atomic_pwrite(dt_atomic_file *af, uint64_t off, const void *bytes, size_t n) {
    if (!af->f) return DT_ERR(DT_ESTATE, "atomic write: file is not open");
    if (fflush(af->f) != 0) return DT_ERR(DT_EIO, "%s: write failed: %s", af->path, strerror(errno));
    const unsigned char *p = bytes;
    while (n > 0) {
        ssize_t k = pwrite(fileno(af->f), p, n, (off_t)off);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return DT_ERR(DT_EIO, "%s: write failed: %s", af->path, k < 0 ? strerror(errno) : "no progress");
        p += k; off += (uint64_t)k; n -= (size_t)k;
    }
    return DT_OK;
}

void dt_atomic_discard(dt_atomic_file *af) {
    if (af->f) fclose(af->f);
    if (af->tmp_path) unlink(af->tmp_path);
    af_release(af);
}

/* fsync the directory holding path so the rename itself is durable. */
static dt_status fsync_parent_dir(const char *path) {
    const char *slash = strrchr(path, '/');
    char *dir;
    if (!slash) {
        dir = str_dup(".");
    } else {
        size_t n = slash == path ? 1 : (size_t)(slash - path);
        dir = malloc(n + 1);
        if (dir) { memcpy(dir, path, n); dir[n] = 0; }
    }
    if (!dir) return DT_ERR(DT_ENOMEM, "%s: out of memory", path);
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    dt_status s = DT_OK;
    if (fd < 0) {
        s = DT_ERR(DT_EIO, "%s: cannot open directory '%s' for fsync: %s", path, dir,
                   strerror(errno));
    } else {
        /* Some file systems cannot fsync directories; that is not an error. */
        if (fsync(fd) != 0 && errno != EINVAL && errno != ENOTSUP)
            s = DT_ERR(DT_EIO, "%s: fsync of directory '%s' failed: %s", path, dir,
                       strerror(errno));
        close(fd);
    }
    free(dir);
    return s;
}

dt_status dt_atomic_commit(dt_atomic_file *af) {
    if (!af->f) {
        dt_atomic_discard(af);
        return DT_ERR(DT_ESTATE, "atomic write: file is not open");
    }
    const char *what = NULL;
    int e = 0;
    if (fflush(af->f) != 0) { what = "write"; e = errno; }
    else if (fsync(fileno(af->f)) != 0) { what = "fsync"; e = errno; }
    FILE *f = af->f;
    af->f = NULL;
    if (fclose(f) != 0 && !what) { what = "close"; e = errno; }
    if (!what && rename(af->tmp_path, af->path) != 0) { what = "rename"; e = errno; }
    if (what) {
        dt_status s = DT_ERR(DT_EIO, "%s: %s failed: %s", af->path, what, strerror(e));
        dt_atomic_discard(af);
        return s;
    }
    dt_status s = fsync_parent_dir(af->path);
    af_release(af);
    return s;
}

dt_status dt_write_file_atomic(const char *path, const void *bytes, size_t n) {
    if (n > 0 && !bytes) return DT_ERR(DT_EINVAL, "%s: atomic write of NULL data", path ? path : "?");
    dt_atomic_file af;
    DT_TRY(dt_atomic_open(&af, path));
    dt_status s = dt_atomic_write(&af, bytes, n);
    if (s != DT_OK) {
        dt_atomic_discard(&af);
        return s;
    }
    return dt_atomic_commit(&af);
}
