/* Environment for tests that run `dtrain --nproc N` (mpirun as root). */
#ifndef DT_TEST_CLI_ENV_H
#define DT_TEST_CLI_ENV_H
/* Allows mpirun as root, and under ASan turns leak detection off in the
 * launched ranks: Open MPI dlcloses its plugins at finalize, so their
 * allocations show up as leaks from "<unknown module>" that no suppression
 * can name. Library leaks are checked by the unit tests themselves. */
void dt_test_cli_mpi_env(void);
#endif
