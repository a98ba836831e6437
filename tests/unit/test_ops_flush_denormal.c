/* dt_cpu_set_flush_denormal: a product that underflows into the denormal
 * range is kept (IEEE) when off and becomes zero when on, on the calling
 * thread and on every OpenMP worker; a denormal input reads as zero when on.
 * The trainer turns it on by default and off with keep_denormals. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <float.h>
#include <omp.h>
#include "dtrain/ops.h"
#include "dtrain/train.h"

static volatile float tiny = 1e-30f, scale = 1e-10f, denormal = FLT_MIN / 4;

/* 1 if this thread flushes: the 1e-40 product and the denormal input both zero */
static int flushes_here(void) { return tiny * scale == 0.0f && denormal * 1.0f == 0.0f; }

/* number of OpenMP threads (of n) that flush */
static int flushing_threads(int n) {
    int count = 0;
#pragma omp parallel num_threads(n) reduction(+ : count)
    count += flushes_here();
    return count;
}

static void test_on_off(void **state) {
    (void)state;
    omp_set_num_threads(2);
    assert_int_equal(dt_cpu_set_flush_denormal(0), DT_OK);
    assert_false(dt_cpu_flush_denormal());
    assert_true(tiny * scale > 0.0f);   /* IEEE: a denormal result */
    assert_int_equal(flushing_threads(2), 0);
    assert_int_equal(dt_cpu_set_flush_denormal(1), DT_OK);
    assert_true(dt_cpu_flush_denormal());
    assert_true(flushes_here());
    assert_int_equal(flushing_threads(2), 2);
    assert_true(1e-20f * (float)scale > 0.0f);   /* normal results are untouched */
    assert_int_equal(dt_cpu_set_flush_denormal(0), DT_OK);
    assert_false(flushes_here());
    assert_int_equal(flushing_threads(2), 0);
}

/* The trainer: default flushes, keep_denormals restores IEEE. Building a
 * trainer needs data; the MLP on a missing directory fails after the mode
 * was set, which is all this checks. */
static void test_trainer_default(void **state) {
    (void)state;
    dt_train_opts o;
    dt_train_opts_default(&o);
    o.data_path = "/nonexistent-dtrain-test";
    o.threads = 2;
    dt_trainer *t = NULL;
    assert_int_equal(dt_cpu_set_flush_denormal(0), DT_OK);
    assert_int_not_equal(dt_trainer_create(&o, NULL, &t), DT_OK);
    assert_true(flushes_here());
    assert_int_equal(flushing_threads(2), 2);
    o.keep_denormals = 1;
    assert_int_not_equal(dt_trainer_create(&o, NULL, &t), DT_OK);
    assert_false(flushes_here());
    assert_int_equal(flushing_threads(2), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_on_off),
        cmocka_unit_test(test_trainer_default),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
