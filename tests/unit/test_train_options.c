/* dt_train_opts_validate refuses, for library users as for the CLI, numbers
 * that mean nothing (negative counts) and sizes whose products would
 * overflow the trainer's arithmetic, and contradictions, naming the setting
 * by its option field (train.batch; the CLI writes it as --batch). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <string.h>

#include "dtrain/train.h"

/* o is refused with a message that begins with want: the setting named by
 * its option field (train.batch), never a CLI flag (the CLI writes flags) */
static void expect_invalid(const dt_train_opts *o, const char *want) {
    dt_error_clear();
    assert_int_equal(dt_train_opts_validate(o), DT_EINVAL);
    if (strncmp(dt_error_message(), want, strlen(want))) fail_msg("wanted '%s...', got: %s", want, dt_error_message());
    if (strstr(dt_error_message(), "--")) fail_msg("a flag in library text: %s", dt_error_message());
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
    o.batch = 0;
    expect_invalid(&o, "train.batch must be positive, got 0");
    dt_train_opts_default(&o);
    o.model = dt_model_cfg_default(DT_MODEL_GPT2);
    o.seq = 0;
    expect_invalid(&o, "train.seq 0 must be in 1..128 (the model's arch.max_t)");
    dt_train_opts_default(&o);
    o.steps = -1;
    expect_invalid(&o, "train.steps must be >= 0");
    dt_train_opts_default(&o);
    o.epochs = 0;
    expect_invalid(&o, "give train.steps or a positive train.epochs");
    dt_train_opts_default(&o);
    o.accum = 0;
    expect_invalid(&o, "train.accum must be >= 1");
    dt_train_opts_default(&o);
    o.eval_batches = -1;
    expect_invalid(&o, "train.eval_batches must be >= 0 (0: all), got -1");
    dt_train_opts_default(&o);
    o.log_every = -5;
    expect_invalid(&o, "train.log_every must be >= 0 (0: about 20 lines a run), got -5");
    dt_train_opts_default(&o);
    o.stop_after = -1;
    expect_invalid(&o, "train.stop_after must be >= 0, got -1");
    dt_train_opts_default(&o);
    o.clip = -1;
    expect_invalid(&o, "train.clip must be >= 0");
    dt_train_opts_default(&o);
    o.min_lr = 1;
    expect_invalid(&o, "train.min_lr must be in [0, train.optim.lr]");
    dt_train_opts_default(&o);
    o.warmup = -1;
    expect_invalid(&o, "train.warmup must be >= 0");
    dt_train_opts_default(&o);
    o.threads = -1;
    expect_invalid(&o, "train.threads must be >= 0");
    dt_train_opts_default(&o);
    o.threads = 1 << 30;
    expect_invalid(&o, "train.threads 1073741824: at most ");
    dt_train_opts_default(&o);
    o.recompute = (dt_recompute)7;
    expect_invalid(&o, "train.recompute: unknown mode 7");
    dt_train_opts_default(&o);   /* subnormal: flushed to 0 once denormals are off (a fixed scale became 65536) */
    o.loss_scale = DT_LOSS_SCALE_FIXED;
    o.loss_scale_init = 1e-40f;
    expect_invalid(&o, "train.loss_scale_init must be from 1.2e-38 up to 2^64");
    o.loss_scale_init = 1e-37f;
    assert_int_equal(dt_train_opts_validate(&o), DT_OK);
}

static void test_contradictions(void **state) {
    (void)state;
    dt_train_opts o;
    const char *empty[] = {""};
    dt_train_opts_default(&o);
    o.save_every = -1;
    expect_invalid(&o, "train.save_every must be >= 0");
    dt_train_opts_default(&o);
    o.save_every = 2;
    expect_invalid(&o, "train.save_every needs train.save PATH");
    dt_train_opts_default(&o);
    o.n_freeze = 1;
    expect_invalid(&o, "train.freeze: 1 patterns without a list");
    o.freeze = empty;
    expect_invalid(&o, "train.freeze: pattern 1 is empty");
    dt_train_opts_default(&o);
    o.unfreeze_at = -1;
    expect_invalid(&o, "train.unfreeze_at must be >= 0 (0: never)");
    o.unfreeze_at = 3;
    expect_invalid(&o, "train.unfreeze_at needs train.freeze PATTERN (what to unfreeze)");
    dt_train_opts_default(&o);
    o.init = "a";
    o.resume = "b";
    expect_invalid(&o, "train.init and train.resume are exclusive");
    dt_train_opts_default(&o);
    o.uneven = 1;
    o.resume = "b";
    expect_invalid(&o, "train.uneven does not combine with train.resume (ranks stop at different steps)");
    o.resume = NULL;
    o.save = "x";
    o.save_every = 2;
    expect_invalid(&o, "train.uneven does not combine with train.save_every (ranks");
    o.save_every = 0;
    o.stop_after = 2;
    expect_invalid(&o, "train.uneven does not combine with train.stop_after (ranks");
    o.stop_after = 0;   /* the rank that ran out of data would miss the unfreezing's collective */
    static const char *freeze[] = {"fc1.*"};
    o.freeze = freeze;
    o.n_freeze = 1;
    o.unfreeze_at = 3;
    expect_invalid(&o, "train.uneven does not combine with train.unfreeze_at (ranks");
}

static void test_overflowing_products(void **state) {
    (void)state;
    dt_train_opts o;
    dt_train_opts_default(&o);
    o.batch = INT64_MAX;   /* batch x accum would wrap */
    expect_invalid(&o, "train.batch 9223372036854775807 x train.accum 1 is too large (at most 2^40 samples");
    dt_train_opts_default(&o);
    o.batch = (int64_t)1 << 20;
    o.accum = 1 << 21;   /* 2^41 samples per step */
    expect_invalid(&o, "train.batch 1048576 x train.accum 2097152 is too large");
    dt_train_opts_default(&o);
    o.model = dt_model_cfg_default(DT_MODEL_GPT2);
    o.batch = (int64_t)1 << 36;   /* x train.seq 64 = 2^42 tokens */
    expect_invalid(&o, "train.batch 68719476736 x train.accum 1 x train.seq 64 is too large (at most 2^40 tokens");
    dt_train_opts_default(&o);
    o.eval_batches = INT64_MAX / 2;   /* x train.batch 64 wraps */
    expect_invalid(&o, "train.eval_batches 4611686018427387903 x train.batch 64 is too large (use 0 for all)");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults_valid),
        cmocka_unit_test(test_bad_numbers),
        cmocka_unit_test(test_contradictions),
        cmocka_unit_test(test_overflowing_products),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
