/* From one rank to every rank: the model's buffers (BatchNorm statistics
 * stay equal; DDP, ZeRO) and the optimizer's state (--uneven: the state of
 * the rank whose model everyone ends with). */
#include <stdlib.h>
#include <string.h>
#include "common_internal.h"

dt_status dt_par_buffers_from(dt_par_buffers *b, int root) {
    dt_model *m = b->m;
    dt_pg *pg = b->pg;
    float **scratch = &b->scratch;
    if (m->n_buffers == 0 || dt_pg_size(pg) < 2) return DT_OK;
    int64_t n = 0;
    for (int i = 0; i < m->n_buffers; i++) n += m->buffers[i]->value.numel;
    if (!*scratch && !(*scratch = malloc((size_t)(n ? n : 1) * sizeof(float))))
        return DT_ERR(DT_ENOMEM, "out of memory");
    float *buf = *scratch;
    int64_t k = 0;
    for (int i = 0; i < m->n_buffers; i++) {
        const dt_tensor *t = &m->buffers[i]->value;
        memcpy(buf + k, t->data, (size_t)t->numel * sizeof(float));
        k += t->numel;
    }
    DT_TRY(dt_broadcast(pg, buf, n, DT_F32, root, NULL));
    k = 0;
    for (int i = 0; i < m->n_buffers; i++) {
        dt_tensor *t = &m->buffers[i]->value;
        memcpy(t->data, buf + k, (size_t)t->numel * sizeof(float));
        k += t->numel;
    }
    return DT_OK;
}

dt_status dt_par_buffers_bcast(dt_par_buffers *b) { return dt_par_buffers_from(b, b->root); }

int dt_par_buffers_enabled(const dt_par_buffers *b, const dt_dp_opts *dp) {
    return dp->broadcast_buffers && !dp->sync_bn && b->m->n_buffers > 0 && dt_pg_size(b->pg) > 1;
}

dt_status dt_par_buffers_sync(dt_par_buffers *b, const dt_dp_opts *dp) {
    return dt_par_buffers_enabled(b, dp) ? dt_par_buffers_bcast(b) : DT_OK;
}

void dt_par_buffers_free(dt_par_buffers *b) {
    free(b->scratch);
    b->scratch = NULL;
}

/* One rank's optimizer onto every rank: the state arrays, the step count and
 * each segment's skipped steps. The ranks must have the same segment table
 * (the same trainable set: agreed at every refresh). */
dt_status dt_par_bcast_optimizer(dt_pg *pg, dt_optimizer *o, int root) {
    for (int k = 0; k < 2; k++)
        if (o->state16[k] && o->state_len)   /* bf16 state (optim.h): its bits, not widened */
            DT_TRY(dt_broadcast(pg, o->state16[k], (int64_t)o->state_len, DT_BF16, root, NULL));
        else if (o->state[k] && o->state_len)
            DT_TRY(dt_broadcast(pg, o->state[k], (int64_t)o->state_len, DT_F32, root, NULL));
    /* int64 counts as pairs of float32 words: a broadcast copies bytes and
     * does no arithmetic, so every bit pattern arrives unchanged */
    if (o->n_segs) DT_TRY(dt_broadcast(pg, o->skipped, 2 * (int64_t)o->n_segs, DT_F32, root, NULL));
    return dt_broadcast(pg, &o->step, 2, DT_F32, root, NULL);
}
