/* Data parallel across the D replicas of a pipeline stage. */
#include "pipe_internal.h"

void dt_pipe_dp_tick(dt_pipe *p) { (void)p; }
