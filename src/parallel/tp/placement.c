/* Tensor-parallel groups sit inside one machine (tp_internal.h "Placement").
 *
 * A TP group all-reduces [B, T, C] activations in every layer, forward and
 * backward: on one machine through node-shared memory (comm.c), across
 * machines over the network at several times the data-parallel traffic
 * (docs/ARCHITECTURE.md). A layout that puts one across machines is refused
 * rather than run slowly: nothing is lost by refusing, since the same ranks
 * placed by slot (or a rank count per machine that T divides) give groups
 * on one machine. Every rank knows every rank's machine (dt_pg_node_of), so
 * each reaches the same verdict without a collective. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tp_internal.h"

dt_status dt_tp_check_placement(dt_pg *world, int T, const int *pos) {
    int W = dt_pg_size(world);
    if (T <= 1) return DT_OK;
    int *node = malloc((size_t)W * sizeof *node), *at = malloc((size_t)W * sizeof *at);
    dt_status st = node && at ? dt_pg_node_of(world, node) : DT_ERR(DT_ENOMEM, "tp: out of memory for %d ranks", W);
    for (int r = 0; st == DT_OK && r < W; r++) at[pos ? pos[r] : r] = r;   /* at[place] = world rank */
    for (int g = 0; st == DT_OK && g < W / T; g++) {
        int first = at[g * T], k = 1;
        while (k < T && node[at[g * T + k]] == node[first]) k++;
        if (k == T) continue;
        char ranks[256], hosts[512];
        int o = 0, h = 0;
        for (int j = 0; j < T; j++) {
            int r = at[g * T + j];
            if (o < (int)sizeof ranks - 16) o += snprintf(ranks + o, sizeof ranks - (size_t)o, "%s%d", j ? ", " : "", r);
            if (h < (int)sizeof hosts - 80)
                h += snprintf(hosts + h, sizeof hosts - (size_t)h, "%srank %d on %s%s", j ? ", " : "", r,
                              dt_pg_host_name(world, r), node[r] != node[first] && !strcmp(dt_pg_host_name(world, r),
                              dt_pg_host_name(world, first)) ? " (another machine by DTRAIN_TEST_MACHINES)" : "");
        }
        st = DT_ERR(DT_EINVAL, "tp.size %d: the tensor-parallel group of world ranks %s spans machines (%s); its "
                    "all-reduces run in every layer, so a group must sit inside one machine: run a multiple of %d ranks "
                    "on every machine%s", T, ranks, hosts, T,
                    pos ? "" : ", placed by slot (consecutive ranks on one machine: dtrain --hosts a:N,b:N, "
                               "mpirun --map-by slot)");
    }
    free(node);
    free(at);
    return st;
}
