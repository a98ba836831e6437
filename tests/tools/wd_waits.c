/* A test tool for test_watchdog_waits.sh: waits outside dt_work_wait that the
 * collective timeout (2 s here) must end too. The last rank comes late; every
 * other rank must fail with the timeout, not wait for it, and prints
 * "rank R: timed out after S s: MESSAGE" (or "rank R: no timeout ...").
 *
 *   wd_waits node-start  the last rank issues a dt_allreduce_node and then
 *                        sleeps without polling; the others' second call
 *                        waits in its start for the peers to finish the first
 *                        (POLL: no other thread watches that wait)
 *   wd_waits debug       --debug-collectives: the fingerprint exchange before
 *                        a dt_allreduce, the last rank asleep before it
 *   wd_waits agree       dt_pg_agree, the last rank asleep before it
 *
 * The ranks that timed out meet on a communicator of their own and rank 0
 * ends the job (MPI_Abort: a group left after a timeout is never finalized). */
#define _POSIX_C_SOURCE 200809L
#include <mpi.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include "dtrain/dist.h"
#include "dtrain/error.h"

enum { LATE_S = 12 };

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void sleep_s(int s) {
    struct timespec ts = {s, 0};
    while (nanosleep(&ts, &ts) != 0) {}
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "";
    int node = !strcmp(mode, "node-start"), debug = !strcmp(mode, "debug"), agree = !strcmp(mode, "agree");
    if (!node && !debug && !agree) {
        fprintf(stderr, "usage: wd_waits node-start|debug|agree\n");
        return 2;
    }
    dt_dist_opts o = {.collective_timeout_s = 2, .debug_collectives = debug};
    if (dt_dist_init(&argc, &argv, &o) != DT_OK) { fprintf(stderr, "dt_dist_init: %s\n", dt_error_message()); return 1; }
    dt_pg *pg;
    if (dt_pg_world(&pg) != DT_OK) { fprintf(stderr, "dt_pg_world: %s\n", dt_error_message()); return 1; }
    int me = dt_pg_rank(pg), late = me == dt_pg_size(pg) - 1;
    MPI_Comm waiting;
    MPI_Comm_split(MPI_COMM_WORLD, late, me, &waiting);
    float a[64] = {0}, b[64];
    dt_agree cfg;
    dt_agree_init(&cfg);
    dt_agree_add(&cfg, "setting", "%d", 1);
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = now_s();
    dt_status s = DT_OK;
    if (late) {
        dt_work *w = NULL;
        if (node) (void)dt_allreduce_node(pg, a, b, 64, DT_RED_SUM, &w);
        sleep_s(LATE_S);   /* (node-start: issued, then busy without dt_pg_tick) */
        fprintf(stderr, "rank %d: awake after %.1f s\n", me, now_s() - t0);
        sleep_s(60);       /* rank 0 ends the job */
        return 1;
    }
    if (node) {
        for (int k = 0; k < 2 && s == DT_OK; k++) s = dt_allreduce_node(pg, a, b, 64, DT_RED_SUM, NULL);
    } else if (debug) {
        s = dt_allreduce(pg, a, a, 64, DT_F32, DT_RED_SUM, NULL);
    } else {
        s = dt_pg_agree(pg, &cfg);
    }
    if (s == DT_ECOMM && dt_dist_collective_timed_out())
        fprintf(stderr, "rank %d: timed out after %.1f s: %s\n", me, now_s() - t0, dt_error_message());
    else
        fprintf(stderr, "rank %d: no timeout (status %d after %.1f s: %s)\n", me, (int)s, now_s() - t0,
                s == DT_OK ? "ok" : dt_error_message());
    MPI_Barrier(waiting);
    if (me == 0) MPI_Abort(MPI_COMM_WORLD, 0);
    sleep_s(60);
    return 1;
}
