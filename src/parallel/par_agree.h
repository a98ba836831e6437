/* The strategies' options in the configuration agreement (dist.h section 8):
 * each adds what must match on every rank, named by its CLI flag. */
#ifndef DT_PAR_AGREE_H
#define DT_PAR_AGREE_H
#include "dtrain/parallel.h"
#include "dtrain/pipeline.h"
#include "dtrain/zero.h"

void dt_par_describe_ddp(const dt_ddp_opts *o, dt_agree *a);
void dt_par_describe_zero(const dt_zero_opts *o, dt_agree *a);
/* the pipeline's own options, then its data-parallel ones (DDP or ZeRO) */
void dt_par_describe_pipe(const dt_pipe_opts *o, dt_agree *a);
#endif
