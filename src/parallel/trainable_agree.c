/* Agreement over a group on per-rank facts that must be equal: small word
 * gathers (bit for bit), and the trainable set a refresh re-partitions for
 * (DDP's buckets, ZeRO's shards are collective layouts: every rank must cut
 * the same ones). */
#include <stdlib.h>
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

/* Only on a hash mismatch: every rank's flags, to name a parameter. */
static dt_status name_difference(const dt_model *m, dt_pg *pg, const char *who) {
    int n = m->n_params, world = dt_pg_size(pg);
    size_t words = (size_t)(n + 31) / 32;
    uint32_t *mine = calloc(words ? words : 1, sizeof *mine), *all = calloc((words ? words : 1) * (size_t)world, sizeof *all);
    if (!mine || !all) { free(mine); free(all); return DT_ERR(DT_ENOMEM, "%s: out of memory", who); }
    for (int i = 0; i < n; i++)
        if (m->params[i]->requires_grad) mine[i / 32] |= 1u << (i % 32);
    dt_status s = words ? dt_allgather(pg, mine, all, (int64_t)words, DT_F32, NULL) : DT_OK;
    for (int r = 1; s == DT_OK && r < world; r++)
        for (int i = 0; i < n; i++) {
            int t0 = (all[i / 32] >> (i % 32)) & 1u, tr = (all[(size_t)r * words + i / 32] >> (i % 32)) & 1u;
            if (t0 == tr) continue;
            s = DT_ERR(DT_EINVAL, "%s: ranks disagree on the trainable parameters: '%s' is %s on rank 0 but %s on rank %d "
                       "(change requires_grad alike on every rank before refreshing)", who, m->params[i]->name,
                       t0 ? "trainable" : "frozen", tr ? "trainable" : "frozen", r);
            goto done;
        }
done:
    free(mine);
    free(all);
    return s;
}

dt_status dt_par_agree_trainable(const dt_model *m, dt_pg *pg, const char *who) {
    int n = m->n_params, world = dt_pg_size(pg);
    uint32_t h = 2166136261u;
    for (int i = 0; i < n; i++) {
        int t = m->params[i]->requires_grad != 0;
        h = dt_par_hash_ints(h, &t, 1);
    }
    uint32_t mine[2] = {(uint32_t)n, h}, *all = malloc((size_t)world * sizeof mine);
    if (!all) return DT_ERR(DT_ENOMEM, "%s: out of memory", who);
    dt_status s = dt_par_gather_words(pg, mine, 2, all);
    int differ = 0;
    for (int r = 1; s == DT_OK && r < world; r++) differ |= all[2 * r] != all[0] || all[2 * r + 1] != all[1];
    for (int r = 1; s == DT_OK && r < world; r++)
        if (all[2 * r] != all[0]) { s = DT_ERR(DT_EINVAL, "%s: rank %d has %u parameters, rank 0 %u", who, r, all[2 * r], all[0]); break; }
    free(all);
    if (s == DT_OK && differ) s = name_difference(m, pg, who);   /* same decision on every rank */
    return s;
}
