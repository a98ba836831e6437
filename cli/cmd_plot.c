/* dtrain plot FILE... -o OUT.svg: training curves from --metrics files and the
 * time split per rank from --trace files, as one SVG (plot_read.c reads,
 * plot_svg.c draws). Which a file is, is read from its content: a trace is a
 * JSON document starting {"traceEvents": ..., anything else is metrics JSONL.
 * A --trace path of a multi-rank run names no file itself (each rank wrote
 * PATH.rankR): given that path, PATH.rank0, PATH.rank1, ... are read. The
 * output is written atomically (temp file + rename). One process, no MPI. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>
#include "dtrain/io.h"
#include "cli.h"
#include "plot.h"

static const char *usage =
    "usage: dtrain plot FILE [FILE ...] -o OUT.svg [--log-loss]\n\n"
    "Draw training curves as an SVG picture, one panel each: loss and validation loss against step\n"
    "(every metrics file overlaid, named in the legend), learning rate, and ms per step. FILE is\n"
    "what `dtrain train --metrics FILE` writes (JSON lines: step, loss, lr, ms; eval_loss at the\n"
    "end), or what `--trace FILE` writes (a Chrome trace, recognised by its content): each rank's\n"
    "compute thread time split into compute (forward, backward, optimizer, evaluation batches),\n"
    "communication (blocked waiting for a collective) and idle (the rest: data loading, the loop,\n"
    "waiting for other ranks, a pipeline's bubble), one stacked bar per rank. A multi-rank run's\n"
    "--trace path names each rank's file PATH.rankR: give PATH and every rank is read.\n\n"
    "  -o, --output OUT.svg   the picture (only SVG is written); replaced atomically\n"
    "  --log-loss             logarithmic y axis for the loss panel\n"
    "  -h, --help             this text\n\n"
    "Every series is also in the file as data: <g class=\"series\" data-series=\"loss\" data-run=\"FILE\"\n"
    "data-n=\"N\" data-points=\"step,value ...\">; every bar <g class=\"rank\" data-rank=\"R\" ...>.\n\n"
    "A metrics file with none of loss, eval_loss, lr, ms (an empty one, say) is left out with a\n"
    "warning when another input has something to draw; a line whose step is not a finite number is\n"
    "skipped with a warning.\n\n"
    "Exit status: 0 written (also when a warning left something out), 1 an input could not be read\n"
    "or is not valid (a line that is not JSON, a trace without complete events), or no input has\n"
    "anything to plot, 2 usage.\n";

static int fail(const char *what) {
    fprintf(stderr, "dtrain: error: %s\n", what);
    return 1;
}

static int ends_with_svg(const char *p) {
    size_t n = strlen(p);
    return n > 4 && !strcasecmp(p + n - 4, ".svg");
}

typedef struct names { char **v; int n; } names;   /* the input paths, owned */

static int add_name(names *l, const char *s) {
    char **v = realloc(l->v, (size_t)(l->n + 1) * sizeof *v);
    if (!v) return -1;
    l->v = v;
    if (!(v[l->n] = strdup(s))) return -1;
    l->n++;
    return 0;
}

/* path itself, or when it does not exist and path.rank0 does, every path.rankR */
static int expand(names *l, const char *path) {
    if (access(path, F_OK) == 0 || errno != ENOENT) return add_name(l, path);
    size_t n = strlen(path) + 24;
    char *p = malloc(n);
    if (!p) return -1;
    int r = 0;
    for (;; r++) {
        snprintf(p, n, "%s.rank%d", path, r);
        if (access(p, F_OK) != 0) break;
        if (add_name(l, p)) { free(p); return -1; }
    }
    free(p);
    return r ? 0 : add_name(l, path);   /* none: the path as given, for its "cannot open" */
}

int dt_cli_plot(int argc, char **argv) {
    const char *out = NULL;
    int log_loss = 0, rc = 0;
    names in = {0};
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(usage, stdout);
            goto done;
        } else if (!strcmp(a, "-o") || !strcmp(a, "--output")) {
            if (i + 1 >= argc) { fprintf(stderr, "dtrain: %s needs a file name (OUT.svg)\n", a); rc = 2; goto done; }
            out = argv[++i];
        } else if (!strcmp(a, "--log-loss")) {
            log_loss = 1;
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "dtrain: unknown option '%s' (see dtrain plot --help)\n", a);
            rc = 2;
            goto done;
        } else if (expand(&in, a)) {
            rc = fail("out of memory");
            goto done;
        }
    }
    if (!in.n) { fprintf(stderr, "dtrain: plot needs a metrics or trace file (see dtrain plot --help)\n"); rc = 2; goto done; }
    if (!out) { fprintf(stderr, "dtrain: plot needs -o OUT.svg\n"); rc = 2; goto done; }
    if (!ends_with_svg(out)) {
        fprintf(stderr, "dtrain: -o %s: only SVG is written; give a name ending in .svg\n", out);
        rc = 2;
        goto done;
    }
    dt_plot_data d = {0};
    char err[1024];
    for (int i = 0; i < in.n && !rc; i++) {
        if (dt_plot_read(&d, in.v[i], err, sizeof err)) rc = fail(err);
    }
    for (int i = 0; i < d.nruns && !rc; i++)
        if (d.runs[i].bad_steps)
            fprintf(stderr, "dtrain: warning: %s:%ld: a step that is not a finite number: %ld line%s skipped\n",
                    d.runs[i].path, d.runs[i].bad_step_line, d.runs[i].bad_steps, d.runs[i].bad_steps == 1 ? "" : "s");
    int series = 0;
    for (int i = 0; i < d.nruns; i++)
        for (int k = 0; k < DT_PLOT_NSERIES; k++) series += d.runs[i].s[k].n > 0;
    for (int i = 0; i < d.nruns && !rc && (series || d.nranks); i++) {   /* nothing at all: the error alone */
        int here = 0;
        for (int k = 0; k < DT_PLOT_NSERIES; k++) here += d.runs[i].s[k].n > 0;
        if (!here)
            fprintf(stderr, "dtrain: warning: %s holds none of the keys loss, eval_loss, lr, ms: nothing of it is "
                            "drawn\n", d.runs[i].path);
    }
    if (!rc && !series && !d.nranks)
        rc = fail("no plottable series: the metrics files hold no numeric loss, eval_loss, lr or ms "
                  "(dtrain train --metrics FILE writes them)");
    size_t len = 0;
    char *svg = rc ? NULL : dt_plot_svg(&d, log_loss, &len);
    if (!rc && !svg) rc = fail("out of memory drawing the plot");
    if (!rc && dt_write_file_atomic(out, svg, len) != DT_OK) rc = fail(dt_error_message());
    if (!rc)
        printf("%s: %d series from %d metrics file%s, %d rank%s from traces\n", out, series, d.nruns,
               d.nruns == 1 ? "" : "s", d.nranks, d.nranks == 1 ? "" : "s");
    free(svg);
    dt_plot_data_free(&d);
done:
    for (int i = 0; i < in.n; i++) free(in.v[i]);
    free(in.v);
    return rc;
}
