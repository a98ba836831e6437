/* The library's one clock for intervals: CLOCK_MONOTONIC in seconds (never
 * steps with the wall clock, so timeouts and step timers stay right when NTP
 * or an operator changes the date). */
#ifndef DT_UTIL_CLOCK_H
#define DT_UTIL_CLOCK_H
double dt_mono_s(void);
#endif
