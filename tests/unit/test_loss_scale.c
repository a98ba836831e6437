/* Loss scaling's state machine and step factor (strategy.h): an overflow
 * skips the step and halves a dynamic scale, a window of clean steps in a
 * row doubles it, a fixed scale only skips; the factor the optimizer steps
 * with divides by the scale after clipping the unscaled norm. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <float.h>
#include <math.h>
#include <string.h>
#include "dtrain/strategy.h"

static void test_dynamic(void **st) {
    (void)st;
    dt_loss_scaler ls;
    assert_int_equal(dt_loss_scaler_init(&ls, 65536.0f, 1, 3), DT_OK);
    float f = 0;
    assert_int_equal(dt_loss_scaler_verdict(&ls, INFINITY, 0, &f), 1);   /* overflow: skip */
    assert_int_equal(dt_loss_scaler_verdict(&ls, NAN, 1.0f, &f), 1);
    dt_loss_scaler_update(&ls, 1);
    assert_true(ls.scale == 32768.0f);
    assert_int_equal(ls.skipped, 1);
    dt_loss_scaler_update(&ls, 0);
    dt_loss_scaler_update(&ls, 0);
    assert_true(ls.scale == 32768.0f);
    assert_int_equal(ls.good, 2);
    dt_loss_scaler_update(&ls, 1);   /* an overflow restarts the window */
    assert_true(ls.scale == 16384.0f);
    assert_int_equal(ls.good, 0);
    for (int i = 0; i < 3; i++) dt_loss_scaler_update(&ls, 0);
    assert_true(ls.scale == 32768.0f);   /* three clean steps in a row: doubled */
    assert_int_equal(ls.good, 0);
    assert_int_equal(ls.skipped, 2);
    /* a finite norm steps: the factor unscales (no clip: 1 / S) */
    assert_int_equal(dt_loss_scaler_verdict(&ls, 4.0, 0, &f), 0);
    assert_true(f == 1.0f / 32768.0f);
    assert_int_equal(dt_loss_scaler_verdict(&ls, -1.0, 0, &f), 0);   /* norm not taken */
    assert_true(f == 1.0f / 32768.0f);
    /* clip applies to the unscaled norm: scaled norm 32768 * 2 */
    double ss = (2.0 * 32768.0) * (2.0 * 32768.0);
    assert_int_equal(dt_loss_scaler_verdict(&ls, ss, 1.0f, &f), 0);
    assert_true(f == dt_clip_scale(2.0, 1.0f) / 32768.0f);
    /* the scale stays a normal, finite float */
    ls.scale = FLT_MIN;
    dt_loss_scaler_update(&ls, 1);
    assert_true(ls.scale == FLT_MIN);
    /* ... and it grows no further than 2^64: its inverse, times a clip
     * factor, must stay a normal float (flushed to zero it zeroed every
     * gradient once the scale passed 2^126) */
    ls.scale = 0x1p63f;
    ls.good = 2;
    dt_loss_scaler_update(&ls, 0);
    assert_true(ls.scale == 0x1p64f);
    ls.good = 2;
    dt_loss_scaler_update(&ls, 0);
    assert_true(ls.scale == 0x1p64f);
    ss = (1e6 * 0x1p64) * (1e6 * 0x1p64);   /* a norm a clip of 1 divides by a million */
    assert_int_equal(dt_loss_scaler_verdict(&ls, ss, 1.0f, &f), 0);
    assert_true(f >= FLT_MIN);
}

static void test_fixed(void **st) {
    (void)st;
    dt_loss_scaler ls;
    assert_int_equal(dt_loss_scaler_init(&ls, 1000.0f, 0, 1), DT_OK);
    float f;
    assert_int_equal(dt_loss_scaler_verdict(&ls, INFINITY, 0, &f), 1);
    dt_loss_scaler_update(&ls, 1);
    for (int i = 0; i < 5; i++) dt_loss_scaler_update(&ls, 0);
    assert_true(ls.scale == 1000.0f);
    assert_int_equal(ls.skipped, 1);
}

static void test_bad(void **st) {
    (void)st;
    dt_loss_scaler ls;
    assert_int_equal(dt_loss_scaler_init(&ls, 0.0f, 1, 10), DT_EINVAL);
    assert_int_equal(dt_loss_scaler_init(&ls, INFINITY, 1, 10), DT_EINVAL);
    assert_int_equal(dt_loss_scaler_init(&ls, 0x1p65f, 1, 10), DT_EINVAL);
    assert_non_null(strstr(dt_error_message(), "at most 2^64"));
    assert_int_equal(dt_loss_scaler_init(&ls, 0x1p64f, 0, 10), DT_OK);
    assert_int_equal(dt_loss_scaler_init(&ls, 2.0f, 1, 0), DT_EINVAL);
    assert_non_null(strstr(dt_error_message(), "loss_scale_window"));
    dt_error_clear();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dynamic),
        cmocka_unit_test(test_fixed),
        cmocka_unit_test(test_bad),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
