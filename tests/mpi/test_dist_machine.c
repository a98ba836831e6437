/* One buffer per machine (dist.h section 10: dt_pg_alloc_machine,
 * dt_allgather_machine), on the real machine and on simulated ones
 * (DTRAIN_TEST_MACHINES, see cmake/tests.cmake):
 *  - the ranks of a machine share it: a value one writes, after a barrier,
 *    the others read; ranks of other machines do not see it;
 *  - init is copied in once; the same offsets on every rank;
 *  - a fill brings every rank's chunk into every machine's buffer, for
 *    several sizes, in flight together, over several rounds that rewrite
 *    the chunks (what ZeRO does each step), in any dtype;
 *  - a buffer outside a machine buffer is refused naming the call. */
#include "mpi_check.h"

static float chunk_val(int rank, int64_t i, int round) { return (float)(rank * 1000 + round * 100) + (float)(i % 97) * 0.5f; }

static void test_shared(dt_pg *world) {
    t_begin("machine buffer: one per machine, shared by its ranks");
    dt_pg_topo t;
    dt_pg_topology(world, &t);
    int n = dt_pg_size(world), me = dt_pg_rank(world);
    int *node = malloc((size_t)n * sizeof *node);
    T_OK(dt_pg_node_of(world, node));
    float init[40];
    for (int i = 0; i < 40; i++) init[i] = (float)i * 1.25f;
    float *b = NULL;
    T_OK(dt_pg_alloc_machine(world, 40, init, &b));
    T_CHECK(b != NULL);   /* poll/thread, flat world or hierarchical: always shareable here */
    T_CHECK(strcmp(dt_pg_shared_unavailable(world), "") == 0);
    T_BITWISE(b, init, 40, "init copied in");
    T_OK(dt_barrier(world, NULL));   /* every rank read init before anyone writes */
    /* the machine's highest rank writes a mark: its machine's ranks see it, others do not */
    int highest = -1;
    for (int r = 0; r < n; r++)
        if (node[r] == node[me]) highest = r;
    if (me == highest) b[39] = 5000.0f + (float)node[me];
    T_OK(dt_barrier(world, NULL));
    T_CHECK(b[39] == 5000.0f + (float)node[me]);
    T_OK(dt_barrier(world, NULL));
    T_OK(dt_pg_free_machine(world, b));
    free(node);
    t_end();
}

static void test_fill(dt_pg *world) {
    t_begin("dt_allgather_machine: every chunk in every machine's buffer, rounds and sizes in flight");
    int n = dt_pg_size(world), me = dt_pg_rank(world);
    const int64_t counts[3] = {1, 1000, 70001};
    int64_t total = 0;
    for (int k = 0; k < 3; k++) total += counts[k] * n;
    float *b = NULL;
    T_OK(dt_pg_alloc_machine(world, (size_t)total, NULL, &b));
    T_CHECK(b != NULL);
    for (int round = 0; round < 3; round++) {
        /* every rank rewrites its own chunks (the previous round's fill is
         * complete and read: the barrier below) */
        dt_work *w[3];
        int64_t off = 0;
        for (int k = 0; k < 3; k++) {
            float *c = b + off + (int64_t)me * counts[k];
            for (int64_t i = 0; i < counts[k]; i++) c[i] = chunk_val(me, i, round + k);
            T_OK(dt_allgather_machine(world, b + off, counts[k], DT_F32, &w[k]));
            off += counts[k] * n;
        }
        for (int k = 2; k >= 0; k--) T_OK(dt_work_wait(w[k]));   /* out of order */
        off = 0;
        for (int k = 0; k < 3; k++) {
            for (int r = 0; r < n; r++)
                for (int64_t i = 0; i < counts[k]; i++)
                    if (b[off + (int64_t)r * counts[k] + i] != chunk_val(r, i, round + k)) {
                        fprintf(stderr, "rank %d round %d size %lld: chunk %d element %lld is %g, want %g\n", me, round,
                                (long long)counts[k], r, (long long)i, (double)b[off + (int64_t)r * counts[k] + i],
                                (double)chunk_val(r, i, round + k));
                        T_CHECK(0);
                    }
            off += counts[k] * n;
        }
        T_OK(dt_barrier(world, NULL));   /* every rank read this round before the next writes */
    }
    /* 16-bit payloads: bytes, not values, are moved */
    uint16_t *h = (uint16_t *)b;
    for (int i = 0; i < 8; i++) h[me * 8 + i] = (uint16_t)(me * 100 + i);
    T_OK(dt_allgather_machine(world, h, 8, DT_BF16, NULL));
    for (int r = 0; r < n; r++)
        for (int i = 0; i < 8; i++) T_CHECK(h[r * 8 + i] == (uint16_t)(r * 100 + i));
    T_OK(dt_barrier(world, NULL));
    /* not a machine buffer */
    float priv[64];
    T_CHECK(dt_allgather_machine(world, priv, 4, DT_F32, NULL) == DT_EINVAL);
    T_CHECK(strstr(dt_error_message(), "dt_allgather_machine") != NULL);
    dt_error_clear();
    T_OK(dt_pg_free_machine(world, b));
    T_CHECK(dt_pg_free_machine(world, priv) == DT_EINVAL);
    dt_error_clear();
    t_end();
}

int main(int argc, char **argv) {
    t_init(&argc, &argv);
    dt_pg *world;
    T_OK(dt_pg_world(&world));
    test_shared(world);
    test_fill(world);
    /* a split group (ZeRO gathers on one): its own machines and buffers */
    dt_pg *sub = NULL;
    T_OK(dt_pg_split(world, 0, dt_pg_rank(world), &sub));
    test_fill(sub);
    dt_pg_free(sub);
    T_OK(dt_dist_finalize());
    return 0;
}
