/* Agreement over a group on per-rank facts that must be equal: small word
 * gathers (bit for bit; static_graph's recorded order), and the trainable
 * set a refresh re-partitions for (DDP's buckets, ZeRO's shards are
 * collective layouts: every rank must cut the same ones). */
#include <stdio.h>
#include <string.h>
#include "parallel_internal.h"

dt_status dt_par_gather_words(dt_pg *pg, const uint32_t *mine, int n, uint32_t *all) {
    if (n < 1 || n > 8) return DT_ERR(DT_EINVAL, "dt_par_gather_words: %d words (1..8)", n);
    float send[8];
    memcpy(send, mine, (size_t)n * sizeof *mine);   /* floats as 4-byte carriers: gathered, never added */
    return dt_allgather(pg, send, all, n, DT_F32, NULL);
}

uint32_t dt_par_hash_ints(uint32_t h, const int *x, int n) {
    for (int i = 0; i < n; i++) {
        uint32_t v = (uint32_t)x[i];
        for (int b = 0; b < 4; b++) {
            h ^= (v >> (8 * b)) & 0xffu;
            h *= 16777619u;
        }
    }
    return h;
}

/* The configuration agreement (dist.h: dt_pg_agree) over one entry per
 * parameter: a hash exchange, and only on a mismatch the lists, so the
 * message names the first differing parameter and the ranks. */
dt_status dt_par_agree_trainable(const dt_model *m, dt_pg *pg, const char *who) {
    dt_agree a;
    dt_agree_init(&a);
    dt_agree_add(&a, "parameters", "%d", m->n_params);
    char key[160];
    for (int i = 0; i < m->n_params; i++) {
        snprintf(key, sizeof key, "parameter '%s'", m->params[i]->name);
        dt_agree_add(&a, key, "%s", m->params[i]->requires_grad ? "trainable" : "frozen");
    }
    dt_status s = dt_pg_agree(pg, &a);
    dt_agree_free(&a);
    if (s != DT_EINVAL) return s;
    char why[1024];
    snprintf(why, sizeof why, "%s", dt_error_message());
    return DT_ERR(DT_EINVAL, "%s: ranks disagree on the trainable parameters (change requires_grad alike on every rank "
                  "before refreshing): %s", who, why);
}
