/* Log messages: format, then hand to the one installed handler. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include "util/log_internal.h"

static dt_log_fn g_fn = dt_log_default_handler;
static void *g_ctx;

void dt_log_set_handler(dt_log_fn fn, void *ctx) {
    g_fn = fn ? fn : dt_log_default_handler;
    g_ctx = fn ? ctx : NULL;
}

void dt_log_default_handler(void *ctx, dt_log_level level, const char *msg) {
    (void)ctx;
    FILE *f = level == DT_LOG_WARN ? stderr : stdout;
    fputs(msg, f);
    fflush(f);
}

void dt_log(dt_log_level level, const char *fmt, ...) {
    char small[1024], *msg = small;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n >= sizeof small) {   /* long message (e.g. a wide memory report line): format again */
        msg = malloc((size_t)n + 1);
        if (!msg) { g_fn(g_ctx, level, small); return; }   /* truncated beats nothing */
        va_start(ap, fmt);
        vsnprintf(msg, (size_t)n + 1, fmt, ap);
        va_end(ap);
    }
    g_fn(g_ctx, level, msg);
    if (msg != small) free(msg);
}
