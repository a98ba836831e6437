#ifndef DT_CLI_H
#define DT_CLI_H
#include <signal.h>
#include "dtrain/log.h"
#include "dtrain/parallel.h"
#include "dtrain/pipeline.h"
#include "dtrain/train.h"
#include "dtrain/zero.h"

typedef struct dt_cli_dist {
    dt_ddp_opts ddp;
    int zero_stage;                 /* 0: DDP */
    dt_zero_opts zero;              /* .dp: the same data-parallel options as ddp.dp (but the default bucket size) */
    dt_zero_ckpt_format save_format;
    dt_progress_mode progress;
    int pipelined;                  /* any pipeline flag given: the pipeline strategy (also at --pp 1) */
    dt_pipe_opts pipe;
    dt_tp_opts tp;                  /* .size > 1: tensor parallelism (.ddp: a copy of ddp) */
    float stall_warn;               /* seconds; 0: off */
    float collective_timeout;       /* seconds; 0: off */
    int debug_collectives;
} dt_cli_dist;

int dt_cli_train(int argc, char **argv, int eval_only);
/* cmd_generate.c, cmd_inspect.c: dtrain generate / inspect (one process, no MPI) */
int dt_cli_generate(int argc, char **argv);
int dt_cli_inspect(int argc, char **argv);
/* cmd_plot.c: dtrain plot (metrics and traces to SVG; one process, no MPI) */
int dt_cli_plot(int argc, char **argv);
/* Initialises MPI, picks the strategy (single process, DDP or ZeRO), runs, and
 * reports errors as one line tagged with the rank. */
int dt_cli_run(const dt_train_opts *o, const dt_cli_dist *dist, int eval_only);
int dt_cli_under_mpi(void);
/* errors.c: prints the job's one error line (on one rank). 0: every rank
 * succeeded; 1: the job failed before training on every rank (clean: exit
 * through MPI_Finalize); after a failure mid-run it does not return (MPI_Abort).
 * Collective (world). */
int dt_cli_report(dt_status s, int rank, int world, int clean);
/* settings.c: library text with each setting ("dp.bucket_bytes") written as
 * the flag that sets it ("--bucket-mb"), cut to fit out's n bytes; returns the
 * whole result's length (as snprintf). dt_cli_flag_text: into buf when it
 * fits, else into a malloc'd string the caller frees (result != buf). */
size_t dt_cli_flag_names(const char *in, char *out, size_t n);
char *dt_cli_flag_text(const char *in, char *buf, size_t n);
/* on: the job runs the pipeline engine, whose train.batch / train.accum /
 * train.eval_batches are per micro-batch: named as such, not as --batch /
 * --accum / --eval-batches (set once, before training) */
void dt_cli_flag_names_pipeline(int on);
/* settings.c: a model setting's flag, from its name: "arch." dropped, '_' as
 * '-' ("arch.max_t" -> "--max-t"); -1 when key is not "arch.<name>" or the
 * flag does not fit n bytes */
int dt_cli_model_flag(const char *key, char *buf, size_t n);
/* Route the library's log messages to this process's stdout / stderr (output.c). */
void dt_cli_log_install(int rank, int world);
/* --nproc N: 1 <= N <= 8 x this machine's cores; else -1 with one line in err */
int dt_cli_nproc_check(int nproc, char *err, int errlen);

/* hosts.c: where the ranks run. n = 0 and !slurm: this machine. */
#define DT_CLI_MAX_HOSTS 4096
typedef struct dt_cli_hosts {
    int n;                    /* --hosts / --hostfile entries */
    char (*name)[256];
    int *slots;
    int total;                /* slots (Slurm: the allocation's tasks) */
    const char *hostfile;     /* --hostfile, passed on to mpirun */
    int slurm;                /* inside a Slurm allocation: mpirun reads it */
    int slurm_per_node;       /* the most tasks on one of its nodes */
    char desc[256];           /* "2 hosts (h0:2, h1:2)", "Slurm job 7: n[1-2] (2 nodes, 4 tasks)" */
} dt_cli_hosts;
/* --hosts LIST / --hostfile FILE (at most one), else SLURM_* if set; -1 with
 * one line in err naming the host or line at fault. Free h either way. */
int dt_cli_hosts_parse(const char *hosts, const char *hostfile, dt_cli_hosts *h, char *err, int errlen);
int dt_cli_hosts_resolve(const dt_cli_hosts *h, char *err, int errlen);
int dt_cli_hosts_max_slots(const dt_cli_hosts *h);
/* "a:2, b:2, c:2" into out (n bytes); when it does not fit, as many as fit
 * and the last: "a:2, b:2, ..., z:2" */
void dt_cli_hosts_list(const dt_cli_hosts *h, const char *sep, char *out, size_t n);
/* a --hosts / --hostfile name for this machine (no DNS lookup: its host
 * name, short or long, "localhost", an IPv4 address it has);
 * dt_cli_hosts_here: some of nproc ranks, which fill h's hosts in order,
 * are expected on this machine */
int dt_cli_host_is_here(const char *name);
int dt_cli_hosts_here(const dt_cli_hosts *h, int nproc);
void dt_cli_hosts_free(dt_cli_hosts *h);

/* launch.c: re-run this command under mpirun: N ranks on this machine or on
 * h's hosts (filled machine by machine); print_only: print the command line
 * and the environment it passes on, run nothing. Returns the exit status. */
int dt_cli_relaunch(int argc, char **argv, int nproc, int threads, const dt_cli_hosts *h, int print_only);
/* dt_cli_relaunch's status when the launcher itself failed (no executable
 * path, no launch directory, no memory, no fork): nothing a restart mends */
#define DT_CLI_LAUNCH_FAILED 125
#define DT_CLI_MAX_RESTARTS 1000   /* --max-restarts K: at most this (cmd_train.c says 1000) */
/* hosts_probe.c: which hosts of h answer (alive[i] = 1; this machine always
 * does): each runs one process through mpirun, all at once, within
 * timeout_s. Returns how many answer, -1 when out of memory.
 * dt_cli_probe_timeout: DTRAIN_HOST_PROBE_TIMEOUT seconds, default 30. */
#define DT_CLI_PROBE_TIMEOUT_ENV "DTRAIN_HOST_PROBE_TIMEOUT"
int dt_cli_hosts_probe(const dt_cli_hosts *h, int *alive, double timeout_s);
double dt_cli_probe_timeout(void);

/* CLOCK_MONOTONIC in seconds: the launcher's timers (probe deadlines, when to
 * ask mpirun again). The CLI keeps to the public API, so not the library's. */
double dt_cli_mono_s(void);

/* elastic.c: the world of a restart on the slots that answer. The job as
 * launched: nproc ranks = stages x replicas, accum micro-steps per replica
 * and step. Returns the largest world W in [min_nproc, min(nproc, slots)]
 * that splits into the stages and keeps the global batch, with the new
 * micro-steps per replica in *accum; 0 when there is none. */
typedef struct dt_cli_elastic {
    int nproc, min_nproc, stages, accum;
    int tp;               /* --tp (0 or 1: none): a replica is stages x tp ranks */
    int accum_multiple;   /* 0 or 1: any; the new accum a multiple of it (interleaved: --pp) */
} dt_cli_elastic;
int dt_cli_elastic_world(const dt_cli_elastic *e, int slots, int *accum);
/* out: the hosts of h with keep[i] (a --host list, no hostfile); -1 when out
 * of memory. Free with dt_cli_hosts_free. */
int dt_cli_hosts_subset(const dt_cli_hosts *h, const int *keep, dt_cli_hosts *out);

/* restart.c: dt_cli_relaunch, and after a failure again from the newest
 * complete checkpoint at save, at most max_restarts times; a summary line.
 * With a host list, the hosts are probed before each restart and the job
 * goes to those that answer (elastic.c; --min-nproc: the fewest ranks it may
 * continue on). batch: per micro-step (a pipeline: per micro-batch). */
#define DT_CLI_PROGRESS_ENV "DTRAIN_PROGRESS_FILE"
typedef struct dt_cli_restart {
    int max_restarts, min_nproc;   /* min_nproc 0: the job's own world */
    int stages, accum;             /* --pp; micro-steps per replica and step */
    int piped;                     /* the pipeline engine runs (--pp, or any of its flags: --pp 1 --microbatches M) */
    int microbatch_multiple;       /* a pipeline's micro-batches are a multiple of it (interleaved: --pp; else 1) */
    int tp;                        /* --tp */
    long long batch;               /* the library's: a micro-batch */
    long long eval_batches;        /* the library's (micro-batches of `batch` for a pipeline); 0: all */
    const char *save;
    const char *metrics;           /* --metrics (NULL: none): an attempt that starts over from step 0
                                      drops the lines the failed ones appended */
} dt_cli_restart;
int dt_cli_relaunch_restarting(int argc, char **argv, int nproc, int threads, const dt_cli_hosts *h,
                               const dt_cli_restart *r);
/* The flags of restart attempt: argv (argc of them) without what the attempt
 * replaces; resize: the world changed, so the micro-steps become accum
 * (--accum, or a pipeline's --microbatches with --batch and --eval-batches
 * scaled to keep the global batch and the evaluated sequences); resume:
 * --resume r->save. av holds argc + 9 pointers; v the numbers' text.
 * Returns the count (av[count] = NULL). */
typedef struct dt_cli_restart_vals { char accum[24], batch[24], eval[24]; } dt_cli_restart_vals;
int dt_cli_restart_argv(int argc, char **argv, const dt_cli_restart *r, int resize, int accum, int resume,
                        char **av, dt_cli_restart_vals *v);
/* signals.c, launcher: a stop signal reached this process (do not restart) */
int dt_cli_launcher_signalled(void);
/* signals.c: stop requests on SIGTERM / SIGINT / SIGUSR1 (this rank) */
void dt_cli_signals_install(void);
/* after the run: 128 + the signal that stopped it at a step boundary, 0 if none */
int dt_cli_stop_status(void);
/* launcher: waits for mpirun (pid child), passing our signals on (held in
 * the signal mask until then; *unblock is the mask to restore); its status.
 * dir: the launch directory shared with the job's ranks on this machine
 * (NULL: none could be made); where: which of the nproc ranks run here
 * (every one, some expected, none expected); see signals.c */
typedef enum { DT_LAUNCH_ALL_HERE, DT_LAUNCH_SOME_HERE, DT_LAUNCH_ELSEWHERE } dt_cli_launch_where;
int dt_cli_launch_wait(int child, const sigset_t *unblock, const char *dir, int nproc, dt_cli_launch_where where);
/* rank: in the launch directory (DTRAIN_LAUNCH_DIR, if set, and only on the
 * machine DTRAIN_LAUNCH_MACHINE names) say this rank handles stop signals
 * now, and take up a stop the launcher got before. Call right after
 * dt_cli_signals_install. */
#define DT_CLI_LAUNCH_DIR_ENV "DTRAIN_LAUNCH_DIR"
#define DT_CLI_LAUNCH_MACHINE_ENV "DTRAIN_LAUNCH_MACHINE"
void dt_cli_launch_ready(void);
/* "hostname/boot id/pid namespace": one machine's process ids; -1 when a
 * part cannot be read */
int dt_cli_machine_key(char *buf, size_t n);
/* launcher: 1 when Open MPI is set to forward no signal to the ranks
 * (ess_base_forward_signals = none: the environment, else the user's
 * ~/.openmpi/mca-params.conf, else /etc/openmpi/openmpi-mca-params.conf),
 * with the setting that says so in why */
int dt_cli_mpirun_forwards_nothing(char *why, size_t n);
/* launcher: the directory and its files, after mpirun exited */
void dt_cli_launch_dir_remove(const char *dir);
#endif
