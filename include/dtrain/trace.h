/* dtrain/trace.h — Chrome trace (Perfetto-compatible); part of the io layer.
 *
 * Kept apart from io.h so layers that only record events (dist) need not see
 * safetensors or checkpoints.
 *
 * Complete events ("ph":"X") with microsecond timestamps relative to
 * dt_trace_open; pid = rank, tid = lane (0 compute, 1 communication). Events
 * are buffered in memory and written (atomically) by dt_trace_close. Every
 * function accepts a NULL trace and then does nothing.
 */
#ifndef DTRAIN_TRACE_H
#define DTRAIN_TRACE_H

#include "dtrain/error.h"

typedef struct dt_trace dt_trace;
dt_status dt_trace_open(dt_trace **t, const char *path, int rank);
double dt_trace_now_us(const dt_trace *t);          /* 0 if t is NULL */
void dt_trace_event(dt_trace *t, const char *name, const char *cat, int lane,
                    double begin_us, double end_us);   /* no-op if t is NULL; name copied */
void dt_trace_instant(dt_trace *t, const char *name, int lane);
dt_status dt_trace_close(dt_trace *t);              /* writes file; frees */

#endif
