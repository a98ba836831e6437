#ifndef DT_PARALLEL_INTERNAL_H
#define DT_PARALLEL_INTERNAL_H
/* Pieces DDP and ZeRO share. */
#include "dtrain/dist.h"
#include "dtrain/nn.h"

/* The root's model buffers (BatchNorm statistics) to every rank, packed into
 * one broadcast through *scratch (allocated on first use, caller frees). */
dt_status dt_par_bcast_buffers(dt_model *m, dt_pg *pg, float **scratch, int root);
double dt_par_now_us(void);
/* Sum n <= 16 doubles across the group (as floats: metrics and counts). */
dt_status dt_par_allreduce_sum(dt_pg *pg, double *x, int n);
/* Rank 0 prints one line per rank: the given bytes and peak RSS. Collective. */
dt_status dt_par_memory_report(dt_pg *pg, const char *label, size_t param_bytes, size_t grad_bytes,
                               size_t optim_bytes, int print);
#endif
