/* A tensor-parallel group of T threads in one process, for unit tests of
 * the tp ops and of models split with them: a dt_tp_comm per thread whose
 * all-reduces meet at a barrier and combine the ranks' buffers in rank order
 * (so every rank gets the same bits, as the real group gives); its
 * all-gather / reduce-scatter (sequence parallelism's [rows, T, n] view,
 * ops.h) read every rank's input the same way, summing in rank order.
 *   tp_threads_run(T, fn, args, arg_size): fn(&comm_r, args + r * arg_size)
 *   on T threads, joined before it returns.
 * fn must not use cmocka asserts (they longjmp on the main thread's stack):
 * record results in its argument and assert after the run. */
#ifndef DT_TP_THREADS_H
#define DT_TP_THREADS_H

#include <stddef.h>
#include "dtrain/ops.h"

#define TP_THREADS_MAX 8
typedef void (*tp_thread_fn)(const dt_tp_comm *c, void *arg);
/* 0 ok, -1 when threads could not start. */
int tp_threads_run(int T, tp_thread_fn fn, void *args, size_t arg_size);

#endif
