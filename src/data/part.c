/* The uneven split of one sequence of n items (a Fashion-MNIST training set,
 * one token file): part r of `world` gets the contiguous range sized in
 * proportion to r + 1 -- the first rank the least, the last the most (2
 * ranks: 1/3 and 2/3; 4 ranks: 1/10, 2/10, 3/10, 4/10) -- so the ranks run
 * different numbers of steps by design. A directory of files is split by
 * file instead (token_part.c). */
#include "dataset_internal.h"

/* n * s / w, exact for n < 2^62 and s <= w < 2^31 */
static int64_t scale(int64_t n, int64_t s, int64_t w) { return n / w * s + n % w * s / w; }

void dt_part_range(int64_t n, int rank, int world, int64_t *a, int64_t *b) {
    int64_t w = (int64_t)world * (world + 1) / 2, s0 = (int64_t)rank * (rank + 1) / 2;
    *a = scale(n, s0, w);
    *b = scale(n, s0 + rank + 1, w);
}
