/* Per-thread last error: code, message, source location. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include "dtrain/error.h"

static _Thread_local dt_status tl_code;
static _Thread_local char tl_msg[1024];
static _Thread_local char tl_loc[256];

dt_status dt_error_set(dt_status code, const char *file, int line, const char *fmt, ...) {
    /* Format into a local buffer first: an argument may be dt_error_message()
     * itself ("...: %s", dt_error_message()), which vsnprintf into tl_msg would
     * overwrite while reading it. */
    char msg[sizeof tl_msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    memcpy(tl_msg, msg, sizeof msg);
    const char *s = strstr(file, "src/");
    snprintf(tl_loc, sizeof tl_loc, "%s:%d", s ? s : file, line);
    tl_code = code;
    return code;
}

const char *dt_error_message(void) { return tl_msg; }
const char *dt_error_location(void) { return tl_loc; }
dt_status dt_error_code(void) { return tl_code; }
void dt_error_clear(void) { tl_code = DT_OK; tl_msg[0] = 0; tl_loc[0] = 0; }

const char *dt_status_name(dt_status s) {
    switch (s) {
    case DT_OK: return "ok";
    case DT_EINVAL: return "invalid argument";
    case DT_ENOMEM: return "out of memory";
    case DT_EIO: return "I/O error";
    case DT_EFORMAT: return "bad format";
    case DT_ECOMM: return "communication error";
    case DT_ESTATE: return "invalid state";
    }
    return "unknown";
}
