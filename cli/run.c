/* Runs a training or evaluation job in this process (one rank of it). */
#include <stdio.h>
#include "cli.h"

int dt_cli_run(const dt_train_opts *o, const dt_cli_dist *dist_in, int eval_only) {
    /* the weights' type is the run's (train.param_dtype): strategies that own the optimizer keep it */
    dt_cli_dist d = *dist_in, *dist = &d;
    dt_dtype pd = dt_train_param_dtype(o);
    d.zero.param_dtype = d.pipe.param_dtype = d.pipe.zero.param_dtype = pd;
    int piped = dist->pipelined;
    /* ZeRO and pipelines need MPI even at one rank */
    int tp = dist->tp.size > 1;
    int under_mpi = dt_cli_under_mpi() || dist->zero_stage > 0 || piped || tp;
    dt_pg *world = NULL;
    dt_strategy strat, *sp = NULL;
    int rank = 0, size = 1;
    dt_status s = DT_OK;
    /* a stop may come at once (a scheduler's cancel): handled from here on,
     * also while MPI starts and the job loads (signals.c) */
    dt_cli_signals_install();
    dt_cli_launch_ready();
    if (under_mpi) {
        dt_dist_opts dopts = {.progress = dist->progress, .deterministic = dist->ddp.dp.deterministic,
                              .stall_warn_s = dist->stall_warn > 0 ? dist->stall_warn : -1.0,
                              .collective_timeout_s = dist->collective_timeout,
                              .debug_collectives = dist->debug_collectives};
        s = dt_dist_init(NULL, NULL, &dopts);
        if (s == DT_OK) s = dt_pg_world(&world);
        if (s == DT_OK) {
            rank = dt_pg_rank(world);
            size = dt_pg_size(world);
            if (piped) {
                s = dt_pipe_strategy(world, &dist->pipe, &strat);
                sp = s == DT_OK ? &strat : NULL;
            } else if (tp) {   /* DDP or ZeRO across its replicas */
                s = dist->zero_stage > 0 ? dt_tp_zero_strategy(world, &dist->tp, &dist->zero, &strat)
                                         : dt_tp_strategy(world, &dist->tp, &strat);
                sp = s == DT_OK ? &strat : NULL;
            } else if (dist->zero_stage > 0) {   /* also at one rank: same code path, sharding of 1 */
                s = dt_zero_strategy(world, &dist->zero, dist->save_format, &strat);
                sp = s == DT_OK ? &strat : NULL;
            } else if (size > 1) {
                s = dt_ddp_strategy(world, &dist->ddp, &strat);
                sp = s == DT_OK ? &strat : NULL;
            }
        }
    }
    dt_cli_log_install(rank, size);
    dt_cli_signals_install();   /* again: MPI_Init may have set handlers of its own */
    dt_trainer *t = NULL;
    if (s == DT_OK) s = dt_trainer_create(o, sp, &t);
    else if (sp && sp->destroy) sp->destroy(sp->self);
    if (s == DT_OK) {
        if (eval_only) {
            double loss, acc;
            s = dt_trainer_evaluate(t, &loss, &acc);
            if (s == DT_OK && rank == 0) {
                if (dt_train_stopped()) printf("interrupted during evaluation\n");
                else printf("%s loss: %.4f  accuracy: %.4f\n", t->data.eval_name, loss, acc);
            }
        } else {
            s = dt_trainer_run(t);
        }
        if (s == DT_OK) s = dt_trainer_finish(t);   /* the trace is written here */
    }
    int rc = dt_cli_report(s, rank, size, t == NULL);   /* one line per job (errors.c) */
    if (!rc) rc = dt_cli_stop_status();   /* 128 + signal when stopped early (every rank agreed) */
    dt_trainer_free(t);
    if (world) dt_pg_free(world);
    if (under_mpi && dt_dist_initialized()) dt_dist_finalize();
    return rc;
}
