/* A stop agreed in the last training step with train.save_every dividing
 * it: the run ends as usual (final save, then evaluation, which the pending
 * stop interrupts), and the checkpoint at train.save holds that last step.
 * Before, the loop skipped its save because a stop was agreed and the end
 * of the run skipped the final one because the loop "had saved" it: the
 * file held the step before (or nothing) while the log said "saved".
 * The stop is requested from the log handler when "step 1/N" is logged,
 * so step 2 agrees it (one process: at the end of step 2). MLP on
 * Fashion-MNIST, 2 steps of 8 (the last) and, for comparison, 3 steps (a
 * stop after step 2 of 3: saved by the stop itself). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtrain/log.h"
#include "dtrain/train.h"
#include "tmpdir.h"

static char g_dir[256];
static const char *g_trigger;

static void on_log(void *ctx, dt_log_level level, const char *msg) {
    (void)ctx; (void)level;
    if (g_trigger && strstr(msg, g_trigger)) dt_train_request_stop(SIGTERM);
}

static void run_and_stop(int steps, const char *trigger, const char *want_step) {
    char path[300];
    snprintf(path, sizeof path, "%s/ck%d.st", g_dir, steps);
    dt_train_opts o;
    dt_train_opts_default(&o);
    o.model.mlp_n_hidden = 1;
    o.model.mlp_hidden[0] = 16;
    o.batch = 8;
    o.steps = steps;
    o.save = path;
    o.save_every = 1;
    o.log_every = 1;
    o.eval_batches = 1;
    o.threads = 1;
    dt_trainer *t;
    assert_int_equal(dt_trainer_create(&o, NULL, &t), DT_OK);
    g_trigger = trigger;
    dt_log_set_handler(on_log, NULL);
    dt_status s = dt_trainer_run(t);
    dt_log_set_handler(dt_log_default_handler, NULL);
    g_trigger = NULL;
    if (s != DT_OK) fail_msg("run: %s", dt_error_message());
    assert_int_equal(dt_train_stopped(), SIGTERM);
    dt_trainer_free(t);
    dt_ckpt *c;
    if (dt_ckpt_open(path, &c) != DT_OK) fail_msg("%d steps: no checkpoint: %s", steps, dt_error_message());
    const char *step = dt_ckpt_get_meta(c, "step");
    assert_non_null(step);
    if (strcmp(step, want_step)) fail_msg("%d steps, stopped in step %s: the checkpoint is at step %s", steps, want_step, step);
    dt_ckpt_close(c);
}

static void test_stop_in_the_last_step_saves_it(void **st) {
    (void)st;
    run_and_stop(2, "step 1/2", "2");
}

static void test_stop_in_an_earlier_step_saves_it(void **st) {
    (void)st;
    run_and_stop(3, "step 1/3", "2");
}

int main(void) {
    if (dt_test_tmpdir(g_dir, sizeof g_dir, "stop_last")) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stop_in_the_last_step_saves_it),
        cmocka_unit_test(test_stop_in_an_earlier_step_saves_it),
    };
    int r = cmocka_run_group_tests(tests, NULL, NULL);
    dt_test_rm_rf(g_dir);
    return r;
}
