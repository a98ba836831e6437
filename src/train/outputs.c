/* Output paths, checked before training so that a run never trains to the end
 * and then fails to write its result: --save, --trace and --metrics must be
 * writable on the ranks that write them. Checking leaves nothing behind: a
 * probe file is created where the output will go and removed at once. A
 * sharded --save DIR must not be another user's directory or link, nor
 * writable by every user (dt_ckpt_check_dir). It is claimed after the
 * configuration agreement: rank 0 creates it if missing and holds its lock
 * file for the trainer's life (one writer per directory), refusing to start
 * when another job holds it. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "trainer_internal.h"

/* creates and removes <dir>/.dtrain-probe.<pid>.<k> (k: the first name free,
 * for ranks of the same pid on other hosts sharing the directory); fails
 * naming the setting (train.save, ...) and the path */
static dt_status probe_dir(const char *dir, const char *setting, const char *path) {
    char probe[4200];
    for (int k = 0; k < 64; k++) {
        if (snprintf(probe, sizeof probe, "%s/.dtrain-probe.%ld.%d", dir, (long)getpid(), k) >= (int)sizeof probe)
            return DT_ERR(DT_EINVAL, "%s %s: path too long", setting, path);
        int fd = open(probe, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (fd < 0 && errno == EEXIST) continue;
        if (fd < 0) return DT_ERR(DT_EIO, "%s %s: cannot create files in %s: %s", setting, path, dir, strerror(errno));
        close(fd);
        unlink(probe);
        return DT_OK;
    }
    return DT_ERR(DT_EIO, "%s %s: cannot create a probe file in %s (64 names taken)", setting, path, dir);
}

/* "a/b/c" -> "a/b", "c" -> ".", "/c" -> "/" */
static dt_status parent_of(const char *path, char *buf, size_t n, const char *setting) {
    const char *slash = strrchr(path, '/');
    size_t len = slash ? (size_t)(slash - path) : 1;
    if (slash && len == 0) len = 1;   /* the root */
    if (len >= n) return DT_ERR(DT_EINVAL, "%s %s: path too long", setting, path);
    memcpy(buf, slash ? path : ".", len);
    buf[len] = 0;
    return DT_OK;
}

/* A file written whole (temp file next to it, then rename: the directory must
 * take new files) or appended to (an existing file must be writable). */
static dt_status check_file(const char *setting, const char *path, int append) {
    if (!*path) return DT_ERR(DT_EINVAL, "%s: empty path", setting);
    struct stat sb;
    /* a file written whole is renamed into place, which replaces a link
     * itself: one's own link would leave its target silently stale (another
     * user's link planted in a shared directory is meant to be replaced: its
     * target is never written) */
    if (!append && lstat(path, &sb) == 0 && S_ISLNK(sb.st_mode) && sb.st_uid == geteuid())
        return DT_ERR(DT_EINVAL, "%s %s: is a symbolic link (a save replaces the file by rename, which would replace "
                      "the link, not write its target): give the target's path", setting, path);
    if (stat(path, &sb) == 0) {
        if (S_ISDIR(sb.st_mode)) return DT_ERR(DT_EINVAL, "%s %s: is a directory, expected a file", setting, path);
        if (!append && !S_ISREG(sb.st_mode))   /* the rename would replace a device or pipe */
            return DT_ERR(DT_EINVAL, "%s %s: exists and is not a regular file", setting, path);
        if (append) {   /* (the metrics file: its link rule is the io layer's) */
            dt_status s = dt_jsonl_check(path);
            return s == DT_OK ? DT_OK : DT_ERR(s, "%s %s", setting, dt_error_message());
        }
    } else if (errno != ENOENT) {
        return DT_ERR(DT_EIO, "%s %s: %s", setting, path, strerror(errno));
    }
    char dir[4096];
    DT_TRY(parent_of(path, dir, sizeof dir, setting));
    return probe_dir(dir, setting, path);
}

/* A directory of files (sharded checkpoint): writable if it exists, else its
 * parent must take the new directory. */
static dt_status check_dir(const char *setting, const char *path) {
    if (!*path) return DT_ERR(DT_EINVAL, "%s: empty path", setting);
    dt_status c = dt_ckpt_check_dir(path);   /* another user's link or directory: not even a probe */
    if (c != DT_OK) return DT_ERR(c, "%s: %s", setting, dt_error_message());
    struct stat sb;
    if (stat(path, &sb) == 0) {
        if (!S_ISDIR(sb.st_mode))
            return DT_ERR(DT_EINVAL, "%s %s: exists and is not a directory (this run writes a sharded checkpoint "
                          "directory; use another path or zero.save_format consolidated)", setting, path);
        return probe_dir(path, setting, path);
    }
    if (errno != ENOENT) return DT_ERR(DT_EIO, "%s %s: %s", setting, path, strerror(errno));
    char dir[4096];
    DT_TRY(parent_of(path, dir, sizeof dir, setting));
    return probe_dir(dir, setting, path);
}

void dt_trainer_trace_path(const dt_trainer *t, char *buf, size_t n) {
    if (t->strat.world > 1) snprintf(buf, n, "%s.rank%d", t->opts.trace, t->strat.rank);
    else snprintf(buf, n, "%s", t->opts.trace);
}

/* a status and message, one float per byte */
#define VERDICT_LEN 1024

/* Every rank of pg ends with the verdict of the lowest rank whose s failed
 * (its status and message) or DT_OK when none did, so all fail alike and at
 * once: a failure only some ranks can see (their own paths, rank 0's lock)
 * would otherwise leave the others waiting in the next collective, and the
 * job's one error line is the same whichever rank is quickest. Collective
 * over pg. */
static dt_status share_verdict(dt_pg *pg, dt_status s) {
    int n = dt_pg_size(pg), me = dt_pg_rank(pg), root = -1;
    char mine[VERDICT_LEN];
    snprintf(mine, sizeof mine, "%s", s != DT_OK ? dt_error_message() : "");
    float *v = calloc((size_t)n + 1 + VERDICT_LEN, sizeof *v), failed = s != DT_OK;
    if (!v) return s != DT_OK ? s : DT_ERR(DT_ENOMEM, "out of memory");
    dt_status b = dt_allgather(pg, &failed, v, 1, DT_F32, NULL);
    for (int r = 0; b == DT_OK && r < n && root < 0; r++)
        if (v[r] != 0.0f) root = r;
    float *m = v + n;
    if (b == DT_OK && root >= 0) {
        if (me == root) {
            m[0] = (float)s;
            for (int i = 0; i < VERDICT_LEN - 1 && mine[i]; i++) m[1 + i] = (float)(unsigned char)mine[i];
        }
        dt_work *w = NULL;
        b = dt_broadcast(pg, m, 1 + VERDICT_LEN, DT_F32, root, &w);
        if (b == DT_OK) b = dt_work_wait(w);
    }
    dt_status out = s != DT_OK ? DT_ERR(s, "%s", mine) : b;
    if (b == DT_OK && root >= 0 && root != me) {   /* the lowest refusing rank's error, alike everywhere */
        char msg[VERDICT_LEN];
        int i = 0;
        for (; i < VERDICT_LEN - 1 && m[1 + i] != 0.0f; i++) msg[i] = (char)(unsigned char)m[1 + i];
        msg[i] = 0;
        out = DT_ERR((dt_status)m[0], "%s", msg);
    }
    free(v);
    return out;
}

/* The job's world when the trainer's ranks are all of it (else NULL: the
 * caller's groups are its own business). */
static dt_status world_of(const dt_trainer *t, dt_pg **pg) {
    *pg = NULL;
    if (t->strat.world > 1 && dt_dist_initialized() && t->strat.world == dt_dist_world_size()) return dt_pg_world(pg);
    return DT_OK;
}

dt_status dt_trainer_check_outputs(const dt_trainer *t) {
    const dt_train_opts *o = &t->opts;
    int rank0 = t->strat.rank == 0;
    if (o->save && t->strat.save_is_dir) DT_TRY(check_dir("train.save", o->save));   /* every rank writes its shard */
    else if (o->save && rank0) DT_TRY(check_file("train.save", o->save, 0));
    /* (uneven: the rank with the most data writes them, known only later: every rank checks) */
    if (o->metrics && (rank0 || o->uneven)) DT_TRY(check_file("train.metrics", o->metrics, 1));
    if (o->trace) {
        char path[4096];
        dt_trainer_trace_path(t, path, sizeof path);
        DT_TRY(check_file("train.trace", path, 0));
    }
    return DT_OK;
}

dt_status dt_trainer_claim_outputs(dt_trainer *t) {
    const dt_train_opts *o = &t->opts;
    dt_pg *pg = NULL;
    DT_TRY(world_of(t, &pg));
    int root = pg ? dt_pg_rank(pg) == 0 : t->strat.rank == 0;
    /* several ranks: the paths are checked here, after the configuration
     * agreement, where every rank is (one rank: at creation's start) */
    dt_status s = t->strat.world > 1 ? dt_trainer_check_outputs(t) : DT_OK;
    if (s == DT_OK && root && o->save && t->strat.save_is_dir) {
        dt_status l = dt_ckpt_lock_dir(o->save, &t->save_lock);
        if (l != DT_OK) s = DT_ERR(l, "train.save: %s", dt_error_message());
    }
    if (!pg) return s;
    s = share_verdict(pg, s);
    dt_status f = dt_pg_free(pg);
    return s != DT_OK ? s : f;
}

dt_status dt_trainer_finish(dt_trainer *t) {
    if (!t) return DT_ERR(DT_EINVAL, "dt_trainer_finish: trainer is NULL");
    if (t->finished) return DT_OK;   /* finished once: nothing left to report */
    t->finished = 1;
    dt_status s = DT_OK;
    dt_bg_writer_free(t->bg);   /* (settled on success; else queued files are written, no set commits
                                    unless every shard of it is complete) */
    t->bg = NULL;
    if (t->strat.destroy) t->strat.destroy(t->strat.self);   /* strategies hold the trace */
    t->strat.destroy = NULL;
    if (t->trace) {
        s = dt_trace_close(t->trace);
        t->trace = t->run.trace = NULL;
    }
    if (t->metrics.f) {
        dt_status m = dt_jsonl_close(&t->metrics);
        if (s == DT_OK) s = m;
    }
    return s;
}
