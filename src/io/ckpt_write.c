/* Writing a sharded set: per-rank shard files, then index.json (the commit
 * point), then removal of files that belong to other sets. */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <cjson/cJSON.h>
#include "bg_internal.h"
#include "ckpt_internal.h"
#include "st_internal.h"

#define SHARD_PREFIX "shard-"

#ifndef S_ISVTX   /* (XSI; not declared under plain POSIX) */
#define S_ISVTX 01000
#endif

void dt_ckpt_set_id(int64_t step, uint32_t nonce, char *out) {
    snprintf(out, DT_CKPT_SET_MAX, "%lld-%08x", (long long)step, (unsigned)nonce);
}

uint32_t dt_ckpt_nonce(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t x = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
    x ^= (uint64_t)getpid() << 32;
    x += 0x9e3779b97f4a7c15ull;   /* splitmix64 finaliser */
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return (uint32_t)(x ^ (x >> 31));
}

static int shard_name(char *buf, size_t cap, const char *set, int rank) {
    return snprintf(buf, cap, SHARD_PREFIX "%s-r%d.safetensors", set, rank) < (int)cap;
}
int dt__ckpt_shard_name(char *buf, size_t cap, const char *set, int rank) { return shard_name(buf, cap, set, rank); }

/* "a/b/c/" -> "a/b", "c" -> ".", "/c" -> "/" (trailing slashes dropped first) */
static void parent_dir(const char *path, char *buf, size_t n) {
    snprintf(buf, n, "%s", path);
    size_t len = strlen(buf);
    while (len > 1 && buf[len - 1] == '/') buf[--len] = 0;
    char *slash = strrchr(buf, '/');
    if (!slash) snprintf(buf, n, ".");
    else if (slash == buf) buf[1] = 0;
    else *slash = 0;
}

/* Whoever can change a checkpoint directory's entries can swap the shards or
 * the index a resume loads, and a link another user planted points the save
 * (which creates, replaces and deletes files there) wherever they like. So a
 * directory is written only when it is this user's or root's, no symbolic
 * link to it is another user's, and others cannot write it (o+w without the
 * sticky bit). */
dt_status dt_ckpt_check_dir(const char *dir) {
    if (!dir || !*dir) return DT_ERR(DT_EINVAL, "sharded checkpoint: empty directory path");
    char path[4096], parent[4096];
    if (snprintf(path, sizeof path, "%s", dir) >= (int)sizeof path)
        return DT_ERR(DT_EINVAL, "sharded checkpoint %s: path too long", dir);
    for (size_t len = strlen(path); len > 1 && path[len - 1] == '/';) path[--len] = 0;   /* lstat the link itself */
    unsigned me = (unsigned)geteuid();
    struct stat ls, sb;
    if (lstat(path, &ls) != 0) {
        if (errno == ENOENT) return DT_OK;   /* created by us */
        return DT_ERR(DT_EIO, "sharded checkpoint %s: %s", dir, strerror(errno));
    }
    if (S_ISLNK(ls.st_mode) && ls.st_uid != me && ls.st_uid != 0) {
        struct stat ps;
        parent_dir(path, parent, sizeof parent);
        int shared = stat(parent, &ps) == 0 && (ps.st_mode & S_IWOTH) && (ps.st_mode & S_ISVTX);
        return DT_ERR(DT_EINVAL, "sharded checkpoint %s: a symbolic link owned by uid %u (this job runs as uid %u)%s%s; "
                      "a checkpoint is not written through another user's link: they could point it at any "
                      "directory, whose files a save replaces and deletes (give a directory of your own)", dir,
                      (unsigned)ls.st_uid, me, shared ? " in the shared directory " : "", shared ? parent : "");
    }
    if (stat(path, &sb) != 0) {
        if (errno == ENOENT && S_ISLNK(ls.st_mode)) return DT_ERR(DT_EINVAL, "sharded checkpoint %s: a dangling "
                                                                  "symbolic link", dir);
        return DT_ERR(DT_EIO, "sharded checkpoint %s: %s", dir, strerror(errno));
    }
    if (!S_ISDIR(sb.st_mode)) return DT_OK;   /* (refused by the caller, which knows what it expected) */
    if (sb.st_uid != me && sb.st_uid != 0)
        return DT_ERR(DT_EINVAL, "sharded checkpoint %s: the directory is owned by uid %u (this job runs as uid %u); "
                      "its owner could swap the shards or the index a resume loads (use a directory of your own)",
                      dir, (unsigned)sb.st_uid, me);
    if ((sb.st_mode & S_IWOTH) && !(sb.st_mode & S_ISVTX))
        return DT_ERR(DT_EINVAL, "sharded checkpoint %s: the directory (owner uid %u) is writable by every user "
                      "(mode %04o, no sticky bit); anyone could swap the shards or the index a resume loads "
                      "(chmod o-w it, or use another directory)", dir, (unsigned)sb.st_uid,
                      (unsigned)(sb.st_mode & 07777));
    return DT_OK;
}

dt_status dt_ckpt_prepare_dir(const char *dir) {
    DT_TRY(dt_ckpt_check_dir(dir));
    struct stat sb;
    if (stat(dir, &sb) == 0) {
        if (S_ISDIR(sb.st_mode)) return DT_OK;
        return DT_ERR(DT_EINVAL, "sharded checkpoint %s: exists and is not a directory (a consolidated "
                      "checkpoint? use another path or the consolidated format)", dir);
    }
    /* never writable by others, whatever the umask (dt_ckpt_check_dir would refuse it next time) */
    if (mkdir(dir, 0775) != 0 && errno != EEXIST)
        return DT_ERR(DT_EIO, "sharded checkpoint %s: cannot create directory: %s", dir, strerror(errno));
    return DT_OK;
}

/* dir/index.json commits set (read whole: it is small) */
static int committed_set(const char *dir, const char *set) {
    char path[4096];
    if (snprintf(path, sizeof path, "%s/%s", dir, DT_CKPT_INDEX_NAME) >= (int)sizeof path) return 0;
    int fd;
    struct stat sb;
    if (dt_io_open_regular(path, &fd, &sb) != DT_OK) {   /* (a FIFO there: not waited on) */
        dt_error_clear();
        return 0;
    }
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        close(fd);
        return 0;
    }
    char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n + 4096 + 1 > cap) {
            size_t want = cap ? 2 * cap : 65536;
            char *b = realloc(buf, want);
            if (!b) break;
            buf = b;
            cap = want;
        }
        size_t k = fread(buf + n, 1, cap - n - 1, f);
        n += k;
        if (k == 0) break;
    }
    fclose(f);
    int yes = 0;
    if (buf) {
        buf[n] = 0;
        cJSON *root = cJSON_Parse(buf);
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(root, "set");
        yes = cJSON_IsString(id) && !strcmp(id->valuestring, set);
        cJSON_Delete(root);
    }
    free(buf);
    return yes;
}

dt_status dt_ckpt_discard_shard(const char *dir, const char *set, int rank) {
    char path[4096], name[128];
    if (!dir || !set || !shard_name(name, sizeof name, set, rank) ||
        snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path)
        return DT_ERR(DT_EINVAL, "dt_ckpt_discard_shard: bad arguments");
    if (dt__bg_capturing()) return DT_OK;   /* queued, not written: dt_bg_writer_abandon removes it */
    if (committed_set(dir, set)) return DT_OK;   /* (a failure after the commit: the set is the one that loads) */
    if (unlink(path) != 0 && errno != ENOENT)
        return DT_ERR(DT_EIO, "sharded checkpoint %s: cannot remove %s of an uncommitted set: %s", dir, name,
                      strerror(errno));
    return DT_OK;
}

static int is_set_id(const char *set);

dt_status dt_ckpt_write_shard(const char *dir, const char *set, int rank, int world,
                              const dt_ckpt_piece *pieces, int n_pieces) {
    char path[4096], name[128], vr[16], vw[16];
    if (!dir || !set || !is_set_id(set))
        return DT_ERR(DT_EINVAL, "dt_ckpt_write_shard: set id '%s' is not one dt_ckpt_set_id makes", set ? set : "(null)");
    if (!shard_name(name, sizeof name, set, rank) ||
        snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path)
        return DT_ERR(DT_EINVAL, "sharded checkpoint %s: path too long", dir);
    dt_st_entry *e = calloc((size_t)n_pieces + 1, sizeof *e);
    char *names = NULL;
    size_t cap = 0;
    for (int i = 0; i < n_pieces; i++) cap += strlen(pieces[i].tensor) + 24;
    if (!e || !(names = malloc(cap + 1))) {
        free(e);
        return DT_ERR(DT_ENOMEM, "%s: out of memory", path);
    }
    int n = 0;
    size_t used = 0;
    for (int i = 0; i < n_pieces; i++) {
        const dt_ckpt_piece *p = &pieces[i];
        if (p->n == 0) continue;
        char *nm = names + used;
        used += (size_t)snprintf(nm, cap - used, "%s@%zu", p->tensor, p->start) + 1;
        e[n++] = (dt_st_entry){.name = nm, .dtype = DT_F32, .ndim = 1, .shape = {(int64_t)p->n}, .data = p->data};
    }
    snprintf(vr, sizeof vr, "%d", rank);
    snprintf(vw, sizeof vw, "%d", world);
    dt_st_meta meta[3] = {{"set", set}, {"rank", vr}, {"world", vw}};
    dt__bg_next_is_shard(1);   /* (captured: an abandoned save removes it) */
    dt_status s = dt_safetensors_write(path, e, n, meta, 3);
    dt__bg_next_is_shard(0);
    free(e);
    free(names);
    return s;
}

/* index.json body; file sizes come from the directory. */
static dt_status build_index(const char *dir, const char *set, int world, int stage,
                             const dt_ckpt_shape *tensors, int n_tensors, const dt_st_meta *meta,
                             int n_meta, char **out) {
    cJSON *root = cJSON_CreateObject(), *files = NULL, *ts = NULL, *md = NULL;
    int ok = root && cJSON_AddStringToObject(root, "format", DT_CKPT_INDEX_FORMAT) &&
             cJSON_AddNumberToObject(root, "world", world) && cJSON_AddNumberToObject(root, "stage", stage) &&
             cJSON_AddStringToObject(root, "set", set) && (files = cJSON_AddArrayToObject(root, "files")) &&
             (ts = cJSON_AddObjectToObject(root, "tensors")) && (md = cJSON_AddObjectToObject(root, "metadata"));
    dt_status s = DT_OK;
    for (int r = 0; ok && s == DT_OK && r < world; r++) {
        char name[128], path[4096];
        struct stat sb;
        shard_name(name, sizeof name, set, r);
        snprintf(path, sizeof path, "%s/%s", dir, name);
        if (stat(path, &sb) != 0) {
            s = DT_ERR(DT_EIO, "sharded checkpoint %s: rank %d's file %s is not visible: %s", dir, r, name,
                       strerror(errno));
            break;
        }
        cJSON *f = cJSON_CreateObject();
        ok = f && cJSON_AddItemToArray(files, f) && cJSON_AddStringToObject(f, "name", name) &&
             cJSON_AddNumberToObject(f, "bytes", (double)sb.st_size);
    }
    for (int i = 0; ok && s == DT_OK && i < n_tensors; i++) {
        cJSON *sh = cJSON_CreateArray();
        ok = sh && cJSON_AddItemToObject(ts, tensors[i].name, sh);
        for (int d = 0; ok && d < tensors[i].ndim; d++)
            ok = cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)tensors[i].shape[d]));
    }
    for (int i = 0; ok && s == DT_OK && i < n_meta; i++) ok = cJSON_AddStringToObject(md, meta[i].key, meta[i].value) != NULL;
    if (s == DT_OK && (!ok || !(*out = cJSON_Print(root)))) s = DT_ERR(DT_ENOMEM, "%s: out of memory", dir);
    cJSON_Delete(root);
    return s;
}

/* p past n >= 1 characters of `what` (isdigit / isxdigit), or NULL */
static const char *skip_run(const char *p, int (*what)(int), int min, int max) {
    int n = 0;
    while (n < max && what((unsigned char)p[n])) n++;
    return n >= min && !what((unsigned char)p[n]) ? p + n : NULL;
}

/* "<step>-<8 hex>", as dt_ckpt_set_id makes it */
static int is_set_id(const char *set) {
    const char *p = skip_run(set, isdigit, 1, 20);
    return p && *p == '-' && (p = skip_run(p + 1, isxdigit, 8, 8)) && !*p;
}

/* A name this writer makes: "shard-<step>-<8 hex>-r<rank>.safetensors", or
 * its atomic temp file (+ ".tmp.<pid>.<n>"). Only those are removed: a
 * user's "shard-notes.txt" in the directory is not dtrain's to delete. */
static int is_shard_file(const char *name) {
    const char *p = !strncmp(name, SHARD_PREFIX, strlen(SHARD_PREFIX)) ? name + strlen(SHARD_PREFIX) : NULL;
    if (p) p = skip_run(p, isdigit, 1, 20);
    if (p && *p == '-') p = skip_run(p + 1, isxdigit, 8, 8);
    else p = NULL;
    if (p && !strncmp(p, "-r", 2)) p = skip_run(p + 2, isdigit, 1, 10);
    else p = NULL;
    if (!p || strncmp(p, ".safetensors", 12)) return 0;
    p += 12;
    if (!*p) return 1;
    if (strncmp(p, ".tmp.", 5) || !(p = skip_run(p + 5, isdigit, 1, 20)) || *p != '.') return 0;
    return (p = skip_run(p + 1, isdigit, 1, 10)) && !*p;
}

/* (bg_internal.h) the set of the shard file at shard_path is the one its
 * directory's index commits */
int dt__ckpt_shard_committed(const char *shard_path) {
    const char *slash = strrchr(shard_path, '/'), *base = slash ? slash + 1 : shard_path;
    const char *r = strstr(base, "-r");   /* (a set id holds digits, '-' and lowercase hex: no "-r") */
    char dir[4096], set[DT_CKPT_SET_MAX];
    if (!is_shard_file(base) || !r) return 0;
    size_t sl = (size_t)(r - base) - strlen(SHARD_PREFIX);
    if (sl >= sizeof set || snprintf(dir, sizeof dir, "%s", slash ? shard_path : ".") >= (int)sizeof dir) return 0;
    if (slash) dir[slash == shard_path ? 1 : slash - shard_path] = 0;   /* "/x": the root */
    memcpy(set, base + strlen(SHARD_PREFIX), sl);
    set[sl] = 0;
    return committed_set(dir, set);
}

/* Shards (or their temp files) of another set than `set`, and index temp files. */
static int stale(const char *name, const char *set) {
    char keep[128];
    int n = snprintf(keep, sizeof keep, SHARD_PREFIX "%s-r", set);
    if (is_shard_file(name)) return strncmp(name, keep, (size_t)n) != 0;
    return !strncmp(name, DT_CKPT_INDEX_NAME ".tmp.", strlen(DT_CKPT_INDEX_NAME ".tmp."));
}

static void remove_stale(const char *dir, const char *set) {
    DIR *d = opendir(dir);
    if (!d) return;   /* best effort: the committed set is complete either way */
    struct dirent *de;
    char path[4096];
    while ((de = readdir(d)))
        if (stale(de->d_name, set) && snprintf(path, sizeof path, "%s/%s", dir, de->d_name) < (int)sizeof path)
            unlink(path);
    closedir(d);
}

dt_status dt_ckpt_write_index(const char *dir, const char *set, int world, int stage,
                              const dt_ckpt_shape *tensors, int n_tensors,
                              const dt_st_meta *meta, int n_meta) {
    if (!dir || !set || world < 1 || n_tensors < 0 || (n_tensors && !tensors) || n_meta < 0 || (n_meta && !meta))
        return DT_ERR(DT_EINVAL, "dt_ckpt_write_index: bad arguments");
    if (!is_set_id(set))   /* (the names a later save removes, or an abandoned one keeps, follow from it) */
        return DT_ERR(DT_EINVAL, "dt_ckpt_write_index: set id '%s' is not one dt_ckpt_set_id makes", set);
    char *json = NULL, path[4096];
    if (snprintf(path, sizeof path, "%s/%s", dir, DT_CKPT_INDEX_NAME) >= (int)sizeof path)
        return DT_ERR(DT_EINVAL, "sharded checkpoint %s: path too long", dir);
    dt_bg_writer *bg = dt__bg_capturing();   /* in the background, once every shard is there */
    if (bg) return dt__bg_queue_index(bg, dir, set, world, stage, tensors, n_tensors, meta, n_meta);
    DT_TRY(build_index(dir, set, world, stage, tensors, n_tensors, meta, n_meta, &json));
    dt_status s = dt_write_file_atomic(path, json, strlen(json));
    cJSON_free(json);
    if (s == DT_OK) remove_stale(dir, set);
    return s;
}
