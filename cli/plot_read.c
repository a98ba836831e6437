/* dtrain plot's input: metrics JSONL (--metrics: one object per line, keys
 * step, loss, lr, ms; eval_loss at evaluation) and Chrome traces (--trace:
 * {"traceEvents":[...]}, pid = rank, tid 0 the compute thread, tid 1 the
 * communication lane; src/io/trace.c writes them). */
#include <ctype.h>
#include <limits.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cjson/cJSON.h>
#include "plot.h"

const char *const dt_plot_keys[DT_PLOT_NSERIES] = {"loss", "eval_loss", "lr", "ms"};

static int push(dt_plot_series *s, double x, double y) {
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 256;
        double *nx = realloc(s->x, cap * sizeof *nx);
        if (!nx) return -1;
        s->x = nx;
        double *ny = realloc(s->y, cap * sizeof *ny);
        if (!ny) return -1;
        s->y = ny;
        s->cap = cap;
    }
    s->x[s->n] = x;
    s->y[s->n] = y;
    s->n++;
    return 0;
}

/* a JSON document whose first key is "traceEvents" (the first bytes decide) */
static int is_trace(const char *text, size_t len) {
    const char *p = text, *end = text + len;
    while (p < end && isspace((unsigned char)*p)) p++;
    if (p == end || *p++ != '{') return 0;
    while (p < end && isspace((unsigned char)*p)) p++;
    return (size_t)(end - p) >= 13 && !memcmp(p, "\"traceEvents\"", 13);
}

static char *read_all(const char *path, size_t *len, char *err, size_t n) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, n, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, got = 0;
    char *buf = malloc(cap);
    while (buf) {
        got += fread(buf + got, 1, cap - got, f);
        if (got < cap) break;
        char *nb = realloc(buf, cap * 2);
        if (!nb) { free(buf); buf = NULL; break; }
        buf = nb;
        cap *= 2;
    }
    if (!buf) snprintf(err, n, "%s: out of memory", path);
    else if (ferror(f)) {
        snprintf(err, n, "%s: read error: %s", path, strerror(errno));
        free(buf);
        buf = NULL;
    }
    fclose(f);
    *len = got;
    return buf;
}

static dt_plot_run *new_run(dt_plot_data *d, const char *path) {
    dt_plot_run *r = realloc(d->runs, (size_t)(d->nruns + 1) * sizeof *r);
    if (!r) return NULL;
    d->runs = r;
    r = &d->runs[d->nruns++];
    memset(r, 0, sizeof *r);
    r->path = path;
    return r;
}

static int read_metrics(dt_plot_data *d, const char *path, const char *text, size_t size, char *err, size_t n) {
    dt_plot_run *run = new_run(d, path);
    if (!run) {
        snprintf(err, n, "%s: out of memory", path);
        return -1;
    }
    long lineno = 0, objects = 0;
    int rc = 0;
    for (size_t at = 0; rc == 0 && at < size;) {
        const char *line = text + at, *nl = memchr(line, '\n', size - at);
        size_t len = nl ? (size_t)(nl - line) + 1 : size - at;
        at += len;
        lineno++;
        size_t sp = 0;
        while (sp < len && isspace((unsigned char)line[sp])) sp++;
        if (sp == len) continue;   /* blank lines (a trailing newline) carry nothing */
        cJSON *o = cJSON_ParseWithLength(line, len);
        if (!cJSON_IsObject(o)) {
            snprintf(err, n, "%s:%ld: not a JSON object (a metrics file holds one per line, as --metrics writes)",
                     path, lineno);
            cJSON_Delete(o);
            rc = -1;
            break;
        }
        objects++;
        const cJSON *st = cJSON_GetObjectItemCaseSensitive(o, "step");
        if (cJSON_IsNumber(st) && !isfinite(st->valuedouble)) {   /* "step":1e999: no place on the x axis */
            if (!run->bad_steps++) run->bad_step_line = lineno;
            cJSON_Delete(o);
            continue;
        }
        double x = cJSON_IsNumber(st) ? st->valuedouble : (double)objects;
        for (int k = 0; k < DT_PLOT_NSERIES && rc == 0; k++) {
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, dt_plot_keys[k]);
            if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble)) continue;   /* null: NaN or infinite */
            if (push(&run->s[k], x, v->valuedouble)) {
                snprintf(err, n, "%s: out of memory", path);
                rc = -1;
            }
        }
        cJSON_Delete(o);
    }
    return rc;
}

/* ---- traces ---- */

typedef struct ivals { double *a; size_t n, cap; } ivals;   /* pairs begin, end */

static int iv_push(ivals *v, double b, double e) {
    if (v->n + 2 > v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 512;
        double *a = realloc(v->a, cap * sizeof *a);
        if (!a) return -1;
        v->a = a;
        v->cap = cap;
    }
    v->a[v->n++] = b;
    v->a[v->n++] = e;
    return 0;
}

static int cmp_begin(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* length of the union of the intervals (sorts them) */
static double iv_union(ivals *v) {
    size_t k = v->n / 2;
    if (k) qsort(v->a, k, 2 * sizeof(double), cmp_begin);
    double total = 0, b = 0, e = 0;
    for (size_t i = 0; i < k; i++) {
        double bi = v->a[2 * i], ei = v->a[2 * i + 1];
        if (i == 0 || bi > e) {
            total += e - b;
            b = bi;
            e = ei;
        } else if (ei > e) {
            e = ei;
        }
    }
    return k ? total + (e - b) : 0;
}

static int num(const cJSON *o, const char *k, double *v) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!cJSON_IsNumber(x) || !isfinite(x->valuedouble)) return 0;
    *v = x->valuedouble;
    return 1;
}

/* an event's pid as a rank: a whole number in [0, INT_MAX] (a pid of 1e300
 * must not become a rank by an undefined conversion) */
static int rank_num(const cJSON *o, int *rank) {
    double p;
    if (!num(o, "pid", &p) || p < 0 || p > INT_MAX || p != floor(p)) return 0;
    *rank = (int)p;
    return 1;
}

/* one rank's split: the compute thread (tid 0) computing, blocked on
 * communication, or neither; the communication lane (tid 1) apart. -1: out
 * of memory; -2: the events span more microseconds than a double holds
 * (ends: the first start and the last end). */
static int split_rank(const cJSON *evs, int pid, dt_plot_rank *r, double ends[2]) {
    ivals comp = {0}, both = {0}, bg = {0};
    double lo = INFINITY, hi = -INFINITY;
    int bad = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, evs) {
        const cJSON *ph = cJSON_GetObjectItemCaseSensitive(e, "ph");
        double tid, ts, dur;
        int p;
        if (!cJSON_IsString(ph) || strcmp(ph->valuestring, "X") || !rank_num(e, &p) || p != pid ||
            !num(e, "tid", &tid) || !num(e, "ts", &ts) || !num(e, "dur", &dur) || dur < 0 || !isfinite(ts + dur))
            continue;   /* (an end past the largest double: not a time) */
        if (ts < lo) lo = ts;
        if (ts + dur > hi) hi = ts + dur;
        const cJSON *cat = cJSON_GetObjectItemCaseSensitive(e, "cat");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(e, "name");
        int comm = cJSON_IsString(cat) && !strcmp(cat->valuestring, "comm");
        int envelope = cJSON_IsString(name) && !strcmp(name->valuestring, "step");   /* holds the others */
        if (tid == 0 && !comm && !envelope) bad |= iv_push(&comp, ts, ts + dur) | iv_push(&both, ts, ts + dur);
        else if (tid == 0 && comm) bad |= iv_push(&both, ts, ts + dur);
        else if (tid != 0) bad |= iv_push(&bg, ts, ts + dur);
    }
    ends[0] = lo;
    ends[1] = hi;
    if (!bad && hi > lo && !isfinite(hi - lo)) {   /* both ends finite, their distance not */
        bad = -2;
    } else if (!bad) {
        r->rank = pid;
        r->span_us = hi > lo ? hi - lo : 0;
        r->compute_us = iv_union(&comp);
        double busy = iv_union(&both);
        r->comm_us = busy - r->compute_us;
        r->idle_us = r->span_us - busy;
        if (r->idle_us < 0) r->idle_us = 0;
        r->overlapped_us = iv_union(&bg);
    }
    free(comp.a);
    free(both.a);
    free(bg.a);
    return bad == -2 ? -2 : bad ? -1 : 0;
}

static int read_trace(dt_plot_data *d, const char *path, const char *text, size_t len, char *err, size_t n) {
    cJSON *doc = cJSON_ParseWithLength(text, len);
    if (!doc) {   /* (cut short by a killed run, most often) */
        const char *at = cJSON_GetErrorPtr();
        size_t off = at && at >= text && at <= text + len ? (size_t)(at - text) : len;
        snprintf(err, n, "%s: not valid JSON at byte %zu of %zu%s", path, off, len,
                 off + 16 >= len ? " (near its end: truncated?)" : "");
        return -1;
    }
    const cJSON *evs = cJSON_GetObjectItemCaseSensitive(doc, "traceEvents");
    if (!cJSON_IsArray(evs)) {
        snprintf(err, n, "%s: not a Chrome trace (expected a JSON object with a traceEvents array, as --trace writes)",
                 path);
        cJSON_Delete(doc);
        return -1;
    }
    int rc = 0, found = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, evs) {   /* each pid with complete events, once */
        const cJSON *ph = cJSON_GetObjectItemCaseSensitive(e, "ph");
        if (!cJSON_IsString(ph) || strcmp(ph->valuestring, "X")) continue;
        int pid, seen = 0;
        if (!rank_num(e, &pid)) {
            snprintf(err, n, "%s: a complete event (\"ph\":\"X\") whose pid is not a rank (a whole number >= 0)", path);
            rc = -2;   /* (said) */
            break;
        }
        for (int i = 0; i < d->nranks && !seen; i++) seen = d->ranks[i].path == path && d->ranks[i].rank == pid;
        if (seen) continue;
        dt_plot_rank *r = realloc(d->ranks, (size_t)(d->nranks + 1) * sizeof *r);
        if (!r) { rc = -1; break; }
        d->ranks = r;
        r = &d->ranks[d->nranks];
        memset(r, 0, sizeof *r);
        r->path = path;
        double ends[2];
        int sr = split_rank(evs, pid, r, ends);
        if (sr == -2) {
            snprintf(err, n, "%s: rank %d's events run from %g to %g us: too far apart to measure", path, pid,
                     ends[0], ends[1]);
            rc = -2;   /* (said) */
            break;
        }
        if (sr) { rc = -1; break; }
        d->nranks++;
        found++;
    }
    if (rc == -1) snprintf(err, n, "%s: out of memory", path);
    else if (rc == -2) rc = -1;
    else if (!found) {
        snprintf(err, n, "%s: a trace without complete events (\"ph\":\"X\"): nothing to plot", path);
        rc = -1;
    }
    cJSON_Delete(doc);
    return rc;
}

int dt_plot_read(dt_plot_data *d, const char *path, char *err, size_t n) {
    size_t len;
    char *text = read_all(path, &len, err, n);
    if (!text) return -1;
    int rc = is_trace(text, len) ? read_trace(d, path, text, len, err, n) : read_metrics(d, path, text, len, err, n);
    free(text);
    return rc;
}

void dt_plot_data_free(dt_plot_data *d) {
    for (int i = 0; i < d->nruns; i++)
        for (int k = 0; k < DT_PLOT_NSERIES; k++) {
            free(d->runs[i].s[k].x);
            free(d->runs[i].s[k].y);
        }
    free(d->runs);
    free(d->ranks);
    memset(d, 0, sizeof *d);
}
