/* Configuration agreement (dist.h section 8): every rank's list of named
 * settings is compared across the group before the work that depends on it.
 *
 * Exchange 1, fixed size whatever the ranks hold: 24 bytes per rank (FNV-1a
 * hash of the serialised list and of its dist settings alone, its length, an
 * out-of-memory flag). Equal
 * everywhere: done. Exchange 2, only on a difference: every rank's list,
 * padded to the longest length (known to all from exchange 1, so every rank
 * passes the same count). Each rank then finds the same first differing
 * setting and fails with the same message.
 *
 * Both exchanges are MPI_Iallgather on the group's side communicator, waited
 * with MPI_Test (polling the other groups in POLL mode): the same calls in
 * both progress modes, and nothing else ever runs on that communicator, so a
 * mismatch elsewhere cannot pair with it. */
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dist/dist_internal.h"

void dt_agree_init(dt_agree *a) { memset(a, 0, sizeof *a); }

void dt_agree_free(dt_agree *a) {
    if (!a) return;
    free(a->buf);
    memset(a, 0, sizeof *a);
}

static void put(dt_agree *a, const char *s, size_t n) {   /* n bytes + NUL */
    if (a->oom) return;
    if (a->len + n + 1 > a->cap) {
        size_t cap = a->cap ? a->cap : 1024;
        while (cap < a->len + n + 1) cap *= 2;
        char *b = realloc(a->buf, cap);
        if (!b) { a->oom = 1; return; }
        a->buf = b;
        a->cap = cap;
    }
    memcpy(a->buf + a->len, s, n);
    a->buf[a->len + n] = 0;
    a->len += n + 1;
}

void dt_agree_add(dt_agree *a, const char *name, const char *fmt, ...) {
    if (!a || a->oom) return;
    char small[256], *v = small;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) n = 0, small[0] = 0;
    if ((size_t)n >= sizeof small) {
        if (!(v = malloc((size_t)n + 1))) { a->oom = 1; return; }
        va_start(ap, fmt);
        vsnprintf(v, (size_t)n + 1, fmt, ap);
        va_end(ap);
    }
    put(a, name, strlen(name));
    put(a, v, (size_t)n);
    if (v != small) free(v);
    a->n++;
}

/* ---- the exchanges ---- */

/* hash and len of the whole list; wire: hash of the dist settings alone
 * (progress mode, segment size), whose mismatch also breaks the group */
typedef struct summary { uint64_t hash, wire; uint32_t len, oom; } summary;
_Static_assert(sizeof(summary) == 24, "exchange 1 is 24 bytes per rank");

static uint64_t fnv1a(const char *p, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)p[i]) * 1099511628211ull;
    return h;
}

dt_status dt__side_allgather(dt_pg *pg, const dt_work *w, const void *in, void *out, int bytes) {
    /* MPI works on copies of its own: after a timeout it may still write them
     * (a late rank arriving), so they are left to it, never the caller's */
    char *mi = malloc((size_t)bytes + 1), *mo = malloc((size_t)pg->size * (size_t)bytes + 1);
    if (!mi || !mo) {
        free(mi);
        free(mo);
        return DT_ERR(DT_ENOMEM, "%s: out of memory for a %d x %d-byte exchange", pg->name, pg->size, bytes);
    }
    memcpy(mi, in, (size_t)bytes);
    MPI_Request r;
    int rc = MPI_Iallgather(mi, bytes, MPI_BYTE, mo, bytes, MPI_BYTE, pg->side, &r);
    if (rc != MPI_SUCCESS) {
        free(mi);
        free(mo);
        return dt__mpi_err(rc, "dt_pg_agree: MPI_Iallgather");
    }
    /* watched like any collective: a rank that never comes must not hang the
     * others past the collective timeout (r stays MPI's: the group is broken) */
    double t0 = dt_mono_s(), next_warn = t0 + dt__dist.stall_warn_s;
    for (int done = 0, idle = 0, k = 0; !done;) {
        rc = MPI_Test(&r, &done, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) return dt__mpi_err(rc, "dt_pg_agree: MPI_Test");   /* (MPI's copies: left) */
        if (done) break;
        if (pg->mode == DT_PROGRESS_POLL && dt__poll_all(pg)) idle = 0;
        else if (++idle > 64) sched_yield();
        if ((++k & 255) == 0 && dt__wd_wait_check(pg, w, w ? NULL : "configuration agreement (dt_pg_agree)", t0,
                                                  &next_warn))
            return dt__wd_timeout_error(pg);   /* (mi, mo: MPI's still) */
    }
    memcpy(out, mo, (size_t)pg->size * (size_t)bytes);
    free(mi);
    free(mo);
    return DT_OK;
}

/* ---- finding and naming the difference ---- */

typedef struct flist { const char **name, **val; int n; } flist;

/* Splits "name\0value\0..." (len bytes) into fields. */
static int parse(const char *b, size_t len, flist *f) {
    int cap = 0;
    for (size_t i = 0; i < len; i++) cap += b[i] == 0;
    cap = cap / 2 + 1;
    f->name = malloc((size_t)cap * sizeof *f->name);
    f->val = malloc((size_t)cap * sizeof *f->val);
    f->n = 0;
    if (!f->name || !f->val) return -1;
    for (size_t i = 0; i < len && f->n < cap;) {
        const char *nm = b + i;
        i += strlen(nm) + 1;
        const char *v = i < len ? b + i : "";
        if (i < len) i += strlen(v) + 1;
        f->name[f->n] = nm;
        f->val[f->n++] = v;
    }
    return 0;
}

/* Value of name in f (NULL: absent); tries position hint first. */
static const char *lookup(const flist *f, const char *name, int hint) {
    if (hint < f->n && !strcmp(f->name[hint], name)) return f->val[hint];
    for (int i = 0; i < f->n; i++)
        if (!strcmp(f->name[i], name)) return f->val[i];
    return NULL;
}

static int same(const char *a, const char *b) { return a == b || (a && b && !strcmp(a, b)); }

/* "rank 1" | "ranks 0, 2-3" into o (appended at *at). */
static void fmt_ranks(char *o, size_t n, size_t *at, const int *grp, int size, int g) {
    int k = 0;
    for (int r = 0; r < size; r++) k += grp[r] == g;
    *at += (size_t)snprintf(o + *at, *at < n ? n - *at : 0, "%s", k == 1 ? "rank " : "ranks ");
    int first = 1;
    for (int r = 0; r < size && *at < n; r++) {
        if (grp[r] != g) continue;
        int e = r;
        while (e + 1 < size && grp[e + 1] == g) e++;
        *at += (size_t)snprintf(o + *at, n - *at, e > r ? "%s%d-%d" : "%s%d", first ? "" : ", ", r, e);
        first = 0;
        r = e;
    }
}

/* The message for setting `name` whose per-rank values are v[0..size). */
static void describe_field(char *o, size_t n, const char *name, const char **v, int size, int *grp) {
    int ng = 0;
    for (int r = 0; r < size; r++) {
        grp[r] = -1;
        for (int q = 0; q < r && grp[r] < 0; q++)
            if (same(v[q], v[r])) grp[r] = grp[q];
        if (grp[r] < 0) grp[r] = ng++;
    }
    size_t at = (size_t)snprintf(o, n, "configuration differs between ranks: %s: ", name);
    /* rank 0's group is 0: the others first (the odd ones out, by first
     * rank), at most 3 of them, then rank 0's */
    for (int j = 0; j < ng && at < n; j++) {
        int g = j + 1 < ng ? j + 1 : 0;
        if (g > 3) {
            if (g == 4) at += (size_t)snprintf(o + at, n - at, "%d more values, ", ng - 4);
            continue;
        }
        int r0 = 0, k = 0;
        while (grp[r0] != g) r0++;
        for (int r = 0; r < size; r++) k += grp[r] == g;
        fmt_ranks(o, n, &at, grp, size, g);
        if (at < n)
            at += (size_t)snprintf(o + at, n - at, " %s %.80s%s%s", k == 1 ? "has" : "have",
                                   v[r0] ? v[r0] : "(not set)", v[r0] && strlen(v[r0]) > 80 ? "..." : "",
                                   g ? ", " : "");
    }
}

/* Every rank computes the same message from the same gathered lists. */
static dt_status explain(dt_pg *pg, const char *all, size_t stride, const summary *sum) {
    int size = pg->size;
    flist *f = calloc((size_t)size, sizeof *f);
    const char **v = malloc((size_t)size * sizeof *v);
    int *grp = malloc((size_t)size * sizeof *grp);
    int ok = f && v && grp;
    for (int r = 0; ok && r < size; r++) ok = parse(all + (size_t)r * stride, sum[r].len, &f[r]) == 0;
    char msg[900];
    msg[0] = 0;
    /* rank 0's settings in its order, then those only later ranks have */
    for (int r0 = 0; ok && !msg[0] && r0 < size; r0++)
        for (int i = 0; i < f[r0].n && !msg[0]; i++) {
            const char *name = f[r0].name[i];
            int seen_before = 0;
            for (int q = 0; q < r0 && !seen_before; q++) seen_before = lookup(&f[q], name, i) != NULL;
            if (seen_before || lookup(&f[r0], name, 0) != f[r0].val[i]) continue;   /* duplicates: first counts */
            int differ = 0;
            for (int r = 0; r < size; r++) {
                v[r] = lookup(&f[r], name, i);
                differ |= !same(v[r], v[0]);
            }
            if (differ) describe_field(msg, sizeof msg, name, v, size, grp);
        }
    if (ok && !msg[0]) {   /* equal field by field, e.g. in another order */
        int k = 0;
        for (int r = 0; r < size; r++) grp[r] = sum[r].hash != sum[0].hash || sum[r].len != sum[0].len, k += grp[r];
        size_t at = (size_t)snprintf(msg, sizeof msg, "configuration differs between ranks: the settings are listed "
                                     "differently on ");
        fmt_ranks(msg, sizeof msg, &at, grp, size, 1);
        if (at < sizeof msg) snprintf(msg + at, sizeof msg - at, " than on rank 0");
    }
    for (int r = 0; f && r < size; r++) { free(f[r].name); free(f[r].val); }
    free(f);
    free(v);
    free(grp);
    if (!ok) return DT_ERR(DT_ENOMEM, "dt_pg_agree on %s: out of memory describing a configuration difference", pg->name);
    return DT_ERR(DT_EINVAL, "%s", msg);
}

dt_status dt_pg_agree(dt_pg *pg, const dt_agree *a) {
    DT_TRY(dt__check_init("dt_pg_agree"));
    if (!pg || !a) return DT_ERR(DT_EINVAL, "dt_pg_agree: NULL %s", pg ? "list" : "process group");
    /* the dist settings that change what goes on the wire come first */
    dt_agree mine;
    dt_agree_init(&mine);
    dt_agree_add(&mine, "dist.progress (DTRAIN_PROGRESS)", "%s",
                 pg->mode == DT_PROGRESS_THREAD ? "thread" : "poll");
    dt_agree_add(&mine, "collective segment bytes", "%zu", dt__dist.segment_bytes);
    size_t wire_len = mine.len;
    if (!mine.oom && !a->oom && a->len) {
        size_t len0 = mine.len;
        if (mine.cap < len0 + a->len) {
            char *b = realloc(mine.buf, len0 + a->len);
            if (b) { mine.buf = b; mine.cap = len0 + a->len; }
            else mine.oom = 1;
        }
        if (!mine.oom) { memcpy(mine.buf + len0, a->buf, a->len); mine.len += a->len; }
    }
    summary me = {fnv1a(mine.buf, mine.len), fnv1a(mine.buf, mine.oom ? 0 : wire_len), (uint32_t)mine.len,
                  (uint32_t)(mine.oom || a->oom || mine.len > 1u << 30)};
    summary *sum = malloc((size_t)pg->size * sizeof *sum);
    dt_status s = sum ? dt__side_allgather(pg, NULL, &me, sum, (int)sizeof me)
                      : DT_ERR(DT_ENOMEM, "dt_pg_agree on %s: out of memory", pg->name);
    int differ = 0, wire_differs = 0;
    size_t longest = 0;
    for (int r = 0; s == DT_OK && r < pg->size; r++) {
        if (sum[r].oom) {
            s = DT_ERR(DT_ENOMEM, "dt_pg_agree on %s: rank %d could not build its configuration list", pg->name, r);
            break;
        }
        differ |= sum[r].hash != me.hash || sum[r].len != me.len;
        wire_differs |= sum[r].wire != me.wire;
        if (sum[r].len > longest) longest = sum[r].len;
    }
    if (s == DT_OK && differ) {   /* every rank sees the same sums: all get here, with the same longest */
        char *all = malloc((size_t)pg->size * longest), *pad = calloc(1, longest);
        if (all && pad) {
            memcpy(pad, mine.buf, mine.len);
            s = dt__side_allgather(pg, NULL, pad, all, (int)longest);
            if (s == DT_OK) s = explain(pg, all, longest, sum);
        } else {
            s = DT_ERR(DT_ENOMEM, "dt_pg_agree on %s: out of memory for %d configurations of %zu bytes", pg->name,
                       pg->size, longest);
        }
        free(all);
        free(pad);
        /* Every rank gets here. Ranks that drive collectives differently
         * (progress mode, segment size) cannot match them any more: the group
         * is broken, so teardown skips its barrier instead of hanging. Other
         * differences leave the group usable. */
        int thr = pg->mode == DT_PROGRESS_THREAD;
        if (thr) pthread_mutex_lock(&pg->mu);
        if (wire_differs && !pg->broken) {
            pg->broken = 1;
            snprintf(pg->broken_msg, sizeof pg->broken_msg, "%s", dt_error_message());
        }
        if (thr) pthread_mutex_unlock(&pg->mu);
    }
    free(sum);
    dt_agree_free(&mine);
    return s;
}
