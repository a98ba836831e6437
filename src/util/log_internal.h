/* The library's printf: formats one message and hands it to the handler
 * installed with dt_log_set_handler (dtrain/log.h). */
#ifndef DT_UTIL_LOG_INTERNAL_H
#define DT_UTIL_LOG_INTERNAL_H
#include "dtrain/log.h"
void dt_log(dt_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#endif
