/* dtrain/error.h — status codes and the per-thread error message.
 *
 * Library functions never exit or abort on bad input: they return a dt_status
 * (or NULL) and leave a message naming the thing at fault (flag, file, tensor,
 * rank). Read it with dt_error_message(); the CLI prints it as one line.
 *
 *   if (dt_safetensors_load(path, &st) != DT_OK)
 *       fprintf(stderr, "dtrain: %s\n", dt_error_message());
 */
#ifndef DTRAIN_ERROR_H
#define DTRAIN_ERROR_H

typedef enum dt_status {
    DT_OK = 0,
    DT_EINVAL,   /* bad argument, flag or shape */
    DT_ENOMEM,   /* allocation failed */
    DT_EIO,      /* file system / OS error */
    DT_EFORMAT,  /* corrupt or mismatched file contents */
    DT_ECOMM,    /* MPI / collective failure or cross-rank mismatch */
    DT_ESTATE,   /* call not valid in the current state */
} dt_status;

/* Records a message (printf format) for the calling thread; returns code so
 * callers can write `return DT_ERR(DT_EINVAL, "...")`. */
dt_status dt_error_set(dt_status code, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
#define DT_ERR(code, ...) dt_error_set((code), __FILE__, __LINE__, __VA_ARGS__)

const char *dt_error_message(void);   /* "" if none */
const char *dt_error_location(void);  /* "src/io/safetensors.c:123" of the last error */
dt_status dt_error_code(void);
void dt_error_clear(void);
const char *dt_status_name(dt_status s);

/* Propagate a non-OK status. */
#define DT_TRY(expr) do { dt_status _dt_s = (expr); if (_dt_s != DT_OK) return _dt_s; } while (0)

#endif
