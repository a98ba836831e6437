/* --debug-collectives (dt_dist_opts.debug_collectives): matching collectives
 * run as usual; the first collective whose op, count or root differs between
 * ranks fails on EVERY rank before anything is issued, with one message
 * naming the op each side issues; the group is broken afterwards (no hang,
 * no later mismatch). */
#include <string.h>
#include "mpi_check.h"

static void same_message_everywhere(void) {
    char mine[900] = {0}, first[900] = {0};
    snprintf(mine, sizeof mine, "%s", dt_error_message());
    memcpy(first, mine, sizeof first);
    MPI_Bcast(first, sizeof first, MPI_CHAR, 0, MPI_COMM_WORLD);
    T_CHECK(!strcmp(first, mine));
}

int main(int argc, char **argv) {
    dt_dist_opts o = {.debug_collectives = 1};
    if (dt_dist_init(&argc, &argv, &o) != DT_OK) { fprintf(stderr, "dt_dist_init: %s\n", dt_error_message()); return 1; }
    T_CHECK(dt_dist_progress_mode() == t_expected_mode());
    int rank = t_rank(), last = t_size() - 1;
    dt_pg *w, *g;
    T_OK(dt_pg_world(&w));
    float x[32];
    char want[512];

    t_begin("matching collectives run and give the usual results");
    for (int i = 0; i < 32; i++) x[i] = (float)(rank + 1);
    T_OK(dt_allreduce(w, x, x, 32, DT_F32, DT_RED_SUM, NULL));
    T_CHECK(x[31] == (float)(t_size() * (t_size() + 1) / 2));
    dt_work *h;
    T_OK(dt_broadcast(w, x, 4, DT_F32, last, &h));
    T_OK(dt_work_wait(h));
    T_OK(dt_barrier(w, NULL));
    t_end();

    t_begin("a diverging op fails on every rank naming both sides");
    T_OK(dt_pg_split(w, 0, rank, &g));
    T_OK(dt_allreduce(g, x, x, 16, DT_F32, DT_RED_SUM, NULL));   /* collective 0 of g */
    dt_status s = rank == last ? dt_broadcast(g, x, 8, DT_F32, 0, NULL)
                               : dt_allreduce(g, x, x, 16, DT_F32, DT_RED_AVG, NULL);
    T_CHECK(s == DT_ECOMM);
    snprintf(want, sizeof want, "collectives diverge on world/0 at collective 1 (dist.debug_collectives): rank %d issues "
             "broadcast #1 (8 F32, root 0), rank 0 issues allreduce #1 (16 F32, avg)", last);
    if (strcmp(dt_error_message(), want)) fprintf(stderr, "got  '%s'\nwant '%s'\n", dt_error_message(), want);
    T_CHECK(!strcmp(dt_error_message(), want));
    same_message_everywhere();
    T_EXPECT(dt_barrier(g, NULL), DT_ECOMM);   /* the group is broken: fails at once everywhere */
    T_OK(dt_pg_free(g));
    t_end();

    t_begin("a count that differs is named");
    T_OK(dt_pg_split(w, 0, rank, &g));
    s = dt_allgather(g, x, x + 8, rank == last ? 3 : 2, DT_F32, NULL);
    T_CHECK(s == DT_ECOMM);
    snprintf(want, sizeof want, "collectives diverge on world/0 at collective 0 (dist.debug_collectives): rank %d issues "
             "allgather #0 (3 F32), rank 0 issues allgather #0 (2 F32)", last);
    if (strcmp(dt_error_message(), want)) fprintf(stderr, "got  '%s'\nwant '%s'\n", dt_error_message(), want);
    T_CHECK(!strcmp(dt_error_message(), want));
    same_message_everywhere();
    T_OK(dt_pg_free(g));
    t_end();

    t_begin("the world group still works");
    for (int i = 0; i < 4; i++) x[i] = 1.0f;
    T_OK(dt_allreduce(w, x, x, 4, DT_F32, DT_RED_SUM, NULL));
    T_CHECK(x[0] == (float)t_size());
    t_end();

    T_OK(dt_pg_free(w));
    T_OK(dt_dist_finalize());
    return 0;
}
