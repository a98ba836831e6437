/* dt_count_correct: argmax (first on ties) vs labels, negative labels never
 * match, bad input returns -1 with a message. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include "op_test_util.h"

static void test_count(void **state) {
    (void)state;
    float v[4 * 3] = {0.1f, 0.9f, 0.0f,    /* argmax 1 */
                      2.0f, 2.0f, 1.0f,    /* tie -> 0 */
                      -1.0f, -3.0f, -0.5f, /* argmax 2 */
                      5.0f, 0.0f, 0.0f};   /* argmax 0 */
    dt_tensor t;
    dt_tensor_view(&t, v, DT_F32, 2, (int64_t[]){4, 3});
    int32_t labels[4] = {1, 0, 1, -1};
    assert_int_equal(dt_count_correct(&t, labels), 2);
    int32_t all[4] = {1, 0, 2, 0};
    assert_int_equal(dt_count_correct(&t, all), 4);
    int32_t tie1[4] = {0, 1, 0, 1};
    assert_int_equal(dt_count_correct(&t, tie1), 0);
}

static void test_bad(void **state) {
    (void)state;
    float v[3] = {0};
    dt_tensor t;
    dt_tensor_view(&t, v, DT_F32, 2, (int64_t[]){1, 3});
    assert_int_equal(dt_count_correct(&t, NULL), -1);
    assert_non_null(strstr(dt_error_message(), "count_correct"));
    assert_int_equal(dt_count_correct(NULL, (int32_t[]){0}), -1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_count),
        cmocka_unit_test(test_bad),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
