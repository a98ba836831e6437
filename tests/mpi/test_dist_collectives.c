/* Collectives against locally computed results, async handles, progress,
 * sub-groups, tracing and errors. ctest runs it in POLL mode and again in
 * THREAD mode (test_dist_collectives_thread: DTRAIN_PROGRESS=thread). */
#include "mpi_check.h"
#include "tmpdir.h"

/* Small integers: every sum and every /size (size 1, 2, 4) is exact in f32,
 * bf16 and f16, so the expected result does not depend on summation order. */
static float val(int rank, int64_t i) { return (float)((rank + 1) * ((int)(i % 13) - 6)); }

static float expect_sum(int n, int64_t i, int avg) {
    float s = 0;
    for (int r = 0; r < n; r++) s += val(r, i);
    return avg ? s / (float)n : s;
}

static const int64_t k_sizes[] = {0, 1, 7, 1001, 65537, (1 << 20) + 3};   /* last: > one 4 MiB segment */
#define N_SIZES ((int)(sizeof k_sizes / sizeof k_sizes[0]))
static const dt_dtype k_types[] = {DT_F32, DT_BF16, DT_F16};

static void test_allreduce(dt_pg *pg) {
    t_begin("allreduce");
    int me = dt_pg_rank(pg), n = dt_pg_size(pg);
    for (int ti = 0; ti < 3; ti++)
        for (int si = 0; si < N_SIZES; si++)
            for (int avg = 0; avg < 2; avg++)
                for (int inplace = 0; inplace < 2; inplace++) {
                    dt_dtype t = k_types[ti];
                    int64_t c = k_sizes[si];
                    float *src = malloc((size_t)(c + 1) * sizeof(float)), *exp = malloc((size_t)(c + 1) * sizeof(float));
                    for (int64_t i = 0; i < c; i++) { src[i] = val(me, i); exp[i] = expect_sum(n, i, avg); }
                    void *in = t_alloc(c, t), *out = inplace ? in : t_alloc(c, t);
                    t_fill(in, t, src, c);
                    dt_work *w = NULL;
                    int op = avg ? DT_RED_AVG : DT_RED_SUM;
                    if (si % 2) T_OK(dt_allreduce(pg, in, out, c, t, op, NULL));   /* blocking */
                    else {
                        T_OK(dt_allreduce(pg, in, out, c, t, op, &w));
                        T_CHECK(w != NULL);
                        T_OK(dt_work_wait(w));
                    }
                    T_DTYPE_EQ(out, t, exp, c, inplace ? "allreduce in place" : "allreduce");
                    if (!inplace) {   /* input untouched */
                        for (int64_t i = 0; i < c; i++) exp[i] = src[i];
                        T_DTYPE_EQ(in, t, exp, c, "allreduce input preserved");
                        free(out);
                    }
                    free(in); free(src); free(exp);
                }
    t_end();
}

static void test_reduce_scatter(dt_pg *pg) {
    t_begin("reduce_scatter");
    int me = dt_pg_rank(pg), n = dt_pg_size(pg);
    for (int ti = 0; ti < 3; ti++)
        for (int si = 0; si < N_SIZES - 1; si++)
            for (int avg = 0; avg < 2; avg++) {
                dt_dtype t = k_types[ti];
                int64_t c = k_sizes[si], tot = c * n;
                float *src = malloc((size_t)(tot + 1) * sizeof(float)), *exp = malloc((size_t)(c + 1) * sizeof(float));
                for (int64_t i = 0; i < tot; i++) src[i] = val(me, i);
                for (int64_t i = 0; i < c; i++) exp[i] = expect_sum(n, (int64_t)me * c + i, avg);
                void *in = t_alloc(tot, t), *out = t_alloc(c, t);
                t_fill(in, t, src, tot);
                dt_work *w;
                T_OK(dt_reduce_scatter(pg, in, out, c, t, avg ? DT_RED_AVG : DT_RED_SUM, &w));
                T_OK(dt_work_wait(w));
                T_DTYPE_EQ(out, t, exp, c, "reduce_scatter");
                /* in place: the result lands on this rank's own chunk of in */
                void *mine = (char *)in + (size_t)me * (size_t)c * dt_dtype_size(t);
                T_OK(dt_reduce_scatter(pg, in, mine, c, t, avg ? DT_RED_AVG : DT_RED_SUM, NULL));
                T_DTYPE_EQ(mine, t, exp, c, "reduce_scatter in place");
                free(in); free(out); free(src); free(exp);
            }
    t_end();
}

static void test_allgather_bcast_reduce(dt_pg *pg) {
    t_begin("allgather/broadcast/reduce");
    int me = dt_pg_rank(pg), n = dt_pg_size(pg);
    for (int ti = 0; ti < 3; ti++)
        for (int si = 0; si < N_SIZES - 1; si++) {
            dt_dtype t = k_types[ti];
            size_t es = dt_dtype_size(t);
            int64_t c = k_sizes[si], tot = c * n;
            float *src = malloc((size_t)(tot + 1) * sizeof(float)), *exp = malloc((size_t)(tot + 1) * sizeof(float));
            /* allgather: rank r contributes val(r, i) */
            for (int64_t i = 0; i < c; i++) src[i] = val(me, i);
            for (int r = 0; r < n; r++) for (int64_t i = 0; i < c; i++) exp[r * c + i] = val(r, i);
            void *in = t_alloc(c, t), *out = t_alloc(tot, t);
            t_fill(in, t, src, c);
            T_OK(dt_allgather(pg, in, out, c, t, NULL));
            T_DTYPE_EQ(out, t, exp, tot, "allgather");
            memset(out, 0, (size_t)tot * es);
            t_fill((char *)out + (size_t)me * (size_t)c * es, t, src, c);
            dt_work *w;
            T_OK(dt_allgather(pg, (char *)out + (size_t)me * (size_t)c * es, out, c, t, &w));   /* in place */
            T_OK(dt_work_wait(w));
            T_DTYPE_EQ(out, t, exp, tot, "allgather in place");
            /* broadcast from the last rank */
            int root = n - 1;
            for (int64_t i = 0; i < c; i++) src[i] = me == root ? val(root, i) : -1.0f;
            for (int64_t i = 0; i < c; i++) exp[i] = val(root, i);
            t_fill(in, t, src, c);
            T_OK(dt_broadcast(pg, in, c, t, root, si % 2 ? NULL : &w));
            if (si % 2 == 0) T_OK(dt_work_wait(w));
            T_DTYPE_EQ(in, t, exp, c, "broadcast");
            /* reduce (sum / avg) to rank 1 % n, in place and out of place */
            root = 1 % n;
            for (int avg = 0; avg < 2; avg++)
                for (int inplace = 0; inplace < 2; inplace++) {
                    for (int64_t i = 0; i < c; i++) { src[i] = val(me, i); exp[i] = expect_sum(n, i, avg); }
                    t_fill(in, t, src, c);
                    void *o = inplace ? in : (me == root ? out : NULL);
                    T_OK(dt_reduce(pg, in, o, c, t, avg ? DT_RED_AVG : DT_RED_SUM, root, &w));
                    T_OK(dt_work_wait(w));
                    if (me == root) T_DTYPE_EQ(o, t, exp, c, "reduce");
                }
            free(in); free(out); free(src); free(exp);
        }
    t_end();
}

/* Several operations in flight at once, completed in reverse order. */
static void test_overlap_out_of_order(dt_pg *pg) {
    t_begin("async overlap, out-of-order waits");
    int me = dt_pg_rank(pg), n = dt_pg_size(pg);
    const int64_t c = 300001;
    float *a = malloc(c * sizeof(float)), *b = malloc((size_t)c * n * sizeof(float)), *g = malloc((size_t)c * n * sizeof(float));
    float *ra = malloc(c * sizeof(float)), *rb = malloc(c * sizeof(float)), *bc = malloc(c * sizeof(float));
    float *d = malloc(c * sizeof(float)), *sbuf = malloc(c * sizeof(float)), *rbuf = malloc(c * sizeof(float));
    uint16_t *h = malloc(c * 2);
    float *hs = malloc(c * sizeof(float));
    for (int64_t i = 0; i < c; i++) {
        a[i] = val(me, i); d[i] = val(me, i + 5); hs[i] = val(me, i + 3);
        bc[i] = me == 0 ? (float)i : 0.0f; sbuf[i] = (float)(me * 1000 + i % 997);
    }
    for (int64_t i = 0; i < c * n; i++) b[i] = val(me, i);
    t_fill(h, DT_BF16, hs, c);
    dt_work *w[8];
    int peer_to = (me + 1) % n, peer_from = (me + n - 1) % n;
    T_OK(dt_recv(pg, rbuf, c, DT_F32, peer_from, 7, &w[0]));   /* receive posted before the send */
    T_OK(dt_allreduce(pg, a, ra, c, DT_F32, DT_RED_SUM, &w[1]));
    T_OK(dt_reduce_scatter(pg, b, rb, c, DT_F32, DT_RED_AVG, &w[2]));
    T_OK(dt_allgather(pg, a, g, c, DT_F32, &w[3]));
    T_OK(dt_broadcast(pg, bc, c, DT_F32, 0, &w[4]));
    T_OK(dt_allreduce(pg, d, d, c, DT_F32, DT_RED_AVG | DT_RED_DETERMINISTIC, &w[5]));
    T_OK(dt_allreduce(pg, h, h, c, DT_BF16, DT_RED_SUM, &w[6]));
    T_OK(dt_send(pg, sbuf, c, DT_F32, peer_to, 7, &w[7]));
    for (int k = 7; k >= 0; k--) T_OK(dt_work_wait(w[k]));
    float *e = malloc((size_t)c * n * sizeof(float));
    for (int64_t i = 0; i < c; i++) e[i] = expect_sum(n, i, 0);
    T_DTYPE_EQ(ra, DT_F32, e, c, "allreduce");
    for (int64_t i = 0; i < c; i++) e[i] = expect_sum(n, (int64_t)me * c + i, 1);
    T_DTYPE_EQ(rb, DT_F32, e, c, "reduce_scatter");
    for (int r = 0; r < n; r++) for (int64_t i = 0; i < c; i++) e[r * c + i] = val(r, i);
    T_DTYPE_EQ(g, DT_F32, e, c * n, "allgather");
    for (int64_t i = 0; i < c; i++) e[i] = (float)i;
    T_DTYPE_EQ(bc, DT_F32, e, c, "broadcast");
    for (int64_t i = 0; i < c; i++) e[i] = expect_sum(n, i + 5, 1);
    T_DTYPE_EQ(d, DT_F32, e, c, "deterministic allreduce");
    for (int64_t i = 0; i < c; i++) e[i] = expect_sum(n, i + 3, 0);
    T_DTYPE_EQ(h, DT_BF16, e, c, "bf16 allreduce");
    for (int64_t i = 0; i < c; i++) e[i] = (float)(peer_from * 1000 + i % 997);
    T_DTYPE_EQ(rbuf, DT_F32, e, c, "recv");
    /* many small ops in flight, waited in a scrambled order */
    enum { K = 24 };
    float v[K];
    dt_work *ws[K];
    for (int k = 0; k < K; k++) {
        v[k] = (float)(me + k);
        T_OK(dt_allreduce(pg, &v[k], &v[k], 1, DT_F32, k % 3 ? DT_RED_SUM : DT_RED_SUM | DT_RED_DETERMINISTIC, &ws[k]));
    }
    for (int k = 0; k < K; k++) T_OK(dt_work_wait(ws[(k * 7 + me) % K]));
    for (int k = 0; k < K; k++) T_CHECK(v[k] == (float)(n * (n - 1) / 2 + n * k));
    T_OK(dt_barrier(pg, NULL));
    free(a); free(b); free(g); free(ra); free(rb); free(bc); free(d); free(sbuf); free(rbuf); free(h); free(hs); free(e);
    t_end();
}

/* An operation completes through poll/test alone, without dt_work_wait. */
static void test_progress_by_polling(dt_pg *pg) {
    t_begin("progress by polling");
    int n = dt_pg_size(pg);
    const int64_t c = 1 << 20;
    float *x = malloc(c * sizeof(float));
    for (int use_tick = 0; use_tick < 2; use_tick++) {
        for (int64_t i = 0; i < c; i++) x[i] = 1.0f;
        dt_work *w;
        T_OK(dt_allreduce(pg, x, x, c, DT_F32, DT_RED_SUM | DT_RED_DETERMINISTIC, &w));
        int done = 0;
        double t0 = t_now();
        while (!done && t_now() - t0 < 60) {
            if (use_tick) dt_dist_tick(); else dt_pg_poll(pg);
            T_OK(dt_work_test(w, &done));
        }
        T_CHECK(done);
        T_OK(dt_pg_wait_all(pg));   /* nothing left; handle still valid */
        T_OK(dt_work_wait(w));
        T_CHECK(x[0] == (float)n && x[c - 1] == (float)n);
    }
    free(x);
    t_end();
}

static void test_split(dt_pg *world) {
    t_begin("split");
    int me = dt_pg_rank(world), n = dt_pg_size(world);
    dt_pg *half;
    /* parity groups, ordered by descending world rank */
    T_OK(dt_pg_split(world, me % 2, -me, &half));
    T_CHECK(half != NULL);
    int members = 0, below = 0;
    for (int r = me % 2; r < n; r += 2) { members++; if (r > me) below++; }
    T_CHECK(dt_pg_size(half) == members);
    T_CHECK(dt_pg_rank(half) == below);
    /* group rank k is the k-th largest world rank of my parity (the key -me) */
    for (int k = 0, r = n - 1 - ((n - 1 - me % 2) % 2); k < members; k++, r -= 2) T_CHECK(dt_pg_world_rank(half, k) == r);
    T_CHECK(dt_pg_world_rank(half, members) == -1 && dt_pg_world_rank(half, -1) == -1);
    T_CHECK(strstr(dt_pg_name(half), "world/") == dt_pg_name(half));
    float v = (float)(me + 1), s = 0;
    for (int r = me % 2; r < n; r += 2) s += (float)(r + 1);
    T_OK(dt_allreduce(half, &v, &v, 1, DT_F32, DT_RED_SUM, NULL));
    T_CHECK(v == s);
    /* a sub-group and its parent used interleaved */
    dt_work *a, *b;
    float x = 1, y = 1;
    T_OK(dt_allreduce(half, &x, &x, 1, DT_F32, DT_RED_SUM, &a));
    T_OK(dt_allreduce(world, &y, &y, 1, DT_F32, DT_RED_SUM, &b));
    T_OK(dt_work_wait(b));
    T_OK(dt_work_wait(a));
    T_CHECK(x == (float)members && y == (float)n);
    T_OK(dt_pg_free(half));
    /* rank 0 opts out */
    dt_pg *rest;
    T_OK(dt_pg_split(world, me == 0 ? DT_PG_NO_COLOR : 0, 0, &rest));
    T_CHECK((me == 0) == (rest == NULL));
    if (rest) {
        T_CHECK(dt_pg_size(rest) == n - 1 && dt_pg_rank(rest) == me - 1);
        float one = 1;
        T_OK(dt_allreduce(rest, &one, &one, 1, DT_F32, DT_RED_SUM, NULL));
        T_CHECK(one == (float)(n - 1));
    }
    T_OK(dt_pg_free(rest));
    t_end();
}

static void test_trace(dt_pg *pg) {
    t_begin("trace hook");
    char dir[128], path[256];
    T_CHECK(dt_test_tmpdir(dir, sizeof dir, "dist_trace") == 0);   /* one per rank */
    snprintf(path, sizeof path, "%s/trace.json", dir);
    dt_trace *tr;
    T_OK(dt_trace_open(&tr, path, dt_pg_rank(pg)));
    dt_pg_set_trace(pg, tr);
    float *x = calloc(1 << 18, sizeof(float));
    dt_work *w;
    T_OK(dt_allreduce(pg, x, x, 1 << 18, DT_F32, DT_RED_SUM, &w));
    T_OK(dt_work_wait(w));
    T_OK(dt_reduce_scatter(pg, x, x, 1 << 10, DT_F32, DT_RED_SUM, NULL));
    dt_pg_set_trace(pg, NULL);
    T_OK(dt_trace_close(tr));
    FILE *f = fopen(path, "rb");
    T_CHECK(f);
    char buf[1 << 14];
    size_t m = fread(buf, 1, sizeof buf - 1, f);
    buf[m] = 0;
    fclose(f);
    dt_test_rm_rf(dir);
    T_CHECK(strstr(buf, "\"allreduce 1.0MiB\""));
    T_CHECK(strstr(buf, "\"reduce_scatter "));
    free(x);
    t_end();
}

static void test_errors(dt_pg *pg) {
    t_begin("errors");
    int me = dt_pg_rank(pg), n = dt_pg_size(pg);
    float x[16] = {0};
    dt_work *w = (dt_work *)1;
    T_EXPECT(dt_allreduce(pg, x, x, -1, DT_F32, DT_RED_SUM, &w), DT_EINVAL);
    T_CHECK(w == NULL);
    T_EXPECT(dt_allreduce(pg, NULL, x, 4, DT_F32, DT_RED_SUM, NULL), DT_EINVAL);
    T_EXPECT(dt_allreduce(pg, x, NULL, 4, DT_F32, DT_RED_SUM, NULL), DT_EINVAL);
    T_EXPECT(dt_allreduce(pg, x, x + 1, 4, DT_F32, DT_RED_SUM, NULL), DT_EINVAL);   /* partial overlap */
    T_EXPECT(dt_allreduce(pg, x, x, 4, (dt_dtype)9, DT_RED_SUM, NULL), DT_EINVAL);
    T_CHECK(strstr(dt_error_message(), "dtype"));
    T_EXPECT(dt_allreduce(pg, x, x, 4, DT_F32, 7, NULL), DT_EINVAL);
    T_EXPECT(dt_allreduce(NULL, x, x, 4, DT_F32, DT_RED_SUM, NULL), DT_EINVAL);
    T_EXPECT(dt_allreduce(pg, x, x, (int64_t)1 << 33, DT_F32, DT_RED_SUM, NULL), DT_EINVAL);
    T_EXPECT(dt_reduce_scatter(pg, NULL, x, 1, DT_F32, DT_RED_SUM, NULL), DT_EINVAL);
    T_EXPECT(dt_allgather(pg, x + 1, x, 2, DT_F32, NULL), DT_EINVAL);   /* overlap, not the in-place slot */
    T_EXPECT(dt_broadcast(pg, x, 1, DT_F32, n, NULL), DT_EINVAL);
    T_EXPECT(dt_broadcast(pg, x, 1, DT_F32, -1, NULL), DT_EINVAL);
    T_EXPECT(dt_reduce(pg, x, x, 1, DT_F32, DT_RED_SUM, n + 3, NULL), DT_EINVAL);
    T_EXPECT(dt_send(pg, x, 1, DT_F32, 0, -1, NULL), DT_EINVAL);
    T_EXPECT(dt_send(pg, x, 1, DT_F32, 0, 1 << 20, NULL), DT_EINVAL);
    T_EXPECT(dt_recv(pg, x, 1, DT_F32, n, 0, NULL), DT_EINVAL);
    T_EXPECT(dt_pg_split(pg, -5, 0, &(dt_pg *){NULL}), DT_EINVAL);
    T_EXPECT(dt_work_test(NULL, &(int){0}), DT_EINVAL);
    T_EXPECT(dt_dist_init(NULL, NULL, NULL), DT_ESTATE);
    T_CHECK(dt_work_wait(NULL) == DT_OK);
    /* MPI failure -> DT_ECOMM naming the operation and its sequence number:
     * a receive buffer shorter than the message (MPI_ERR_TRUNCATE). */
    dt_pg *pair;
    T_OK(dt_pg_split(pg, me < 2 ? 0 : 1, 0, &pair));
    if (me < 2 && n >= 2) {
        for (int i = 0; i < 16; i++) x[i] = (float)i;
        if (me == 0) {
            T_OK(dt_send(pair, x, 10, DT_F32, 1, 3, NULL));
        } else {
            T_EXPECT(dt_recv(pair, x, 5, DT_F32, 0, 3, NULL), DT_ECOMM);
            const char *m = dt_error_message();
            T_CHECK(strstr(m, "recv #0") && strstr(m, "MPI_"));
            if (me == 1) fprintf(stderr, "  (expected) %s\n", m);
        }
        /* a failed point-to-point operation leaves the group usable */
        float one = 1;
        T_OK(dt_allreduce(pair, &one, &one, 1, DT_F32, DT_RED_SUM, NULL));
        T_CHECK(one == 2.0f);
    }
    T_OK(dt_pg_free(pair));
    t_end();
}

static void run_collective_tests(void) {
    dt_pg *world;
    T_OK(dt_pg_world(&world));
    T_CHECK(dt_pg_size(world) == t_size() && dt_pg_rank(world) == t_rank());
    T_CHECK(dt_dist_initialized());
    test_allreduce(world);
    test_reduce_scatter(world);
    test_allgather_bcast_reduce(world);
    test_overlap_out_of_order(world);
    test_progress_by_polling(world);
    test_split(world);
    test_trace(world);
    test_errors(world);
    T_OK(dt_pg_free(world));
}

int main(int argc, char **argv) {
    t_init(&argc, &argv);
    run_collective_tests();
    T_OK(dt_dist_finalize());
    T_CHECK(!dt_dist_initialized());
    return 0;
}
