/* The collective watchdog (dist.h section 9), stall_warn_s = 0.5: a rank
 * that joins a collective 2 s late makes every other rank log a warning
 * naming the op, its sequence number, the group and the late rank (as "has
 * not joined it", with its last operation); the collective then completes
 * normally. A collective everyone joins at once logs nothing. */
#include <string.h>
#include <time.h>
#include "dtrain/log.h"
#include "mpi_check.h"

static char g_warn[4096];
static int g_nwarn;
static void capture(void *ctx, dt_log_level level, const char *msg) {
    (void)ctx;
    if (level != DT_LOG_WARN) return;
    if (!g_nwarn++) snprintf(g_warn, sizeof g_warn, "%s", msg);
}

static void sleep_s(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

int main(int argc, char **argv) {
    dt_dist_opts o = {.stall_warn_s = 0.5};
    if (dt_dist_init(&argc, &argv, &o) != DT_OK) { fprintf(stderr, "dt_dist_init: %s\n", dt_error_message()); return 1; }
    T_CHECK(dt_dist_progress_mode() == t_expected_mode());
    dt_log_set_handler(capture, NULL);
    int rank = t_rank(), last = t_size() - 1;
    dt_pg *w;
    T_OK(dt_pg_world(&w));
    float x[256];
    for (int i = 0; i < 256; i++) x[i] = 1.0f;

    t_begin("no warning when every rank joins at once");
    MPI_Barrier(MPI_COMM_WORLD);   /* (start-up skew, under ASan on a busy machine, is not what is tested) */
    T_OK(dt_allreduce(w, x, x, 256, DT_F32, DT_RED_SUM, NULL));
    T_CHECK(g_nwarn == 0);
    t_end();

    t_begin("a late rank is named by every waiting rank");
    for (int i = 0; i < 256; i++) x[i] = 1.0f;
    dt_work *h = NULL;
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == last) sleep_s(2.0);
    double t0 = t_now();
    T_OK(dt_allreduce(w, x, x, 256, DT_F32, DT_RED_SUM, &h));   /* #1 on world */
    T_OK(dt_work_wait(h));
    T_CHECK(x[0] == (float)t_size());   /* it still completes */
    if (rank != last) {
        char want[256];
        snprintf(want, sizeof want, "collective stalled: allreduce #1 (1.0KiB F32) on world has waited ");
        double waited = t_now() - t0;
        /* every 0.5 s while it lasts: bounded by how long it lasted here (a
         * late rank slowed past its 2 s by a busy machine makes more) */
        T_CHECK(g_nwarn >= 1 && g_nwarn <= (int)(waited / 0.5) + 1);
        T_CHECK(waited > 1.0);
        if (strncmp(g_warn, want, strlen(want))) fprintf(stderr, "got '%s'\n", g_warn);
        T_CHECK(!strncmp(g_warn, want, strlen(want)));
        snprintf(want, sizeof want, "rank %d (its last operation #0, idle ", last);
        T_CHECK(strstr(g_warn, want) != NULL);
        T_CHECK(strstr(g_warn, ") has not joined it\n") != NULL);
    } else {
        T_CHECK(g_nwarn == 0);   /* the late rank itself waited for nobody */
    }
    t_end();

    T_OK(dt_pg_free(w));
    T_OK(dt_dist_finalize());
    return 0;
}
