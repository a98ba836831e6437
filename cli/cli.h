#ifndef DT_CLI_H
#define DT_CLI_H
#include "dtrain/train.h"
int dt_cli_train(int argc, char **argv, int eval_only);
/* Builds the strategy for this process (single or data parallel), runs, reports errors. */
int dt_cli_run(const dt_train_opts *o, int eval_only);
int dt_cli_under_mpi(void);
int dt_cli_relaunch(int argc, char **argv, int nproc, int threads);
#endif
