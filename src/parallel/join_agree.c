/* The activity agreement of join (DDP's and ZeRO's): every rank contributes
 * its rank if still active, else -1, with one float of its own (ZeRO: its
 * LR); the highest active rank is PyTorch's common rank, whose buffers (and
 * value) every rank adopts. Ranks are exact in float below 2^24. */
#include <stdlib.h>
#include "parallel_internal.h"

dt_status dt_par_join_agree(dt_pg *pg, int active, float value, int *top, float *top_value) {
    int world = dt_pg_size(pg);
    float mine[2] = {active ? (float)dt_pg_rank(pg) : -1.0f, value}, stack[32], *all = stack;
    if (world > 16 && !(all = malloc((size_t)world * sizeof mine)))
        return DT_ERR(DT_ENOMEM, "join: out of memory for the activity of %d ranks", world);
    dt_status s = dt_allgather(pg, mine, all, 2, DT_F32, NULL);
    *top = -1;
    for (int r = 0; s == DT_OK && r < world; r++)
        if (all[2 * r] >= 0.0f && (int)all[2 * r] > *top) {
            *top = (int)all[2 * r];
            if (top_value) *top_value = all[2 * r + 1];
        }
    if (all != stack) free(all);
    return s;
}
