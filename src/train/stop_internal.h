#ifndef DT_STOP_INTERNAL_H
#define DT_STOP_INTERNAL_H
#include "dtrain/dist.h"
#include "dtrain/train.h"
#define DT_STOP_MAX_CODE 31

/* One step's stop agreement: begin() when the step starts (posts this rank's
 * request), end() when it ends (*code = the highest code any rank posted,
 * 0 = go on). Without a multi-rank world, end() reads the local request. */
typedef struct dt_stop_sync {
    dt_pg *pg;                        /* NULL: single process */
    dt_work *w;                       /* the step's allreduce, between begin and end */
    float votes[DT_STOP_MAX_CODE];    /* votes[c-1] = ranks that posted code c */
    struct dt_stop_sync *next;        /* list of abandoned syncs */
} dt_stop_sync;

dt_status dt_stop_sync_init(dt_stop_sync *s, int world);
dt_status dt_stop_sync_begin(dt_stop_sync *s);
dt_status dt_stop_sync_end(dt_stop_sync *s, int *code);
void dt_stop_sync_free(dt_stop_sync *s);
/* After a failed step (s heap-allocated): other ranks may be blocked in a
 * collective this rank will never join, so nothing collective may run
 * (freeing the group is a barrier), and the step's allreduce may still be in
 * flight: s is kept until the process ends (MPI_Abort / MPI_Finalize). */
void dt_stop_sync_abandon(dt_stop_sync *s);
/* dt_train_stopped() = code; a non-zero code also consumes the request */
void dt_stop_set_stopped(int code);
#endif
