/* Chrome trace event writer (chrome://tracing, Perfetto). Events are kept in
 * a growable array guarded by a mutex (compute and comm threads both record)
 * and written as one JSON document, atomically, on close. */
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "dtrain/io.h"
#include "util/atomic_file.h"

#define NO_CAT SIZE_MAX

typedef struct trace_ev {
    double ts, dur;          /* microseconds since open */
    size_t name_off, cat_off;   /* into the string pool; cat_off NO_CAT if none */
    int lane;
    char ph;                 /* 'X' complete, 'i' instant */
} trace_ev;

struct dt_trace {
    pthread_mutex_t mu;
    char *path;
    int rank;
    struct timespec t0;
    trace_ev *ev;
    size_t n, cap;
    char *pool;              /* NUL-separated copies of names/categories */
    size_t pool_len, pool_cap;
    uint64_t lanes_seen;     /* bit i: lane i (0..63) was used */
    size_t dropped;          /* events lost to allocation failure */
};

dt_status dt_trace_open(dt_trace **tp, const char *path, int rank) {
    if (!tp) return DT_ERR(DT_EINVAL, "dt_trace_open: NULL handle");
    *tp = NULL;
    if (!path || !*path) return DT_ERR(DT_EINVAL, "dt_trace_open: empty path");
    dt_trace *t = calloc(1, sizeof *t);
    size_t len = strlen(path) + 1;
    if (t) t->path = malloc(len);
    if (!t || !t->path) {
        free(t);
        return DT_ERR(DT_ENOMEM, "%s: out of memory", path);
    }
    memcpy(t->path, path, len);
    if (pthread_mutex_init(&t->mu, NULL) != 0) {
        free(t->path);
        free(t);
        return DT_ERR(DT_ENOMEM, "%s: cannot create trace mutex", path);
    }
    t->rank = rank;
    t->lanes_seen = 3;   /* compute and comm lanes are always named */
    clock_gettime(CLOCK_MONOTONIC, &t->t0);
    *tp = t;
    return DT_OK;
}

double dt_trace_now_us(const dt_trace *t) {
    if (!t) return 0.0;
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)(now.tv_sec - t->t0.tv_sec) * 1e6 + (double)(now.tv_nsec - t->t0.tv_nsec) * 1e-3;
}

/* Copies s into the pool; returns its offset or NO_CAT on failure. Locked. */
static size_t pool_add(dt_trace *t, const char *s) {
    size_t n = strlen(s) + 1;
    if (t->pool_cap - t->pool_len < n) {
        size_t cap = t->pool_cap ? t->pool_cap : 4096;
        while (cap - t->pool_len < n) cap *= 2;
        char *p = realloc(t->pool, cap);
        if (!p) return NO_CAT;
        t->pool = p;
        t->pool_cap = cap;
    }
    memcpy(t->pool + t->pool_len, s, n);
    size_t off = t->pool_len;
    t->pool_len += n;
    return off;
}

static void record(dt_trace *t, char ph, const char *name, const char *cat, int lane, double ts,
                   double dur) {
    pthread_mutex_lock(&t->mu);
    if (t->n == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 1024;
        trace_ev *ev = realloc(t->ev, cap * sizeof *ev);
        if (!ev) goto drop;
        t->ev = ev;
        t->cap = cap;
    }
    trace_ev *e = &t->ev[t->n];
    e->name_off = pool_add(t, name ? name : "?");
    if (e->name_off == NO_CAT) goto drop;
    e->cat_off = NO_CAT;
    if (cat && (e->cat_off = pool_add(t, cat)) == NO_CAT) goto drop;
    e->ph = ph;
    e->lane = lane;
    e->ts = ts;
    e->dur = dur;
    if (lane >= 0 && lane < 64) t->lanes_seen |= (uint64_t)1 << lane;
    t->n++;
    pthread_mutex_unlock(&t->mu);
    return;
drop:
    t->dropped++;
    pthread_mutex_unlock(&t->mu);
}

void dt_trace_event(dt_trace *t, const char *name, const char *cat, int lane, double begin_us,
                    double end_us) {
    if (!t || !isfinite(begin_us) || !isfinite(end_us)) return;
    double dur = end_us > begin_us ? end_us - begin_us : 0.0;
    record(t, 'X', name, cat, lane, begin_us, dur);
}

void dt_trace_instant(dt_trace *t, const char *name, int lane) {
    if (!t) return;
    record(t, 'i', name, NULL, lane, dt_trace_now_us(t), 0.0);
}

/* ---- output ---- */

typedef struct sbuf { char *p; size_t len, cap; int oom; } sbuf;

static void sb_reserve(sbuf *b, size_t extra) {
    if (b->oom || b->cap - b->len > extra) return;
    size_t cap = b->cap ? b->cap : 1 << 16;
    while (cap - b->len <= extra) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) { b->oom = 1; return; }
    b->p = p;
    b->cap = cap;
}

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0) { b->oom = 1; return; }
    sb_reserve(b, (size_t)n + 1);
    if (b->oom) return;
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

/* Appends s as a quoted JSON string. */
static void sb_json_str(sbuf *b, const char *s) {
    sb_reserve(b, strlen(s) * 6 + 3);
    if (b->oom) return;
    char *o = b->p + b->len;
    *o++ = '"';
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        unsigned c = *p;
        if (c == '"' || c == '\\') { *o++ = '\\'; *o++ = (char)c; }
        else if (c == '\n') { *o++ = '\\'; *o++ = 'n'; }
        else if (c == '\t') { *o++ = '\\'; *o++ = 't'; }
        else if (c < 0x20) o += sprintf(o, "\\u%04x", c);
        else *o++ = (char)c;
    }
    *o++ = '"';
    b->len = (size_t)(o - b->p);
}

static void write_meta(sbuf *b, int pid, int tid, const char *what, const char *value) {
    sb_printf(b, "{\"name\":\"%s\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":", what,
              pid, tid);
    sb_json_str(b, value);
    sb_printf(b, "}},\n");
}

static void write_json(const dt_trace *t, sbuf *b) {
    char label[32];
    sb_printf(b, "{\"traceEvents\":[\n");
    snprintf(label, sizeof label, "rank %d", t->rank);
    write_meta(b, t->rank, 0, "process_name", label);
    sb_printf(b, "{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,"
                 "\"args\":{\"sort_index\":%d}},\n", t->rank, t->rank);
    for (int lane = 0; lane < 64; lane++) {
        if (!(t->lanes_seen >> lane & 1)) continue;
        if (lane == 0) snprintf(label, sizeof label, "compute");
        else if (lane == 1) snprintf(label, sizeof label, "comm");
        else snprintf(label, sizeof label, "lane %d", lane);
        write_meta(b, t->rank, lane, "thread_name", label);
    }
    for (size_t i = 0; i < t->n && !b->oom; i++) {
        const trace_ev *e = &t->ev[i];
        sb_printf(b, "{\"name\":");
        sb_json_str(b, t->pool + e->name_off);
        if (e->cat_off != NO_CAT) {
            sb_printf(b, ",\"cat\":");
            sb_json_str(b, t->pool + e->cat_off);
        }
        if (e->ph == 'X')
            sb_printf(b, ",\"ph\":\"X\",\"ts\":%.3f,\"dur\":%.3f", e->ts, e->dur);
        else
            sb_printf(b, ",\"ph\":\"i\",\"s\":\"t\",\"ts\":%.3f", e->ts);
        sb_printf(b, ",\"pid\":%d,\"tid\":%d},\n", t->rank, e->lane);
    }
    /* Every entry above ends in ",\n"; drop the last comma. */
    if (!b->oom) b->len -= 2;
    sb_printf(b, "\n],\"displayTimeUnit\":\"ms\"}\n");
}

dt_status dt_trace_close(dt_trace *t) {
    if (!t) return DT_OK;
    pthread_mutex_lock(&t->mu);
    sbuf b = {0};
    write_json(t, &b);
    size_t dropped = t->dropped;
    pthread_mutex_unlock(&t->mu);
    dt_status s;
    if (b.oom) s = DT_ERR(DT_ENOMEM, "%s: out of memory writing the trace", t->path);
    else s = dt_write_file_atomic(t->path, b.p, b.len);
    if (s == DT_OK && dropped)
        s = DT_ERR(DT_ENOMEM, "%s: %zu trace events dropped (out of memory)", t->path, dropped);
    free(b.p);
    pthread_mutex_destroy(&t->mu);
    free(t->ev);
    free(t->pool);
    free(t->path);
    free(t);
    return s;
}
