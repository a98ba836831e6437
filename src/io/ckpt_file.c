/* Random-access safetensors: only the header is read and validated at open;
 * tensor bytes are read later with pread (checkpoint loads read just the
 * ranges they need, never the whole file). */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cjson/cJSON.h>
#include "ckpt_internal.h"

#define HEADER_MAX ((uint64_t)1 << 30)   /* refuse absurd header lengths before allocating */
#define EXACT_MAX 9007199254740992.0     /* 2^53 */

static int json_u64(const cJSON *v, uint64_t *out) {
    if (!cJSON_IsNumber(v)) return -1;
    double d = v->valuedouble;
    if (!(d >= 0.0 && d <= EXACT_MAX) || (double)(uint64_t)d != d) return -1;
    *out = (uint64_t)d;
    return 0;
}

static dt_status read_full(int fd, const char *path, uint64_t off, void *dst, size_t n) {
    unsigned char *p = dst;
    while (n > 0) {
        ssize_t k = pread(fd, p, n, (off_t)off);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) return DT_ERR(DT_EIO, "%s: read failed: %s", path, strerror(errno));
        if (k == 0) return DT_ERR(DT_EFORMAT, "%s: unexpected end of file at byte %" PRIu64, path, off);
        p += k; off += (uint64_t)k; n -= (size_t)k;
    }
    return DT_OK;
}

static dt_status parse_entry(const dt_ckpt_file *f, const cJSON *it, uint64_t data_start,
                             dt_ckpt_entry *e) {
    const char *path = f->path, *name = it->string;
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(it, "dtype");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(it, "shape");
    const cJSON *of = cJSON_GetObjectItemCaseSensitive(it, "data_offsets");
    if (!cJSON_IsObject(it) || !cJSON_IsString(dt) || !cJSON_IsArray(sh) || !cJSON_IsArray(of))
        return DT_ERR(DT_EFORMAT, "%s: tensor '%s': needs 'dtype', 'shape' and 'data_offsets'", path, name);
    if (dt_dtype_parse(dt->valuestring, &e->dtype) != 0)
        return DT_ERR(DT_EFORMAT, "%s: tensor '%s': unsupported dtype '%s'", path, name, dt->valuestring);
    e->ndim = cJSON_GetArraySize(sh);
    if (e->ndim > DT_MAX_DIMS)
        return DT_ERR(DT_EFORMAT, "%s: tensor '%s': rank %d not supported (max %d)", path, name,
                      e->ndim, DT_MAX_DIMS);
    uint64_t numel = 1, d;
    int k = 0;
    for (const cJSON *v = sh->child; v; v = v->next, k++) {
        if (json_u64(v, &d) != 0)
            return DT_ERR(DT_EFORMAT, "%s: tensor '%s': shape dimension %d is not a valid integer", path, name, k);
        if (d && numel > UINT64_MAX / 8 / d)
            return DT_ERR(DT_EFORMAT, "%s: tensor '%s': shape overflows", path, name);
        e->shape[k] = (int64_t)d;
        numel *= d;
    }
    for (; k < DT_MAX_DIMS; k++) e->shape[k] = 1;
    uint64_t b, en, nbytes = numel * dt_dtype_size(e->dtype);
    if (cJSON_GetArraySize(of) != 2 || json_u64(of->child, &b) || json_u64(of->child->next, &en))
        return DT_ERR(DT_EFORMAT, "%s: tensor '%s': 'data_offsets' must be two non-negative integers", path, name);
    if (b > en || en > f->size - data_start)
        return DT_ERR(DT_EFORMAT, "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] beyond the "
                      "%" PRIu64 "-byte data section (truncated file?)", path, name, b, en, f->size - data_start);
    if (en - b != nbytes)
        return DT_ERR(DT_EFORMAT, "%s: tensor '%s': data_offsets span %" PRIu64 " bytes, shape needs %" PRIu64,
                      path, name, en - b, nbytes);
    e->numel = numel;
    e->off = data_start + b;
    e->name = dt_ckpt_strdup(name);
    return e->name ? DT_OK : DT_ERR(DT_ENOMEM, "%s: out of memory", path);
}

static dt_status parse_meta(dt_ckpt_file *f, const cJSON *m) {
    if (!cJSON_IsObject(m)) return DT_ERR(DT_EFORMAT, "%s: '__metadata__' is not an object", f->path);
    int n = cJSON_GetArraySize(m);
    f->mk = calloc((size_t)n + 1, sizeof *f->mk);
    f->mv = calloc((size_t)n + 1, sizeof *f->mv);
    if (!f->mk || !f->mv) return DT_ERR(DT_ENOMEM, "%s: out of memory", f->path);
    for (const cJSON *v = m->child; v; v = v->next) {
        if (!cJSON_IsString(v)) return DT_ERR(DT_EFORMAT, "%s: metadata '%s' is not a string", f->path, v->string);
        if (dt_ckpt_file_meta(f, v->string))
            return DT_ERR(DT_EFORMAT, "%s: duplicate metadata key '%s'", f->path, v->string);
        int i = f->n_meta++;
        f->mk[i] = dt_ckpt_strdup(v->string);
        f->mv[i] = dt_ckpt_strdup(v->valuestring);
        if (!f->mk[i] || !f->mv[i]) return DT_ERR(DT_ENOMEM, "%s: out of memory", f->path);
    }
    return DT_OK;
}

static dt_status parse_header(dt_ckpt_file *f, const char *text, uint64_t data_start) {
    cJSON *root = cJSON_ParseWithOpts(text, NULL, 1);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return DT_ERR(DT_EFORMAT, "%s: safetensors header is not a JSON object", f->path);
    }
    dt_status s = DT_OK;
    f->e = calloc((size_t)cJSON_GetArraySize(root) + 1, sizeof *f->e);
    if (!f->e) s = DT_ERR(DT_ENOMEM, "%s: out of memory", f->path);
    for (const cJSON *v = root->child; v && s == DT_OK; v = v->next) {
        if (!strcmp(v->string, "__metadata__")) {
            s = f->mk ? DT_ERR(DT_EFORMAT, "%s: duplicate '__metadata__'", f->path) : parse_meta(f, v);
            continue;
        }
        s = parse_entry(f, v, data_start, &f->e[f->n]);
        if (s == DT_OK) f->n++;
        else free(f->e[f->n].name);
    }
    cJSON_Delete(root);
    return s;
}

dt_status dt_ckpt_file_open(const char *path, dt_ckpt_file *f) {
    memset(f, 0, sizeof *f);
    f->fd = -1;
    if (!(f->path = dt_ckpt_strdup(path))) return DT_ERR(DT_ENOMEM, "%s: out of memory", path);
    dt_status s = DT_OK;
    char *text = NULL;
    struct stat sb;
    unsigned char lb[8];
    uint64_t n = 0;
    f->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (f->fd < 0) s = DT_ERR(DT_EIO, "%s: cannot open: %s", path, strerror(errno));
    else if (fstat(f->fd, &sb) != 0 || !S_ISREG(sb.st_mode)) s = DT_ERR(DT_EIO, "%s: not a regular file", path);
    else if ((f->size = (uint64_t)sb.st_size) < 8)
        s = DT_ERR(DT_EFORMAT, "%s: %" PRIu64 " bytes, too short for a safetensors file", path, f->size);
    if (s == DT_OK) s = read_full(f->fd, path, 0, lb, 8);
    if (s == DT_OK) {
        for (int i = 7; i >= 0; i--) n = (n << 8) | lb[i];
        if (n > f->size - 8 || n > HEADER_MAX)
            s = DT_ERR(DT_EFORMAT, "%s: header length %" PRIu64 " exceeds the file (%" PRIu64 " bytes)",
                       path, n, f->size);
    }
    if (s == DT_OK && !(text = malloc((size_t)n + 1))) s = DT_ERR(DT_ENOMEM, "%s: out of memory", path);
    if (s == DT_OK) s = read_full(f->fd, path, 8, text, (size_t)n);
    if (s == DT_OK) {
        text[n] = 0;
        if (strlen(text) != n) s = DT_ERR(DT_EFORMAT, "%s: header contains a NUL byte", path);
    }
    if (s == DT_OK) s = parse_header(f, text, 8 + n);
    free(text);
    if (s != DT_OK) dt_ckpt_file_close(f);
    return s;
}

void dt_ckpt_file_close(dt_ckpt_file *f) {
    if (!f) return;
    if (f->fd >= 0) close(f->fd);
    for (int i = 0; i < f->n; i++) free(f->e[i].name);
    for (int i = 0; i < f->n_meta; i++) { free(f->mk[i]); free(f->mv[i]); }
    free(f->e); free(f->mk); free(f->mv); free(f->path);
    memset(f, 0, sizeof *f);
    f->fd = -1;
}

const char *dt_ckpt_file_meta(const dt_ckpt_file *f, const char *key) {
    for (int i = 0; i < f->n_meta; i++)
        if (f->mk[i] && !strcmp(f->mk[i], key)) return f->mv[i];
    return NULL;
}

dt_status dt_ckpt_file_pread(const dt_ckpt_file *f, uint64_t off, void *dst, size_t n) {
    if (off > f->size || n > f->size - off)
        return DT_ERR(DT_EFORMAT, "%s: read of %zu bytes at %" PRIu64 " beyond the file", f->path, n, off);
    return read_full(f->fd, f->path, off, dst, n);
}
