/* safetensors reader: loads the whole file into one aligned buffer and
 * validates every length and offset before exposing tensors. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cjson/cJSON.h>
#include "st_internal.h"

#define MAX_EXACT_INT 9007199254740992.0   /* 2^53: larger JSON numbers lose precision */

/* The file buffer is allocated so that the data section (file offset
 * 8 + N) is 64-byte aligned, whatever N is. The distance from the start of
 * the allocation is stored in the size_t just before file_bytes. */
static void *file_buf_alloc(size_t size, uint64_t data_start) {
    size_t off = (size_t)((64 - data_start % 64) % 64);
    if (off < sizeof(size_t)) off += 64;
    if (size > SIZE_MAX - off - 64) return NULL;
    size_t total = (off + size + 63) & ~(size_t)63;
    unsigned char *base = aligned_alloc(64, total);
    if (!base) return NULL;
    memcpy(base + off - sizeof off, &off, sizeof off);
    return base + off;
}

static void file_buf_free(void *p) {
    if (!p) return;
    size_t off;
    memcpy(&off, (unsigned char *)p - sizeof off, sizeof off);
    free((unsigned char *)p - off);
}

static char *str_dup(const char *s) {
    size_t n = strlen(s) + 1;
    char *p = malloc(n);
    if (p) memcpy(p, s, n);
    return p;
}

static void fmt_shape(int ndim, const int64_t *shape, char *buf, size_t cap) {
    size_t k = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < ndim && k < cap; i++)
        k += (size_t)snprintf(buf + k, cap - k, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (k < cap) snprintf(buf + k, cap - k, "]");
}

/* Non-negative integer that a double represents exactly; 0 ok, -1 not. */
static int json_uint(const cJSON *v, uint64_t *out) {
    if (!cJSON_IsNumber(v)) return -1;
    double d = v->valuedouble;
    if (!(d >= 0.0 && d <= MAX_EXACT_INT)) return -1;
    uint64_t u = (uint64_t)d;
    if ((double)u != d) return -1;
    *out = u;
    return 0;
}

typedef struct span { uint64_t begin, end; int idx; } span;

static int cmp_span(const void *a, const void *b) {
    const span *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return x->idx - y->idx;
}

static int cmp_str_ptr(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Parses one tensor entry; fills t (name copied) and its span. */
static dt_status parse_tensor(const char *path, const cJSON *item, uint64_t data_size,
                              dt_st_tensor *t, span *sp) {
    const char *name = item->string;
    if (!cJSON_IsObject(item))
        return DT_ERR(DT_EFORMAT, "%s: tensor '%s': entry is not a JSON object", path, name);
    const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(item, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(item, "shape");
    const cJSON *offs = cJSON_GetObjectItemCaseSensitive(item, "data_offsets");
    if (!cJSON_IsString(dtype))
        return DT_ERR(DT_EFORMAT, "%s: tensor '%s': missing or non-string 'dtype'", path, name);
    if (dt_dtype_parse(dtype->valuestring, &t->dtype) != 0)
        return DT_ERR(DT_EFORMAT, "%s: tensor '%s': unsupported dtype '%s' (expected F32, BF16 or F16)",
                      path, name, dtype->valuestring);
    if (!cJSON_IsArray(shape))
        return DT_ERR(DT_EFORMAT, "%s: tensor '%s': missing or non-array 'shape'", path, name);
    int ndim = cJSON_GetArraySize(shape);
    if (ndim > DT_MAX_DIMS)
        return DT_ERR(DT_EFORMAT, "%s: tensor '%s': rank %d not supported (max %d)", path, name,
                      ndim, DT_MAX_DIMS);
    t->ndim = ndim;
    uint64_t numel = 1;
    int d = 0;
    for (const cJSON *v = shape->child; v; v = v->next, d++) {
        uint64_t dim;
        if (cJSON_IsNumber(v) && v->valuedouble < 0)
            return DT_ERR(DT_EFORMAT, "%s: tensor '%s': negative dimension %.17g in shape", path,
                          name, v->valuedouble);
        if (json_uint(v, &dim) != 0)
            return DT_ERR(DT_EFORMAT, "%s: tensor '%s': shape dimension %d is not a valid integer",
                          path, name, d);
        t->shape[d] = (int64_t)dim;
        if (dim && numel > UINT64_MAX / dim)
            return DT_ERR(DT_EFORMAT, "%s: tensor '%s': element count of the shape overflows",
                          path, name);
        numel *= dim;
    }
    for (int i = ndim; i < DT_MAX_DIMS; i++) t->shape[i] = 1;
    uint64_t esz = dt_dtype_size(t->dtype);
    if (numel > UINT64_MAX / esz)
        return DT_ERR(DT_EFORMAT, "%s: tensor '%s': byte size of the shape overflows", path, name);
    uint64_t nbytes = numel * esz;

    uint64_t b, e;
    if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2 || json_uint(offs->child, &b) ||
        json_uint(offs->child->next, &e))
        return DT_ERR(DT_EFORMAT, "%s: tensor '%s': 'data_offsets' must be two non-negative integers",
                      path, name);
    if (b > e || e > data_size)
        return DT_ERR(DT_EFORMAT,
                      "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64
                      "] out of range (data section is %" PRIu64 " bytes; truncated file?)",
                      path, name, b, e, data_size);
    if (e - b != nbytes) {
        char sh[128];
        fmt_shape(ndim, t->shape, sh, sizeof sh);
        return DT_ERR(DT_EFORMAT,
                      "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64
                      "] do not match shape %s %s (%" PRIu64 " bytes)",
                      path, name, b, e, sh, dt_dtype_name(t->dtype), nbytes);
    }
    if (b % esz)
        return DT_ERR(DT_EFORMAT,
                      "%s: tensor '%s': data offset %" PRIu64 " is not a multiple of the %s "
                      "element size %" PRIu64, path, name, b, dt_dtype_name(t->dtype), esz);
    t->nbytes = (size_t)nbytes;
    t->offset = b;
    sp->begin = b;
    sp->end = e;
    t->name = str_dup(name);
    if (!t->name) return DT_ERR(DT_ENOMEM, "%s: out of memory", path);
    return DT_OK;
}

static dt_status parse_metadata(const char *path, const cJSON *m, dt_safetensors *st) {
    if (cJSON_IsNull(m)) return DT_OK;
    if (!cJSON_IsObject(m))
        return DT_ERR(DT_EFORMAT, "%s: '__metadata__' is not a JSON object", path);
    int n = cJSON_GetArraySize(m);
    if (n == 0) return DT_OK;
    st->meta_keys = calloc((size_t)n, sizeof(char *));
    st->meta_values = calloc((size_t)n, sizeof(char *));
    if (!st->meta_keys || !st->meta_values) return DT_ERR(DT_ENOMEM, "%s: out of memory", path);
    for (const cJSON *v = m->child; v; v = v->next) {
        if (!cJSON_IsString(v))
            return DT_ERR(DT_EFORMAT, "%s: metadata '%s' is not a string", path, v->string);
        for (int i = 0; i < st->n_meta; i++)
            if (!strcmp(st->meta_keys[i], v->string))
                return DT_ERR(DT_EFORMAT, "%s: duplicate metadata key '%s'", path, v->string);
        int i = st->n_meta++;
        st->meta_keys[i] = str_dup(v->string);
        st->meta_values[i] = str_dup(v->valuestring);
        if (!st->meta_keys[i] || !st->meta_values[i])
            return DT_ERR(DT_ENOMEM, "%s: out of memory", path);
    }
    return DT_OK;
}

static int hex_digit(char ch) {
    return ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10 : -1;
}

/* Metadata "crc32.<tensor>": 8 hex digits, for a tensor of the file. */
static dt_status parse_crcs(const char *path, dt_safetensors *st) {
    size_t np = strlen(DT_ST_CRC_PREFIX);
    for (int i = 0; i < st->n_meta; i++) {
        const char *k = st->meta_keys[i], *v = st->meta_values[i];
        if (strncmp(k, DT_ST_CRC_PREFIX, np)) continue;
        dt_st_tensor *t = NULL;
        for (int j = 0; j < st->n_tensors && !t; j++)
            if (!strcmp(st->tensors[j].name, k + np)) t = &st->tensors[j];
        if (!t) return DT_ERR(DT_EFORMAT, "%s: metadata '%s' is the checksum of a tensor the file does not have", path, k);
        uint32_t c = 0;   /* exactly 8 hex digits (strtoul would take "0x000000", " +1234ab") */
        int digits = 0;
        for (int d; digits < 8 && (d = hex_digit(v[digits])) >= 0; digits++) c = c << 4 | (uint32_t)d;
        if (digits != 8 || v[8])
            return DT_ERR(DT_EFORMAT, "%s: tensor '%s': checksum '%s' is not 8 hex digits", path, t->name, v);
        t->has_crc = 1;
        t->crc = c;
    }
    return DT_OK;
}

/* Data section must be covered exactly: sorted spans start at 0, each begins
 * where the previous ended, the last ends at data_size. */
static dt_status check_coverage(const char *path, const dt_safetensors *st, span *sp,
                                uint64_t data_size) {
    int n = st->n_tensors;
    qsort(sp, (size_t)n, sizeof *sp, cmp_span);
    uint64_t pos = 0;
    for (int i = 0; i < n; i++) {
        const char *name = st->tensors[sp[i].idx].name;
        if (sp[i].begin < pos)
            return DT_ERR(DT_EFORMAT,
                          "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64
                          "] overlap tensor '%s' [%" PRIu64 ", %" PRIu64 "]",
                          path, name, sp[i].begin, sp[i].end, st->tensors[sp[i - 1].idx].name,
                          sp[i - 1].begin, sp[i - 1].end);
        if (sp[i].begin > pos) {
            if (i == 0)
                return DT_ERR(DT_EFORMAT,
                              "%s: tensor '%s': first tensor starts at data offset %" PRIu64
                              ", leaving bytes [0, %" PRIu64 ") uncovered",
                              path, name, sp[i].begin, sp[i].begin);
            return DT_ERR(DT_EFORMAT,
                          "%s: tensor '%s': gap in data section, bytes [%" PRIu64 ", %" PRIu64
                          ") after tensor '%s' are uncovered",
                          path, name, pos, sp[i].begin, st->tensors[sp[i - 1].idx].name);
        }
        pos = sp[i].end;
    }
    if (pos != data_size) {
        if (n == 0)
            return DT_ERR(DT_EFORMAT, "%s: data section has %" PRIu64 " bytes but no tensors",
                          path, data_size);
        return DT_ERR(DT_EFORMAT,
                      "%s: data section has %" PRIu64 " bytes but tensors cover only %" PRIu64
                      " (trailing bytes after tensor '%s')",
                      path, data_size, pos, st->tensors[sp[n - 1].idx].name);
    }
    /* Duplicate keys survive JSON parsing; reject them. */
    if (n > 1) {
        const char **names = malloc((size_t)n * sizeof *names);
        if (!names) return DT_ERR(DT_ENOMEM, "%s: out of memory", path);
        for (int i = 0; i < n; i++) names[i] = st->tensors[i].name;
        qsort(names, (size_t)n, sizeof *names, cmp_str_ptr);
        for (int i = 1; i < n; i++)
            if (!strcmp(names[i - 1], names[i])) {
                dt_status s = DT_ERR(DT_EFORMAT, "%s: duplicate tensor '%s'", path, names[i]);
                free(names);
                return s;
            }
        free(names);
    }
    return DT_OK;
}

static const char *file_kind(mode_t m) {
    return S_ISDIR(m) ? "a directory" : S_ISFIFO(m) ? "a FIFO (named pipe)" : S_ISCHR(m) ? "a character device"
         : S_ISBLK(m) ? "a block device" : S_ISSOCK(m) ? "a socket" : "not a file";
}

dt_status dt_io_open_regular(const char *path, int *fd, struct stat *sb) {
    *fd = -1;
    int k = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);   /* (a FIFO's open would wait for a writer) */
    if (k < 0) return DT_ERR(DT_EIO, "%s: cannot open: %s", path, strerror(errno));
    if (fstat(k, sb) != 0) {
        dt_status s = DT_ERR(DT_EIO, "%s: cannot stat: %s", path, strerror(errno));
        close(k);
        return s;
    }
    if (!S_ISREG(sb->st_mode)) {
        close(k);
        return DT_ERR(DT_EIO, "%s: %s, not a regular file", path, file_kind(sb->st_mode));
    }
    int fl = fcntl(k, F_GETFL);
    if (fl < 0 || fcntl(k, F_SETFL, fl & ~O_NONBLOCK) != 0) {
        dt_status s = DT_ERR(DT_EIO, "%s: cannot set blocking reads: %s", path, strerror(errno));
        close(k);
        return s;
    }
    *fd = k;
    return DT_OK;
}

/* Reads the file into st->file_bytes (data section 64-byte aligned). */
static dt_status read_file(const char *path, dt_safetensors *st, uint64_t *hdr_len) {
    struct stat sb;
    int fd;
    DT_TRY(dt_io_open_regular(path, &fd, &sb));
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        dt_status e = DT_ERR(DT_EIO, "%s: cannot open: %s", path, strerror(errno));
        close(fd);
        return e;
    }
    dt_status s = DT_OK;
    unsigned char lenb[8];
    uint64_t size = 0, n = 0;
    size = (uint64_t)sb.st_size;
    if (size < 8) {
        s = DT_ERR(DT_EFORMAT, "%s: file is %" PRIu64 " bytes, too short for the 8-byte header length",
                   path, size);
        goto done;
    }
    if (size > SIZE_MAX / 2) {
        s = DT_ERR(DT_EIO, "%s: file too large (%" PRIu64 " bytes)", path, size);
        goto done;
    }
    if (fread(lenb, 1, 8, f) != 8) {
        s = DT_ERR(DT_EIO, "%s: read failed", path);
        goto done;
    }
    for (int i = 7; i >= 0; i--) n = (n << 8) | lenb[i];
    if (n > size - 8) {
        s = DT_ERR(DT_EFORMAT, "%s: header length %" PRIu64 " exceeds the %" PRIu64
                   " bytes that follow it", path, n, size - 8);
        goto done;
    }
    st->file_bytes = file_buf_alloc((size_t)size, 8 + n);
    if (!st->file_bytes) {
        s = DT_ERR(DT_ENOMEM, "%s: out of memory reading %" PRIu64 " bytes", path, size);
        goto done;
    }
    memcpy(st->file_bytes, lenb, 8);
    size_t rest = (size_t)size - 8;
    if (fread((unsigned char *)st->file_bytes + 8, 1, rest, f) != rest || fgetc(f) != EOF) {
        s = DT_ERR(DT_EIO, "%s: short read or file changed while reading", path);
        goto done;
    }
    st->file_size = (size_t)size;
    *hdr_len = n;
done:
    fclose(f);
    return s;
}

int dt_json_escapes_nul(const char *text) {
    for (const char *p = text; *p; p++) {
        if (*p != '\\' || !p[1]) continue;
        if (p[1] == 'u' && !strncmp(p + 2, "0000", 4)) return 1;
        p++;   /* the escaped character ("\\u0000" is a backslash, then text) */
    }
    return 0;
}

dt_status dt_st_parse_header(const char *path, const char *raw, uint64_t n, uint64_t data_size,
                             dt_safetensors *st) {
    if (memchr(raw, 0, (size_t)n))
        return DT_ERR(DT_EFORMAT, "%s: header contains a NUL byte", path);
    char *text = malloc((size_t)n + 1);
    if (!text) return DT_ERR(DT_ENOMEM, "%s: out of memory", path);
    memcpy(text, raw, (size_t)n);
    text[n] = 0;
    if (dt_json_escapes_nul(text)) {
        free(text);
        return DT_ERR(DT_EFORMAT, "%s: header escapes a NUL character (\\u0000) in a name or value", path);
    }
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithOpts(text, &end, 1);
    if (!root) {
        size_t at = end ? (size_t)(end - text) : 0;
        free(text);
        return DT_ERR(DT_EFORMAT, "%s: header is not valid JSON (error near header byte %zu of %" PRIu64 ")",
                      path, at, n);
    }
    free(text);
    dt_status s = DT_OK;
    span *sp = NULL;
    if (!cJSON_IsObject(root)) {
        s = DT_ERR(DT_EFORMAT, "%s: header is not a JSON object", path);
        goto done;
    }
    int n_items = cJSON_GetArraySize(root), n_t = 0;
    const cJSON *meta = NULL;
    for (const cJSON *v = root->child; v; v = v->next) {
        if (strcmp(v->string, "__metadata__")) continue;
        if (meta) {
            s = DT_ERR(DT_EFORMAT, "%s: duplicate '__metadata__'", path);
            goto done;
        }
        meta = v;
    }
    if (meta && (s = parse_metadata(path, meta, st)) != DT_OK) goto done;
    size_t cap = (size_t)(n_items > 0 ? n_items : 1);
    st->tensors = calloc(cap, sizeof *st->tensors);
    sp = calloc(cap, sizeof *sp);
    if (!st->tensors || !sp) {
        s = DT_ERR(DT_ENOMEM, "%s: out of memory", path);
        goto done;
    }
    for (const cJSON *v = root->child; v; v = v->next) {
        if (v == meta) continue;
        st->n_tensors = n_t + 1;   /* so free() sees the partial entry */
        s = parse_tensor(path, v, data_size, &st->tensors[n_t], &sp[n_t]);
        if (s != DT_OK) goto done;
        sp[n_t].idx = n_t;
        n_t++;
    }
    st->n_tensors = n_t;
    s = check_coverage(path, st, sp, data_size);
    if (s == DT_OK) s = parse_crcs(path, st);
done:
    free(sp);
    cJSON_Delete(root);
    return s;
}

dt_status dt_safetensors_load(const char *path, dt_safetensors *st) {
    if (!st) return DT_ERR(DT_EINVAL, "dt_safetensors_load: NULL output");
    memset(st, 0, sizeof *st);
    if (!path || !*path) return DT_ERR(DT_EINVAL, "dt_safetensors_load: empty path");
    uint64_t n = 0;
    dt_status s = read_file(path, st, &n);
    if (s == DT_OK) s = dt_st_parse_header(path, (const char *)st->file_bytes + 8, n, st->file_size - 8 - n, st);
    for (int i = 0; s == DT_OK && i < st->n_tensors; i++) {
        dt_st_tensor *t = &st->tensors[i];
        t->data = (unsigned char *)st->file_bytes + 8 + n + t->offset;
        if (t->has_crc) s = dt_st_crc_verify(path, t->name, t->crc, dt_st_crc_update(0, t->data, t->nbytes));
    }
    if (s == DT_OK && !(st->path = str_dup(path))) s = DT_ERR(DT_ENOMEM, "%s: out of memory", path);
    if (s != DT_OK) dt_safetensors_free(st);
    return s;
}

void dt_safetensors_free(dt_safetensors *st) {
    if (!st) return;
    for (int i = 0; i < st->n_tensors; i++) free(st->tensors[i].name);
    free(st->tensors);
    for (int i = 0; i < st->n_meta; i++) {
        free(st->meta_keys[i]);
        free(st->meta_values[i]);
    }
    free(st->meta_keys);
    free(st->meta_values);
    free(st->path);
    file_buf_free(st->file_bytes);
    memset(st, 0, sizeof *st);
}

const dt_st_tensor *dt_safetensors_find(const dt_safetensors *st, const char *name) {
    if (!st || !name) return NULL;
    for (int i = 0; i < st->n_tensors; i++)
        if (!strcmp(st->tensors[i].name, name)) return &st->tensors[i];
    return NULL;
}

const char *dt_safetensors_meta(const dt_safetensors *st, const char *key) {
    if (!st || !key) return NULL;
    for (int i = 0; i < st->n_meta; i++)
        if (!strcmp(st->meta_keys[i], key)) return st->meta_values[i];
    return NULL;
}

dt_status dt_safetensors_expect(const dt_safetensors *st, const char *name, dt_dtype dtype,
                                int ndim, const int64_t *shape, const dt_st_tensor **out) {
    if (out) *out = NULL;
    if (!st || !name || ndim < 0 || ndim > DT_MAX_DIMS || (ndim > 0 && !shape))
        return DT_ERR(DT_EINVAL, "dt_safetensors_expect: bad arguments for tensor '%s'",
                      name ? name : "?");
    const char *path = st->path ? st->path : "safetensors";
    const dt_st_tensor *t = dt_safetensors_find(st, name);
    if (!t) return DT_ERR(DT_EFORMAT, "%s: missing tensor '%s'", path, name);
    int same = t->ndim == ndim;
    for (int i = 0; same && i < ndim; i++) same = t->shape[i] == shape[i];
    if (!same) {
        char have[128], want[128];
        fmt_shape(t->ndim, t->shape, have, sizeof have);
        fmt_shape(ndim, shape, want, sizeof want);
        return DT_ERR(DT_EFORMAT, "%s: tensor '%s' has shape %s, expected %s", path, name, have,
                      want);
    }
    if (t->dtype != dtype)
        return DT_ERR(DT_EFORMAT, "%s: tensor '%s' has dtype %s, expected %s", path, name,
                      dt_dtype_name(t->dtype), dt_dtype_name(dtype));
    if (out) *out = t;
    return DT_OK;
}
