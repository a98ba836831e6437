/* Rank placement: which world rank is which (stage, replica).
 *
 * A stage's D replicas exchange every gradient each step (all-reduce or
 * reduce-scatter of the whole stage), its pipeline neighbours only one
 * activation per micro-batch: so the data-parallel groups should stay inside
 * a machine and the pipeline links cross machines. Ranks are ordered by
 * (machine, rank) and cut into consecutive groups of D: position i is stage
 * i / D, replica i % D. When every machine runs a multiple of D ranks, each
 * data-parallel group lies on one machine whatever order the launcher used
 * (by slot or round-robin by node); on one machine it is the identity. */
#include <stdlib.h>
#include "pipe_internal.h"

void dt_pipe_place(const int *node, int W, int *pos) {
    /* stable counting by machine id (ids are ranks < W) */
    int at = 0;
    for (int id = 0; id < W; id++)
        for (int r = 0; r < W; r++)
            if (node[r] == id) pos[r] = at++;
}

int dt_pipe_place_local(const int *node, const int *pos, int W, int D) {
    int *first = malloc((size_t)W * sizeof *first);
    if (!first) return 0;
    for (int i = 0; i < W; i++) first[i] = -1;
    int ok = 1;
    for (int r = 0; r < W; r++) {
        int stage = pos[r] / D;
        if (first[stage] < 0) first[stage] = node[r];
        else if (first[stage] != node[r]) ok = 0;
    }
    free(first);
    return ok;
}
