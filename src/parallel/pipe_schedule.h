#ifndef DT_PIPE_SCHEDULE_H
#define DT_PIPE_SCHEDULE_H
/* TEMPORARY stand-in (gpipe, 1f1b) until the schedule module lands. */
#include "dtrain/pipeline.h"
typedef enum dt_pipe_op { DT_PIPE_F = 0, DT_PIPE_B, DT_PIPE_W } dt_pipe_op;
typedef struct dt_pipe_action { uint8_t op, chunk; int32_t mb; } dt_pipe_action;
typedef struct dt_pipe_schedule {
    dt_pipe_kind kind;
    int P, M, V;
    int split_w;
    int max_outstanding;
    int *n;
    dt_pipe_action **act;
} dt_pipe_schedule;
dt_status dt_pipe_schedule_build(dt_pipe_kind kind, int P, int M, int V, int max_outstanding, dt_pipe_schedule *out);
void dt_pipe_schedule_free(dt_pipe_schedule *s);
double dt_pipe_bubble_formula(dt_pipe_kind kind, int P, int M, int V);
#endif
