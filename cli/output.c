/* The CLI owns the output: the library's log messages are printed here.
 * Progress and info lines go to stdout as they are; warnings go to stderr as
 * one line tagged like the CLI's errors ("dtrain: [rank R: ]warning: ...").
 * Settings are written as their flags (settings.c). */
#include <stdio.h>
#include <stdlib.h>
#include "cli.h"

typedef struct cli_log_ctx { int rank, world; } cli_log_ctx;
static cli_log_ctx g_ctx;

static void cli_log(void *ctx, dt_log_level level, const char *text) {
    const cli_log_ctx *c = ctx;
    char buf[1024], *msg = dt_cli_flag_text(text, buf, sizeof buf);   /* long lines: on the heap */
    if (level == DT_LOG_WARN) {
        if (c->world > 1) fprintf(stderr, "dtrain: rank %d: warning: %s", c->rank, msg);
        else fprintf(stderr, "dtrain: warning: %s", msg);
        fflush(stderr);
    } else {
        fputs(msg, stdout);
        fflush(stdout);
    }
    if (msg != buf) free(msg);
}

void dt_cli_log_install(int rank, int world) {
    g_ctx = (cli_log_ctx){rank, world};
    dt_log_set_handler(cli_log, &g_ctx);
}
