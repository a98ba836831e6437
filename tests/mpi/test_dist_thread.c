/* The collective and deterministic tests again, in DT_PROGRESS_THREAD mode
 * (a communication thread per group runs the operations with blocking MPI
 * calls in issue order), and the node-shared-memory ones (the thread runs
 * them too). */
#define DIST_TEST_MODE DT_PROGRESS_THREAD
#define DIST_TEST_NO_MAIN
#include "test_dist_collectives.c"
#include "test_dist_deterministic.c"
#include "test_dist_shm.c"

int main(int argc, char **argv) {
    t_init(&argc, &argv);
    T_CHECK(dt_dist_progress_mode() == DT_PROGRESS_THREAD);
    run_collective_tests();
    run_det_tests();
    run_shm_tests();
    T_OK(dt_dist_finalize());
    return 0;
}
