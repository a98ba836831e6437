/* Groups that span machines (dist.h section 10), on machines simulated with
 * DTRAIN_TEST_MACHINES (read whenever a group is made):
 *  - topology: machines, ranks per machine, lanes, contiguity, the start-up
 *    description and dt_pg_node_of, for 2x2, 3+1, interleaved and 1 machine;
 *  - the hierarchical allreduce sums each machine first (tree order, checked
 *    bitwise: the flat path's order differs on these inputs), any dtype,
 *    SUM/AVG, in and out of place, sizes 1 .. several segments;
 *  - deterministic: bitwise the rank-ordered sum (the chain across machines;
 *    interleaved machines and 16-bit payloads fall back to the flat path);
 *  - many operations in flight, waited out of order, mixed with flat ones.
 * At np 2 only the topology checks apply (no machine has two ranks). */
#include "mpi_check.h"

static float val(int rank, int64_t i, dt_dtype t) {   /* order-sensitive inputs */
    static const float big[6] = {1e8f, 1.0f, -1e8f, 3.14159f, -2.5e7f, 0.001f};
    float x = big[(i + 2 * rank + (i / 7) * rank) % 6] * (1.0f + (float)(i % 5) * 0.37f);
    if (t != DT_F32) x = (float)((i * 7 + rank * 3) % 23) * 0.25f - 2.0f;   /* exact in 16 bits */
    return t_round(x, t);
}

static void *input(int me, int64_t c, dt_dtype t) {
    float *f = malloc((size_t)(c + 1) * sizeof(float));
    for (int64_t i = 0; i < c; i++) f[i] = val(me, i, t);
    void *b = t_alloc(c, t);
    t_fill(b, t, f, c);
    free(f);
    return b;
}

/* Expected: det: rank order. Plain: each machine's ranks in rank order
 * (rounded once for 16-bit), then the machines' partial sums in machine order
 * (2 machines: exact either way), then / n for AVG (16-bit: of the rounded sum). */
static float *expected(const int *machine_of, int n, int64_t c, dt_dtype t, int avg, int det) {
    float *e = malloc((size_t)(c + 1) * sizeof(float));
    int nm = 0;
    for (int r = 0; r < n; r++) nm = machine_of[r] + 1 > nm ? machine_of[r] + 1 : nm;
    for (int64_t i = 0; i < c; i++) {
        float s = 0;
        if (det) {
            s = val(0, i, t);
            for (int r = 1; r < n; r++) s += val(r, i, t);
            e[i] = avg ? s / (float)n : s;
            continue;
        }
        for (int m = 0; m < nm; m++) {
            float p = 0;
            int first = 1;
            for (int r = 0; r < n; r++)
                if (machine_of[r] == m) { p = first ? val(r, i, t) : p + val(r, i, t); first = 0; }
            p = t_round(p, t);
            s = m == 0 ? p : s + p;
        }
        s = t_round(s, t);
        e[i] = avg ? t_round(s / (float)n, t) : s;
    }
    return e;
}

static dt_pg *world_on(const char *machines) {
    if (machines) setenv("DTRAIN_TEST_MACHINES", machines, 1);
    else unsetenv("DTRAIN_TEST_MACHINES");
    dt_pg *pg;
    T_OK(dt_pg_world(&pg));
    unsetenv("DTRAIN_TEST_MACHINES");
    return pg;
}

static void test_topology(void) {
    t_begin("topology: machines, lanes, description");
    int n = t_size();
    char d[96];
    dt_pg_topo t;
    dt_pg *pg = world_on(NULL);   /* one real machine */
    dt_pg_topology(pg, &t);
    T_CHECK(t.machines == 1 && t.max_ranks == n && !t.hierarchical && t.contiguous);
    dt_pg_topology_describe(pg, d, sizeof d);
    char want[64];
    snprintf(want, sizeof want, "1 machine x %d ranks", n);
    T_CHECK(!strcmp(d, want));
    T_OK(dt_pg_free(pg));

    if (n == 2) {   /* 2 machines x 1 rank: nothing to do inside a machine, so flat */
        pg = world_on("0,1");
        dt_pg_topology(pg, &t);
        T_CHECK(t.machines == 2 && t.max_ranks == 1 && !t.hierarchical && t.machine == t_rank());
        dt_pg_topology_describe(pg, d, sizeof d);
        T_CHECK(!strcmp(d, "2 machines x 1 rank"));
        T_OK(dt_pg_free(pg));
    }
    if (n == 4) {
        int node[4];
        pg = world_on("7,7,3,3");   /* ids are labels: machines are numbered by their lowest rank */
        dt_pg_topology(pg, &t);
        T_CHECK(t.machines == 2 && t.min_ranks == 2 && t.max_ranks == 2 && t.hierarchical && t.lanes == 2);
        T_CHECK(t.contiguous && t.machine == t_rank() / 2 && t.local_rank == t_rank() % 2);
        dt_pg_topology_describe(pg, d, sizeof d);
        T_CHECK(!strcmp(d, "2 machines x 2 ranks"));
        T_OK(dt_pg_node_of(pg, node));
        T_CHECK(node[0] == 0 && node[1] == 0 && node[2] == 2 && node[3] == 2);
        T_OK(dt_pg_free(pg));

        pg = world_on("0,0,0,1");
        dt_pg_topology(pg, &t);
        T_CHECK(t.machines == 2 && t.min_ranks == 1 && t.max_ranks == 3 && t.hierarchical && t.lanes == 3);
        dt_pg_topology_describe(pg, d, sizeof d);
        T_CHECK(!strcmp(d, "2 machines (3+1 ranks)"));
        T_OK(dt_pg_free(pg));

        pg = world_on("0,1,0,1");
        dt_pg_topology(pg, &t);
        T_CHECK(t.machines == 2 && t.hierarchical && !t.contiguous && t.machine == t_rank() % 2);
        T_OK(dt_pg_node_of(pg, node));
        T_CHECK(node[0] == 0 && node[1] == 1 && node[2] == 0 && node[3] == 1);
        T_OK(dt_pg_free(pg));

        /* a group split from a spanning world learns its own machines */
        pg = world_on("0,0,1,1");
        dt_pg *sub;
        setenv("DTRAIN_TEST_MACHINES", "0,0,1,1", 1);   /* (the hook holds for every group made) */
        T_OK(dt_pg_split(pg, t_rank() % 2, 0, &sub));   /* {0,2} and {1,3}: one rank per machine */
        unsetenv("DTRAIN_TEST_MACHINES");
        dt_pg_topology(sub, &t);
        T_CHECK(t.machines == 2 && t.max_ranks == 1 && !t.hierarchical);
        T_OK(dt_pg_free(sub));
        T_OK(dt_pg_free(pg));

        /* a malformed hook is refused with its value */
        setenv("DTRAIN_TEST_MACHINES", "0,0,1", 1);
        dt_pg *bad = NULL;
        T_EXPECT(dt_pg_world(&bad), DT_EINVAL);
        T_CHECK(bad == NULL && strstr(dt_error_message(), "names 3 ranks"));
        unsetenv("DTRAIN_TEST_MACHINES");
    }
    t_end();
}

/* Every dtype x SUM/AVG x det x in/out of place x size on one topology. */
static void check_sums(const char *machines, const int *machine_of) {
    char name[96];
    snprintf(name, sizeof name, "hierarchical allreduce on machines %s", machines);
    t_begin(name);
    dt_pg *pg = world_on(machines);
    int me = dt_pg_rank(pg), n = dt_pg_size(pg);
    const int64_t sizes[] = {1, 2, 3, 5, 1001, 262147, 1300007};   /* the last > one 4 MiB segment */
    const dt_dtype types[] = {DT_F32, DT_BF16, DT_F16};
    for (int ti = 0; ti < 3; ti++)
        for (int si = 0; si < 7; si++)
            for (int k = 0; k < 8; k++) {
                int avg = k & 1, det = (k >> 1) & 1, inplace = (k >> 2) & 1;
                dt_dtype t = types[ti];
                int64_t c = sizes[si];
                if (c > 300000 && (ti || k % 3)) continue;   /* big: a few combinations */
                void *x = input(me, c, t), *y = inplace ? x : t_alloc(c, t);
                float *e = expected(machine_of, n, c, t, avg, det);
                int op = (avg ? DT_RED_AVG : DT_RED_SUM) | (det ? DT_RED_DETERMINISTIC : 0);
                dt_work *w = NULL;
                T_OK(dt_allreduce(pg, x, y, c, t, op, si % 2 ? &w : NULL));
                T_OK(dt_work_wait(w));
                T_DTYPE_EQ(y, t, e, c, det ? "deterministic allreduce" : "hierarchical allreduce");
                if (!inplace) free(y);
                free(x);
                free(e);
            }
    T_OK(dt_pg_free(pg));
    t_end();
}

/* DT_RED_CROSS_BF16 / F16: float32 inside each machine, each machine's sum
 * rounded once to 16 bits, MPI's 16-bit sum across (2 machines: one rounding),
 * widened back, / n for AVG. On one machine the flag changes nothing. */
static void test_cross_wire(void) {
    t_begin("16-bit only between machines (DT_RED_CROSS_*)");
    static const int mo[4] = {0, 0, 1, 1};
    const int64_t c = 100003;
    for (int w16 = 0; w16 < 2; w16++)
        for (int avg = 0; avg < 2; avg++)
            for (int one = 0; one < 2; one++) {
                dt_pg *pg = world_on(one ? NULL : "0,0,1,1");
                int me = dt_pg_rank(pg), n = dt_pg_size(pg);
                dt_dtype wt = w16 ? DT_F16 : DT_BF16;
                float *x = input(me, c, DT_F32), *e = malloc((size_t)c * sizeof *e);
                float *plain = expected(mo, n, c, DT_F32, avg, 0);
                for (int64_t i = 0; i < c; i++) {
                    float p0 = val(0, i, DT_F32) + val(1, i, DT_F32), p1 = val(2, i, DT_F32) + val(3, i, DT_F32);
                    float s = t_round(t_round(p0, wt) + t_round(p1, wt), wt);
                    e[i] = avg ? s / (float)n : s;
                }
                int op = (avg ? DT_RED_AVG : DT_RED_SUM) | (w16 ? DT_RED_CROSS_F16 : DT_RED_CROSS_BF16);
                T_OK(dt_allreduce(pg, x, x, c, DT_F32, op, NULL));
                if (one) {   /* one machine: float32 throughout (MPI's order: compare loosely) */
                    float *ref = malloc((size_t)c * sizeof *ref);
                    for (int64_t i = 0; i < c; i++) {
                        float s = val(0, i, DT_F32);
                        for (int r = 1; r < n; r++) s += val(r, i, DT_F32);
                        ref[i] = avg ? s / (float)n : s;
                    }
                    T_NEAR(x, ref, (size_t)c, 1e-6, "one machine: the flag is ignored");
                    free(ref);
                } else {
                    T_BITWISE(x, e, (size_t)c, "16-bit across machines");
                    T_CHECK(t_differs(x, plain, (size_t)c));   /* really rounded: not the float32 result */
                }
                free(x);
                free(e);
                free(plain);
                T_OK(dt_pg_free(pg));
            }
    dt_pg *pg = world_on(NULL);
    float f[4] = {0};
    T_EXPECT(dt_allreduce(pg, f, f, 4, DT_F32, DT_RED_SUM | DT_RED_CROSS_BF16 | DT_RED_DETERMINISTIC, NULL), DT_EINVAL);
    T_CHECK(strstr(dt_error_message(), "deterministic") != NULL);
    T_OK(dt_pg_free(pg));
    t_end();
}

/* Reduce-scatter (plain: tree order; deterministic: rank order) and
 * allgather (exact), every dtype, in and out of place, one topology. */
static void check_shards(const char *machines, const int *machine_of) {
    char name[96];
    snprintf(name, sizeof name, "hierarchical reduce-scatter / allgather on machines %s", machines);
    t_begin(name);
    dt_pg *pg = world_on(machines);
    int me = dt_pg_rank(pg), n = dt_pg_size(pg);
    const int64_t sizes[] = {1, 3, 1000, 65537};
    const dt_dtype types[] = {DT_F32, DT_BF16, DT_F16};
    for (int ti = 0; ti < 3; ti++)
        for (int si = 0; si < 4; si++)
            for (int k = 0; k < 8; k++) {
                int avg = k & 1, det = (k >> 1) & 1, inplace = (k >> 2) & 1;
                dt_dtype t = types[ti];
                int64_t c = sizes[si];
                size_t es = dt_dtype_size(t);
                void *x = input(me, c * n, t);
                void *y = inplace ? (char *)x + (size_t)me * (size_t)c * es : t_alloc(c, t);
                float *e = expected(machine_of, n, c * n, t, avg, det || ti > 0);   /* 16-bit inputs: exact */
                int op = (avg ? DT_RED_AVG : DT_RED_SUM) | (det ? DT_RED_DETERMINISTIC : 0);
                dt_work *w = NULL;
                T_OK(dt_reduce_scatter(pg, x, y, c, t, op, si % 2 ? &w : NULL));
                T_OK(dt_work_wait(w));
                T_DTYPE_EQ(y, t, e + (size_t)me * (size_t)c, c, det ? "deterministic reduce-scatter"
                                                                     : "hierarchical reduce-scatter");
                /* allgather the chunks back: every rank holds every rank's */
                void *all = t_alloc(c * n, t);
                if (inplace) memcpy((char *)all + (size_t)me * (size_t)c * es, y, (size_t)c * es);
                T_OK(dt_allgather(pg, inplace ? (char *)all + (size_t)me * (size_t)c * es : y, all, c, t,
                                  si % 2 ? NULL : &w));
                T_OK(dt_work_wait(si % 2 ? NULL : w));
                T_DTYPE_EQ(all, t, e, c * n, "hierarchical allgather");
                free(all);
                if (!inplace) free(y);
                free(x);
                free(e);
            }
    T_OK(dt_pg_free(pg));
    t_end();
}

/* Several operations in flight on one group (hierarchical plain and det,
 * flat broadcast and reduce-scatter in between), waited in reverse order. */
static void test_in_flight(void) {
    t_begin("hierarchical allreduces in flight with flat operations");
    static const int mo[4] = {0, 0, 1, 1};
    dt_pg *pg = world_on("0,0,1,1");
    int me = dt_pg_rank(pg), n = dt_pg_size(pg);
    enum { K = 6 };
    const int64_t c = 70001;
    void *x[K];
    float *e[K];
    dt_work *w[K + 2];
    float bc[64], rs_in[4 * 33], rs_out[33];
    for (int k = 0; k < 64; k++) bc[k] = me == 1 ? (float)k : -1.0f;
    for (int k = 0; k < 4 * 33; k++) rs_in[k] = (float)(k + me);
    for (int k = 0; k < K; k++) {
        int det = k % 2;
        x[k] = input(me, c, DT_F32);
        e[k] = expected(mo, n, c, DT_F32, 0, det);
        T_OK(dt_allreduce(pg, x[k], x[k], c, DT_F32, det ? DT_RED_SUM | DT_RED_DETERMINISTIC : DT_RED_SUM, &w[k]));
        if (k == 2) T_OK(dt_broadcast(pg, bc, 64, DT_F32, 1, &w[K]));
        if (k == 3) T_OK(dt_reduce_scatter(pg, rs_in, rs_out, 33, DT_F32, DT_RED_SUM, &w[K + 1]));
    }
    for (int k = K + 1; k >= 0; k--) T_OK(dt_work_wait(w[k]));
    for (int k = 0; k < K; k++) {
        T_DTYPE_EQ(x[k], DT_F32, e[k], c, "allreduce in flight");
        free(x[k]);
        free(e[k]);
    }
    for (int k = 0; k < 64; k++) T_CHECK(bc[k] == (float)k);
    for (int k = 0; k < 33; k++) T_CHECK(rs_out[k] == (float)(4 * (me * 33 + k) + 0 + 1 + 2 + 3));
    T_OK(dt_pg_free(pg));
    t_end();
}

int main(int argc, char **argv) {
    t_init(&argc, &argv);
    test_topology();
    if (t_size() == 4) {
        static const int m22[4] = {0, 0, 1, 1}, m31[4] = {0, 0, 0, 1}, m_il[4] = {0, 1, 0, 1};
        check_sums("0,0,1,1", m22);
        check_sums("0,0,0,1", m31);
        check_sums("0,1,0,1", m_il);
        check_shards("0,0,1,1", m22);
        check_shards("0,0,0,1", m31);
        check_shards("0,1,0,1", m_il);
        test_in_flight();
        test_cross_wire();
        /* the checks above can fail: plain tree order differs from rank order here */
        int differ = 0;
        for (int64_t i = 0; i < 1000; i++) {
            float tree = (val(0, i, DT_F32) + val(1, i, DT_F32)) + (val(2, i, DT_F32) + val(3, i, DT_F32));
            float flat = ((val(0, i, DT_F32) + val(1, i, DT_F32)) + val(2, i, DT_F32)) + val(3, i, DT_F32);
            differ += tree != flat;
        }
        t_begin("inputs tell tree order from rank order");
        T_CHECK(differ > 50);
        t_end();
    }
    T_OK(dt_dist_finalize());
    return 0;
}
