/* Agreements over a group: every rank learns whether all succeeded; the
 * activity of join; words and the trainable set that must be equal. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "common_internal.h"

dt_status dt_par_agree(dt_pg *pg, dt_status mine, const char *what) {
    char msg[512];
    snprintf(msg, sizeof msg, "%s", dt_error_message());
    float f[2] = {mine != DT_OK ? 1.0f : 0.0f, mine != DT_OK ? (float)(dt_pg_rank(pg) + 1) : 0.0f};
    DT_TRY(dt_allreduce(pg, f, f, 2, DT_F32, DT_RED_SUM, NULL));
    if (mine != DT_OK) return DT_ERR(mine, "%s", msg);
    if (f[0] == 1.0f) return DT_ERR(DT_ECOMM, "%s: failed on rank %d (see its error)", what, (int)f[1] - 1);
    if (f[0] > 1.0f) return DT_ERR(DT_ECOMM, "%s: failed on %d ranks (see their errors)", what, (int)f[0]);
    return DT_OK;
}

/* The activity agreement of join (DDP's and ZeRO's): every rank contributes
 * its rank if still active, else -1, with one float of its own (ZeRO: its
 * LR); the highest active rank is PyTorch's common rank, whose buffers (and
 * value) every rank adopts. Ranks are exact in float below 2^24. */
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

/* Agreement over a group on per-rank facts that must be equal: small word
 * gathers (bit for bit; static_graph's recorded order), and the trainable
 * set a refresh re-partitions for (DDP's buckets, ZeRO's shards are
 * collective layouts: every rank must cut the same ones). */
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
