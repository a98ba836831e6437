/* Distributed sampler: rank sharding, determinism, epoch boundaries, seek. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "dtrain/data.h"

/* Draw one whole epoch for s in batches of `batch`; returns the count, fills out. */
static int64_t draw_epoch(dt_sampler *s, int64_t batch, int64_t *out) {
    int64_t total = 0, k;
    int64_t e0 = s->epoch;
    do {
        k = dt_sampler_next(s, batch, out + total);
        total += k;
    } while (k == batch);
    assert_int_equal(s->epoch, e0 + 1);   /* short call moved to the next epoch */
    assert_int_equal(s->cursor, 0);
    return total;
}

/* Whole-epoch sequence for (seed, epoch) seen by one rank. */
static int64_t rank_epoch(int64_t n, uint64_t seed, int shuffle, int rank, int world, int pad,
                          int64_t epoch, int64_t *out) {
    dt_sampler s;
    assert_int_equal(dt_sampler_init(&s, n, seed, shuffle, rank, world, pad), DT_OK);
    assert_int_equal(dt_sampler_seek(&s, epoch, 0), DT_OK);
    int64_t k = draw_epoch(&s, 7, out);
    assert_int_equal(k, s.per_rank);
    dt_sampler_free(&s);
    return k;
}

static void test_sampler_ranks_disjoint_cover(void **state) {
    (void)state;
    enum { N = 103, W = 4 };
    int *seen = calloc(N, sizeof *seen);
    assert_non_null(seen);
    int64_t buf[N];
    int64_t total = 0;
    for (int r = 0; r < W; r++) {
        int64_t k = rank_epoch(N, 42, 1, r, W, 0, 0, buf);
        assert_int_equal(k, N / W);   /* 25: tail of 3 dropped */
        for (int64_t i = 0; i < k; i++) {
            assert_in_range(buf[i], 0, N - 1);
            seen[buf[i]]++;
        }
        total += k;
    }
    assert_int_equal(total, (N / W) * W);
    int distinct = 0;
    for (int i = 0; i < N; i++) {
        assert_in_range(seen[i], 0, 1);   /* disjoint */
        distinct += seen[i];
    }
    assert_int_equal(distinct, (N / W) * W);
    free(seen);
}

static void test_sampler_pad_wraps(void **state) {
    (void)state;
    enum { N = 103, W = 4 };
    int seen[N] = {0};
    int64_t buf[N];
    for (int r = 0; r < W; r++) {
        int64_t k = rank_epoch(N, 9, 1, r, W, 1, 3, buf);
        assert_int_equal(k, 26);   /* ceil(103 / 4) */
        for (int64_t i = 0; i < k; i++) seen[buf[i]]++;
    }
    /* 104 draws over 103 samples: all covered, exactly one repeated once */
    int twice = 0;
    for (int i = 0; i < N; i++) {
        assert_in_range(seen[i], 1, 2);
        twice += seen[i] == 2;
    }
    assert_int_equal(twice, 1);
}

static void test_sampler_world1_covers_all(void **state) {
    (void)state;
    enum { N = 50 };
    int64_t buf[N];
    int seen[N] = {0};
    int64_t k = rank_epoch(N, 1, 1, 0, 1, 0, 0, buf);
    assert_int_equal(k, N);
    int moved = 0;
    for (int i = 0; i < N; i++) {
        seen[buf[i]]++;
        moved += buf[i] != i;
    }
    for (int i = 0; i < N; i++) assert_int_equal(seen[i], 1);
    assert_true(moved > N / 2);   /* actually shuffled */
}

static void test_sampler_no_shuffle_strided(void **state) {
    (void)state;
    int64_t buf[16];
    int64_t k = rank_epoch(10, 5, 0, 1, 3, 0, 2, buf);
    assert_int_equal(k, 3);
    assert_int_equal(buf[0], 1);
    assert_int_equal(buf[1], 4);
    assert_int_equal(buf[2], 7);
    /* pad: rank 2 of 3 over 10 -> positions 2, 5, 8, 11 -> 11 wraps to 1 */
    k = rank_epoch(10, 5, 0, 2, 3, 1, 0, buf);
    assert_int_equal(k, 4);
    assert_int_equal(buf[3], 1);
}

static void test_sampler_deterministic(void **state) {
    (void)state;
    enum { N = 200 };
    int64_t a[N], b[N], c[N], e1[N];
    rank_epoch(N, 1234, 1, 1, 2, 0, 5, a);
    rank_epoch(N, 1234, 1, 1, 2, 0, 5, b);
    assert_memory_equal(a, b, sizeof(int64_t) * (N / 2));        /* same seed + epoch */
    rank_epoch(N, 1235, 1, 1, 2, 0, 5, c);
    assert_memory_not_equal(a, c, sizeof(int64_t) * (N / 2));    /* different seed */
    rank_epoch(N, 1234, 1, 1, 2, 0, 6, e1);
    assert_memory_not_equal(a, e1, sizeof(int64_t) * (N / 2));   /* different epoch */
}

static void test_sampler_epochs_advance_and_differ(void **state) {
    (void)state;
    enum { N = 64 };
    dt_sampler s;
    assert_int_equal(dt_sampler_init(&s, N, 77, 1, 0, 1, 0), DT_OK);
    int64_t e0[N], e1[N];
    assert_int_equal(draw_epoch(&s, 16, e0), N);
    assert_int_equal(s.epoch, 1);
    assert_int_equal(draw_epoch(&s, 16, e1), N);
    assert_int_equal(s.epoch, 2);
    assert_memory_not_equal(e0, e1, sizeof e0);
    /* epoch 1 drawn continuously equals epoch 1 drawn fresh via seek */
    int64_t fresh[N];
    rank_epoch(N, 77, 1, 0, 1, 0, 1, fresh);
    assert_memory_equal(e1, fresh, sizeof e1);
    dt_sampler_free(&s);
}

static void test_sampler_boundary_calls(void **state) {
    (void)state;
    dt_sampler s;
    int64_t out[8];
    /* per_rank 10, batch 5: 5, 5, then a 0-length call that ends the epoch */
    assert_int_equal(dt_sampler_init(&s, 20, 3, 1, 1, 2, 0), DT_OK);
    assert_int_equal(s.per_rank, 10);
    assert_int_equal(dt_sampler_next(&s, 5, out), 5);
    assert_int_equal(dt_sampler_next(&s, 5, out), 5);
    assert_int_equal(s.epoch, 0);
    assert_int_equal(s.cursor, 10);
    assert_int_equal(dt_sampler_next(&s, 5, out), 0);
    assert_int_equal(s.epoch, 1);
    assert_int_equal(s.cursor, 0);
    assert_int_equal(dt_sampler_next(&s, 5, out), 5);
    dt_sampler_free(&s);
    /* batch 4: 4, 4, 2 (short call ends the epoch), then 4 from epoch 1 */
    assert_int_equal(dt_sampler_init(&s, 20, 3, 1, 1, 2, 0), DT_OK);
    assert_int_equal(dt_sampler_next(&s, 4, out), 4);
    assert_int_equal(dt_sampler_next(&s, 4, out), 4);
    assert_int_equal(dt_sampler_next(&s, 4, out), 2);
    assert_int_equal(s.epoch, 1);
    assert_int_equal(dt_sampler_next(&s, 4, out), 4);
    assert_int_equal(s.cursor, 4);
    /* batch <= 0 is a no-op */
    assert_int_equal(dt_sampler_next(&s, 0, out), 0);
    assert_int_equal(s.cursor, 4);
    assert_int_equal(s.epoch, 1);
    dt_sampler_free(&s);
}

static void test_sampler_seek_reproduces(void **state) {
    (void)state;
    enum { N = 90 };
    dt_sampler a, b;
    assert_int_equal(dt_sampler_init(&a, N, 2024, 1, 2, 3, 1), DT_OK);   /* per_rank 30 */
    int64_t scratch[64], ref[40], got[40];
    draw_epoch(&a, 8, scratch);                        /* epoch 0 */
    assert_int_equal(dt_sampler_next(&a, 10, scratch), 10);   /* epoch 1, cursor 10 */
    int64_t ep = a.epoch, cur = a.cursor;
    assert_int_equal(ep, 1);
    assert_int_equal(cur, 10);
    /* 40 more: 20 to finish epoch 1 (one short call), then 20 of epoch 2 */
    int64_t n = 0;
    n += dt_sampler_next(&a, 25, ref + n);
    assert_int_equal(n, 20);
    n += dt_sampler_next(&a, 20, ref + n);
    assert_int_equal(n, 40);

    assert_int_equal(dt_sampler_init(&b, N, 2024, 1, 2, 3, 1), DT_OK);
    assert_int_equal(dt_sampler_seek(&b, ep, cur), DT_OK);
    int64_t m = 0;
    m += dt_sampler_next(&b, 25, got + m);
    m += dt_sampler_next(&b, 20, got + m);
    assert_int_equal(m, 40);
    assert_memory_equal(ref, got, sizeof ref);
    assert_int_equal(a.epoch, b.epoch);
    assert_int_equal(a.cursor, b.cursor);

    /* seek back to an earlier epoch and to the end-of-epoch cursor */
    assert_int_equal(dt_sampler_seek(&b, 0, b.per_rank), DT_OK);
    assert_int_equal(dt_sampler_next(&b, 4, got), 0);
    assert_int_equal(b.epoch, 1);
    dt_sampler_free(&a);
    dt_sampler_free(&b);
}

static void test_sampler_bad_args(void **state) {
    (void)state;
    dt_sampler s;
    assert_int_equal(dt_sampler_init(&s, 100, 1, 1, 0, 0, 0), DT_EINVAL);
    assert_non_null(strstr(dt_error_message(), "world"));
    assert_null(s.perm);
    assert_int_equal(dt_sampler_init(&s, 100, 1, 1, 4, 4, 0), DT_EINVAL);
    assert_non_null(strstr(dt_error_message(), "rank 4"));
    assert_int_equal(dt_sampler_init(&s, 100, 1, 1, -1, 4, 0), DT_EINVAL);
    assert_int_equal(dt_sampler_init(&s, 3, 1, 1, 0, 4, 0), DT_EINVAL);
    assert_int_equal(dt_sampler_init(&s, 0, 1, 1, 0, 1, 0), DT_EINVAL);
    assert_int_equal(dt_sampler_init(&s, -5, 1, 1, 0, 1, 0), DT_EINVAL);

    assert_int_equal(dt_sampler_init(&s, 10, 1, 1, 0, 2, 0), DT_OK);
    assert_int_equal(dt_sampler_seek(&s, -1, 0), DT_EINVAL);
    assert_int_equal(dt_sampler_seek(&s, 0, -1), DT_EINVAL);
    assert_int_equal(dt_sampler_seek(&s, 0, 6), DT_EINVAL);   /* per_rank is 5 */
    assert_int_equal(s.epoch, 0);
    assert_int_equal(s.cursor, 0);
    dt_sampler_free(&s);
    assert_null(s.perm);
    assert_int_equal(dt_sampler_seek(&s, 0, 0), DT_ESTATE);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sampler_ranks_disjoint_cover),
        cmocka_unit_test(test_sampler_pad_wraps),
        cmocka_unit_test(test_sampler_world1_covers_all),
        cmocka_unit_test(test_sampler_no_shuffle_strided),
        cmocka_unit_test(test_sampler_deterministic),
        cmocka_unit_test(test_sampler_epochs_advance_and_differ),
        cmocka_unit_test(test_sampler_boundary_calls),
        cmocka_unit_test(test_sampler_seek_reproduces),
        cmocka_unit_test(test_sampler_bad_args),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
