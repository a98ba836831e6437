/* Temporary directories for test fixtures. */
#ifndef DT_TEST_TMPDIR_H
#define DT_TEST_TMPDIR_H
#include <stddef.h>
/* mkdtemp("/tmp/dt_test_<tag>_XXXXXX") into buf; 0 on success. */
int dt_test_tmpdir(char *buf, size_t n, const char *tag);
/* Remove a file or a directory tree (no symlink following; directories a
 * test made read-only are made writable first). */
void dt_test_rm_rf(const char *path);
#endif
