/* scale_projection — step time and scaling efficiency of DDP and ZeRO-3 on n
 * machines of R ranks, flat vs hierarchical collectives, from measured link
 * and compute figures (docs/PERFORMANCE.md, "Many machines").
 *
 *   scale_projection [--gbit 10] [--link-eff 0.78] [--alpha-us 50] [--mem-gbs 5]
 *                    [--check n,R,stage,hier,MiB]
 *
 * Model, per training step and machine (weak scaling: the batch per rank is
 * fixed, so compute per rank C does not change with n):
 *   bytes over the machine's link (S = gradient/parameter bytes, N = n R):
 *     DDP   hierarchical 2(n-1)/n S         flat (ring) 2(N-1)/N S
 *     ZeRO-3 hierarchical 3(n-1)/n S        flat 3 R (n-1)/n S
 *       (a reduce-scatter and two parameter all-gathers per step)
 *     ZeRO-3 --node-params 2(n-1)/n S (one all-gather per step, into each
 *       machine's one copy; nothing copied inside for it; flat: n/a)
 *   T_comm = bytes / (link-eff x line rate) + hops x alpha
 *            (+ hierarchical: the copies inside the machine, 2 (R-1)/R S per
 *            rank at mem-gbs, the measured shared-memory allreduce rate)
 *     hops: a ring's 2(m-1) steps over the m parties that cross machines
 *     (hierarchical: n machines; flat: N ranks), per bucket; buckets are in
 *     flight together, so the latency term is counted for 8 of them
 *   exposed = max(0, T_comm - hide x C), hide = 2/3 for DDP (reductions run
 *     under backward), 1 for ZeRO-3 (gathers prefetched under forward too)
 *   step = C + exposed;  efficiency = C / step.
 * link-eff is the share of line rate the hierarchical allreduce reached on
 * the simulated link (16 MiB, 1 Gbit/s: 172 ms against 134 ms at line rate).
 * --check n,R,stage,hier,MiB prints the model's bytes per machine for a
 * measured W3 configuration (bench/multihost.sh) next to the measured figure. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct workload { const char *name; double params, compute_ms; } workload;

/* compute per rank and step at 1 thread per rank (docs/PERFORMANCE.md: W1 DDP
 * 2 x 1 ~1420 ms/step; W2 ~2 x its 2-thread 1080 ms) */
static const workload k_work[] = {{"W1", 10.84e6, 1420}, {"W2", 124.5e6, 2160}};

/* zero3: 1 ZeRO-3, 2 ZeRO-3 with node-shared parameters (hierarchical only) */
static double bytes_per_machine(int zero3, int hier, int n, int R, double S) {
    double N = (double)n * R;
    if (zero3 == 2) return 2.0 * (n - 1) / n * S;
    if (zero3) return hier ? 3.0 * (n - 1) / n * S : 3.0 * R * (n - 1) / n * S;
    return hier ? 2.0 * (n - 1) / n * S : 2.0 * (N - 1) / N * S;
}

int main(int argc, char **argv) {
    double gbit = 10, eff = 0.78, alpha_us = 50, mem_gbs = 5;
    const char *check = NULL;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--gbit")) gbit = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--link-eff")) eff = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--alpha-us")) alpha_us = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--mem-gbs")) mem_gbs = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--check")) check = argv[i + 1];
        else { fprintf(stderr, "scale_projection: unknown option %s\n", argv[i]); return 2; }
    }
    if (check) {
        int n, R, stage, h;
        double mib;
        /* stage 4: ZeRO-3 with --node-params */
        if (sscanf(check, "%d,%d,%d,%d,%lf", &n, &R, &stage, &h, &mib) != 5 || n < 1 || R < 1) {
            fprintf(stderr, "scale_projection: --check n,R,stage,hier,MiB\n");
            return 2;
        }
        /* W3: 14.2M params = 54.2 MiB; stage 2 moves what DDP does (a
         * reduce-scatter and one all-gather), stage 3 one all-gather more */
        double S = 14.2e6 * 4 / 1048576.0;
        double model = bytes_per_machine(stage == 4 ? 2 : stage == 3, h, n, R, S);
        if (stage == 2) model = h ? 2.0 * (n - 1) / n * S : 2.0 * R * (n - 1) / n * S;
        printf("W3 n=%d R=%d %s %s: model %.1f MiB per machine and step, measured %.1f (%+.1f%%)\n", n, R,
               stage == 4 ? "ZeRO-3 --node-params" : stage ? (stage == 3 ? "ZeRO-3" : "ZeRO-2") : "DDP",
               h ? "hierarchical" : "flat", model, mib,
               100 * (mib - model) / model);
        return 0;
    }
    double Bps = gbit * 1e9 / 8 * eff, alpha = alpha_us * 1e-6;
    printf("link %.0f Gbit/s at %.0f%% of line rate, alpha %.0f us, %.0f GB/s per rank inside a machine\n\n", gbit,
           eff * 100, alpha_us, mem_gbs);
    printf("| workload | strategy | machines | ranks/machine | GB/machine/step hier (flat) | step ms hier (flat) | efficiency hier (flat) |\n");
    printf("|---|---|---|---|---|---|---|\n");
    const int ns[] = {8, 64, 256}, Rs[] = {2, 32};
    for (size_t w = 0; w < sizeof k_work / sizeof *k_work; w++)
        for (int z = 0; z < 3; z++)
            for (int ri = 0; ri < 2; ri++)
                for (int ni = 0; ni < 3; ni++) {
                    int n = ns[ni], R = Rs[ri];
                    double S = k_work[w].params * 4, C = k_work[w].compute_ms * 1e-3, step[2], gb[2];
                    for (int h = 0; h < 2; h++) {
                        double b = bytes_per_machine(z, h, n, R, S);
                        int parties = h ? n : n * R;
                        double t = b / Bps + 8.0 * 2 * (parties - 1) * alpha;
                        if (h) t += (z == 1 ? 1.5 : z == 2 ? 0.5 : 2.0) * (R - 1) / R * S / (mem_gbs * 1e9);
                        double exposed = t - (z ? 1.0 : 2.0 / 3.0) * C;
                        step[h] = C + (exposed > 0 ? exposed : 0);
                        gb[h] = b / 1e9;
                    }
                    if (z == 2)
                        printf("| %s | ZeRO-3 --node-params | %d | %d | %.2f (n/a) | %.0f (n/a) | %.0f%% (n/a) |\n",
                               k_work[w].name, n, R, gb[1], step[1] * 1e3, 100 * C / step[1]);
                    else
                        printf("| %s | %s | %d | %d | %.2f (%.2f) | %.0f (%.0f) | %.0f%% (%.0f%%) |\n", k_work[w].name,
                               z ? "ZeRO-3" : "DDP", n, R, gb[1], gb[0], step[1] * 1e3, step[0] * 1e3,
                               100 * C / step[1], 100 * C / step[0]);
                }
    return 0;
}
