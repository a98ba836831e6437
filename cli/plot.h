/* dtrain plot: the data (plot_read.c: metrics JSONL and Chrome traces in)
 * and the picture (plot_svg.c: one SVG document out). cmd_plot.c parses the
 * command line and writes the file. */
#ifndef DT_CLI_PLOT_H
#define DT_CLI_PLOT_H
#include <stddef.h>

/* the series a metrics file can give, by the key the trainer writes (--metrics) */
enum { DT_PLOT_LOSS, DT_PLOT_EVAL_LOSS, DT_PLOT_LR, DT_PLOT_MS, DT_PLOT_NSERIES };
extern const char *const dt_plot_keys[DT_PLOT_NSERIES];   /* "loss", "eval_loss", "lr", "ms" */

typedef struct dt_plot_series {
    double *x, *y;    /* x: "step" (else the line's ordinal among the file's objects) */
    size_t n, cap;
} dt_plot_series;

typedef struct dt_plot_run {   /* one metrics file */
    const char *path;          /* as given (not owned) */
    dt_plot_series s[DT_PLOT_NSERIES];
    long bad_steps;            /* lines skipped: a "step" that is not a finite number (1e999) */
    long bad_step_line;        /* the first of them */
} dt_plot_run;

typedef struct dt_plot_rank {  /* one rank of a trace: its compute thread's time, split */
    const char *path;          /* not owned */
    int rank;                  /* the events' pid */
    double span_us;            /* first event's start to last event's end */
    double compute_us;         /* compute lane inside forward / backward / optimizer (not the "step" envelope) */
    double comm_us;            /* compute lane blocked on communication ("comm" events), not also computing */
    double idle_us;            /* span - compute - comm: data loading, the loop, waiting for other ranks */
    double overlapped_us;      /* communication lane busy (reductions running while compute goes on) */
} dt_plot_rank;

typedef struct dt_plot_data {
    dt_plot_run *runs;
    int nruns;
    dt_plot_rank *ranks;
    int nranks;
} dt_plot_data;

/* Reads path once (a pipe gives its bytes once: `dtrain plot <(...)`) and
 * appends what it holds: a Chrome trace (a JSON document whose first key is
 * "traceEvents") adds one dt_plot_rank per pid of its complete events,
 * anything else is metrics JSONL and adds one run. -1 with one line in err
 * naming the file (and line: "m.jsonl:7: not a JSON object"). */
int dt_plot_read(dt_plot_data *d, const char *path, char *err, size_t n);
void dt_plot_data_free(dt_plot_data *d);

/* The SVG document (malloc'd, *len bytes); NULL when out of memory.
 * log_loss: the loss panel's y axis is logarithmic (base 10). */
char *dt_plot_svg(const dt_plot_data *d, int log_loss, size_t *len);
#endif
