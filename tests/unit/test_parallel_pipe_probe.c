/* Pipeline set-up pieces that need no MPI: the balanced cut (expected cuts
 * worked out by hand from "minimise the largest stage cost"), the interleaved
 * cut (by hand from "minimise the largest rank total, then the largest
 * range", plus an exhaustive check of small instances), snapping, the probe's
 * parameter and module ownership on the built-in models, and
 * dt_model_keep_params (a stage keeps its parameters' values, names and a
 * contiguous layout, and can still run its blocks). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "parallel/pipe/pipe_internal.h"

static void check_cut(const double *cost, int n, int S, const int *want) {
    int first[16];
    assert_int_equal(dt_pipe_balance(cost, n, S, first), DT_OK);
    for (int v = 0; v <= S; v++) assert_int_equal(first[v], want[v]);
}

static void test_balance(void **state) {
    (void)state;
    check_cut((double[]){1, 1, 1, 1}, 4, 2, (int[]){0, 2, 4});
    /* one heavy block alone: 5 | 1+1+1+1+1 */
    check_cut((double[]){5, 1, 1, 1, 1, 1}, 6, 2, (int[]){0, 1, 6});
    /* 1+2+3 | 4 | 5 (max 6) beats 1+2 | 3+4 | 5 (7) */
    check_cut((double[]){1, 2, 3, 4, 5}, 5, 3, (int[]){0, 3, 4, 5});
    /* as many stages as blocks: one each */
    check_cut((double[]){3, 1, 2}, 3, 3, (int[]){0, 1, 2, 3});
    check_cut((double[]){3, 1, 2}, 3, 1, (int[]){0, 3});
    int first[8];
    assert_int_equal(dt_pipe_balance((double[]){1, 1}, 2, 3, first), DT_EINVAL);
    assert_non_null(strstr(dt_error_message(), "2 blocks into 3 stages"));
}

/* ---- dt_pipe_balance_ranks: rank r runs ranges r, r + P, ...; minimise the
 * largest rank total, then the largest range ---- */

static void assert_cut(const int *first, int n, int S) {
    assert_int_equal(first[0], 0);
    assert_int_equal(first[S], n);
    for (int v = 0; v < S; v++) assert_true(first[v] < first[v + 1]);
}

/* the largest rank total and the largest range of a cut, summed here */
static void cut_value(const double *cost, int P, int S, const int *first, double *t, double *c) {
    double T[64] = {0};
    *t = *c = 0;
    for (int v = 0; v < S; v++) {
        double x = 0;
        for (int i = first[v]; i < first[v + 1]; i++) x += cost[i];
        T[v % P] += x;
        if (x > *c) *c = x;
    }
    for (int r = 0; r < P; r++)
        if (T[r] > *t) *t = T[r];
}

static void check_ranks(const double *cost, int n, int P, int V, const int *want) {
    int first[257];
    assert_int_equal(dt_pipe_balance_ranks(cost, n, P, V, first), DT_OK);
    for (int v = 0; v <= P * V; v++) assert_int_equal(first[v], want[v]);
}

/* Cuts where min-max over the ranges and min-max over the ranks differ. */
static void test_ranks_vs_chunks(void **state) {
    (void)state;
    /* 1 2 2 3 1 into 4 ranges, P = V = 2 (rank 0: ranges 0, 2; rank 1: 1, 3).
     * One pair of neighbours shares a range; all four cuts:
     *   {1 2}{2}{3}{1}   ranges 3 2 3 1  ranks 3+3=6 2+1=3   largest range 3
     *   {1}{2 2}{3}{1}   ranges 1 4 3 1  ranks 1+3=4 4+1=5   largest range 4
     *   {1}{2}{2 3}{1}   ranges 1 2 5 1  ranks 1+5=6 2+1=3   largest range 5
     *   {1}{2}{2}{3 1}   ranges 1 2 2 4  ranks 1+2=3 2+4=6   largest range 4
     * Over ranges the first wins alone (3); over ranks the second (5). */
    double a[] = {1, 2, 2, 3, 1};
    check_cut(a, 5, 4, (int[]){0, 2, 3, 4, 5});
    check_ranks(a, 5, 2, 2, (int[]){0, 1, 3, 4, 5});
    /* 1 2 3 3 1 3 2 into 6 ranges, P = 3, V = 2 (rank r: ranges r, r + 3).
     * Total 15, so some rank has >= 5. One pair shares a range:
     *   {1 2}            ranges 3 3 3 1 3 2  ranks 3+1=4 3+3=6 3+2=5  largest 3
     *   {2 3}            ranges 1 5 3 1 3 2  ranks 1+1=2 5+3=8 3+2=5
     *   {3 3}            ranges 1 2 6 1 3 2  ranks 1+1=2 2+3=5 6+2=8
     *   {3 1}            ranges 1 2 3 4 3 2  ranks 1+4=5 2+3=5 3+2=5  largest 4
     *   {1 3}            ranges 1 2 3 3 4 2  ranks 1+3=4 2+4=6 3+2=5
     *   {3 2}            ranges 1 2 3 3 1 5  ranks 1+3=4 2+1=3 3+5=8
     * Over ranges {1 2} alone reaches 3 (ranks up to 6); over ranks {3 1}. */
    double b[] = {1, 2, 3, 3, 1, 3, 2};
    check_cut(b, 7, 6, (int[]){0, 2, 3, 4, 5, 6, 7});
    check_ranks(b, 7, 3, 2, (int[]){0, 1, 2, 3, 5, 6, 7});
    /* GPT-2's shape: embedding 1, five layers 4, loss head 11, P = V = 2. The
     * head ends range 3 (rank 1), range 1 holds >= 1 layer and no embedding:
     * rank 1 = 11 + 4j with j >= 1 layers, rank 0 = 32 - rank 1. j = 1: 15 and
     * 17; j = 2: 19. So the best largest rank total is 17: range 1 one layer,
     * range 3 the head alone, ranges 0 and 2 the embedding and four layers:
     * range 0 = embedding + i layers, range 2 = 4 - i layers (i = 0..3):
     *   i = 0: 1 4 16 11 (16)   i = 1: 5 4 12 11 (12)
     *   i = 2: 9 4 8 11 (11)    i = 3: 13 4 4 11 (13)
     * so i = 2 on the largest range. (Min-max over ranges also reaches 11,
     * e.g. with 5 8 8 11: ranks 13 and 19.) */
    double g[] = {1, 4, 4, 4, 4, 4, 11};
    check_ranks(g, 7, 2, 2, (int[]){0, 3, 4, 6, 7});
    int first[8];
    double t, c;
    assert_int_equal(dt_pipe_balance(g, 7, 4, first), DT_OK);
    cut_value(g, 2, 4, first, &t, &c);
    assert_true(c == 11);   /* the same largest range, whatever its ranks */
}

/* V = 1 (and P = 1) is dt_pipe_balance: the same cut, ties included. */
static void test_ranks_v1(void **state) {
    (void)state;
    struct { double cost[8]; int n, S; } in[] = {
        {{1, 2, 3, 4, 5}, 5, 3},
        {{5, 1, 1, 1, 1, 1}, 6, 2},
        {{1, 1, 1, 1, 1, 1}, 6, 4},
        {{0.31, 1.02, 0.99, 1.01, 0.97, 1.03, 2.4}, 7, 3},
        {{3, 1, 2}, 3, 3},
        {{2, 0, 0, 2, 1, 1, 3, 0}, 8, 5},
    };
    for (size_t k = 0; k < sizeof in / sizeof in[0]; k++) {
        int want[9], got[9];
        assert_int_equal(dt_pipe_balance(in[k].cost, in[k].n, in[k].S, want), DT_OK);
        assert_int_equal(dt_pipe_balance_ranks(in[k].cost, in[k].n, in[k].S, 1, got), DT_OK);
        assert_memory_equal(got, want, (size_t)(in[k].S + 1) * sizeof *got);
        assert_int_equal(dt_pipe_balance_ranks(in[k].cost, in[k].n, 1, in[k].S, got), DT_OK);   /* one rank */
        assert_memory_equal(got, want, (size_t)(in[k].S + 1) * sizeof *got);
    }
}

static void test_ranks_errors(void **state) {
    (void)state;
    int first[8];
    assert_int_equal(dt_pipe_balance_ranks((double[]){1, 1, 1}, 3, 2, 2, first), DT_EINVAL);
    assert_non_null(strstr(dt_error_message(), "3 blocks into 4 stages"));
    assert_int_equal(dt_pipe_balance_ranks((double[]){1, 1, 1}, 3, 4, 1, first), DT_EINVAL);
    assert_int_equal(dt_pipe_balance_ranks((double[]){1, 1, 1}, 3, 0, 2, first), DT_EINVAL);
    assert_int_equal(dt_pipe_balance_ranks((double[]){1, 1, 1}, 3, 2, 0, first), DT_EINVAL);
    assert_int_equal(dt_pipe_balance_ranks((double[]){1, 1, 1}, 3, 1 << 20, 1 << 12, first), DT_EINVAL);
    assert_int_equal(dt_pipe_balance_ranks((double[]){1, 1.0 / 0.0, 1, 1}, 4, 2, 2, first), DT_EINVAL);
    assert_non_null(strstr(dt_error_message(), "block 1"));
}

static void test_ranks_equal(void **state) {
    (void)state;
    /* 8 equal blocks, P = V = 2: ranks >= 8 / 2 = 4 blocks, ranges >= 8 / 4 =
     * 2; both at once only with every range 2 blocks */
    double e8[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    check_ranks(e8, 8, 2, 2, (int[]){0, 2, 4, 6, 8});
    /* 50 equal blocks, P = V = 4: some rank has >= ceil(50 / 4) = 13, some
     * range >= ceil(50 / 16) = 4, and 13 and 4 together are reachable (ranks'
     * ranges 4+3+3+3, 4+3+3+3, 3+3+3+3, 3+3+3+3), so ranks get 13, 13, 12, 12 */
    double e50[50];
    for (int i = 0; i < 50; i++) e50[i] = 1;
    int first[17], blocks[4] = {0};
    assert_int_equal(dt_pipe_balance_ranks(e50, 50, 4, 4, first), DT_OK);
    assert_cut(first, 50, 16);
    double t, c;
    cut_value(e50, 4, 16, first, &t, &c);
    assert_true(t == 13 && c == 4);
    for (int v = 0; v < 16; v++) blocks[v % 4] += first[v + 1] - first[v];
    for (int r = 0; r < 4; r++) assert_true(blocks[r] == 12 || blocks[r] == 13);
}

/* GPT-2 with 48 layers: embedding 1, layers 4, loss head 10 (n = 50), P = V = 4.
 * Block 0 is on rank 0 and the head on rank 3 (range 15), so with a, b, c, d
 * layers on ranks 0..3 (a + b + c + d = 48) the totals are 4a + 1, 4b, 4c,
 * 4d + 10. All <= 51 needs a, b, c <= 12 and d <= 10: 46 layers < 48. All
 * <= 52 allows a <= 12, b, c <= 13, d <= 10: exactly 48, so the best largest
 * rank total is 52 (ranks 49, 52, 52, 50). Ranks 1 and 2 then spread 13
 * layers over 4 ranges: one holds >= 4 layers = 16; 16 is reachable (rank 0:
 * 1+12, 12, 12, 12; ranks 1, 2: 16, 12, 12, 12; rank 3: 12, 12, 12, 4+10). */
static void test_ranks_gpt2_48(void **state) {
    (void)state;
    double cost[50];
    cost[0] = 1;
    for (int i = 1; i < 49; i++) cost[i] = 4;
    cost[49] = 10;
    int first[17];
    assert_int_equal(dt_pipe_balance_ranks(cost, 50, 4, 4, first), DT_OK);
    assert_cut(first, 50, 16);
    double t, c;
    cut_value(cost, 4, 16, first, &t, &c);
    assert_true(t == 52 && c == 16);
}

/* Against every cut of small integer instances (zero costs included): the
 * value found is the least (largest rank total, largest range). */
static void brute(const double *cost, int n, int P, int S, int v, int at, int *first, double *bt, double *bc) {
    if (v == S) {
        double t, c;
        cut_value(cost, P, S, first, &t, &c);
        if (t < *bt || (t == *bt && c < *bc)) { *bt = t; *bc = c; }
        return;
    }
    for (int e = at + 1; e <= n - (S - v - 1); e++) {
        if (v == S - 1 && e != n) continue;
        first[v + 1] = e;
        brute(cost, n, P, S, v + 1, e, first, bt, bc);
    }
}

static void test_ranks_exhaustive(void **state) {
    (void)state;
    unsigned seed = 12345;
    int cases = 0;
    for (int P = 2; P <= 4; P++)
        for (int V = 2; V <= 3; V++)
            for (int n = P * V; n <= 14 && n <= P * V + 8; n++)
                for (int rep = 0; rep < 6; rep++) {
                    double cost[14];
                    for (int i = 0; i < n; i++) {
                        seed = seed * 1103515245u + 12345u;
                        cost[i] = (double)((seed >> 16) % 10);
                    }
                    int S = P * V, first[13], all[13] = {0};
                    double bt = 1e30, bc = 1e30, t, c;
                    brute(cost, n, P, S, 0, 0, all, &bt, &bc);
                    assert_int_equal(dt_pipe_balance_ranks(cost, n, P, V, first), DT_OK);
                    assert_cut(first, n, S);
                    cut_value(cost, P, S, first, &t, &c);
                    if (t != bt || c != bc)
                        fail_msg("P %d V %d n %d rep %d: got (%g, %g), best (%g, %g)", P, V, n, rep, t, c, bt, bc);
                    cases++;
                }
    assert_true(cases > 100);
}

/* Distinct noisy costs (the exact search may run out of budget): a valid cut,
 * never worse than dt_pipe_balance's on the ranks. */
static void test_ranks_noisy(void **state) {
    (void)state;
    double cost[50];
    unsigned seed = 7;
    for (int i = 0; i < 50; i++) {
        seed = seed * 1103515245u + 12345u;
        cost[i] = 1.0 + 0.08 * ((double)((seed >> 16) % 1000) / 1000.0 - 0.5);
    }
    cost[0] = 0.3;
    cost[49] = 2.6;
    int first[17], old[17];
    assert_int_equal(dt_pipe_balance_ranks(cost, 50, 4, 4, first), DT_OK);
    assert_cut(first, 50, 16);
    assert_int_equal(dt_pipe_balance(cost, 50, 16, old), DT_OK);
    double t, c, ot, oc;
    cut_value(cost, 4, 16, first, &t, &c);
    cut_value(cost, 4, 16, old, &ot, &oc);
    assert_true(t <= ot * (1 + 1e-9));
    /* layers cost 1 + 0.08 (u - 0.5) < 1.04 (u < 1); the cut giving ranks 0..3
     * 12, 13, 13 and 10 layers (the embedding on rank 0, the head on rank 3)
     * has rank totals below 0.3 + 12 * 1.04 = 12.78, 13 * 1.04 = 13.52, 13.52,
     * 10 * 1.04 + 2.6 = 13.0: at least that good */
    assert_true(t <= 13.52);
}

static void test_snap_costs(void **state) {
    (void)state;
    /* 0.98 .. 1.02: neighbours and the whole group within 5% -> mean
     * (1 + 1.02 + 0.98 + 1.01) / 4 = 1.0025; 0.5 and 2 alone */
    double a[] = {2.0, 1.00, 1.02, 0.98, 1.01, 0.5};
    assert_ptr_equal(dt_pipe_snap_costs(a, 6), a);
    assert_true(a[0] == 2.0 && a[5] == 0.5);
    assert_true(a[1] == a[2] && a[2] == a[3] && a[3] == a[4]);
    assert_true(fabs(a[1] - 1.0025) < 1e-12);
    /* a chain 4% apart spans 8%: left as measured */
    double b[] = {1.08, 1.00, 1.04};
    dt_pipe_snap_costs(b, 3);
    assert_true(b[0] == 1.08 && b[1] == 1.00 && b[2] == 1.04);
    /* two kinds: (1 + 1.01) / 2 = 1.005, (2 + 2.02) / 2 = 2.01 */
    double c[] = {2.02, 1.0, 2.0, 1.01};
    dt_pipe_snap_costs(c, 4);
    assert_true(fabs(c[0] - 2.01) < 1e-12 && c[2] == c[0]);
    assert_true(fabs(c[1] - 1.005) < 1e-12 && c[3] == c[1]);
    /* zero, negative, single: untouched */
    double d[] = {0, 0, -1, 3};
    dt_pipe_snap_costs(d, 4);
    assert_true(d[0] == 0 && d[1] == 0 && d[2] == -1 && d[3] == 3);
}

/* Snapping makes the cut follow the structure, not the noise. Embedding 0.25,
 * five layers measured 1.00 1.02 0.99 1.01 0.98 (total 8), head 2.75, P = V = 2.
 * Rank 1 holds the head and range 1 (>= 1 layer); two layers there make it
 * >= 2.75 + 0.98 + 0.99 = 4.72, so at best range 1 is one layer j, range 3
 * the head: rank 1 = 2.75 + layer j, rank 0 = 8 - rank 1:
 *   j = 1: 4.25   j = 2: 4.23   j = 3: 4.26   j = 4: 4.24   (rank 0)
 * As measured, j = 2 wins ({0, 2, 3, 6, 7}: ranges 1.25 1.02 2.98 2.75) on a
 * 0.02 noise margin. Snapped, the layers all cost 1: rank 0 is 4.25 for every
 * j and the largest range decides: j = 1: 4 (four layers), j = 2: 3,
 * j = 3: 2.75 (ranges 2.25 1 2 2.75), j = 4: 3.25 (embedding + 3 layers). */
static void test_snap_then_cut(void **state) {
    (void)state;
    double cost[] = {0.25, 1.00, 1.02, 0.99, 1.01, 0.98, 2.75};
    check_ranks(cost, 7, 2, 2, (int[]){0, 2, 3, 6, 7});
    dt_pipe_snap_costs(cost, 7);
    assert_true(cost[0] == 0.25 && cost[6] == 2.75 && fabs(cost[1] - 1.0) < 1e-12);
    check_ranks(cost, 7, 2, 2, (int[]){0, 3, 4, 6, 7});
}

static dt_batch gpt2_batch(int32_t *ids, int32_t *y, int B, int T) {
    for (int i = 0; i < B * T; i++) { ids[i] = (i * 7 + 3) % 64; y[i] = (i * 5 + 1) % 64; }
    dt_batch b = {.B = B, .T = T, .y = y};
    assert_int_equal(dt_batch_add_input(&b, "ids", DT_I32, 2, (int64_t[]){B, T}, ids), DT_OK);
    return b;
}

static dt_model *tiny_gpt2(void) {
    dt_model_cfg c = dt_model_cfg_default(DT_MODEL_GPT2);
    c.n_layer = 2; c.n_embd = 32; c.n_head = 2; c.vocab = 64; c.max_t = 16;
    dt_model *m;
    assert_int_equal(dt_model_create(&c, 3, &m), DT_OK);
    return m;
}

static int used(const dt_pipe_probe *pr, int k, int i) { return pr->used[(size_t)k * (size_t)pr->n_blocks + (size_t)i]; }

static void test_probe_gpt2(void **state) {
    (void)state;
    dt_model *m = tiny_gpt2();
    int32_t ids[2 * 8], y[2 * 8];
    dt_batch b = gpt2_batch(ids, y, 2, 8);
    float *before = malloc(m->param_flat.numel * sizeof(float));
    memcpy(before, m->param_flat.data, m->param_flat.numel * sizeof(float));
    dt_pipe_probe pr;
    assert_int_equal(dt_pipe_probe_run(m, &b, &pr), DT_OK);
    assert_int_equal(pr.n_blocks, 4);   /* embed, h.0, h.1, head */
    for (int i = 0; i < 4; i++) assert_true(pr.cost[i] > 0);
    int wte = dt_model_find_param(m, "wte.weight")->index, wpe = dt_model_find_param(m, "wpe.weight")->index;
    int h1 = dt_model_find_param(m, "h.1.mlp.c_fc.weight")->index, lnf = dt_model_find_param(m, "ln_f.weight")->index;
    /* the tied embedding: block 0 (lookup) and block 3 (lm-head), nothing between */
    assert_true(used(&pr, wte, 0) && !used(&pr, wte, 1) && !used(&pr, wte, 2) && used(&pr, wte, 3));
    assert_true(used(&pr, wpe, 0) && !used(&pr, wpe, 3));
    assert_true(!used(&pr, h1, 1) && used(&pr, h1, 2));
    assert_true(used(&pr, lnf, 3) && !used(&pr, lnf, 2));
    /* the probe leaves no trace: values and gradients untouched */
    assert_memory_equal(before, m->param_flat.data, m->param_flat.numel * sizeof(float));
    for (size_t i = 0; i < m->grad_flat.numel; i++) assert_true(m->grad_flat.data[i] == 0.f);
    dt_pipe_probe_free(&pr);
    free(before);
    dt_model_free(m);
}

static void test_probe_cnn_modules(void **state) {
    (void)state;
    dt_model_cfg c = dt_model_cfg_default(DT_MODEL_CNN);
    c.cnn_c1 = 4; c.cnn_c2 = 4; c.cnn_fc = 8;
    dt_model *m;
    assert_int_equal(dt_model_create(&c, 1, &m), DT_OK);
    static float img[2 * 784];
    int32_t y[2] = {1, 2};
    for (int i = 0; i < 2 * 784; i++) img[i] = (float)((i * 31) % 17) / 17.f;
    dt_batch b = {.B = 2, .T = 1, .y = y};
    assert_int_equal(dt_batch_add_input(&b, "image", DT_F32, 4, (int64_t[]){2, 1, 28, 28}, img), DT_OK);
    float *stats = malloc((size_t)m->buffers[0]->value.numel * sizeof(float));
    memcpy(stats, m->buffers[0]->value.data, (size_t)m->buffers[0]->value.numel * sizeof(float));
    dt_pipe_probe pr;
    assert_int_equal(dt_pipe_probe_run(m, &b, &pr), DT_OK);
    for (int k = 0; k < m->n_modules; k++) {
        const char *nm = m->modules[k]->name;
        int want = !strcmp(nm, "conv1") || !strcmp(nm, "bn1") ? 0 : !strcmp(nm, "conv2") || !strcmp(nm, "bn2") ? 1
                 : !strcmp(nm, "fc1") ? 2 : 3;
        assert_int_equal(pr.module_block[k], want);
    }
    /* eval mode: BatchNorm's running statistics are not updated by the probe */
    assert_memory_equal(stats, m->buffers[0]->value.data, (size_t)m->buffers[0]->value.numel * sizeof(float));
    for (int k = 0; k < m->n_modules; k++) assert_null(m->modules[k]->hook);   /* hooks restored */
    dt_pipe_probe_free(&pr);
    free(stats);
    dt_model_free(m);
}

/* The last stage of a 2-stage GPT-2: ln_f + lm-head (tied wte) and h.1. */
static void test_keep_params(void **state) {
    (void)state;
    dt_model *full = tiny_gpt2(), *m = tiny_gpt2();
    unsigned char keep[64] = {0};
    size_t want_elems = 0;
    int want_n = 0;
    for (int i = 0; i < m->n_params; i++) {
        const char *nm = m->params[i]->name;
        keep[i] = !strncmp(nm, "h.1.", 4) || !strncmp(nm, "ln_f.", 5) || !strcmp(nm, "wte.weight");
        if (keep[i]) { want_elems += (size_t)m->params[i]->value.numel; want_n++; }
    }
    assert_int_equal(dt_model_keep_params(m, keep), DT_OK);
    assert_int_equal(m->n_params, want_n);
    assert_int_equal(m->n_elems, want_elems);
    assert_int_equal(m->param_flat.numel, want_elems);
    for (int i = 0; i < m->n_params; i++) {
        dt_param *q = m->params[i], *o = dt_model_find_param(full, q->name);
        assert_non_null(o);
        assert_int_equal(q->index, i);
        assert_memory_equal(q->value.data, o->value.data, (size_t)o->value.numel * sizeof(float));
        assert_true((float *)q->value.data >= m->param_flat.data &&
                    (float *)q->value.data + q->value.numel <= m->param_flat.data + m->param_flat.numel);
        if (i > 0) assert_true(o->index > dt_model_find_param(full, m->params[i - 1]->name)->index);   /* order kept */
    }
    for (int k = 0; k < m->n_modules; k++)   /* modules list kept parameters only */
        for (int j = 0; j < m->modules[k]->n_params; j++) assert_ptr_equal(dt_model_find_param(m, m->modules[k]->params[j]->name), m->modules[k]->params[j]);
    assert_null(dt_model_find_param(m, "h.0.attn.c_attn.weight"));
    /* the stage still runs its blocks: h.1 + head on an activation equal the full model's */
    int32_t ids[2 * 8], y[2 * 8];
    dt_batch b = gpt2_batch(ids, y, 2, 8);
    dt_graph *g = dt_graph_create(), *gf = dt_graph_create();
    dt_tensor *x = dt_model_run_blocks(full, gf, &b, 0, 2, NULL);
    assert_non_null(x);
    dt_tensor *in = dt_graph_input(g, x->ndim, x->shape, dt_f32(x), 1);
    dt_tensor *ys = dt_model_run_blocks(m, g, &b, 2, 4, in), *yf = dt_model_run_blocks(full, gf, &b, 2, 4, x);
    assert_non_null(ys);
    assert_non_null(yf);
    assert_memory_equal(ys->data, yf->data, (size_t)yf->numel * sizeof(float));
    dt_graph_free(g);
    dt_graph_free(gf);
    dt_model_free(m);
    dt_model_free(full);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_balance),
        cmocka_unit_test(test_ranks_vs_chunks),
        cmocka_unit_test(test_ranks_v1),
        cmocka_unit_test(test_ranks_errors),
        cmocka_unit_test(test_ranks_equal),
        cmocka_unit_test(test_ranks_gpt2_48),
        cmocka_unit_test(test_ranks_exhaustive),
        cmocka_unit_test(test_ranks_noisy),
        cmocka_unit_test(test_snap_costs),
        cmocka_unit_test(test_snap_then_cut),
        cmocka_unit_test(test_probe_gpt2),
        cmocka_unit_test(test_probe_cnn_modules),
        cmocka_unit_test(test_keep_params),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
