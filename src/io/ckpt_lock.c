/* One writer per sharded checkpoint directory. Two jobs saving into the same
 * directory destroy each other's sets (each save removes every file of other
 * sets, ckpt_write.c), so a writer holds <dir>/.dtrain.lock locked with fcntl
 * (a whole-file write lock: also on NFS, through its lock manager) for as
 * long as it keeps the descriptor open, and writes "pid <pid> host <host>"
 * into it for whoever is refused. The file stays when the job ends: removing
 * a lock file races with a process about to lock it; the kernel releases the
 * lock of a holder that dies, however it dies. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "ckpt_internal.h"

dt_status dt_ckpt_lock_dir(const char *dir, int *fd_out) {
    *fd_out = -1;
    DT_TRY(dt_ckpt_prepare_dir(dir));
    char path[4096];
    if (snprintf(path, sizeof path, "%s/%s", dir, DT_CKPT_LOCK_NAME) >= (int)sizeof path)
        return DT_ERR(DT_EINVAL, "sharded checkpoint %s: path too long", dir);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0666);
    if (fd < 0) return DT_ERR(DT_EIO, "sharded checkpoint %s: cannot open its lock file %s: %s", dir, path, strerror(errno));
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 0};
    if (fcntl(fd, F_SETLK, &fl) == 0) {
        char host[256] = "?", line[320];
        if (gethostname(host, sizeof host) != 0) strcpy(host, "?");
        host[sizeof host - 1] = 0;
        int n = snprintf(line, sizeof line, "pid %ld host %s\n", (long)getpid(), host);
        /* (who holds it is for the message of a refused writer only) */
        if (ftruncate(fd, 0) != 0 || pwrite(fd, line, (size_t)n, 0) != (ssize_t)n) {}
        *fd_out = fd;
        return DT_OK;
    }
    int e = errno;
    if (e != EACCES && e != EAGAIN) {
        close(fd);
        return DT_ERR(DT_EIO, "sharded checkpoint %s: cannot lock %s: %s", dir, path, strerror(e));
    }
    /* held by another process: name it (its own words; else what the kernel says) */
    char buf[320] = {0}, host[256] = "an unknown host";
    long pid = 0;
    ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
    if (n > 0) buf[n] = 0;
    if (n <= 0 || sscanf(buf, "pid %ld host %255s", &pid, host) != 2) {
        struct flock q = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 0};
        pid = fcntl(fd, F_GETLK, &q) == 0 && q.l_type != F_UNLCK ? (long)q.l_pid : 0;
        if (pid > 0 && gethostname(host, sizeof host) != 0) strcpy(host, "this host");
        host[sizeof host - 1] = 0;
    }
    close(fd);
    char who[320];
    if (pid > 0) snprintf(who, sizeof who, "pid %ld on host %s", pid, host);
    else snprintf(who, sizeof who, "a process on %s", host);
    return DT_ERR(DT_ESTATE, "sharded checkpoint %s is in use by another job (%s holds %s): "
                  "two jobs saving into one directory would delete each other's checkpoints; "
                  "use another directory or wait until that job ends", dir, who, path);
}

void dt_ckpt_unlock_dir(int fd) {
    if (fd >= 0) close(fd);   /* closing releases the lock */
}
