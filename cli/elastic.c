/* The world a restart runs on when machines were lost (restart.c).
 *
 * A job of N ranks = S pipeline stages x T tensor-parallel ranks x D = N /
 * (S T) replicas (R = S T ranks per replica); each replica
 * runs A micro-steps of b samples per optimizer step (--accum A, or a
 * pipeline's A micro-batches of --batch / A). One step consumes the global
 * batch b x A x D samples, positions [s x bAD, (s+1) x bAD) of the sampler's
 * global order at any world size (sampler.c), so a restart on W ranks that
 * keeps A x D (A' = A x D / D', D' = W / R) sees the same samples in every
 * step and continues the loss curve where it was.
 *
 * The world chosen is the largest W with min_nproc <= W <= min(N, slots
 * that answer), R | W and D' | A x D (and an interleaved pipeline's P | A'): never larger than the job as
 * launched, so spare machines (a host list with more slots than N) replace
 * lost ones first and only then does the world shrink. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli.h"

int dt_cli_elastic_world(const dt_cli_elastic *e, int slots, int *accum_out) {
    int S = e->stages > 0 ? e->stages : 1, R = S * (e->tp > 0 ? e->tp : 1);   /* ranks per replica */
    if (e->nproc % R) return 0;
    long long units = (long long)e->accum * (e->nproc / R);   /* A x D: micro-steps per step, all replicas */
    int top = slots < e->nproc ? slots : e->nproc;
    for (int W = top; W >= e->min_nproc && W >= R; W--) {
        if (W % R) continue;
        int D = W / R;
        if (units % D) continue;
        if (e->accum_multiple > 1 && (units / D) % e->accum_multiple) continue;   /* interleaved: M a multiple of P */
        *accum_out = (int)(units / D);
        return W;
    }
    return 0;
}

int dt_cli_hosts_subset(const dt_cli_hosts *h, const int *keep, dt_cli_hosts *out) {
    memset(out, 0, sizeof *out);
    out->name = calloc((size_t)(h->n > 0 ? h->n : 1), sizeof *out->name);
    out->slots = calloc((size_t)(h->n > 0 ? h->n : 1), sizeof *out->slots);
    if (!out->name || !out->slots) {
        dt_cli_hosts_free(out);
        return -1;
    }
    for (int i = 0; i < h->n; i++) {
        if (!keep[i]) continue;
        memcpy(out->name[out->n], h->name[i], sizeof *out->name);
        out->slots[out->n++] = h->slots[i];
        out->total += h->slots[i];
    }
    dt_cli_hosts_list(out, ",", out->desc, sizeof out->desc);
    return 0;   /* no hostfile: the list goes to mpirun as --host */
}
