/* safetensors writer: whole-file (dt_safetensors_write) and streaming
 * (dt_st_writer). Both validate the entries, build the same padded header and
 * write through the atomic temp-file helper. Both record every tensor's
 * CRC-32 as metadata "crc32.<name>" (st_internal.h): the whole-file writer
 * computes them first; the streaming one writes 8-character placeholders and
 * patches them at commit, having summed the bytes as they were appended. */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cjson/cJSON.h>
#include "bg_internal.h"
#include "st_internal.h"
#include "util/atomic_file.h"

struct dt_st_writer {
    dt_atomic_file af;
    int n_entries;
    char **names;         /* copies, for error messages */
    uint64_t *ends;       /* end offset of each entry in the data section */
    uint64_t total;       /* declared data section size */
    uint64_t written;     /* data bytes appended so far */
    int failed;           /* sticky: an append failed, commit must fail */
    uint64_t *crc_at;     /* file offset of entry i's checksum placeholder */
    uint32_t *crc;        /* entry i's CRC-32 (complete once written passes ends[i]) */
    int cur;              /* entry the next appended byte belongs to */
    /* captured (bg_write.c): bytes go to snap; the file is queued at commit */
    dt_bg_writer *bg;
    char *snap; size_t snap_cap;
    char *path;           /* (captured) */
    dt_st_entry *e;       /* (captured) names point into `names` */
    dt_st_meta *meta; int n_meta;   /* (captured) strings in meta_strs */
    char **meta_strs;
};

#define CRC_HEX 8   /* placeholder and value length */

static const char *path_or(const char *p) { return p ? p : "?"; }

/* Strict UTF-8 check (no overlongs, surrogates or > U+10FFFF): the format's
 * header is JSON, which readers decode as UTF-8. */
static int utf8_valid(const char *s) {
    const unsigned char *p = (const unsigned char *)s;
    while (*p) {
        unsigned c = *p;
        int n;
        uint32_t cp;
        if (c < 0x80) { p++; continue; }
        if (c >= 0xC2 && c <= 0xDF) { n = 1; cp = c & 0x1F; }
        else if (c >= 0xE0 && c <= 0xEF) { n = 2; cp = c & 0x0F; }
        else if (c >= 0xF0 && c <= 0xF4) { n = 3; cp = c & 0x07; }
        else return 0;
        for (int i = 1; i <= n; i++) {
            if ((p[i] & 0xC0) != 0x80) return 0;
            cp = (cp << 6) | (p[i] & 0x3F);
        }
        if ((n == 2 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) ||
            (n == 3 && (cp < 0x10000 || cp > 0x10FFFF)))
            return 0;
        p += n + 1;
    }
    return 1;
}

static int cmp_str_ptr(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Returns a duplicated string among strs[0..n), or NULL. */
static const char *find_duplicate(const char **strs, int n) {
    if (n < 2) return NULL;
    const char **sorted = malloc((size_t)n * sizeof *sorted);
    if (!sorted) return NULL;   /* best effort; the reader rejects duplicates too */
    memcpy(sorted, strs, (size_t)n * sizeof *sorted);
    qsort(sorted, (size_t)n, sizeof *sorted, cmp_str_ptr);
    const char *dup = NULL;
    for (int i = 1; i < n && !dup; i++)
        if (!strcmp(sorted[i - 1], sorted[i])) dup = sorted[i];
    free(sorted);
    return dup;
}

/* Validates entries and metadata; fills ends[i] (data end offset of entry i)
 * and *total. need_data: entries must carry data pointers. */
static dt_status validate(const char *path, const dt_st_entry *entries, int n_entries,
                          const dt_st_meta *meta, int n_meta, int need_data,
                          uint64_t *ends, uint64_t *total) {
    if (!path || !*path) return DT_ERR(DT_EINVAL, "safetensors write: empty path");
    if (n_entries < 0 || (n_entries > 0 && !entries))
        return DT_ERR(DT_EINVAL, "%s: bad entry list (n_entries = %d)", path, n_entries);
    if (n_meta < 0 || (n_meta > 0 && !meta))
        return DT_ERR(DT_EINVAL, "%s: bad metadata list (n_meta = %d)", path, n_meta);
    uint64_t off = 0;
    for (int i = 0; i < n_entries; i++) {
        const dt_st_entry *e = &entries[i];
        if (!e->name || !*e->name)
            return DT_ERR(DT_EINVAL, "%s: entry %d has an empty name", path, i);
        if (!strcmp(e->name, "__metadata__"))
            return DT_ERR(DT_EINVAL, "%s: '__metadata__' is reserved, not a tensor name", path);
        if (!utf8_valid(e->name))
            return DT_ERR(DT_EINVAL, "%s: entry %d: tensor name is not valid UTF-8", path, i);
        if ((int)e->dtype < (int)DT_F32 || (int)e->dtype > (int)DT_F16)
            return DT_ERR(DT_EINVAL, "%s: tensor '%s': unknown dtype %d", path, e->name,
                          (int)e->dtype);
        if (e->ndim < 0 || e->ndim > DT_MAX_DIMS)
            return DT_ERR(DT_EINVAL, "%s: tensor '%s': rank %d not supported (0..%d)", path,
                          e->name, e->ndim, DT_MAX_DIMS);
        uint64_t esz = dt_dtype_size(e->dtype), numel = 1;
        for (int d = 0; d < e->ndim; d++) {
            if (e->shape[d] < 0)
                return DT_ERR(DT_EINVAL, "%s: tensor '%s': negative dimension %lld", path,
                              e->name, (long long)e->shape[d]);
            uint64_t dim = (uint64_t)e->shape[d];
            if (dim && numel > UINT64_MAX / dim)
                return DT_ERR(DT_EINVAL, "%s: tensor '%s': shape overflows", path, e->name);
            numel *= dim;
        }
        if (numel > (UINT64_MAX - off) / esz)
            return DT_ERR(DT_EINVAL, "%s: tensor '%s': size overflows", path, e->name);
        uint64_t nbytes = numel * esz;
        if (nbytes > SIZE_MAX)
            return DT_ERR(DT_EINVAL, "%s: tensor '%s': too large", path, e->name);
        /* No padding between tensors (the data section must be contiguous),
         * so the order itself must keep every tensor element-aligned. */
        if (off % esz)
            return DT_ERR(DT_EINVAL,
                          "%s: tensor '%s' (%s) would start at data offset %" PRIu64
                          ", not a multiple of %" PRIu64 "; put larger dtypes first",
                          path, e->name, dt_dtype_name(e->dtype), off, esz);
        if (need_data && nbytes > 0 && !e->data)
            return DT_ERR(DT_EINVAL, "%s: tensor '%s': NULL data", path, e->name);
        off += nbytes;
        ends[i] = off;
    }
    *total = off;

    const char **names = malloc(((size_t)(n_entries > n_meta ? n_entries : n_meta) + 1) *
                                sizeof *names);
    if (!names) return DT_ERR(DT_ENOMEM, "%s: out of memory", path);
    for (int i = 0; i < n_entries; i++) names[i] = entries[i].name;
    const char *dup = find_duplicate(names, n_entries);
    if (dup) {
        dt_status s = DT_ERR(DT_EINVAL, "%s: duplicate tensor name '%s'", path, dup);
        free(names);
        return s;
    }
    for (int i = 0; i < n_meta; i++) {
        if (!meta[i].key || !meta[i].value) {
            free(names);
            return DT_ERR(DT_EINVAL, "%s: metadata entry %d has a NULL key or value", path, i);
        }
        if (!utf8_valid(meta[i].key) || !utf8_valid(meta[i].value)) {
            dt_status s = DT_ERR(DT_EINVAL, "%s: metadata '%s' is not valid UTF-8", path,
                                 meta[i].key);
            free(names);
            return s;
        }
        if (!strncmp(meta[i].key, DT_ST_CRC_PREFIX, strlen(DT_ST_CRC_PREFIX))) {
            dt_status s = DT_ERR(DT_EINVAL, "%s: metadata key '%s': the prefix '" DT_ST_CRC_PREFIX
                                 "' is reserved for checksums", path, meta[i].key);
            free(names);
            return s;
        }
        names[i] = meta[i].key;
    }
    dup = find_duplicate(names, n_meta);
    if (dup) {
        dt_status s = DT_ERR(DT_EINVAL, "%s: duplicate metadata key '%s'", path, dup);
        free(names);
        return s;
    }
    free(names);
    return DT_OK;
}

/* Adds a raw (already formatted) integer to a cJSON array. cJSON would print
 * large doubles in exponent form, which strict readers reject for offsets. */
static int add_u64(cJSON *arr, uint64_t v) {
    char buf[32];
    snprintf(buf, sizeof buf, "%" PRIu64, v);
    cJSON *n = cJSON_CreateRaw(buf);
    if (n && cJSON_AddItemToArray(arr, n)) return 1;
    cJSON_Delete(n);
    return 0;
}

/* Checksum value of entry i: its CRC as hex, or the placeholder "#<i as 7 hex digits>". */
static void crc_value(const uint32_t *crc, int i, char *buf) {
    if (crc) snprintf(buf, CRC_HEX + 1, "%08" PRIx32, crc[i]);
    else snprintf(buf, CRC_HEX + 1, "#%07x", (unsigned)i & 0xfffffffu);
}

/* Builds "<u64 N><N bytes JSON, space padded so 8 + N is a multiple of 8>".
 * Metadata: meta, then a checksum per entry (crc: values; NULL: placeholders).
 * The caller frees *out. */
static dt_status build_header(const char *path, const dt_st_entry *entries, int n_entries,
                              const dt_st_meta *meta, int n_meta, const uint64_t *ends,
                              const uint32_t *crc, char **out, size_t *out_len) {
    cJSON *root = cJSON_CreateObject();
    int ok = root != NULL;
    if (ok && n_meta + n_entries > 0) {
        cJSON *m = cJSON_AddObjectToObject(root, "__metadata__");
        ok = m != NULL;
        for (int i = 0; ok && i < n_meta; i++)
            ok = cJSON_AddStringToObject(m, meta[i].key, meta[i].value) != NULL;
        for (int i = 0; ok && i < n_entries; i++) {
            size_t kn = strlen(DT_ST_CRC_PREFIX) + strlen(entries[i].name) + 1;
            char *key = malloc(kn), val[CRC_HEX + 1];
            ok = key != NULL;
            if (ok) {
                snprintf(key, kn, DT_ST_CRC_PREFIX "%s", entries[i].name);
                crc_value(crc, i, val);
                ok = cJSON_AddStringToObject(m, key, val) != NULL;
            }
            free(key);
        }
    }
    for (int i = 0; ok && i < n_entries; i++) {
        const dt_st_entry *e = &entries[i];
        cJSON *t = cJSON_AddObjectToObject(root, e->name);
        cJSON *shape = NULL, *offs = NULL;
        ok = t && cJSON_AddStringToObject(t, "dtype", dt_dtype_name(e->dtype)) &&
             (shape = cJSON_AddArrayToObject(t, "shape")) != NULL;
        for (int d = 0; ok && d < e->ndim; d++) ok = add_u64(shape, (uint64_t)e->shape[d]);
        if (ok) ok = (offs = cJSON_AddArrayToObject(t, "data_offsets")) != NULL;
        if (ok) ok = add_u64(offs, i ? ends[i - 1] : 0) && add_u64(offs, ends[i]);
    }
    char *json = ok ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    if (!json) return DT_ERR(DT_ENOMEM, "%s: out of memory building the header", path);
    size_t n = strlen(json);
    size_t padded = (n + 7) & ~(size_t)7;   /* 8 + padded is 8-byte aligned */
    char *buf = malloc(8 + padded);
    if (!buf) {
        cJSON_free(json);
        return DT_ERR(DT_ENOMEM, "%s: out of memory building the header", path);
    }
    uint64_t len = padded;
    for (int i = 0; i < 8; i++) buf[i] = (char)(unsigned char)(len >> (8 * i));
    memcpy(buf + 8, json, n);
    memset(buf + 8 + n, ' ', padded - n);
    cJSON_free(json);
    *out = buf;
    *out_len = 8 + padded;
    return DT_OK;
}

/* Validate + build the header; *ends is allocated for the caller. need_data:
 * checksums from the entries' data, else placeholders. */
static dt_status prepare(const char *path, const dt_st_entry *entries, int n_entries,
                         const dt_st_meta *meta, int n_meta, int need_data, uint64_t **ends,
                         uint64_t *total, char **hdr, size_t *hdr_len) {
    *ends = calloc((size_t)(n_entries > 0 ? n_entries : 1), sizeof **ends);
    if (!*ends) return DT_ERR(DT_ENOMEM, "%s: out of memory", path_or(path));
    dt_status s = validate(path, entries, n_entries, meta, n_meta, need_data, *ends, total);
    uint32_t *crc = NULL;
    if (s == DT_OK && need_data) {
        crc = calloc((size_t)(n_entries > 0 ? n_entries : 1), sizeof *crc);
        if (!crc) s = DT_ERR(DT_ENOMEM, "%s: out of memory", path);
        for (int i = 0; crc && i < n_entries; i++)
            crc[i] = dt_st_crc_update(0, entries[i].data, (size_t)((*ends)[i] - (i ? (*ends)[i - 1] : 0)));
    }
    if (s == DT_OK) s = build_header(path, entries, n_entries, meta, n_meta, *ends, crc, hdr, hdr_len);
    free(crc);
    if (s != DT_OK) {
        free(*ends);
        *ends = NULL;
    }
    return s;
}

dt_status dt_safetensors_write(const char *path, const dt_st_entry *entries, int n_entries,
                               const dt_st_meta *meta, int n_meta) {
    uint64_t *ends, total;
    char *hdr;
    size_t hdr_len;
    dt_bg_writer *bg = dt__bg_capturing();
    if (bg) {   /* checked now, copied, written by the background thread */
        ends = calloc((size_t)(n_entries > 0 ? n_entries : 1), sizeof *ends);
        if (!ends) return DT_ERR(DT_ENOMEM, "%s: out of memory", path_or(path));
        dt_status s = validate(path, entries, n_entries, meta, n_meta, 1, ends, &total);
        free(ends);
        return s != DT_OK ? s : dt__bg_queue_copy(bg, path, entries, n_entries, meta, n_meta);
    }
    DT_TRY(prepare(path, entries, n_entries, meta, n_meta, 1, &ends, &total, &hdr, &hdr_len));
    dt_atomic_file af;
    dt_status s = dt_atomic_open(&af, path);
    if (s == DT_OK) {
        s = dt_atomic_write(&af, hdr, hdr_len);
        for (int i = 0; s == DT_OK && i < n_entries; i++)
            s = dt_atomic_write(&af, entries[i].data,
                                (size_t)(ends[i] - (i ? ends[i - 1] : 0)));
        if (s == DT_OK) s = dt_atomic_commit(&af);
        else dt_atomic_discard(&af);
    }
    free(hdr);
    free(ends);
    return s;
}

/* ---- streaming writer ---- */

static void writer_free(dt_st_writer *w) {
    for (int i = 0; i < w->n_entries; i++) free(w->names[i]);
    for (int i = 0; w->meta_strs && i < 2 * w->n_meta; i++) free(w->meta_strs[i]);
    free(w->meta_strs);
    free(w->meta);
    free(w->e);
    free(w->path);
    free(w->snap);
    free(w->names);
    free(w->ends);
    free(w->crc_at);
    free(w->crc);
    free(w);
}

dt_status dt_st_writer_open(dt_st_writer **wp, const char *path, const dt_st_entry *entries,
                            int n_entries, const dt_st_meta *meta, int n_meta) {
    if (!wp) return DT_ERR(DT_EINVAL, "%s: dt_st_writer_open: NULL writer", path_or(path));
    *wp = NULL;
    dt_st_writer *w = calloc(1, sizeof *w);
    if (!w) return DT_ERR(DT_ENOMEM, "%s: out of memory", path_or(path));
    char *hdr = NULL;
    size_t hdr_len = 0;
    dt_status s = prepare(path, entries, n_entries, meta, n_meta, 0, &w->ends, &w->total, &hdr,
                          &hdr_len);
    if (s != DT_OK) {
        free(w);
        return s;
    }
    w->names = calloc((size_t)(n_entries > 0 ? n_entries : 1), sizeof *w->names);
    w->crc_at = calloc((size_t)(n_entries > 0 ? n_entries : 1), sizeof *w->crc_at);
    w->crc = calloc((size_t)(n_entries > 0 ? n_entries : 1), sizeof *w->crc);
    if (!w->names || !w->crc_at || !w->crc) {
        free(hdr);
        writer_free(w);
        return DT_ERR(DT_ENOMEM, "%s: out of memory", path);
    }
    for (int i = 0; i < n_entries; i++) {
        size_t len = strlen(entries[i].name) + 1;
        w->names[i] = malloc(len);
        if (!w->names[i]) {
            w->n_entries = i;
            free(hdr);
            writer_free(w);
            return DT_ERR(DT_ENOMEM, "%s: out of memory", path);
        }
        memcpy(w->names[i], entries[i].name, len);
    }
    w->n_entries = n_entries;
    dt_bg_writer *bg = dt__bg_capturing();
    if (bg) {   /* appends fill a copy; commit queues it for the background thread */
        free(hdr);
        w->bg = bg;
        w->snap = dt__bg_alloc(bg, (size_t)w->total, &w->snap_cap);
        w->path = strdup(path);
        w->e = calloc((size_t)(n_entries > 0 ? n_entries : 1), sizeof *w->e);
        w->meta = calloc((size_t)(n_meta > 0 ? n_meta : 1), sizeof *w->meta);
        w->meta_strs = calloc((size_t)(n_meta > 0 ? 2 * n_meta : 1), sizeof *w->meta_strs);
        uint64_t total = w->total;
        int ok = w->snap && w->path && w->e && w->meta && w->meta_strs;
        w->n_meta = w->meta_strs ? n_meta : 0;
        for (int i = 0; ok && i < n_meta; i++) {
            ok = (w->meta_strs[2 * i] = strdup(meta[i].key)) && (w->meta_strs[2 * i + 1] = strdup(meta[i].value));
            if (ok) w->meta[i] = (dt_st_meta){w->meta_strs[2 * i], w->meta_strs[2 * i + 1]};
        }
        if (!ok) {
            writer_free(w);
            return DT_ERR(DT_ENOMEM, "%s: out of memory for a %" PRIu64 "-byte background checkpoint copy", path, total);
        }
        for (int i = 0; i < n_entries; i++) {
            w->e[i] = entries[i];
            w->e[i].name = w->names[i];
            w->e[i].data = NULL;
        }
        *wp = w;
        return DT_OK;
    }
    /* Placeholder i is the last ':"#<i>"' of the header: metadata values are
     * the only strings after a ':', and the checksums come after meta's. */
    for (int i = 0; i < n_entries; i++) {
        char pat[CRC_HEX + 4], val[CRC_HEX + 1];
        crc_value(NULL, i, val);
        int np = snprintf(pat, sizeof pat, ":\"%s\"", val);
        size_t at = 0;   /* hdr is hdr_len bytes, not NUL-terminated */
        for (size_t q = hdr_len - (size_t)np; q >= 8 && !at; q--)
            if (!memcmp(hdr + q, pat, (size_t)np)) at = q;
        w->crc_at[i] = (uint64_t)at + 2;   /* always found: build_header wrote it */
    }
    s = dt_atomic_open(&w->af, path);
    if (s == DT_OK) {
        s = dt_atomic_write(&w->af, hdr, hdr_len);
        if (s != DT_OK) dt_atomic_discard(&w->af);
    }
    free(hdr);
    if (s != DT_OK) {
        writer_free(w);
        return s;
    }
    *wp = w;
    return DT_OK;
}

/* Name of the entry containing data offset off (for messages). */
static const char *entry_at(const dt_st_writer *w, uint64_t off) {
    for (int i = 0; i < w->n_entries; i++)
        if (off < w->ends[i]) return w->names[i];
    return "?";
}

dt_status dt_st_writer_append(dt_st_writer *w, const void *bytes, size_t n) {
    if (!w) return DT_ERR(DT_EINVAL, "dt_st_writer_append: NULL writer");
    if (w->failed)
        return DT_ERR(DT_ESTATE, "%s: streaming writer already failed", w->af.path);
    if (n == 0) return DT_OK;
    if (!bytes) {
        w->failed = 1;
        return DT_ERR(DT_EINVAL, "%s: append of NULL data", w->af.path);
    }
    if ((uint64_t)n > w->total - w->written) {
        w->failed = 1;
        return DT_ERR(DT_EINVAL,
                      "%s: append of %zu bytes at data offset %" PRIu64
                      " exceeds the declared data size %" PRIu64,
                      w->af.path, n, w->written, w->total);
    }
    if (w->bg) {   /* captured: the background thread sums and writes */
        dt__bg_copy(w->snap + w->written, bytes, n);
        w->written += n;
        return DT_OK;
    }
    dt_status s = dt_atomic_write(&w->af, bytes, n);
    if (s != DT_OK) {
        w->failed = 1;
        return s;
    }
    /* checksums of the entries these bytes belong to */
    const unsigned char *b = bytes;
    uint64_t pos = w->written, end = w->written + n;
    while (pos < end) {
        while (w->cur < w->n_entries && w->ends[w->cur] <= pos) w->cur++;   /* (skips empty entries) */
        uint64_t stop = w->ends[w->cur] < end ? w->ends[w->cur] : end;
        w->crc[w->cur] = dt_st_crc_update(w->crc[w->cur], b + (pos - w->written), (size_t)(stop - pos));
        pos = stop;
    }
    w->written += n;
    return DT_OK;
}

dt_status dt_st_writer_commit(dt_st_writer *w) {
    if (!w) return DT_ERR(DT_EINVAL, "dt_st_writer_commit: NULL writer");
    dt_status s;
    if (w->bg) {   /* captured: nothing on disk yet; complete, it is queued */
        if (w->failed) s = DT_ERR(DT_ESTATE, "%s: commit after a failed append; file not written", w->path);
        else if (w->written != w->total)
            s = DT_ERR(DT_ESTATE, "%s: commit after %" PRIu64 " of %" PRIu64 " declared data bytes (tensor '%s' "
                       "incomplete); file not written", w->path, w->written, w->total, entry_at(w, w->written));
        else {
            s = dt__bg_queue_owned(w->bg, w->path, w->e, w->n_entries, w->meta, w->n_meta, w->snap, (size_t)w->total,
                                   w->snap_cap);
            w->snap = NULL;   /* the job's now (freed by it on failure too) */
        }
        writer_free(w);
        return s;
    }
    if (w->failed) {
        s = DT_ERR(DT_ESTATE, "%s: commit after a failed append; file not written", w->af.path);
        dt_atomic_discard(&w->af);
    } else if (w->written != w->total) {
        s = DT_ERR(DT_ESTATE,
                   "%s: commit after %" PRIu64 " of %" PRIu64
                   " declared data bytes (tensor '%s' incomplete); file not written",
                   w->af.path, w->written, w->total, entry_at(w, w->written));
        dt_atomic_discard(&w->af);
    } else {
        s = DT_OK;
        for (int i = 0; s == DT_OK && i < w->n_entries; i++) {
            char val[CRC_HEX + 1];
            crc_value(w->crc, i, val);
            s = dt_atomic_pwrite(&w->af, w->crc_at[i], val, CRC_HEX);
        }
        if (s == DT_OK) s = dt_atomic_commit(&w->af);
        else dt_atomic_discard(&w->af);
    }
    writer_free(w);
    return s;
}

void dt_st_writer_abort(dt_st_writer *w) {
    if (!w) return;
    if (!w->bg) dt_atomic_discard(&w->af);   /* (captured: nothing was opened) */
    writer_free(w);
}
