/* One error line per job. A failing rank does not print at once: every rank
 * (failed or not) joins two small non-blocking allreduces on MPI_COMM_WORLD
 * (no dtrain collective uses it: dist works on duplicates) when its run ends:
 *   MINLOC (failure time, rank)  -> the rank that failed first (DT_ECOMM last)
 *   MAX (hash, -hash, succeeded) -> did every rank fail with the same message?
 * Same message everywhere: printed once, without a rank ("dtrain: error: ...");
 * else the first failing rank prints its line ("dtrain: rank R: error: ...").
 * When the failure came before training (`clean`: creation failed on every
 * rank, nothing in flight) every rank then leaves through MPI_Finalize: no
 * MPI_Abort banner. After a failure mid-run, a step's communication may
 * never complete (a peer's pending sends), so the cleanup could hang: the
 * printing rank calls MPI_Abort once its line is out and the others wait to
 * be killed. A failed rank whose peers do not join within DT_CLI_AGREE_S
 * (they wait in a collective for it) prints its own line and aborts (a
 * communication error waits twice that, a collective timeout 1 s more, and
 * all but the lowest rank that timeout found alive 4 x DT_CLI_TIER_S more). The
 * --nproc launcher runs mpirun --quiet, which drops the abort banner. */
#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include "cli.h"

#define DT_CLI_AGREE_S 10.0
#define DT_CLI_TIER_S 2.0

static double wall_s(void) {   /* comparable across the ranks of a machine (and NTP-synced ones) */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int msg_hash(const char *s) {   /* FNV-1a, 30 bits: -h fits an int */
    unsigned h = 2166136261u;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 16777619u;
    return (int)(h & 0x3fffffffu);
}

static void print_error(int rank, int with_rank) {
    char buf[2048], *msg = dt_cli_flag_text(dt_error_message(), buf, sizeof buf);
    if (with_rank) fprintf(stderr, "dtrain: rank %d: error: %s\n", rank, msg);
    else fprintf(stderr, "dtrain: error: %s\n", msg);
    fflush(stderr);
    if (msg != buf) free(msg);
}

int dt_cli_report(dt_status s, int rank, int world, int clean) {
    int failed = s != DT_OK;
    if (world <= 1) {
        if (failed) print_error(rank, 0);
        return failed;
    }
    /* a communication error is usually another rank's failure seen from here
     * ("... (see its error)"): it reports only when no rank has another kind */
    double key = failed ? wall_s() + (dt_error_code() == DT_ECOMM ? 1e10 : 0) : 1e300;
    struct { double t; int r; } mine = {key, rank}, first = {0, 0};
    int h = failed ? msg_hash(dt_error_message()) : 0;
    int v[3] = {failed ? h : INT_MIN, failed ? -h : INT_MIN, !failed}, agg[3] = {0, 0, 0};
    MPI_Request req[2];
    MPI_Iallreduce(&mine, &first, 1, MPI_DOUBLE_INT, MPI_MINLOC, MPI_COMM_WORLD, &req[0]);
    MPI_Iallreduce(v, agg, 3, MPI_INT, MPI_MAX, MPI_COMM_WORLD, &req[1]);
    int done = 0;
    if (!failed) {
        MPI_Waitall(2, req, MPI_STATUSES_IGNORE);   /* a rank that fails for good aborts us */
        done = 1;
    } else {
        /* a communication error waits twice as long: the rank whose failure
         * it saw times out first, prints the real cause and aborts us. A
         * collective timeout needs only a little longer than that rank: the
         * timeout came after the peer failed (it was still waiting for it
         * then), so the peer's own DT_CLI_AGREE_S ends first; a peer that is
         * stopped or hung never joins, and a longer wait only delays the end */
        double wait = dt_error_code() != DT_ECOMM ? DT_CLI_AGREE_S
                    : dt_dist_collective_timed_out() ? DT_CLI_AGREE_S + 1 : 2 * DT_CLI_AGREE_S;
        /* A timeout usually ends every live rank's wait at once: the lowest
         * rank it found alive reports (each live rank works it out alike
         * from the watchdog's view), the others wait 4 x DT_CLI_TIER_S
         * longer, so its abort ends them before they print: one line, not
         * one per rank (the abort took over 4 s to end a rank beside two
         * stopped ones, simulated hosts). Not known: by rank, 0 first, 1
         * DT_CLI_TIER_S later, the others 3 x DT_CLI_TIER_S. */
        if (dt_dist_collective_timed_out()) {
            int first = dt_dist_timeout_first_live();
            wait += first >= 0 ? (rank == first ? 0 : 4 * DT_CLI_TIER_S) : DT_CLI_TIER_S * (rank < 2 ? rank : 3);
        }
        for (double end = wall_s() + wait; !done && wall_s() < end;) {
            MPI_Testall(2, req, &done, MPI_STATUSES_IGNORE);
            if (!done) nanosleep(&(struct timespec){0, 2000000}, NULL);
        }
    }
    if (!done) {   /* peers stuck waiting for us: ours is the line to read */
        print_error(rank, 1);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if (first.t > 1e299) return 0;   /* nobody failed */
    int all_alike = agg[2] == 0 && agg[0] == -agg[1];
    int printer = all_alike ? 0 : first.r;
    clean = clean && agg[2] == 0;   /* every rank failed before training */
    if (rank == printer) print_error(rank, !all_alike);
    if (clean) return 1;
    if (rank == printer) MPI_Abort(MPI_COMM_WORLD, 1);
    for (;;) pause();   /* killed by the printer's abort */
}
