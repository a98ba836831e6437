/* dt_ckpt: one reader for consolidated files and sharded sets. A tensor is a
 * full shape plus spans (element ranges -> file offsets); a consolidated file
 * has one span per tensor, a sharded set one per piece. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "ckpt_internal.h"
#include "st_internal.h"

char *dt_ckpt_strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *p = malloc(n);
    if (p) memcpy(p, s, n);
    return p;
}

void dt_ckpt_fmt_shape(int ndim, const int64_t *shape, char *buf, size_t cap) {
    size_t k = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < ndim && k < cap; i++)
        k += (size_t)snprintf(buf + k, cap - k, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (k < cap) snprintf(buf + k, cap - k, "]");
}

int dt_ckpt_tensor_cmp(const void *a, const void *b) {
    return strcmp(((const dt_ckpt_tensor *)a)->name, ((const dt_ckpt_tensor *)b)->name);
}

dt_ckpt_tensor *dt_ckpt_lookup(const dt_ckpt *c, const char *name) {
    dt_ckpt_tensor key = {.name = (char *)name};
    return bsearch(&key, c->t, (size_t)c->n_t, sizeof *c->t, dt_ckpt_tensor_cmp);
}

dt_status dt_ckpt_add_span(dt_ckpt *c, dt_ckpt_tensor *t, dt_ckpt_span s) {
    if (t->n_sp == t->cap_sp) {
        int cap = t->cap_sp ? 2 * t->cap_sp : 4;
        dt_ckpt_span *p = realloc(t->sp, (size_t)cap * sizeof *p);
        if (!p) return DT_ERR(DT_ENOMEM, "%s: out of memory", c->path);
        t->sp = p;
        t->cap_sp = cap;
    }
    t->sp[t->n_sp++] = s;
    return DT_OK;
}

/* Consolidated file: every tensor is one span. */
static dt_status open_single(const char *path, dt_ckpt *c) {
    c->files = calloc(1, sizeof *c->files);
    if (!c->files) return DT_ERR(DT_ENOMEM, "%s: out of memory", path);
    DT_TRY(dt_ckpt_file_open(path, &c->files[0]));
    c->n_files = 1;
    const dt_ckpt_file *f = &c->files[0];
    c->t = calloc((size_t)f->n + 1, sizeof *c->t);
    if (!c->t) return DT_ERR(DT_ENOMEM, "%s: out of memory", path);
    for (int i = 0; i < f->n; i++) {
        const dt_ckpt_entry *e = &f->e[i];
        dt_ckpt_tensor *t = &c->t[c->n_t++];
        if (!(t->name = dt_ckpt_strdup(e->name))) return DT_ERR(DT_ENOMEM, "%s: out of memory", path);
        t->dtype = e->dtype;
        t->ndim = e->ndim;
        memcpy(t->shape, e->shape, sizeof t->shape);
        t->numel = e->numel;
        DT_TRY(dt_ckpt_add_span(c, t, (dt_ckpt_span){0, e->numel, e->off, 0, i}));
    }
    qsort(c->t, (size_t)c->n_t, sizeof *c->t, dt_ckpt_tensor_cmp);   /* (names are unique: the header parser checked) */
    return DT_OK;
}

/* Everything but the path: c as calloc left it. */
static void ckpt_clear(dt_ckpt *c) {
    for (int i = 0; i < c->n_files; i++) dt_ckpt_file_close(&c->files[i]);
    for (int i = 0; i < c->n_t; i++) { free(c->t[i].name); free(c->t[i].sp); }
    for (int i = 0; i < c->n_meta; i++) { free(c->mk[i]); free(c->mv[i]); }
    free(c->files); free(c->t); free(c->mk); free(c->mv);
    char *path = c->path;
    memset(c, 0, sizeof *c);
    c->path = path;
}

/* index.json's identity: a save replaces it by a rename (a new inode). */
static int index_id(const char *dir, struct stat *sb) {
    char p[4096];
    return snprintf(p, sizeof p, "%s/%s", dir, DT_CKPT_INDEX_NAME) < (int)sizeof p && stat(p, sb) == 0 ? 0 : -1;
}

/* A save into a directory commits its set by renaming index.json over the
 * old one, then removes the old set's files: a reader between the two finds a
 * file of the set it read gone. When the index changed meanwhile, the reader
 * takes the new set (a few times over: saves may follow each other fast);
 * an error with the index unchanged is the directory's own. */
#define CKPT_OPEN_TRIES 8

static dt_status open_sharded(const char *dir, dt_ckpt *c) {
    dt_status s = DT_OK;
    for (int tries = 0; tries < CKPT_OPEN_TRIES; tries++) {
        struct stat before, after;
        int have = index_id(dir, &before) == 0;
        s = dt_ckpt_open_sharded(dir, c);
        if (s == DT_OK || !have || index_id(dir, &after) != 0 || (after.st_ino == before.st_ino &&
            after.st_dev == before.st_dev && after.st_mtim.tv_sec == before.st_mtim.tv_sec &&
            after.st_mtim.tv_nsec == before.st_mtim.tv_nsec && after.st_size == before.st_size))
            return s;
        ckpt_clear(c);
        c->sharded = 1;
    }
    return s;
}

dt_status dt_ckpt_open(const char *path, dt_ckpt **out) {
    if (!out) return DT_ERR(DT_EINVAL, "dt_ckpt_open: NULL output");
    *out = NULL;
    if (!path || !*path) return DT_ERR(DT_EINVAL, "dt_ckpt_open: empty path");
    dt_ckpt *c = calloc(1, sizeof *c);
    if (!c || !(c->path = dt_ckpt_strdup(path))) {
        free(c);
        return DT_ERR(DT_ENOMEM, "%s: out of memory", path);
    }
    struct stat sb;
    dt_status s;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        c->sharded = 1;
        s = open_sharded(path, c);
    } else {
        s = open_single(path, c);
    }
    if (s != DT_OK) {
        dt_ckpt_close(c);
        return s;
    }
    *out = c;
    return DT_OK;
}

void dt_ckpt_close(dt_ckpt *c) {
    if (!c) return;
    ckpt_clear(c);
    free(c->path);
    free(c);
}

const char *dt_ckpt_path(const dt_ckpt *c) { return c ? c->path : "?"; }
int dt_ckpt_is_sharded(const dt_ckpt *c) { return c && c->sharded; }

const char *dt_ckpt_get_meta(const dt_ckpt *c, const char *key) {
    if (!c || !key) return NULL;
    if (!c->sharded) return c->n_files ? dt_ckpt_file_meta(&c->files[0], key) : NULL;
    for (int i = 0; i < c->n_meta; i++)
        if (!strcmp(c->mk[i], key)) return c->mv[i];
    return NULL;
}

int dt_ckpt_find(const dt_ckpt *c, const char *name, int *ndim, int64_t *shape) {
    const dt_ckpt_tensor *t = c && name ? dt_ckpt_lookup(c, name) : NULL;
    if (!t) return 0;
    if (ndim) *ndim = t->ndim;
    if (shape) memcpy(shape, t->shape, sizeof t->shape);
    return 1;
}

/* Where a tensor's shape is recorded, for messages. */
static const char *shape_source(const dt_ckpt *c) {
    return c->sharded ? DT_CKPT_INDEX_NAME " of sharded checkpoint" : "checkpoint";
}

dt_status dt_ckpt_expect(const dt_ckpt *c, const char *name, int ndim, const int64_t *shape) {
    if (!c || !name || ndim < 0 || ndim > DT_MAX_DIMS || (ndim > 0 && !shape))
        return DT_ERR(DT_EINVAL, "dt_ckpt_expect: bad arguments for tensor '%s'", name ? name : "?");
    const dt_ckpt_tensor *t = dt_ckpt_lookup(c, name);
    if (!t) return DT_ERR(DT_EFORMAT, "%s: missing tensor '%s' (%s)", c->path, name, shape_source(c));
    int same = t->ndim == ndim;
    for (int i = 0; same && i < ndim; i++) same = t->shape[i] == shape[i];
    if (!same) {
        char have[128], want[128];
        dt_ckpt_fmt_shape(t->ndim, t->shape, have, sizeof have);
        dt_ckpt_fmt_shape(ndim, shape, want, sizeof want);
        return DT_ERR(DT_EFORMAT, "%s: tensor '%s' has shape %s in the %s, this model expects %s",
                      c->path, name, have, shape_source(c), want);
    }
    return DT_OK;
}

dt_status dt_ckpt_read(const dt_ckpt *c, const char *name, size_t start, size_t n, float *dst) {
    if (!c || !name || (n > 0 && !dst)) return DT_ERR(DT_EINVAL, "dt_ckpt_read: bad arguments");
    const dt_ckpt_tensor *t = dt_ckpt_lookup(c, name);
    if (!t) return DT_ERR(DT_EFORMAT, "%s: missing tensor '%s'", c->path, name);
    if (t->dtype != DT_F32)
        return DT_ERR(DT_EFORMAT, "%s: tensor '%s' is %s, expected F32", c->path, name, dt_dtype_name(t->dtype));
    if (start > t->numel || n > t->numel - start)
        return DT_ERR(DT_EINVAL, "%s: tensor '%s': elements [%zu, %zu) out of range (%" PRIu64 " elements)",
                      c->path, name, start, start + n, t->numel);
    /* first span ending after start (spans tile [0, numel) in order) */
    int lo = 0, hi = t->n_sp;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (t->sp[mid].start + t->sp[mid].n <= start) lo = mid + 1;
        else hi = mid;
    }
    uint64_t pos = start, end = (uint64_t)start + n;
    for (int i = lo; pos < end && i < t->n_sp; i++) {
        const dt_ckpt_span *s = &t->sp[i];
        uint64_t a = pos, b = s->start + s->n < end ? s->start + s->n : end;
        dt_ckpt_file *f = &c->files[s->file];
        dt_ckpt_entry *e = &f->e[s->entry];
        DT_TRY(dt_ckpt_file_pread(f, s->off + (a - s->start) * sizeof(float), dst + (a - start),
                                  (size_t)(b - a) * sizeof(float)));
        /* Checksum: from the bytes just read when they are the whole entry,
         * else by reading the entry once. */
        if (e->has_crc && !e->verified && a == s->start && b == s->start + s->n) {
            DT_TRY(dt_st_crc_verify(f->path, e->name, e->crc,
                                    dt_st_crc_update(0, dst + (a - start), (size_t)(b - a) * sizeof(float))));
            e->verified = 1;
        }
        DT_TRY(dt_ckpt_file_verify(f, s->entry));
        pos = b;
    }
    if (pos != end)   /* unreachable after open's tiling check */
        return DT_ERR(DT_EFORMAT, "%s: tensor '%s': elements from %" PRIu64 " not stored", c->path, name, pos);
    return DT_OK;
}
