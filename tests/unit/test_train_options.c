/* dt_train_opts_validate refuses, for library users as for the CLI, numbers
 * that mean nothing (negative counts) and sizes whose products would
 * overflow the trainer's arithmetic, naming the flag. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <string.h>

#include "dtrain/train.h"

static void expect_invalid(const dt_train_opts *o, const char *needle) {
    dt_error_clear();
    assert_int_equal(dt_train_opts_validate(o), DT_EINVAL);
    if (!strstr(dt_error_message(), needle)) fail_msg("wanted '%s' in: %s", needle, dt_error_message());
}

static void test_defaults_valid(void **state) {
    (void)state;
    dt_train_opts o;
    dt_train_opts_default(&o);
    assert_int_equal(dt_train_opts_validate(&o), DT_OK);
    o.batch = (int64_t)1 << 40;   /* the largest step: 2^40 samples */
    assert_int_equal(dt_train_opts_validate(&o), DT_OK);
}

static void test_bad_numbers(void **state) {
    (void)state;
    dt_train_opts o;
    dt_train_opts_default(&o);
    o.eval_batches = -1;
    expect_invalid(&o, "--eval-batches");
    dt_train_opts_default(&o);
    o.log_every = -5;
    expect_invalid(&o, "--log-every");
    dt_train_opts_default(&o);
    o.stop_after = -1;
    expect_invalid(&o, "--stop-after");
    dt_train_opts_default(&o);
    o.threads = 1 << 30;
    expect_invalid(&o, "--threads");
}

static void test_overflowing_products(void **state) {
    (void)state;
    dt_train_opts o;
    dt_train_opts_default(&o);
    o.batch = INT64_MAX;   /* batch x accum would wrap */
    expect_invalid(&o, "--batch 9223372036854775807");
    dt_train_opts_default(&o);
    o.batch = (int64_t)1 << 20;
    o.accum = 1 << 21;   /* 2^41 samples per step */
    expect_invalid(&o, "--accum 2097152");
    dt_train_opts_default(&o);
    o.model = dt_model_cfg_default(DT_MODEL_GPT2);
    o.batch = (int64_t)1 << 36;   /* x --seq 64 = 2^42 tokens */
    expect_invalid(&o, "--seq 64");
    dt_train_opts_default(&o);
    o.eval_batches = INT64_MAX / 2;   /* x --batch 64 wraps */
    expect_invalid(&o, "--eval-batches");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults_valid),
        cmocka_unit_test(test_bad_numbers),
        cmocka_unit_test(test_overflowing_products),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
