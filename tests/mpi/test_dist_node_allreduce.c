/* dt_allreduce_node (dist.h; src/dist/node_allreduce.c, shm.c): private
 * buffers staged through the group's node-shared window. Every rank gets
 * the rank-ordered sum bit for bit (order-sensitive values: MPI's own
 * algorithm at 4 ranks adds in another order), in and out of place, SUM and
 * AVG; sizes that grow the window between calls; many calls back to back with
 * handles waited in reverse order (the slot of call k is rewritten by call
 * k + 1 only once every rank has read it); calls interleaved with MPI
 * collectives on the same group; sub-groups; bad arguments. Run again with
 * DTRAIN_TEST_MACHINES (ranks on simulated machines): the group spans
 * machines, so the call runs dt_allreduce, deterministic: still the
 * rank-ordered sum (sub-groups of 2 on one simulated machine stay staged). */
#include <stdlib.h>
#include "mpi_check.h"

static float val(int rank, int64_t i, int salt) {
    static const float v[6] = {1e8f, 1.0f, -1e8f, 3.14159f, -2.5e7f, 0.001f};
    return v[(i + 2 * rank + (i / 7) * rank + salt) % 6] * (1.0f + (float)(i % 5) * 0.37f) + (float)rank;
}

static void fill(float *x, int me, int64_t c, int salt) {
    for (int64_t i = 0; i < c; i++) x[i] = val(me, i, salt);
}

static void check(const float *x, int n, int64_t c, int salt, int avg, const char *what) {
    float *e = malloc((size_t)(c > 0 ? c : 1) * sizeof *e);
    for (int64_t i = 0; i < c; i++) {
        float s = val(0, i, salt);
        for (int r = 1; r < n; r++) s += val(r, i, salt);
        e[i] = avg ? s / (float)n : s;
    }
    T_DTYPE_EQ(x, DT_F32, e, c, what);
    free(e);
}

static void test_sums(dt_pg *pg) {
    t_begin("dt_allreduce_node == rank-ordered sum on every rank (bitwise), window grown between calls");
    int me = dt_pg_rank(pg), n = dt_pg_size(pg);
    const int64_t cnt[6] = {1000, 1, 262147, 5, 1 << 20, 4099};   /* 262147 and 1 << 20 grow the window */
    float *x = malloc(((size_t)1 << 20) * sizeof *x), *y = malloc(((size_t)1 << 20) * sizeof *y);
    for (int k = 0; k < 6; k++) {
        int avg = k % 2, salt = k;
        fill(x, me, cnt[k], salt);
        T_OK(dt_allreduce_node(pg, x, x, cnt[k], avg ? DT_RED_AVG : DT_RED_SUM, NULL));   /* in place */
        check(x, n, cnt[k], salt, avg, "in place");
        fill(x, me, cnt[k], salt + 1);
        y[cnt[k] - 1] = -7.0f;
        T_OK(dt_allreduce_node(pg, x, y, cnt[k], DT_RED_SUM | DT_RED_DETERMINISTIC, NULL));
        check(y, n, cnt[k], salt + 1, 0, "out of place");
        T_CHECK(x[0] == val(me, 0, salt + 1));   /* the input is left alone */
    }
    T_OK(dt_allreduce_node(pg, x, x, 0, DT_RED_SUM, NULL));   /* nothing to do */
    free(x);
    free(y);
}

static void test_back_to_back(dt_pg *pg) {
    t_begin("dt_allreduce_node: 200 calls in flight, waited in reverse, between MPI collectives");
    int me = dt_pg_rank(pg), n = dt_pg_size(pg);
    enum { K = 200, C = 3001 };
    float *x = malloc((size_t)K * C * sizeof *x), *m = malloc(64 * sizeof *m);
    dt_work *w[K] = {0}, *wm = NULL;
    for (int k = 0; k < K; k++) fill(x + (size_t)k * C, me, C, k);
    for (int i = 0; i < 64; i++) m[i] = (float)(me + 1);
    for (int k = 0; k < K; k++) {
        T_OK(dt_allreduce_node(pg, x + (size_t)k * C, x + (size_t)k * C, C, DT_RED_SUM, &w[k]));
        if (k == K / 2) T_OK(dt_allreduce(pg, m, m, 64, DT_F32, DT_RED_SUM, &wm));   /* MPI in between */
    }
    for (int k = K - 1; k >= 0; k--) T_OK(dt_work_wait(w[k]));
    T_OK(dt_work_wait(wm));
    for (int k = 0; k < K; k++) check(x + (size_t)k * C, n, C, k, 0, "call k of 200");
    T_CHECK(m[0] == (float)(n * (n + 1) / 2) && m[63] == m[0]);
    free(x);
    free(m);
}

static void test_subgroups(dt_pg *world) {
    t_begin("dt_allreduce_node in sub-groups of 2 (the tensor-parallel groups of --tp 2)");
    int wr = dt_pg_rank(world), ws = dt_pg_size(world);
    if (ws % 2) return;
    dt_pg *g = NULL;
    T_OK(dt_pg_split(world, wr / 2, wr, &g));
    float *x = malloc(50000 * sizeof *x);
    for (int round = 0; round < 3; round++) {
        fill(x, dt_pg_rank(g), 50000, round + wr / 2);
        T_OK(dt_allreduce_node(g, x, x, 50000, DT_RED_SUM, NULL));
        check(x, 2, 50000, round + wr / 2, 0, "sub-group");
    }
    free(x);
    T_OK(dt_pg_free(g));
}

static void test_errors(dt_pg *pg) {
    t_begin("dt_allreduce_node: bad arguments fail before anything is issued");
    float x[8] = {0};
    T_EXPECT(dt_allreduce_node(NULL, x, x, 8, DT_RED_SUM, NULL), DT_EINVAL);
    T_EXPECT(dt_allreduce_node(pg, x, x, -1, DT_RED_SUM, NULL), DT_EINVAL);
    T_EXPECT(dt_allreduce_node(pg, NULL, x, 8, DT_RED_SUM, NULL), DT_EINVAL);
    T_EXPECT(dt_allreduce_node(pg, x, x + 1, 4, DT_RED_SUM, NULL), DT_EINVAL);   /* overlapping */
    T_EXPECT(dt_allreduce_node(pg, x, x, 8, 7, NULL), DT_EINVAL);
    T_OK(dt_allreduce_node(pg, x, x, 8, DT_RED_SUM, NULL));   /* the group still works */
}

int main(int argc, char **argv) {
    t_init(&argc, &argv);
    dt_pg *world = NULL;
    T_OK(dt_pg_world(&world));
    test_sums(world);
    test_back_to_back(world);
    test_subgroups(world);
    test_errors(world);
    T_OK(dt_pg_free(world));
    T_OK(dt_dist_finalize());
    return 0;
}
