/* The error message may quote itself: DT_ERR(code, "...: %s", dt_error_message())
 * wraps the previous message instead of garbling it (the buffer it writes is
 * the one the argument points into). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <string.h>

#include "dtrain/error.h"

static void test_wrap_own_message(void **state) {
    (void)state;
    DT_ERR(DT_EIO, "ckpt.st: cannot open: No such file or directory");
    dt_status s = DT_ERR(DT_EFORMAT, "resume from %s failed: %s", "ckpt.st", dt_error_message());
    assert_int_equal(s, DT_EFORMAT);
    assert_string_equal(dt_error_message(),
                        "resume from ckpt.st failed: ckpt.st: cannot open: No such file or directory");
}

static void test_message_as_first_argument(void **state) {
    (void)state;
    DT_ERR(DT_EINVAL, "inner");
    DT_ERR(DT_EINVAL, "%s, then %s", dt_error_message(), "outer");
    assert_string_equal(dt_error_message(), "inner, then outer");
    DT_ERR(DT_EINVAL, "%s%s", dt_error_message(), dt_error_message());
    assert_string_equal(dt_error_message(), "inner, then outerinner, then outer");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_wrap_own_message),
        cmocka_unit_test(test_message_as_first_argument),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
