/* LR schedule at its key points, clip scale, and dt_sumsq against a plain
 * double sum. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <omp.h>

#include "dtrain/optim.h"

static int near(double a, double b, double rtol) { return fabs(a - b) <= rtol * fabs(b); }

static void test_schedule_warmup_cosine(void **st) {
    (void)st;
    const double lr = 6e-4, lo = 6e-5;
    dt_lr_schedule s = {.lr = (float)lr, .min_lr = (float)lo, .warmup = 10, .total = 110};
    /* warm-up: lr*(step+1)/warmup */
    assert_true(near(dt_lr_at(&s, 0), lr / 10, 1e-6));
    assert_true(near(dt_lr_at(&s, 4), lr * 5 / 10, 1e-6));
    assert_true(near(dt_lr_at(&s, 9), lr, 1e-6));
    /* cosine starts at lr, passes (lr+min)/2 halfway, approaches min */
    assert_true(near(dt_lr_at(&s, 10), lr, 1e-6));
    assert_true(near(dt_lr_at(&s, 60), (lr + lo) / 2, 1e-6));
    assert_true(dt_lr_at(&s, 109) > (float)lo);
    assert_true(near(dt_lr_at(&s, 109), lo, 1e-2));
    assert_true(dt_lr_at(&s, 110) == (float)lo);
    assert_true(dt_lr_at(&s, 100000) == (float)lo);
    /* strictly decreasing over the cosine part */
    for (int64_t t = 11; t < 110; t++) assert_true(dt_lr_at(&s, t) < dt_lr_at(&s, t - 1));
    /* strictly increasing over warm-up */
    for (int64_t t = 1; t < 10; t++) assert_true(dt_lr_at(&s, t) > dt_lr_at(&s, t - 1));
}

static void test_schedule_quarter_point(void **st) {
    (void)st;
    dt_lr_schedule s = {.lr = 1.0f, .min_lr = 0.0f, .warmup = 0, .total = 100};
    assert_true(dt_lr_at(&s, 0) == 1.0f);   /* no warm-up: starts at lr */
    /* 25% through: 0.5*(1+cos(pi/4)) */
    assert_true(near(dt_lr_at(&s, 25), 0.5 * (1 + sqrt(0.5)), 1e-6));
    assert_true(near(dt_lr_at(&s, 50), 0.5, 1e-6));
    assert_true(dt_lr_at(&s, 100) == 0.0f);
}

static void test_schedule_constant(void **st) {
    (void)st;
    dt_lr_schedule s = {.lr = 0.1f, .min_lr = 0.01f, .warmup = 4, .total = 0};
    assert_true(near(dt_lr_at(&s, 0), 0.025, 1e-6));
    assert_true(near(dt_lr_at(&s, 2), 0.075, 1e-6));
    assert_true(dt_lr_at(&s, 3) == 0.1f);
    assert_true(dt_lr_at(&s, 4) == 0.1f);
    assert_true(dt_lr_at(&s, 1000000) == 0.1f);
    s.total = -5;
    s.warmup = 0;
    assert_true(dt_lr_at(&s, 0) == 0.1f && dt_lr_at(&s, 77) == 0.1f);
}

static void test_clip_scale(void **st) {
    (void)st;
    assert_true(near(dt_clip_scale(10.0, 1.0f), 1.0 / (10.0 + 1e-6), 1e-6));
    assert_true(near(dt_clip_scale(4.0, 2.0f), 0.5, 1e-6));
    assert_true(dt_clip_scale(0.5, 1.0f) == 1.0f);   /* below the max: no clipping */
    assert_true(near(dt_clip_scale(1.0, 1.0f), 1.0 / (1.0 + 1e-6), 1e-7));   /* PyTorch's 1e-6 */
    assert_true(dt_clip_scale(0.0, 1.0f) == 1.0f);
    assert_true(dt_clip_scale(1e9, 0.0f) == 1.0f);   /* disabled */
    assert_true(dt_clip_scale(1e9, -1.0f) == 1.0f);
    assert_true(dt_clip_scale(INFINITY, 1.0f) == 0.0f);
}

static void test_sumsq(void **st) {
    (void)st;
    float small[3] = {1.0f, -2.0f, 3.0f};
    assert_true(dt_sumsq(small, 3) == 14.0);
    assert_true(dt_sumsq(small, 0) == 0.0);
    size_t n = 1000003;
    float *x = malloc(n * sizeof *x);
    assert_non_null(x);
    uint64_t r = 42;
    double want = 0;
    for (size_t i = 0; i < n; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((double)(r >> 40) / 16777216.0 - 0.5) * 3.0f;
        want += (double)x[i] * (double)x[i];
    }
    int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    double s1 = dt_sumsq(x, n);
    omp_set_num_threads(3);
    double s3 = dt_sumsq(x, n), s3b = dt_sumsq(x, n);
    omp_set_num_threads(saved);
    assert_true(near(s1, want, 1e-12));
    assert_true(near(s3, want, 1e-12));
    assert_true(s3 == s3b);   /* reproducible for a fixed thread count */
    /* odd length and offset: tail handling */
    double w2 = 0;
    for (size_t i = 3; i < 3 + 1001; i++) w2 += (double)x[i] * (double)x[i];
    assert_true(near(dt_sumsq(x + 3, 1001), w2, 1e-12));
    free(x);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_schedule_warmup_cosine),
        cmocka_unit_test(test_schedule_quarter_point),
        cmocka_unit_test(test_schedule_constant),
        cmocka_unit_test(test_clip_scale),
        cmocka_unit_test(test_sumsq),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
