/* Token streams and the store behind them (dataset_internal.h).
 *
 * A stream is a list of pieces (views of ids: bytes or uint16) with their cumulative
 * ends; window i starts at token i*T and takes T+1 tokens, walking into the
 * next pieces when it crosses a piece's end. Slicing copies views, never
 * ids, so a split or a rank's part costs memory per file, not per token. */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include "dataset_internal.h"

dt_status dt_token_stream_push(dt_token_stream *s, const void *ids, int width, int64_t n, const char *path) {
    if (s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 16;
        dt_token_piece *p = realloc(s->piece, (size_t)cap * sizeof *p);
        if (p) s->piece = p;
        int64_t *e = p ? realloc(s->end, (size_t)cap * sizeof *e) : NULL;
        if (!e) return DT_ERR(DT_ENOMEM, "%s: out of memory listing %d files", path, cap);
        s->end = e;
        s->cap = cap;
    }
    s->piece[s->n] = (dt_token_piece){.ids = ids, .n = n, .width = width};
    s->n_tokens += n;
    s->end[s->n++] = s->n_tokens;
    return DT_OK;
}

void dt_token_stream_free(dt_token_stream *s) {
    if (!s) return;
    free(s->piece);
    free(s->end);
    memset(s, 0, sizeof *s);
}

/* the piece holding token p (p < n_tokens): the first k with end[k] > p */
static int piece_at(const dt_token_stream *s, int64_t p) {
    int lo = 0, hi = s->n - 1;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (s->end[mid] > p) hi = mid;
        else lo = mid + 1;
    }
    return lo;
}

dt_status dt_token_stream_slice(const dt_token_stream *s, int64_t a, int64_t b, dt_token_stream *out,
                                const char *path) {
    memset(out, 0, sizeof *out);
    out->vocab = s->vocab;
    if (a < 0 || b > s->n_tokens || a > b)
        return DT_ERR(DT_EINVAL, "%s: token range [%lld, %lld) outside the %lld tokens", path, (long long)a,
                      (long long)b, (long long)s->n_tokens);
    for (int k = a < b ? piece_at(s, a) : s->n; k < s->n && s->end[k] - s->piece[k].n < b; k++) {
        int64_t start = s->end[k] - s->piece[k].n;   /* piece k holds [start, end[k]) */
        int64_t lo = a > start ? a : start, hi = b < s->end[k] ? b : s->end[k];
        const dt_token_piece *pc = &s->piece[k];
        const void *ids = hi > lo ? (const uint8_t *)pc->ids + (lo - start) * pc->width : pc->ids;   /* (NULL: empty) */
        dt_status st = dt_token_stream_push(out, ids, pc->width, hi - lo, path);
        if (st != DT_OK) {
            dt_token_stream_free(out);
            return st;
        }
    }
    return DT_OK;
}

int64_t dt_token_stream_windows(const dt_token_stream *s, int T) {
    if (!s || T <= 0 || s->n_tokens < 2) return 0;
    return (s->n_tokens - 1) / T;
}

/* ids [0, len) of a run (window tokens j .. j+len-1) into x[j..] and y[j-1..]:
 * window token j goes to x[j] (j < T) and y[j - 1] (j > 0) */
#define COPY_RUN(ids)                                                              \
    do {                                                                           \
        for (int64_t m = j; m < j + len && m < T; m++) xr[m] = (ids)[m - j];       \
        for (int64_t m = j > 0 ? j : 1; m < j + len; m++) yr[m - 1] = (ids)[m - j]; \
    } while (0)

void dt_token_stream_batch(const dt_token_stream *s, const int64_t *idx, int64_t n, int T, int32_t *x, int32_t *y) {
    for (int64_t i = 0; i < n; i++) {
        int64_t p = idx[i] * (int64_t)T;
        int k = piece_at(s, p);
        int64_t off = p - (s->end[k] - s->piece[k].n);
        int32_t *xr = x + i * (int64_t)T, *yr = y + i * (int64_t)T;
        for (int64_t j = 0; j <= T; k++, off = 0) {   /* runs that lie in one piece each */
            const dt_token_piece *pc = &s->piece[k];
            int64_t len = pc->n - off;
            if (len > T + 1 - j) len = T + 1 - j;
            if (len > 0 && pc->width == 1) COPY_RUN((const uint8_t *)pc->ids + off);
            else if (len > 0) COPY_RUN((const uint16_t *)pc->ids + off);
            j += len;
        }
    }
}

dt_status dt_token_store_add(dt_token_store *st, void *base, size_t mapped, const char *path, const struct stat *id) {
    if (st->n == st->cap) {
        int cap = st->cap ? 2 * st->cap : 16;
        dt_token_region *r = realloc(st->region, (size_t)cap * sizeof *r);
        if (!r) {
            if (mapped) munmap(base, mapped);
            else free(base);
            return DT_ERR(DT_ENOMEM, "%s: out of memory", path);
        }
        st->region = r;
        st->cap = cap;
    }
    /* which file: the training and validation sets must not share one (dataset_tokens.c) */
    st->region[st->n++] = (dt_token_region){.base = base, .mapped = mapped, .dev = id ? id->st_dev : 0,
                                            .ino = id ? id->st_ino : 0};
    return DT_OK;
}

void dt_token_store_free(dt_token_store *st) {
    if (!st) return;
    for (int i = 0; i < st->n; i++) {
        if (st->region[i].mapped) munmap(st->region[i].base, st->region[i].mapped);
        else free(st->region[i].base);
    }
    free(st->region);
    memset(st, 0, sizeof *st);
}
