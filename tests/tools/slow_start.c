/* A test tool, LD_PRELOADed into the ranks of one simulated host by
 * test_multihost.sh: it holds each MPI rank DT_TEST_HOLD_S seconds before its
 * main() runs, that is before dtrain installs its signal handlers, as a slow
 * machine (loading from a network file system) would. Processes that are not
 * ranks (Open MPI's orted, the shell) pass at once. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdlib.h>
#include <time.h>

__attribute__((constructor)) static void hold_rank(void) {
    const char *s = getenv("DT_TEST_HOLD_S");
    if (!getenv("OMPI_COMM_WORLD_RANK") || !s) return;
    double sec = atof(s);
    if (sec <= 0 || sec > 60) return;
    struct timespec ts = {(time_t)sec, (long)((sec - (double)(time_t)sec) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}   /* (a signal cuts it short: sleep the rest) */
}
