/* Node-shared memory (dist.h section 6): allocation, the in-place allreduce
 * that runs on it (bitwise the rank-ordered sum at any world size, with or
 * without DT_RED_DETERMINISTIC), many operations in flight (more than the
 * descriptor ring), interleaving with MPI collectives, sub-groups, waits in
 * different orders across groups, and the errors: ranks passing different
 * ranges or sizes (also with operations queued behind). Every rank of these tests
 * runs on one machine, so the allocation must be shared. */
#include "mpi_check.h"

/* Order-sensitive inputs: 1e8 + 1 - 1e8 depends on the order of additions. */
static float shm_val(int rank, int64_t i) {
    static const float v[6] = {1e8f, 1.0f, -1e8f, 3.14159f, -2.5e7f, 0.001f};
    return v[(i + 2 * rank + (i / 7) * rank) % 6] * (1.0f + (float)(i % 5) * 0.37f) + (float)rank;
}

static float shm_expect(int n, int64_t i, int avg) {
    float s = shm_val(0, i);
    for (int r = 1; r < n; r++) s += shm_val(r, i);
    return avg ? s / (float)n : s;
}

static void shm_fill(float *x, int me, int64_t off, int64_t c) {
    for (int64_t i = 0; i < c; i++) x[off + i] = shm_val(me, off + i);
}

static void check_range(const float *x, int n, int64_t off, int64_t c, int avg, const char *what) {
    float *e = malloc((size_t)(c > 0 ? c : 1) * sizeof *e);
    for (int64_t i = 0; i < c; i++) e[i] = shm_expect(n, off + i, avg);
    T_DTYPE_EQ(x + off, DT_F32, e, c, what);
    free(e);
}

static void test_shm_allreduce_bitwise(dt_pg *pg) {
    t_begin("shared-memory allreduce == rank-ordered sum (bitwise)");
    int me = dt_pg_rank(pg), n = dt_pg_size(pg);
    const int64_t C = 1 << 20;
    float *x = NULL;
    T_OK(dt_pg_alloc_shared(pg, (size_t)C, &x));
    T_CHECK(x != NULL && dt_pg_shared_unavailable(pg)[0] == 0);
    for (int64_t i = 0; i < C; i++) T_CHECK(x[i] == 0.0f);   /* zeroed */
    /* disjoint ranges: odd sizes, unaligned offsets, one element, in flight together */
    const int64_t off[6] = {0, 1, 1002, 5001, 300001, 700000};
    const int64_t cnt[6] = {1, 1000, 3999, 262147, 17, 348576};
    for (int round = 0; round < 2; round++) {
        for (int k = 0; k < 6; k++) shm_fill(x, me, off[k], cnt[k]);
        x[1001] = 42.0f + (float)me;   /* between two ranges: must stay untouched */
        dt_work *w[6] = {0};
        for (int k = 0; k < 6; k++) {
            int op = (k % 2 ? DT_RED_AVG : DT_RED_SUM) | (round ? DT_RED_DETERMINISTIC : 0);
            T_OK(dt_allreduce(pg, x + off[k], x + off[k], cnt[k], DT_F32, op, k == 3 ? NULL : &w[k]));
        }
        for (int k = 5; k >= 0; k--) T_OK(dt_work_wait(w[k]));   /* any wait order */
        for (int k = 0; k < 6; k++) check_range(x, n, off[k], cnt[k], k % 2, "shared allreduce");
        T_CHECK(x[1001] == 42.0f + (float)me);
    }
    /* an allreduce of private memory (MPI) and of shared memory in flight together */
    float *priv = malloc(4096 * sizeof *priv);
    for (int i = 0; i < 4096; i++) priv[i] = (float)(me + 1);
    shm_fill(x, me, 0, 4096);
    dt_work *wp = NULL, *ws = NULL;
    T_OK(dt_allreduce(pg, priv, priv, 4096, DT_F32, DT_RED_SUM, &wp));
    T_OK(dt_allreduce(pg, x, x, 4096, DT_F32, DT_RED_SUM, &ws));
    T_OK(dt_work_wait(ws));
    T_OK(dt_work_wait(wp));
    check_range(x, n, 0, 4096, 0, "shared allreduce next to an MPI one");
    for (int i = 0; i < 4096; i++) T_CHECK(priv[i] == (float)(n * (n + 1) / 2));
    free(priv);
    T_OK(dt_pg_free_shared(pg, x));
    t_end();
}

/* More operations in flight than the descriptor ring holds (1024), with one
 * rank polling late: issuing must progress its own earlier operations. */
static void test_shm_many_in_flight(dt_pg *pg) {
    t_begin("shared-memory allreduce: 3000 operations in flight");
    int me = dt_pg_rank(pg), n = dt_pg_size(pg);
    enum { K = 3000 };
    float *x = NULL;
    T_OK(dt_pg_alloc_shared(pg, 2 * K, &x));
    T_CHECK(x != NULL);
    shm_fill(x, me, 0, 2 * K);
    dt_work **w = calloc(K, sizeof *w);
    for (int k = 0; k < K; k++) {
        T_OK(dt_allreduce(pg, x + 2 * k, x + 2 * k, 2, DT_F32, DT_RED_AVG, &w[k]));
        if (me != 0) dt_pg_poll(pg);   /* rank 0 never polls: it runs ahead */
    }
    for (int k = 0; k < K; k++) T_OK(dt_work_wait(w[k]));
    check_range(x, n, 0, 2 * K, 1, "3000 small shared allreduces");
    free(w);
    T_OK(dt_pg_free_shared(pg, x));
    t_end();
}

/* Sub-groups, each with its own shared allocation: at np 4 one of 3 ranks
 * (AVG divides by 3: not a power of two) and one of 1; at np 2 one of 2. */
static void test_shm_subgroups(dt_pg *world) {
    t_begin("shared-memory allreduce in sub-groups");
    int wr = dt_pg_rank(world), ws = dt_pg_size(world);
    int color = ws >= 4 && wr == ws - 1;
    dt_pg *sub = NULL;
    T_OK(dt_pg_split(world, color, 0, &sub));
    int me = dt_pg_rank(sub), n = dt_pg_size(sub);
    T_CHECK(n == (color ? 1 : ws >= 4 ? ws - 1 : ws));
    float *x = NULL;
    T_OK(dt_pg_alloc_shared(sub, 1000, &x));
    T_CHECK(x != NULL);
    for (int avg = 0; avg < 2; avg++) {
        shm_fill(x, me, 0, 1000);
        T_OK(dt_allreduce(sub, x, x, 1000, DT_F32, avg ? DT_RED_AVG : DT_RED_SUM, NULL));
        check_range(x, n, 0, 1000, avg, "sub-group shared allreduce");
    }
    /* left for dt_pg_free to release */
    T_OK(dt_pg_free(sub));
    t_end();
}

/* One machine: every rank's machine id is the group's lowest rank (0 in
 * the world; in a reversed sub-group too, since ids are group ranks). */
static void test_node_of(dt_pg *world) {
    t_begin("dt_pg_node_of on one machine");
    int ws = dt_pg_size(world), node[64];
    T_OK(dt_pg_node_of(world, node));
    for (int r = 0; r < ws && r < 64; r++) T_CHECK(node[r] == 0);
    dt_pg *rev = NULL;
    T_OK(dt_pg_split(world, 0, ws - dt_pg_rank(world), &rev));   /* ranks in reverse order */
    for (int r = 0; r < ws && r < 64; r++) node[r] = -1;
    T_OK(dt_pg_node_of(rev, node));
    for (int r = 0; r < ws && r < 64; r++) T_CHECK(node[r] == 0);
    T_CHECK(dt_pg_node_of(world, NULL) == DT_EINVAL);
    T_OK(dt_pg_free(rev));
    t_end();
}

static void test_shm_errors(dt_pg *world) {
    t_begin("shared memory: bad sizes and ranges fail on every rank");
    int me = dt_pg_rank(world);
    float *x = (float *)1;
    T_EXPECT(dt_pg_alloc_shared(world, 0, &x), DT_EINVAL);
    T_CHECK(x == NULL);
    T_EXPECT(dt_pg_alloc_shared(world, 100 + (size_t)me, &x), DT_EINVAL);   /* sizes differ */
    T_CHECK(x == NULL && strstr(dt_error_message(), "different sizes"));
    /* 4 TiB per rank cannot fit Open MPI's backing directory: no window (a
     * fault on first touch otherwise), the reason names the directory */
    T_OK(dt_pg_alloc_shared(world, (size_t)1 << 40, &x));
    T_CHECK(x == NULL && strstr(dt_pg_shared_unavailable(world), "MiB free") != NULL);
    float local[4];
    T_EXPECT(dt_pg_free_shared(world, local), DT_EINVAL);
    T_OK(dt_pg_free_shared(world, NULL));

    /* ranks pass different offsets: a usage error the ranks detect together;
     * it breaks the group, so use a private one */
    dt_pg *g = NULL;
    T_OK(dt_pg_split(world, 0, 0, &g));
    T_OK(dt_pg_alloc_shared(g, 64, &x));
    T_CHECK(x != NULL);
    T_EXPECT(dt_allreduce(g, x + (me == 0 ? 0 : 16), x + (me == 0 ? 0 : 16), 16, DT_F32, DT_RED_SUM, NULL), DT_ECOMM);
    T_CHECK(strstr(dt_error_message(), "ranks disagree") != NULL);
    T_EXPECT(dt_allreduce(g, x, x, 16, DT_F32, DT_RED_SUM, NULL), DT_ECOMM);   /* group broken */
    dt_pg_free(g);

    /* the same with a correct operation already in flight behind the bad one:
     * both waits fail, none waits forever for a slice that is never summed */
    T_OK(dt_pg_split(world, 0, 0, &g));
    T_OK(dt_pg_alloc_shared(g, 64, &x));
    dt_work *bad = NULL, *good = NULL;
    alarm(120);   /* a hang fails the test instead of stalling ctest */
    T_OK(dt_allreduce(g, x + (me == 0 ? 0 : 16), x + (me == 0 ? 0 : 16), 16, DT_F32, DT_RED_SUM, &bad));
    /* THREAD mode may have run (and failed) the first already: then the
     * broken group refuses the second at issue; POLL runs nothing before a poll */
    dt_status sg = dt_allreduce(g, x + 32, x + 32, 16, DT_F32, DT_RED_SUM, &good);
    T_CHECK(sg == DT_OK || (sg == DT_ECOMM && dt_dist_progress_mode() == DT_PROGRESS_THREAD));
    T_EXPECT(dt_work_wait(bad), DT_ECOMM);
    if (sg == DT_OK) T_EXPECT(dt_work_wait(good), DT_ECOMM);
    alarm(0);
    dt_pg_free(g);
    t_end();
}

/* Ranks wait for a shared-memory allreduce of one group and run a blocking
 * collective of another in different orders: the rank in the blocking call
 * must still sum its slice (its wait polls every group). */
static void test_shm_cross_group_waits(dt_pg *world) {
    t_begin("shared-memory allreduce progresses while a rank waits in another group");
    int me = dt_pg_rank(world), n = dt_pg_size(world);
    dt_pg *other = NULL;
    T_OK(dt_pg_split(world, 0, 0, &other));
    float *x = NULL;
    T_OK(dt_pg_alloc_shared(world, 4096, &x));
    T_CHECK(x != NULL);
    alarm(120);
    for (int round = 0; round < 3; round++) {
        shm_fill(x, me, 0, 4096);
        float one = 1.0f;
        dt_work *w = NULL;
        T_OK(dt_allreduce(world, x, x, 4096, DT_F32, DT_RED_SUM, &w));
        if (me == 0) {
            T_OK(dt_work_wait(w));
            T_OK(dt_allreduce(other, &one, &one, 1, DT_F32, DT_RED_SUM, NULL));
        } else {
            T_OK(dt_allreduce(other, &one, &one, 1, DT_F32, DT_RED_SUM, NULL));
            T_OK(dt_work_wait(w));
        }
        T_CHECK(one == (float)n);
        check_range(x, n, 0, 4096, 0, "shared allreduce across another group's wait");
    }
    /* the same around a split of the other group (blocking MPI_Comm_split) */
    float *y = NULL;
    T_OK(dt_pg_alloc_shared(other, 4096, &y));
    T_CHECK(y != NULL);
    shm_fill(y, me, 0, 4096);
    dt_work *w = NULL;
    dt_pg *sub = NULL;
    T_OK(dt_allreduce(other, y, y, 4096, DT_F32, DT_RED_SUM, &w));
    if (me == 0) {
        T_OK(dt_pg_split(world, 0, 0, &sub));
        T_OK(dt_work_wait(w));
    } else {
        T_OK(dt_work_wait(w));
        T_OK(dt_pg_split(world, 0, 0, &sub));
    }
    check_range(y, n, 0, 4096, 0, "shared allreduce across another group's split");
    alarm(0);
    T_OK(dt_pg_free(sub));
    T_OK(dt_pg_free_shared(other, y));
    T_OK(dt_pg_free_shared(world, x));
    T_OK(dt_pg_free(other));
    t_end();
}

static void run_shm_tests(void) {
    dt_pg *world = NULL;
    T_OK(dt_pg_world(&world));
    test_shm_allreduce_bitwise(world);
    test_shm_many_in_flight(world);
    test_shm_subgroups(world);
    test_node_of(world);
    test_shm_errors(world);
    test_shm_cross_group_waits(world);
    T_OK(dt_pg_free(world));
}

int main(int argc, char **argv) {
    t_init(&argc, &argv);
    run_shm_tests();
    T_OK(dt_dist_finalize());
    return 0;
}
