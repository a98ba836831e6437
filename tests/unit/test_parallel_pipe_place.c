/* Pipeline rank placement (pipe/strategy.c): ranks ordered by (machine, rank),
 * cut into data-parallel groups of D. Expected places worked out by hand. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include "parallel/pipe/pipe_internal.h"

static void check(const int *node, int W, int D, const int *want_pos, int want_local) {
    int pos[16];
    dt_pipe_place(node, W, pos);
    for (int r = 0; r < W; r++) assert_int_equal(pos[r], want_pos[r]);
    assert_int_equal(dt_pipe_place_local(node, pos, W, D), want_local);
}

static void test_one_machine_is_identity(void **state) {
    (void)state;
    check((int[]){0, 0, 0, 0}, 4, 2, (int[]){0, 1, 2, 3}, 1);
}

static void test_by_slot(void **state) {
    (void)state;
    /* ranks 0,1 on machine A, 2,3 on B: already grouped */
    check((int[]){0, 0, 2, 2}, 4, 2, (int[]){0, 1, 2, 3}, 1);
}

static void test_round_robin(void **state) {
    (void)state;
    /* --map-by node: 0,2 on A, 1,3 on B. Order (A: 0, 2), (B: 1, 3):
     * rank 0 -> 0, rank 2 -> 1, rank 1 -> 2, rank 3 -> 3; with D = 2 stage 0
     * is {0, 2} (A) and stage 1 {1, 3} (B): both groups on one machine,
     * where r / D would have put 0 and 1 (two machines) together. */
    check((int[]){0, 1, 0, 1}, 4, 2, (int[]){0, 2, 1, 3}, 1);
    /* 6 ranks round-robin over 3 machines (A: 0,3  B: 1,4  C: 2,5), D = 2 */
    check((int[]){0, 1, 2, 0, 1, 2}, 6, 2, (int[]){0, 2, 4, 1, 3, 5}, 1);
}

static void test_uneven_machines(void **state) {
    (void)state;
    /* 3 ranks on A, 1 on B, D = 2: the second group has A's last and B's
     * rank, so it spans machines */
    check((int[]){0, 0, 0, 3}, 4, 2, (int[]){0, 1, 2, 3}, 0);
    /* D = 1: every group is one rank */
    check((int[]){0, 0, 0, 3}, 4, 1, (int[]){0, 1, 2, 3}, 1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_machine_is_identity),
        cmocka_unit_test(test_by_slot),
        cmocka_unit_test(test_round_robin),
        cmocka_unit_test(test_uneven_machines),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
