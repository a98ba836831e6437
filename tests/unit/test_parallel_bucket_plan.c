/* Bucket cutting shared by DDP and ZeRO (dt_bucket_plan). Every expected
 * value is worked out by hand from the rule in common/common_internal.h: a new
 * bucket opens when the open one is non-empty and the next item would take
 * it over its cap (first cap while the open bucket is bucket 0) or has
 * another class, sizes are
 * spans in floats (4 bytes), and pad > 0 packs buckets back to back, each
 * rounded up to a multiple of pad (at least pad). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "parallel/common/common_internal.h"

typedef struct { int first, n; size_t begin, used, numel; } want_cut;

static void check(const dt_bucket_rule *r, const dt_bucket_item *it, int n, const want_cut *want, int nb,
                  const int *want_of, const size_t *want_pos) {
    dt_bucket_cut cuts[16];
    int of[16];
    size_t pos[16];
    for (int k = 0; k < 16; k++) pos[k] = 777;
    assert_int_equal(dt_bucket_plan(r, it, n, cuts, of, pos), nb);
    for (int i = 0; i < nb; i++) {
        assert_int_equal(cuts[i].first, want[i].first);
        assert_int_equal(cuts[i].n, want[i].n);
        assert_int_equal(cuts[i].begin, want[i].begin);
        assert_int_equal(cuts[i].used, want[i].used);
        assert_int_equal(cuts[i].numel, want[i].numel);
    }
    for (int k = 0; k < n; k++) {
        assert_int_equal(of[k], want_of[k]);
        if (want_pos) assert_int_equal(pos[k], want_pos[k]);
    }
}

/* DDP-like, in place. First cap 16 B = 4 floats, then 32 B = 8 floats.
 * 3 | 2+4 | 4+1 | 10 | 2: item 1 does not fit beside item 0 under the small
 * first cap; 10 floats (40 B) exceed the cap and get a bucket of their own. */
static void test_first_cap_and_oversized(void **st) {
    (void)st;
    dt_bucket_rule r = {16, 32, 0};
    dt_bucket_item it[] = {{3, 0, 0, 0}, {2, 3, 0, 0}, {4, 5, 0, 0}, {4, 9, 0, 0}, {1, 13, 0, 0}, {10, 14, 0, 0}, {2, 24, 0, 0}};
    want_cut w[] = {{0, 1, 0, 3, 3}, {1, 2, 3, 6, 6}, {3, 2, 9, 5, 5}, {5, 1, 14, 10, 10}, {6, 1, 24, 2, 2}};
    int of[] = {0, 1, 1, 2, 2, 3, 4};
    size_t pos[] = {0, 3, 5, 9, 13, 14, 24};
    check(&r, it, 7, w, 5, of, pos);
}

/* First cap larger than the rest (40 B vs 8 B), and a bucket filled exactly
 * to its cap keeps the item: 4+4 | 4 | 1+1 | 1. */
static void test_large_first_cap_and_exact_fit(void **st) {
    (void)st;
    dt_bucket_rule r = {40, 8, 0};
    dt_bucket_item it[] = {{4, 0, 0, 0}, {4, 4, 0, 0}, {4, 8, 0, 0}, {1, 12, 0, 0}, {1, 13, 0, 0}, {1, 14, 0, 0}};
    want_cut w[] = {{0, 2, 0, 8, 8}, {2, 1, 8, 4, 4}, {3, 2, 12, 2, 2}, {5, 1, 14, 1, 1}};
    int of[] = {0, 0, 1, 2, 2, 3};
    check(&r, it, 6, w, 4, of, NULL);
}

/* Skipped (frozen) items join no bucket, and no bucket spans the gap they
 * leave (in place, a bucket is one range of the gradient buffer, and a frozen
 * parameter has no gradient there): item 1 [1, 3) is bucket 0; item 3 [6, 8)
 * does not start at 3, so it opens bucket 1, which items 4 [8, 10) and
 * 5 [10, 12) join (2 + 2 + 2 floats = 24 B, just the cap); item 6 at 13
 * opens bucket 2 (a hole, and the cap; test_hole_cuts has a hole alone). */
static void test_skipped_items_and_gaps(void **st) {
    (void)st;
    dt_bucket_rule r = {24, 24, 0};
    dt_bucket_item it[] = {{1, 0, 1, 0}, {2, 1, 0, 0}, {3, 3, 1, 0}, {2, 6, 0, 0}, {2, 8, 0, 0},
                           {2, 10, 0, 0}, {1, 13, 0, 0}};
    want_cut w[] = {{1, 1, 1, 2, 2}, {3, 3, 6, 6, 6}, {6, 1, 13, 1, 1}};
    int of[] = {-1, 0, -1, 1, 1, 1, 2};
    check(&r, it, 7, w, 3, of, NULL);
}

/* A hole alone cuts: 1 float at 0, 1 float at 2 (hole at 1) under a 64 B cap
 * would fit in one bucket by size, but a bucket is one range: two buckets. */
static void test_hole_cuts(void **st) {
    (void)st;
    dt_bucket_rule r = {64, 64, 0};
    dt_bucket_item it[] = {{1, 0, 0, 0}, {1, 2, 0, 0}, {1, 3, 0, 0}};
    want_cut w[] = {{0, 1, 0, 1, 1}, {1, 2, 2, 2, 2}};
    int of[] = {0, 1, 1};
    check(&r, it, 3, w, 2, of, NULL);
}

/* ZeRO-like: packed from 0 (offsets ignored), each bucket padded to a
 * multiple of 8. First cap 16 B, then 40 B (10 floats).
 *   3        -> [0, 8)            item at 0
 *   5 + 2    -> [8, 16)           items at 8, 13
 *   12 (48 B, over the cap) -> [16, 32)  item at 16
 *   1        -> [32, 40)          item at 32 */
static void test_padding_packs_buckets(void **st) {
    (void)st;
    dt_bucket_rule r = {16, 40, 8};
    dt_bucket_item it[] = {{3, 1000, 0, 0}, {5, 1000, 0, 0}, {2, 1000, 0, 0}, {12, 1000, 0, 0}, {1, 1000, 0, 0}};
    want_cut w[] = {{0, 1, 0, 3, 8}, {1, 2, 8, 7, 8}, {3, 1, 16, 12, 16}, {4, 1, 32, 1, 8}};
    int of[] = {0, 1, 1, 2, 3};
    size_t pos[] = {0, 8, 13, 16, 32};
    check(&r, it, 5, w, 4, of, pos);
}

/* An empty bucket is never closed (its used is 0), and padding gives it at
 * least one pad unit; without padding it stays 0. No items: no buckets. */
static void test_empty_items(void **st) {
    (void)st;
    dt_bucket_rule padded = {4, 4, 4}, inplace = {4, 4, 0};
    dt_bucket_item zeros[] = {{0, 0, 0, 0}, {0, 0, 0, 0}};
    want_cut w1[] = {{0, 2, 0, 0, 4}};
    int of2[] = {0, 0};
    check(&padded, zeros, 2, w1, 1, of2, NULL);
    want_cut w0[] = {{0, 2, 0, 0, 0}};
    check(&inplace, zeros, 2, w0, 1, of2, NULL);
    dt_bucket_item zz2[] = {{0, 0, 0, 0}, {0, 0, 0, 0}, {2, 0, 0, 0}};   /* 2 floats = 8 B > cap 4 B, still joins */
    want_cut w2[] = {{0, 3, 0, 2, 4}};
    int of3[] = {0, 0, 0};
    size_t pos3[] = {0, 0, 0};
    check(&padded, zz2, 3, w2, 1, of3, pos3);
    dt_bucket_cut cuts[1];
    int of[1];
    assert_int_equal(dt_bucket_plan(&padded, zeros, 0, cuts, of, NULL), 0);
}

/* Classes never share a bucket (ZeRO: frozen parameters apart, so they get
 * no optimizer state). Caps 40 B = 10 floats, pad 4. Classes 0 0 1 1 0:
 *   2 + 3 (class 0)  -> [0, 8)    items at 0, 2
 *   1 + 1 (class 1)  -> [8, 12)   items at 8, 9: would fit beside, but another class
 *   2     (class 0)  -> [12, 16)  item at 12 */
static void test_classes_never_mix(void **st) {
    (void)st;
    dt_bucket_rule r = {40, 40, 4};
    dt_bucket_item it[] = {{2, 0, 0, 0}, {3, 0, 0, 0}, {1, 0, 0, 1}, {1, 0, 0, 1}, {2, 0, 0, 0}};
    want_cut w[] = {{0, 2, 0, 5, 8}, {2, 2, 8, 2, 4}, {4, 1, 12, 2, 4}};
    int of[] = {0, 0, 1, 1, 2};
    size_t pos[] = {0, 2, 8, 9, 12};
    check(&r, it, 5, w, 3, of, pos);
    dt_bucket_cut cuts[4];
    int of2[5];
    dt_bucket_plan(&r, it, 5, cuts, of2, NULL);
    assert_int_equal(cuts[0].cls, 0);
    assert_int_equal(cuts[1].cls, 1);
    assert_int_equal(cuts[2].cls, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_first_cap_and_oversized),
        cmocka_unit_test(test_large_first_cap_and_exact_fit),
        cmocka_unit_test(test_skipped_items_and_gaps),
        cmocka_unit_test(test_hole_cuts),
        cmocka_unit_test(test_padding_packs_buckets),
        cmocka_unit_test(test_empty_items),
        cmocka_unit_test(test_classes_never_mix),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
