/* Opening a sharded set: index.json, then every listed file (size, set id,
 * rank), then the pieces of every tensor must tile [0, numel) exactly. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cjson/cJSON.h>
#include "ckpt_internal.h"
#include "st_internal.h"

#define INDEX_MAX ((long)1 << 28)

static dt_status read_text(const char *dir, const char *path, char **out) {
    int fd;
    struct stat sb;
    if (stat(path, &sb) != 0)
        return DT_ERR(DT_EIO, "sharded checkpoint %s: cannot open %s: %s (not a checkpoint directory, "
                      "or the first save did not finish)", dir, DT_CKPT_INDEX_NAME, strerror(errno));
    if (dt_io_open_regular(path, &fd, &sb) != DT_OK)   /* a FIFO, a directory, ...: named, not waited on */
        return DT_ERR(DT_EIO, "sharded checkpoint %s: %s", dir, dt_error_message());
    FILE *f = fdopen(fd, "rb");
    if (!f) close(fd);
    long n = -1;
    if (f && fseek(f, 0, SEEK_END) == 0) n = ftell(f);
    char *buf = n >= 0 && n <= INDEX_MAX ? malloc((size_t)n + 1) : NULL;
    int ok = buf && fseek(f, 0, SEEK_SET) == 0 && fread(buf, 1, (size_t)n, f) == (size_t)n;
    if (f) fclose(f);
    if (!ok) {
        free(buf);
        return DT_ERR(DT_EIO, "sharded checkpoint %s: cannot read %s", dir, DT_CKPT_INDEX_NAME);
    }
    buf[n] = 0;
    *out = buf;
    return DT_OK;
}

static int json_int(const cJSON *v, int64_t lo, int64_t hi, int64_t *out) {
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= (double)lo && v->valuedouble <= (double)hi)) return -1;
    *out = (int64_t)v->valuedouble;
    return (double)*out == v->valuedouble ? 0 : -1;
}

/* "tensors": {"name": [dims], ...} -> the sorted tensor table. */
static dt_status parse_tensors(const char *dir, const cJSON *ts, dt_ckpt *c) {
    if (!cJSON_IsObject(ts)) return DT_ERR(DT_EFORMAT, "sharded checkpoint %s: index 'tensors' is not an object", dir);
    c->t = calloc((size_t)cJSON_GetArraySize(ts) + 1, sizeof *c->t);
    if (!c->t) return DT_ERR(DT_ENOMEM, "%s: out of memory", dir);
    for (const cJSON *v = ts->child; v; v = v->next) {
        dt_ckpt_tensor *t = &c->t[c->n_t++];
        t->dtype = DT_F32;
        if (!(t->name = dt_ckpt_strdup(v->string))) return DT_ERR(DT_ENOMEM, "%s: out of memory", dir);
        t->ndim = cJSON_GetArraySize(v);
        if (!cJSON_IsArray(v) || t->ndim > DT_MAX_DIMS)
            return DT_ERR(DT_EFORMAT, "sharded checkpoint %s: index shape of '%s' is not an array of <= %d dims",
                          dir, t->name, DT_MAX_DIMS);
        t->numel = 1;
        int k = 0;
        for (const cJSON *d = v->child; d; d = d->next, k++) {
            if (json_int(d, 0, (int64_t)1 << 40, &t->shape[k]) != 0)
                return DT_ERR(DT_EFORMAT, "sharded checkpoint %s: index shape of '%s': bad dimension %d", dir, t->name, k);
            if (t->shape[k] && t->numel > ((uint64_t)1 << 50) / (uint64_t)t->shape[k])
                return DT_ERR(DT_EFORMAT, "sharded checkpoint %s: index shape of '%s' is too large", dir, t->name);
            t->numel *= (uint64_t)t->shape[k];
        }
        for (; k < DT_MAX_DIMS; k++) t->shape[k] = 1;
    }
    qsort(c->t, (size_t)c->n_t, sizeof *c->t, dt_ckpt_tensor_cmp);
    for (int i = 1; i < c->n_t; i++)
        if (!strcmp(c->t[i - 1].name, c->t[i].name))
            return DT_ERR(DT_EFORMAT, "sharded checkpoint %s: index lists tensor '%s' twice", dir, c->t[i].name);
    return DT_OK;
}

static dt_status parse_meta(const char *dir, const cJSON *m, dt_ckpt *c) {
    if (!cJSON_IsObject(m)) return DT_ERR(DT_EFORMAT, "sharded checkpoint %s: index 'metadata' is not an object", dir);
    int n = cJSON_GetArraySize(m);
    c->mk = calloc((size_t)n + 1, sizeof *c->mk);
    c->mv = calloc((size_t)n + 1, sizeof *c->mv);
    if (!c->mk || !c->mv) return DT_ERR(DT_ENOMEM, "%s: out of memory", dir);
    for (const cJSON *v = m->child; v; v = v->next) {
        if (!cJSON_IsString(v))
            return DT_ERR(DT_EFORMAT, "sharded checkpoint %s: metadata '%s' is not a string", dir, v->string);
        for (int i = 0; i < c->n_meta; i++)   /* (JSON parsing keeps both; a lookup would see the first) */
            if (!strcmp(c->mk[i], v->string))
                return DT_ERR(DT_EFORMAT, "sharded checkpoint %s: %s: duplicate metadata key '%s'", dir,
                              DT_CKPT_INDEX_NAME, v->string);
        int i = c->n_meta++;
        c->mk[i] = dt_ckpt_strdup(v->string);
        c->mv[i] = dt_ckpt_strdup(v->valuestring);
        if (!c->mk[i] || !c->mv[i]) return DT_ERR(DT_ENOMEM, "%s: out of memory", dir);
    }
    return DT_OK;
}

/* File i of the set: present, the listed size, this set's id and rank i. */
static dt_status open_file(const char *dir, const cJSON *item, int i, int world, const char *set, dt_ckpt *c) {
    const cJSON *nm = cJSON_GetObjectItemCaseSensitive(item, "name");
    int64_t bytes;
    if (!cJSON_IsString(nm) || !*nm->valuestring || strchr(nm->valuestring, '/') ||
        !strcmp(nm->valuestring, "..") ||
        json_int(cJSON_GetObjectItemCaseSensitive(item, "bytes"), 0, INT64_MAX / 2, &bytes) != 0)
        return DT_ERR(DT_EFORMAT, "sharded checkpoint %s: index file entry %d needs a plain 'name' and 'bytes'", dir, i);
    char path[4096];
    if (snprintf(path, sizeof path, "%s/%s", dir, nm->valuestring) >= (int)sizeof path)
        return DT_ERR(DT_EINVAL, "sharded checkpoint %s: path too long", dir);
    struct stat sb;
    if (stat(path, &sb) != 0)
        return DT_ERR(DT_EFORMAT, "sharded checkpoint %s: file %s of set %s (rank %d of %d) is missing: %s",
                      dir, nm->valuestring, set, i, world, strerror(errno));
    if (!S_ISREG(sb.st_mode))   /* (a FIFO would block the open below) */
        return DT_ERR(DT_EFORMAT, "sharded checkpoint %s: file %s of set %s (rank %d of %d) is not a regular file",
                      dir, nm->valuestring, set, i, world);
    if ((int64_t)sb.st_size != bytes)
        return DT_ERR(DT_EFORMAT, "sharded checkpoint %s: file %s is %lld bytes, index.json says %lld "
                      "(truncated or rewritten)", dir, nm->valuestring, (long long)sb.st_size, (long long)bytes);
    dt_ckpt_file *f = &c->files[i];
    DT_TRY(dt_ckpt_file_open(path, f));
    c->n_files = i + 1;
    const char *fs = dt_ckpt_file_meta(f, "set"), *fr = dt_ckpt_file_meta(f, "rank");
    if (!fs || strcmp(fs, set))
        return DT_ERR(DT_EFORMAT, "sharded checkpoint %s: file %s belongs to set '%s', index.json to set '%s' "
                      "(files of different saves)", dir, nm->valuestring, fs ? fs : "none", set);
    char want[16];
    snprintf(want, sizeof want, "%d", i);
    if (!fr || strcmp(fr, want))
        return DT_ERR(DT_EFORMAT, "sharded checkpoint %s: file %s holds rank '%s', index.json lists it as rank %d",
                      dir, nm->valuestring, fr ? fr : "none", i);
    return DT_OK;
}

/* Every entry "<tensor>@<start>" of file i becomes a span of that tensor. */
static dt_status add_pieces(const char *dir, int i, dt_ckpt *c) {
    const dt_ckpt_file *f = &c->files[i];
    const char *fname = strrchr(f->path, '/') + 1;
    for (int k = 0; k < f->n; k++) {
        const dt_ckpt_entry *e = &f->e[k];
        const char *at = strrchr(e->name, '@');
        char *end = NULL;
        unsigned long long start = at ? strtoull(at + 1, &end, 10) : 0;
        if (!at || end == at + 1 || *end)
            return DT_ERR(DT_EFORMAT, "sharded checkpoint %s: %s: entry '%s' is not named <tensor>@<start>",
                          dir, fname, e->name);
        if (e->dtype != DT_F32 || e->ndim != 1)
            return DT_ERR(DT_EFORMAT, "sharded checkpoint %s: %s: piece '%s' is %s with %d dims, expected 1-D F32",
                          dir, fname, e->name, dt_dtype_name(e->dtype), e->ndim);
        char tname[1024];
        if ((size_t)(at - e->name) >= sizeof tname)
            return DT_ERR(DT_EFORMAT, "sharded checkpoint %s: %s: piece name '%.64s...' too long", dir, fname, e->name);
        memcpy(tname, e->name, (size_t)(at - e->name));
        tname[at - e->name] = 0;
        dt_ckpt_tensor *t = dt_ckpt_lookup(c, tname);
        if (!t)
            return DT_ERR(DT_EFORMAT, "sharded checkpoint %s: %s: piece '%s' of a tensor index.json does not list",
                          dir, fname, e->name);
        if (start > t->numel || e->numel > t->numel - start)
            return DT_ERR(DT_EFORMAT, "sharded checkpoint %s: %s: piece '%s' of %" PRIu64 " elements runs past "
                          "the tensor's %" PRIu64, dir, fname, e->name, e->numel, t->numel);
        if (e->numel) DT_TRY(dt_ckpt_add_span(c, t, (dt_ckpt_span){start, e->numel, e->off, i, k}));
    }
    return DT_OK;
}

static int cmp_span(const void *a, const void *b) {
    const dt_ckpt_span *x = a, *y = b;
    return x->start < y->start ? -1 : x->start > y->start;
}

static const char *file_name(const dt_ckpt *c, int i) { return strrchr(c->files[i].path, '/') + 1; }

static dt_status check_tiling(const char *dir, dt_ckpt *c) {
    for (int i = 0; i < c->n_t; i++) {
        dt_ckpt_tensor *t = &c->t[i];
        qsort(t->sp, (size_t)t->n_sp, sizeof *t->sp, cmp_span);
        uint64_t pos = 0;
        for (int k = 0; k <= t->n_sp; k++) {
            uint64_t next = k < t->n_sp ? t->sp[k].start : t->numel;
            if (next > pos)
                return DT_ERR(DT_EFORMAT, "sharded checkpoint %s: tensor '%s' elements [%" PRIu64 ", %" PRIu64
                              ") missing (expected from the %d files of the set)", dir, t->name, pos, next, c->n_files);
            if (next < pos)
                return DT_ERR(DT_EFORMAT, "sharded checkpoint %s: tensor '%s' elements [%" PRIu64 ", %" PRIu64
                              ") stored twice (%s and %s)", dir, t->name, next, pos,
                              file_name(c, t->sp[k - 1].file), file_name(c, t->sp[k].file));
            if (k < t->n_sp) pos = t->sp[k].start + t->sp[k].n;
        }
    }
    return DT_OK;
}

void (*dt__ckpt_after_index_read)(const char *dir);

dt_status dt_ckpt_open_sharded(const char *dir, dt_ckpt *c) {
    char path[4096];
    if (snprintf(path, sizeof path, "%s/%s", dir, DT_CKPT_INDEX_NAME) >= (int)sizeof path)
        return DT_ERR(DT_EINVAL, "sharded checkpoint %s: path too long", dir);
    char *text = NULL;
    DT_TRY(read_text(dir, path, &text));
    if (dt_json_escapes_nul(text)) {
        free(text);
        return DT_ERR(DT_EFORMAT, "%s: escapes a NUL character (\\u0000) in a name or value", path);
    }
    cJSON *root = cJSON_ParseWithOpts(text, NULL, 1);
    free(text);
    dt_status s = DT_OK;
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(root, "format");
    const cJSON *set = cJSON_GetObjectItemCaseSensitive(root, "set");
    const cJSON *files = cJSON_GetObjectItemCaseSensitive(root, "files");
    int64_t world = 0;
    if (!cJSON_IsObject(root))
        s = DT_ERR(DT_EFORMAT, "sharded checkpoint %s: %s is not a JSON object", dir, DT_CKPT_INDEX_NAME);
    else if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, DT_CKPT_INDEX_FORMAT))
        s = DT_ERR(DT_EFORMAT, "sharded checkpoint %s: index format '%s', expected '%s'", dir,
                   cJSON_IsString(fmt) ? fmt->valuestring : "missing", DT_CKPT_INDEX_FORMAT);
    else if (json_int(cJSON_GetObjectItemCaseSensitive(root, "world"), 1, 1 << 20, &world) != 0 ||
             !cJSON_IsString(set) || !cJSON_IsArray(files))
        s = DT_ERR(DT_EFORMAT, "sharded checkpoint %s: index needs 'world', 'set' and 'files'", dir);
    else if (cJSON_GetArraySize(files) != world)
        s = DT_ERR(DT_EFORMAT, "sharded checkpoint %s: index lists %d files for world size %lld", dir,
                   cJSON_GetArraySize(files), (long long)world);
    if (s == DT_OK) s = parse_tensors(dir, cJSON_GetObjectItemCaseSensitive(root, "tensors"), c);
    if (s == DT_OK) s = parse_meta(dir, cJSON_GetObjectItemCaseSensitive(root, "metadata"), c);
    if (s == DT_OK && !(c->files = calloc((size_t)world, sizeof *c->files)))
        s = DT_ERR(DT_ENOMEM, "%s: out of memory", dir);
    if (s == DT_OK && dt__ckpt_after_index_read) dt__ckpt_after_index_read(dir);
    int i = 0;
    for (const cJSON *it = s == DT_OK ? files->child : NULL; it && s == DT_OK; it = it->next, i++)
        s = open_file(dir, it, i, (int)world, set->valuestring, c);
    for (i = 0; s == DT_OK && i < c->n_files; i++) s = add_pieces(dir, i, c);
    if (s == DT_OK) s = check_tiling(dir, c);
    cJSON_Delete(root);
    return s;
}
