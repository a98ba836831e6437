/* Measuring across ranks: a clock, small sums that arrive exact, and the
 * start-up memory report (every rank's parameter / gradient / optimizer-state
 * bytes and peak RSS, logged by rank 0; DDP and ZeRO). */
#include <stdlib.h>
#include <sys/resource.h>
#include "common_internal.h"
#include "util/clock.h"
#include "util/log_internal.h"

double dt_par_now_us(void) { return dt_mono_s() * 1e6; }

/* Each double travels as three floats (hi + mid + lo: 72 bits of mantissa
 * >= a double's 53), so a value only one rank contributes (a pipeline's loss,
 * on its last stage) and integer counts arrive exactly. */
dt_status dt_par_allreduce_sum(dt_pg *pg, double *x, int n) {
    float f[48] = {0};
    if (n > 16) return DT_ERR(DT_EINVAL, "allreduce_sum: at most 16 values");
    for (int i = 0; i < n; i++) {
        double r = x[i];
        for (int k = 0; k < 3; k++) { f[3 * i + k] = (float)r; r -= (double)f[3 * i + k]; }
    }
    DT_TRY(dt_allreduce(pg, f, f, 3 * n, DT_F32, DT_RED_SUM, NULL));
    for (int i = 0; i < n; i++) x[i] = (double)f[3 * i] + (double)f[3 * i + 1] + (double)f[3 * i + 2];
    return DT_OK;
}

dt_status dt_par_sum_rank_order(dt_pg *pg, double *x) {
    int n = dt_pg_size(pg);
    double *all = malloc((size_t)n * sizeof *all);
    if (!all) return DT_ERR(DT_ENOMEM, "out of memory");
    dt_status s = dt_allgather(pg, x, all, 2, DT_F32, NULL);   /* 8 bytes as 2 floats, unchanged */
    if (s == DT_OK) {
        double sum = 0;
        for (int r = 0; r < n; r++) sum += all[r];
        *x = sum;
    }
    free(all);
    return s;
}

static double peak_rss_bytes(void) {
    struct rusage ru;
    return getrusage(RUSAGE_SELF, &ru) == 0 ? (double)ru.ru_maxrss * 1024.0 : 0.0;   /* Linux: KiB */
}

dt_status dt_par_memory_report(dt_pg *pg, const char *label, size_t param_bytes, size_t grad_bytes,
                               size_t optim_bytes, int print) {
    int world = dt_pg_size(pg);
    float mine[4] = {(float)param_bytes, (float)grad_bytes, (float)optim_bytes, (float)peak_rss_bytes()};
    float *all = malloc((size_t)world * sizeof mine);
    if (!all) return DT_ERR(DT_ENOMEM, "out of memory");
    dt_status st = dt_allgather(pg, mine, all, 4, DT_F32, NULL);
    if (st == DT_OK && print && dt_pg_rank(pg) == 0) {
        const double MiB = 1048576.0;
        dt_log(DT_LOG_INFO, "dtrain: %s memory per rank (MiB): params / grads / optimizer state / peak RSS so far\n", label);
        for (int r = 0; r < world; r++)
            dt_log(DT_LOG_INFO, "  rank %d: %.2f / %.2f / %.2f / %.1f\n", r, all[4 * r] / MiB, all[4 * r + 1] / MiB,
                   all[4 * r + 2] / MiB, all[4 * r + 3] / MiB);
        /* across machines: what each machine holds (its ranks share its DRAM) */
        dt_pg_topo t;
        dt_pg_topology(pg, &t);
        int *node = t.machines > 1 ? malloc((size_t)world * sizeof *node) : NULL;
        if (node && dt_pg_node_of(pg, node) == DT_OK)
            for (int m = 0; m < world; m++) {
                if (node[m] != m) continue;   /* m: a machine's lowest rank */
                double sum[4] = {0};
                int n = 0;
                for (int r = 0; r < world; r++)
                    if (node[r] == m) {
                        n++;
                        for (int k = 0; k < 4; k++) sum[k] += all[4 * r + k];
                    }
                dt_log(DT_LOG_INFO, "  machine %s (%d rank%s): %.2f / %.2f / %.2f / %.1f\n", dt_pg_host_name(pg, m), n,
                       n == 1 ? "" : "s", sum[0] / MiB, sum[1] / MiB, sum[2] / MiB, sum[3] / MiB);
            }
        free(node);
    }
    free(all);
    return st;
}
