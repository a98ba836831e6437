/* Elastic restarts (cli/elastic.c): the world a job continues on when some
 * of its machines no longer answer. Expected worlds are worked out by hand
 * from the rule: the largest W <= min(N, slots), W >= --min-nproc, that the
 * pipeline's stages divide and whose replicas divide the job's micro-steps
 * per step (A x D), so the global batch is kept. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <string.h>
#include "cli.h"

static int world(int nproc, int min_nproc, int stages, int accum, int slots, int *acc) {
    dt_cli_elastic e = {.nproc = nproc, .min_nproc = min_nproc, .stages = stages, .accum = accum};
    *acc = -1;
    return dt_cli_elastic_world(&e, slots, acc);
}

/* --tp T: a replica is stages x T ranks, so the world is a multiple of it.
 * 4 ranks = 2 replicas x tp 2 x accum 3, 3 slots left: 3 ranks would not
 * split into tp groups of 2 (it chose 3 before and every attempt failed),
 * so 2 ranks = 1 replica x accum 6. */
static void test_tensor_parallel_replicas(void **st) {
    (void)st;
    int acc = -1;
    dt_cli_elastic e = {.nproc = 4, .min_nproc = 2, .stages = 1, .accum = 3, .tp = 2};
    assert_int_equal(dt_cli_elastic_world(&e, 3, &acc), 2);
    assert_int_equal(acc, 6);
    /* pp 2 x tp 2 x 2 replicas = 8 ranks, 6 slots: one replica of 4 ranks, twice the micro-steps */
    dt_cli_elastic p = {.nproc = 8, .min_nproc = 4, .stages = 2, .accum = 2, .tp = 2};
    assert_int_equal(dt_cli_elastic_world(&p, 6, &acc), 4);
    assert_int_equal(acc, 4);
    /* fewer slots than one replica: none */
    assert_int_equal(dt_cli_elastic_world(&p, 3, &acc), 0);
}

static void test_all_answer_keeps_the_world(void **st) {
    (void)st;
    int acc;
    assert_int_equal(world(4, 2, 1, 1, 4, &acc), 4);
    assert_int_equal(acc, 1);
    /* spare slots never grow the job */
    assert_int_equal(world(4, 4, 1, 3, 6, &acc), 4);
    assert_int_equal(acc, 3);
}

static void test_shrink_keeps_the_global_batch(void **st) {
    (void)st;
    int acc;
    /* DDP 4 ranks x accum 1, a machine of 2 lost: 2 ranks x accum 2 */
    assert_int_equal(world(4, 2, 1, 1, 2, &acc), 2);
    assert_int_equal(acc, 2);
    /* 4 ranks x accum 1 on 3 slots: 3 does not divide 4 micro-steps, so 2 */
    assert_int_equal(world(4, 1, 1, 1, 3, &acc), 2);
    assert_int_equal(acc, 2);
    /* 6 ranks x accum 2 (12 micro-steps) on 5 slots: 5 does not divide 12, 4 does (3 each) */
    assert_int_equal(world(6, 1, 1, 2, 5, &acc), 4);
    assert_int_equal(acc, 3);
}

static void test_pipeline_stages_divide_the_world(void **st) {
    (void)st;
    int acc;
    /* pp 2 x dp 2, 2 micro-batches each (4 per step): pp 2 x dp 1, 4 micro-batches */
    assert_int_equal(world(4, 2, 2, 2, 3, &acc), 2);
    assert_int_equal(acc, 4);
    /* pp 4 on 3 slots: no world splits into 4 stages */
    assert_int_equal(world(4, 1, 4, 2, 3, &acc), 0);
}

/* interleaved: the micro-batches stay a multiple of --pp. pp 2 x dp 3,
 * 2 micro-batches each (6 per step), 4 slots: pp 2 x dp 2 would run 3
 * micro-batches (the schedule refuses 3 with P 2, every attempt failed), so
 * pp 2 x dp 1 with 6. */
static void test_interleaved_keeps_micro_batches_a_multiple_of_stages(void **st) {
    (void)st;
    int acc = -1;
    dt_cli_elastic e = {.nproc = 6, .min_nproc = 2, .stages = 2, .accum = 2, .accum_multiple = 2};
    assert_int_equal(dt_cli_elastic_world(&e, 4, &acc), 2);
    assert_int_equal(acc, 6);
    e.accum_multiple = 1;   /* 1f1b: 3 is fine */
    assert_int_equal(dt_cli_elastic_world(&e, 4, &acc), 4);
    assert_int_equal(acc, 3);
}

static int has_pair(char **av, int n, const char *flag, const char *val) {
    for (int i = 0; i + 1 < n; i++)
        if (!strcmp(av[i], flag) && (!val || !strcmp(av[i + 1], val))) return 1;
    return 0;
}

/* A resized restart of a pipeline of one stage (--pp 1 --microbatches 4:
 * the pipeline engine, micro-batches of --batch / 4) rescales
 * --microbatches and --batch; it used to pass --accum beside them, which
 * the CLI refuses with a pipeline, so every restart failed. */
static void test_restart_flags_of_a_one_stage_pipeline(void **st) {
    (void)st;
    char *argv[] = {"dtrain", "train", "--pp", "1", "--microbatches", "4", "--batch=8", "--save", "ck", NULL};
    dt_cli_restart r = {.max_restarts = 2, .stages = 1, .accum = 4, .piped = 1, .microbatch_multiple = 1,
                        .batch = 2, .save = "ck"};
    char *av[9 + 9];
    dt_cli_restart_vals v;
    int n = dt_cli_restart_argv(9, argv, &r, 1, 8, 1, av, &v);
    assert_null(av[n]);
    assert_false(has_pair(av, n, "--accum", NULL));
    assert_true(has_pair(av, n, "--microbatches", "8"));
    assert_true(has_pair(av, n, "--batch", "16"));   /* 8 micro-batches of 2 */
    assert_true(has_pair(av, n, "--resume", "ck"));
    assert_true(has_pair(av, n, "--pp", "1"));
    for (int i = 0; i < n; i++) {
        assert_string_not_equal(av[i], "--batch=8");
        assert_string_not_equal(av[i], "4");
    }
    /* DDP: --accum, and --batch kept as given */
    char *ddp[] = {"dtrain", "train", "--accum", "2", "--batch", "8", "--save", "ck", NULL};
    dt_cli_restart d = {.max_restarts = 2, .stages = 1, .accum = 2, .batch = 8, .save = "ck"};
    n = dt_cli_restart_argv(8, ddp, &d, 1, 4, 0, av, &v);
    assert_true(has_pair(av, n, "--accum", "4"));
    assert_true(has_pair(av, n, "--batch", "8"));
    assert_false(has_pair(av, n, "--microbatches", NULL));
    assert_false(has_pair(av, n, "--resume", NULL));
    assert_int_equal(n, 8);
}

static void test_min_nproc_is_a_floor(void **st) {
    (void)st;
    int acc;
    assert_int_equal(world(4, 3, 1, 1, 2, &acc), 0);   /* 2 left, 3 required */
    assert_int_equal(world(4, 4, 1, 1, 3, &acc), 0);   /* default floor: the job's own world */
    assert_int_equal(world(8, 3, 1, 1, 7, &acc), 4);   /* 7, 6, 5 do not divide 8 micro-steps */
    assert_int_equal(acc, 2);
    assert_int_equal(world(8, 5, 1, 1, 7, &acc), 0);   /* ... and 4 is below the floor */
}

static void test_subset_keeps_the_answering_hosts_in_order(void **st) {
    (void)st;
    char names[3][256] = {"a", "b", "c"};
    int slots[3] = {2, 2, 1}, keep[3] = {1, 0, 1};
    dt_cli_hosts h = {.n = 3, .name = names, .slots = slots, .total = 5, .hostfile = "hosts.txt"};
    dt_cli_hosts s;
    assert_int_equal(dt_cli_hosts_subset(&h, keep, &s), 0);
    assert_int_equal(s.n, 2);
    assert_int_equal(s.total, 3);
    assert_string_equal(s.name[0], "a");
    assert_string_equal(s.name[1], "c");
    assert_int_equal(s.slots[1], 1);
    assert_null(s.hostfile);   /* the hosts left go to mpirun as a list */
    assert_string_equal(s.desc, "a:2,c:1");
    dt_cli_hosts_free(&s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tensor_parallel_replicas),
        cmocka_unit_test(test_all_answer_keeps_the_world),
        cmocka_unit_test(test_shrink_keeps_the_global_batch),
        cmocka_unit_test(test_pipeline_stages_divide_the_world),
        cmocka_unit_test(test_min_nproc_is_a_floor),
        cmocka_unit_test(test_interleaved_keeps_micro_batches_a_multiple_of_stages),
        cmocka_unit_test(test_restart_flags_of_a_one_stage_pipeline),
        cmocka_unit_test(test_subset_keeps_the_answering_hosts_in_order),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
