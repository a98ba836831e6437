/* dt_pg_agree: equal lists pass; a difference fails on every rank with one
 * message naming the setting and the ranks on each side (the odd rank first,
 * rank 0's group last); lists of different lengths, settings only some ranks
 * have, and lists that differ in everything are safe (no hang, no overrun:
 * run under ASan) and the group stays usable for collectives afterwards. */
#include <string.h>
#include "mpi_check.h"

/* Runs dt_pg_agree and checks every rank got the same status and message. */
static dt_status agree_same_everywhere(dt_pg *w, const dt_agree *a, char *msg, size_t n) {
    dt_error_clear();
    dt_status s = dt_pg_agree(w, a);
    snprintf(msg, n, "%s", s == DT_OK ? "" : dt_error_message());
    int st[2] = {(int)s, (int)strlen(msg)}, lo[2], hi[2];
    MPI_Allreduce(st, lo, 2, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(st, hi, 2, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    T_CHECK(lo[0] == hi[0] && lo[1] == hi[1]);   /* same status and message length on every rank */
    char first[900] = {0};
    snprintf(first, sizeof first, "%s", msg);
    MPI_Bcast(first, sizeof first, MPI_CHAR, 0, MPI_COMM_WORLD);
    T_CHECK(!strcmp(first, msg));
    return s;
}

/* The group still runs a collective correctly after an agreement. */
static void check_group_usable(dt_pg *w) {
    float x = 1.0f;
    T_OK(dt_allreduce(w, &x, &x, 1, DT_F32, DT_RED_SUM, NULL));
    T_CHECK(x == (float)t_size());
}

int main(int argc, char **argv) {
    t_init(&argc, &argv);
    dt_pg *w;
    T_OK(dt_pg_world(&w));
    int rank = t_rank(), size = t_size(), odd = size - 1;
    char msg[900], want[600];
    dt_agree a;

    t_begin("equal lists agree");
    dt_agree_init(&a);
    dt_agree_add(&a, "arch.layers", "%d", 2);
    dt_agree_add(&a, "train.batch", "%d", 8);
    T_CHECK(agree_same_everywhere(w, &a, msg, sizeof msg) == DT_OK);
    dt_agree_free(&a);
    check_group_usable(w);
    t_end();

    t_begin("an empty list agrees");
    dt_agree_init(&a);
    T_CHECK(agree_same_everywhere(w, &a, msg, sizeof msg) == DT_OK);
    t_end();

    t_begin("one odd rank: named first, the others after");
    dt_agree_init(&a);
    dt_agree_add(&a, "train.model.kind", "gpt2");
    dt_agree_add(&a, "arch.layers", "%d", rank == odd ? 3 : 2);
    dt_agree_add(&a, "arch.heads", "%d", rank == odd ? 8 : 4);   /* second difference: not the one named */
    T_CHECK(agree_same_everywhere(w, &a, msg, sizeof msg) == DT_EINVAL);
    if (size == 2) snprintf(want, sizeof want, "configuration differs between ranks: arch.layers: rank 1 has 3, rank 0 has 2");
    else snprintf(want, sizeof want, "configuration differs between ranks: arch.layers: rank %d has 3, ranks 0-%d have 2", odd,
                  odd - 1);
    if (strcmp(msg, want)) fprintf(stderr, "got  '%s'\nwant '%s'\n", msg, want);
    T_CHECK(!strcmp(msg, want));
    dt_agree_free(&a);
    check_group_usable(w);
    t_end();

    t_begin("every rank different, lists of different lengths");
    dt_agree_init(&a);
    dt_agree_add(&a, "train.steps", "%d", 100 * (rank + 1));
    for (int i = 0; i < 50 * rank; i++) dt_agree_add(&a, "param", "h.%d.weight %dx%d", i, i, rank);
    T_CHECK(agree_same_everywhere(w, &a, msg, sizeof msg) == DT_EINVAL);
    if (size == 2) snprintf(want, sizeof want, "configuration differs between ranks: train.steps: rank 1 has 200, rank 0 has 100");
    else snprintf(want, sizeof want, "configuration differs between ranks: train.steps: rank 1 has 200, rank 2 has 300, "
                  "rank 3 has 400, rank 0 has 100");
    if (strcmp(msg, want)) fprintf(stderr, "got  '%s'\nwant '%s'\n", msg, want);
    T_CHECK(!strcmp(msg, want));
    dt_agree_free(&a);
    check_group_usable(w);
    t_end();

    t_begin("a setting only rank 0 lacks is named with (not set)");
    dt_agree_init(&a);
    dt_agree_add(&a, "strategy", "ddp");
    if (rank) dt_agree_add(&a, "dp.wire", "bf16");
    T_CHECK(agree_same_everywhere(w, &a, msg, sizeof msg) == DT_EINVAL);
    snprintf(want, sizeof want, "configuration differs between ranks: dp.wire: %s bf16, rank 0 has (not set)",
             size == 2 ? "rank 1 has" : "ranks 1-3 have");
    if (strcmp(msg, want)) fprintf(stderr, "got  '%s'\nwant '%s'\n", msg, want);
    T_CHECK(!strcmp(msg, want));
    dt_agree_free(&a);
    t_end();

    t_begin("long values are cut, the message stays bounded");
    dt_agree_init(&a);
    char big[4000];
    memset(big, 'a' + rank, sizeof big - 1);
    big[sizeof big - 1] = 0;
    dt_agree_add(&a, "train.init", "%s", big);
    T_CHECK(agree_same_everywhere(w, &a, msg, sizeof msg) == DT_EINVAL);
    T_CHECK(strstr(msg, "train.init: rank 1 has bbbb") != NULL && strstr(msg, "...") != NULL && strlen(msg) < 900);
    dt_agree_free(&a);
    check_group_usable(w);
    t_end();

    T_OK(dt_pg_free(w));
    T_OK(dt_dist_finalize());
    return 0;
}
