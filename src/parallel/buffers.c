/* Shared by DDP and ZeRO: model buffers broadcast from one rank (BatchNorm
 * statistics stay equal), small sums for metrics, a clock, the error naming
 * unused parameters. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "parallel_internal.h"

double dt_par_now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec * 1e-3;
}

dt_status dt_par_bcast_buffers(dt_model *m, dt_pg *pg, float **scratch, int root) {
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

void dt_par_unused_add(dt_par_unused *u, const char *name) {
    if (u->n++ >= 4) return;
    size_t l = strlen(u->names);
    snprintf(u->names + l, sizeof u->names - l, "%s'%s'", l ? ", " : "", name);
}

dt_status dt_par_unused_error(const dt_par_unused *u, const char *who) {
    return DT_ERR(DT_EINVAL, "%s: parameter%s %s%s received no gradient in this step; if that is expected "
                  "enable find_unused_params (--find-unused)", who, u->n > 1 ? "s" : "", u->names,
                  u->n > 4 ? " and more" : "");
}
