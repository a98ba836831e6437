/* dtrain/log.h — where the library's own output goes.
 *
 * The library never writes to stdout or stderr itself: the trainer's start,
 * progress and result lines and the strategies' start-up reports (DDP path,
 * memory per rank) are handed, one finished message at a time, to a single
 * process-wide handler. The default handler writes PROGRESS and INFO to
 * stdout and WARN to stderr, flushing after each message. A program that
 * owns its output (the CLI, a GUI, a test) installs its own:
 *
 *   static void to_file(void *ctx, dt_log_level level, const char *msg) {
 *       fputs(msg, (FILE *)ctx);
 *   }
 *   dt_log_set_handler(to_file, f);     // ...; dt_log_set_handler(NULL, NULL) restores the default
 *
 * A message is the exact text to show, line ending included: "...\n", or for
 * a progress line that rewrites itself on a terminal "\r..." without one.
 * Errors are not logged; they are returned (error.h). Set the handler before
 * work starts: it is not synchronised with threads that may be logging.
 */
#ifndef DTRAIN_LOG_H
#define DTRAIN_LOG_H

typedef enum dt_log_level {
    DT_LOG_PROGRESS = 0,   /* per-step progress lines */
    DT_LOG_INFO = 1,       /* start-up and result lines */
    DT_LOG_WARN = 2,       /* something the user should know; the run goes on */
} dt_log_level;

typedef void (*dt_log_fn)(void *ctx, dt_log_level level, const char *msg);

/* fn = NULL: back to dt_log_default_handler. */
void dt_log_set_handler(dt_log_fn fn, void *ctx);
/* PROGRESS/INFO -> stdout, WARN -> stderr, each flushed; ctx unused. */
void dt_log_default_handler(void *ctx, dt_log_level level, const char *msg);

#endif
