/* The DDP equivalence, accumulation, hook, join and buffer tests again in
 * DT_PROGRESS_THREAD mode (a communication thread per group runs the
 * reductions while backward computes; no polling from the graph's tick). */
#define DIST_TEST_MODE DT_PROGRESS_THREAD
#define DDP_TEST_NO_MAIN
#include "test_ddp_equivalence.c"
#include "test_ddp_hooks.c"
#include "test_ddp_join.c"
#include "test_ddp_accum.c"
#include "test_ddp_buffers.c"

int main(int argc, char **argv) {
    t_init(&argc, &argv);
    DTT_CHECK(dt_dist_progress_mode() == DT_PROGRESS_THREAD);
    DTT_OK(dt_pg_world(&world));
    test_bitwise_vs_reference();
    test_global_batch();
    test_bucket_caps();
    test_validation();
    test_custom_hook();
    test_compression();
    test_join();
    test_join_misuse();
    test_no_sync();
    test_accum_grads();
    test_broadcast_buffers();
    test_sync_bn();
    DTT_OK(dt_dist_finalize());
    return 0;
}
