/* dtrain plot's output: one SVG document, panels stacked top to bottom --
 * loss and validation loss against step (runs overlaid), learning rate,
 * ms per step, and for traces each rank's compute / communication / idle
 * time as a stacked bar. Every series is also data: its <g> carries
 * data-series, data-run, data-n and data-points ("x,y x,y ...", the values
 * read, shortest text that reads back to the same double), every bar
 * data-rank and its times in microseconds. */
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "plot.h"
#include "text.h"

typedef struct sbuf { char *p; size_t len, cap; int oom; } sbuf;

static void put(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(sbuf *b, const char *fmt, ...) {
    if (b->oom) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? b->cap - b->len : 0, fmt, ap);
    va_end(ap);
    if (n < 0) { b->oom = 1; return; }
    if (!b->p || b->len + (size_t)n >= b->cap) {
        size_t cap = b->cap ? b->cap : 1 << 16;
        while (cap <= b->len + (size_t)n) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) { b->oom = 1; return; }
        b->p = p;
        b->cap = cap;
        va_start(ap, fmt);
        vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
    }
    b->len += (size_t)n;
}

/* text for an attribute or element: XML's five escapes; characters XML
 * cannot hold (controls, bytes that are not UTF-8) become '?' */
static void esc(sbuf *b, const char *s) {
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        int u;
        switch (*p) {
        case '&': put(b, "&amp;"); break;
        case '<': put(b, "&lt;"); break;
        case '>': put(b, "&gt;"); break;
        case '"': put(b, "&quot;"); break;
        case '\'': put(b, "&apos;"); break;
        default:
            if (*p < 0x20 || *p == 0x7f) put(b, "?");
            else if (*p < 0x80) put(b, "%c", *p);
            else if ((u = dt_cli_utf8_len(p)) != 0) { put(b, "%.*s", u, (const char *)p); p += u - 1; }
            else put(b, "?");
        }
    }
}

static const char *base(const char *path) {
    const char *s = strrchr(path, '/');
    return s && s[1] ? s + 1 : path;
}

/* the shortest of %.15g / %.17g that reads back as v */
static void put_num(sbuf *b, double v) {
    char t[40];
    snprintf(t, sizeof t, "%.15g", v);
    if (strtod(t, NULL) != v) snprintf(t, sizeof t, "%.17g", v);
    put(b, "%s", t);
}

static const char *const palette[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e",
                                      "#17becf", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22"};
#define NPAL (sizeof palette / sizeof palette[0])

enum { W = 960, PH = 300, ML = 80, MR = 250, MT = 36, MB = 46, TOP = 28 };

/* ---- axes ---- */

typedef struct axis { double lo, hi, step; int log; } axis;

/* a round step (1, 2 or 5 times a power of ten) near (hi - lo) / target:
 * finite and positive for any finite lo < hi (hi - lo itself may overflow:
 * -1e308..1e308; a subnormal range gives the smallest normal double's step) */
static double nice_step(double lo, double hi, int target) {
    double raw = hi / target - lo / target;
    if (!(raw >= DBL_MIN)) raw = DBL_MIN;
    double p = pow(10, floor(log10(raw))), f = raw / p;
    if (!(p > 0) || !isfinite(f)) return raw;   /* (10^e not a normal double: the raw step itself) */
    double step = (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) * p;
    return isfinite(step) ? step : raw;
}

/* [lo, hi] of the data -> bounds on whole ticks (about 5); finite data give
 * finite bounds lo < hi and a finite step > 0 */
static axis make_axis(double lo, double hi, int log_scale) {
    axis a = {lo, hi, 1, log_scale};
    if (log_scale) {
        a.lo = floor(log10(lo));
        a.hi = ceil(log10(hi));
        if (a.hi <= a.lo) a.hi = a.lo + 1;
        return a;
    }
    /* one value, or values a tick step could not tell apart (0.3 and
     * 0.30000000000000004: a step below their ulp would never advance) */
    if (!(hi / 2 - lo / 2 > fmax(fabs(lo), fabs(hi)) * 5e-10)) {   /* a band around them */
        double pad = lo != 0 ? fabs(lo) * 0.1 : 1;
        lo = fmax(lo - pad, -DBL_MAX);
        hi = fmin(hi + pad, DBL_MAX);
    }
    a.step = nice_step(lo, hi, 5);
    a.lo = floor(lo / a.step) * a.step;
    a.hi = ceil(hi / a.step) * a.step;
    if (!isfinite(a.lo)) a.lo = lo;   /* the next tick is past the largest double: the data's own bound */
    if (!isfinite(a.hi)) a.hi = hi;
    return a;
}

/* ticks lo + i * step, i = 0..ticks(a) - 1: those inside [lo, hi] (a count,
 * not v += step: that never ends where lo + step rounds back to lo) */
static int ticks(const axis *a) {
    double k = floor((a->hi / a->step - a->lo / a->step) * (1 + 1e-9)) + 1;
    return k < 1 ? 1 : k > 1000 ? 1000 : (int)k;
}

/* tick i, lo + i * step (in halves: 4 * 5e307 alone would overflow) */
static double tick_at(const axis *a, int i) { return 2 * (a->lo / 2 + i * (a->step / 2)); }

/* v on [p0, p1]; halves so that hi - lo never overflows */
static double map(const axis *a, double v, double p0, double p1) {
    double t = a->log ? log10(v) : v;
    return p0 + (t / 2 - a->lo / 2) / (a->hi / 2 - a->lo / 2) * (p1 - p0);
}

static void tick_label(char *t, size_t n, double v, double step, double maxabs) {
    if (fabs(v) < step * 1e-9) v = 0;
    if (step >= 1e-3 && maxabs < 1e6) {
        int dec = step >= 1 ? 0 : (int)ceil(-log10(step) - 1e-9);
        snprintf(t, n, "%.*f", dec, v);
    } else {
        snprintf(t, n, "%.3g", v);
    }
}

/* frame, grid, tick labels, axis titles */
static void draw_axes(sbuf *b, int top, const axis *x, const axis *y, const char *xlabel, const char *ylabel) {
    int x0 = ML, x1 = W - MR, y0 = top + MT, y1 = top + PH - MB;
    put(b, "<g class=\"axes\" stroke=\"#ccc\" stroke-width=\"1\">\n");
    char t[48];
    double xm = fmax(fabs(x->lo), fabs(x->hi));
    for (int i = 0, nt = ticks(x); xlabel && i < nt; i++) {   /* no x label: no x ticks */
        double v = tick_at(x, i), px = map(x, v, x0, x1);
        tick_label(t, sizeof t, v, x->step, xm);
        put(b, "<line x1=\"%.2f\" y1=\"%d\" x2=\"%.2f\" y2=\"%d\"/>", px, y0, px, y1);
        put(b, "<text x=\"%.2f\" y=\"%d\" text-anchor=\"middle\" stroke=\"none\" fill=\"#333\">%s</text>\n", px,
            y1 + 16, t);
    }
    if (y->log) {
        for (double e = y->lo; e <= y->hi + 1e-9; e++)
            for (int m = 1; m <= 5; m += m == 1 ? 1 : 3) {   /* 1, 2, 5 per decade (only 1 past 4 decades) */
                double v = (double)m * pow(10, e), py = y1 + (log10(v) - y->lo) / (y->hi - y->lo) * (y0 - y1);
                if (!(v > 0) || !isfinite(v) || log10(v) > y->hi + 1e-9 || (m > 1 && y->hi - y->lo > 4))
                    continue;   /* (10^-324 is 0, 10^309 infinite) */
                snprintf(t, sizeof t, "%g", v);
                put(b, "<line x1=\"%d\" y1=\"%.2f\" x2=\"%d\" y2=\"%.2f\"/>", x0, py, x1, py);
                put(b, "<text x=\"%d\" y=\"%.2f\" text-anchor=\"end\" stroke=\"none\" fill=\"#333\">%s</text>\n",
                    x0 - 6, py + 4, t);
            }
    } else {
        double ym = fmax(fabs(y->lo), fabs(y->hi));
        for (int i = 0, nt = ticks(y); i < nt; i++) {
            double v = tick_at(y, i), py = map(y, v, y1, y0);
            tick_label(t, sizeof t, v, y->step, ym);
            put(b, "<line x1=\"%d\" y1=\"%.2f\" x2=\"%d\" y2=\"%.2f\"/>", x0, py, x1, py);
            put(b, "<text x=\"%d\" y=\"%.2f\" text-anchor=\"end\" stroke=\"none\" fill=\"#333\">%s</text>\n", x0 - 6,
                py + 4, t);
        }
    }
    put(b, "</g>\n<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#333\"/>\n", x0, y0, x1 - x0,
        y1 - y0);
    if (xlabel) put(b, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">%s</text>\n", (x0 + x1) / 2, y1 + 36, xlabel);
    put(b, "<text transform=\"translate(%d %d) rotate(-90)\" text-anchor=\"middle\">%s</text>\n", 18, (y0 + y1) / 2,
        ylabel);
}

/* ---- line panels ---- */

typedef struct line { const dt_plot_series *s; const char *key, *run; int color, dashed; } line;

#define LEGEND_ROOM ((PH - MB - MT - 8) / 18 + 1)   /* legend lines beside a panel */

/* a run's name in the legend: its file name, or the path as given when
 * another run has the same file name (runA/metrics.jsonl, runB/metrics.jsonl) */
static const char *run_name(const line *ls, int n, int i) {
    for (int j = 0; j < n; j++)
        if (strcmp(ls[j].run, ls[i].run) && !strcmp(base(ls[j].run), base(ls[i].run))) return ls[i].run;
    return base(ls[i].run);
}

static void legend_entry(sbuf *b, int top, int i, const line *l, const char *name, const char *label) {
    int x = W - MR + 16, y = top + MT + 8 + 18 * i;
    put(b, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"%s\" stroke-width=\"2\"%s/>", x, y, x + 24, y,
        palette[l->color % NPAL], l->dashed ? " stroke-dasharray=\"6 4\"" : "");
    put(b, "<text x=\"%d\" y=\"%d\">", x + 30, y + 4);
    esc(b, name);
    put(b, "%s%s</text>\n", label ? " " : "", label ? label : "");
}

/* more lines than room: the last line says how many are not listed (their
 * series are drawn, each named by its data-run attribute) */
static void legend_more(sbuf *b, int top, int more) {
    put(b, "<text x=\"%d\" y=\"%d\" fill=\"#333\">+%d more not listed</text>\n", W - MR + 16,
        top + MT + 8 + 18 * (LEGEND_ROOM - 1) + 4, more);
}

static void draw_lines(sbuf *b, int top, const char *title, const char *ylabel, const line *ls, int n, int log_y,
                       int name_series) {
    double xl = INFINITY, xh = -INFINITY, yl = INFINITY, yh = -INFINITY;
    for (int i = 0; i < n; i++)
        for (size_t k = 0; k < ls[i].s->n; k++) {
            xl = fmin(xl, ls[i].s->x[k]);
            xh = fmax(xh, ls[i].s->x[k]);
            yl = fmin(yl, ls[i].s->y[k]);
            yh = fmax(yh, ls[i].s->y[k]);
        }
    if (log_y && !(yl > 0)) {   /* a value <= 0 has no logarithm: linear, and the title says so */
        log_y = 0;
        title = "loss (linear: a value is <= 0)";
    }
    axis ax = make_axis(xl, xh, 0), ay = make_axis(yl, yh, log_y);
    put(b, "<g class=\"panel\" data-panel=\"");
    esc(b, title);
    put(b, "\">\n<text x=\"%d\" y=\"%d\" font-size=\"15\" font-weight=\"bold\">", ML, top + 22);
    esc(b, title);
    put(b, "</text>\n");
    draw_axes(b, top, &ax, &ay, "step", ylabel);
    int x0 = ML, x1 = W - MR, y0 = top + MT, y1 = top + PH - MB;
    for (int i = 0; i < n; i++) {
        const line *l = &ls[i];
        const char *col = palette[l->color % NPAL];
        put(b, "<g class=\"series\" data-series=\"%s\" data-run=\"", l->key);
        esc(b, l->run);
        put(b, "\" data-n=\"%zu\" data-points=\"", l->s->n);
        for (size_t k = 0; k < l->s->n; k++) {
            put(b, "%s", k ? " " : "");
            put_num(b, l->s->x[k]);
            put(b, ",");
            put_num(b, l->s->y[k]);
        }
        put(b, "\">\n");
        /* one polyline per stretch of growing steps (a file appended to by a second run starts over) */
        for (size_t k0 = 0, k1; k0 < l->s->n; k0 = k1) {
            for (k1 = k0 + 1; k1 < l->s->n && l->s->x[k1] >= l->s->x[k1 - 1];) k1++;
            if (k1 - k0 < 2) {   /* a point alone: a dot */
                if (!l->dashed || l->s->n > 200)
                    put(b, "<circle cx=\"%.2f\" cy=\"%.2f\" r=\"3.5\" fill=\"%s\"/>", map(&ax, l->s->x[k0], x0, x1),
                        map(&ay, l->s->y[k0], y1, y0), col);
                continue;
            }
            put(b, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\"%s points=\"", col,
                l->dashed ? " stroke-dasharray=\"6 4\"" : "");
            for (size_t k = k0; k < k1; k++)
                put(b, "%s%.2f,%.2f", k > k0 ? " " : "", map(&ax, l->s->x[k], x0, x1), map(&ay, l->s->y[k], y1, y0));
            put(b, "\"/>\n");
        }
        if (l->dashed && l->s->n <= 200)   /* evaluations: every point marked */
            for (size_t k = 0; k < l->s->n; k++)
                put(b, "<circle cx=\"%.2f\" cy=\"%.2f\" r=\"3.5\" fill=\"%s\"/>", map(&ax, l->s->x[k], x0, x1),
                    map(&ay, l->s->y[k], y1, y0), col);
        put(b, "</g>\n");
        if (n <= LEGEND_ROOM || i < LEGEND_ROOM - 1)
            legend_entry(b, top, i, l, run_name(ls, n, i), name_series ? (l->dashed ? "validation" : "training") : NULL);
    }
    if (n > LEGEND_ROOM) legend_more(b, top, n - (LEGEND_ROOM - 1));
    put(b, "</g>\n");
}

/* ---- trace panel ---- */

static void draw_ranks(sbuf *b, int top, const dt_plot_rank *r, int n) {
    static const char *const part[3] = {"compute", "communication", "idle"};
    static const char *const fill[3] = {"#1f77b4", "#ff7f0e", "#c7c7c7"};
    double hi = 0;
    for (int i = 0; i < n; i++) hi = fmax(hi, r[i].compute_us + r[i].comm_us + r[i].idle_us);
    int secs = hi >= 1e6;
    double unit = secs ? 1e6 : 1e3;
    axis ay = make_axis(0, hi > 0 ? hi / unit : 1, 0);
    put(b, "<g class=\"panel\" data-panel=\"ranks\">\n<text x=\"%d\" y=\"%d\" font-size=\"15\" font-weight=\"bold\">"
           "time per rank (compute thread)</text>\n", ML, top + 22);
    int x0 = ML, x1 = W - MR, y0 = top + MT, y1 = top + PH - MB;
    /* a frame without x ticks: the bars are labelled */
    axis ax = {0, 1, 2, 0};
    draw_axes(b, top, &ax, &ay, NULL, secs ? "seconds" : "milliseconds");
    double slot = (double)(x1 - x0) / n, bw = fmin(slot * 0.6, 80);
    /* two bars with one rank number (traces of different runs): every bar
     * names its file, by the path as given where file names repeat */
    int many_files = 0;
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++) many_files |= r[i].rank == r[j].rank;
    for (int i = 0; i < n; i++) {
        double v[3] = {r[i].compute_us, r[i].comm_us, r[i].idle_us}, tot = v[0] + v[1] + v[2];
        put(b, "<g class=\"rank\" data-rank=\"%d\" data-trace=\"", r[i].rank);
        esc(b, r[i].path);
        put(b, "\" data-span-us=\"%.3f\" data-compute-us=\"%.3f\" data-comm-us=\"%.3f\" data-idle-us=\"%.3f\" "
               "data-overlapped-comm-us=\"%.3f\">\n<title>rank %d: ", r[i].span_us, v[0], v[1], v[2], r[i].overlapped_us,
            r[i].rank);
        for (int k = 0; k < 3; k++)
            put(b, "%s%s %.1f ms (%.0f%%)", k ? ", " : "", part[k], v[k] / 1e3, tot > 0 ? 100 * (v[k] / tot) : 0);
        put(b, "; communication running under compute %.1f ms</title>\n", r[i].overlapped_us / 1e3);
        double cx = x0 + slot * (i + 0.5), acc = 0;
        for (int k = 0; k < 3; k++) {
            double ya = map(&ay, (acc + v[k]) / unit, y1, y0), yb = map(&ay, acc / unit, y1, y0);
            put(b, "<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" fill=\"%s\"/>\n", cx - bw / 2, ya, bw,
                yb - ya, fill[k]);
            acc += v[k];
        }
        put(b, "<text x=\"%.2f\" y=\"%d\" text-anchor=\"middle\">rank %d", cx, y1 + 16, r[i].rank);
        if (many_files) {
            const char *name = base(r[i].path);
            for (int j = 0; j < n; j++)
                if (strcmp(r[j].path, r[i].path) && !strcmp(base(r[j].path), name)) name = r[i].path;
            put(b, " (");
            esc(b, name);
            put(b, ")");
        }
        put(b, "</text>\n<text x=\"%.2f\" y=\"%d\" text-anchor=\"middle\" fill=\"#333\">%.0f%% compute</text>\n</g>\n",
            cx, y1 + 32, tot > 0 ? 100 * (v[0] / tot) : 0);
    }
    for (int k = 0; k < 3; k++)
        put(b, "<rect x=\"%d\" y=\"%d\" width=\"14\" height=\"14\" fill=\"%s\"/><text x=\"%d\" y=\"%d\">%s</text>\n",
            W - MR + 16, top + MT + 18 * k, fill[k], W - MR + 36, top + MT + 11 + 18 * k, part[k]);
    put(b, "</g>\n");
}

char *dt_plot_svg(const dt_plot_data *d, int log_loss, size_t *len) {
    int nr = d->nruns;
    line *ls = calloc((size_t)(nr ? nr : 1) * 2, sizeof *ls);
    if (!ls) return NULL;
    int have[DT_PLOT_NSERIES] = {0};
    for (int i = 0; i < nr; i++)
        for (int k = 0; k < DT_PLOT_NSERIES; k++) have[k] |= d->runs[i].s[k].n > 0;
    int panels = (have[DT_PLOT_LOSS] || have[DT_PLOT_EVAL_LOSS]) + have[DT_PLOT_LR] + have[DT_PLOT_MS] + (d->nranks > 0);
    int height = TOP + panels * PH;
    sbuf b = {0};
    put(&b, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
            "font-family=\"sans-serif\" font-size=\"12\">\n"
            "<desc>dtrain plot: loss and validation loss, learning rate, ms per step against step; time per rank. "
            "Each series' points are in its data-points attribute (step,value ...).</desc>\n"
            "<rect width=\"%d\" height=\"%d\" fill=\"white\"/>\n",
        W, height, W, height, W, height);
    int top = TOP;
    if (have[DT_PLOT_LOSS] || have[DT_PLOT_EVAL_LOSS]) {
        int n = 0;
        for (int i = 0; i < nr; i++)
            for (int k = DT_PLOT_LOSS; k <= DT_PLOT_EVAL_LOSS; k++)
                if (d->runs[i].s[k].n)
                    ls[n++] = (line){&d->runs[i].s[k], dt_plot_keys[k], d->runs[i].path, i, k == DT_PLOT_EVAL_LOSS};
        draw_lines(&b, top, log_loss ? "loss (log scale)" : "loss", "loss", ls, n, log_loss, 1);
        top += PH;
    }
    static const char *const title[DT_PLOT_NSERIES] = {NULL, NULL, "learning rate", "ms per step"};
    for (int k = DT_PLOT_LR; k <= DT_PLOT_MS; k++) {
        if (!have[k]) continue;
        int n = 0;
        for (int i = 0; i < nr; i++)
            if (d->runs[i].s[k].n) ls[n++] = (line){&d->runs[i].s[k], dt_plot_keys[k], d->runs[i].path, i, 0};
        draw_lines(&b, top, title[k], title[k], ls, n, 0, 0);
        top += PH;
    }
    if (d->nranks) draw_ranks(&b, top, d->ranks, d->nranks);
    put(&b, "</svg>\n");
    free(ls);
    if (b.oom) {
        free(b.p);
        return NULL;
    }
    *len = b.len;
    return b.p;
}
