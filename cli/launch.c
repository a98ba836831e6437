/* --nproc N: re-launch this command under mpirun on this machine. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "cli.h"

#ifndef DT_MPIEXEC
#define DT_MPIEXEC "mpirun"
#endif

int dt_cli_under_mpi(void) {
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK") || getenv("PMI_SIZE");
}

/* More ranks than this on one machine only thrash: each rank has its own
 * model, optimizer and MPI buffers, and they share the cores. */
#define MAX_RANKS_PER_CORE 8

int dt_cli_nproc_check(int nproc, char *err, int errlen) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (cores < 1) cores = 1;
    if (nproc < 1) {
        snprintf(err, (size_t)errlen, "--nproc must be >= 1 (got %d)", nproc);
        return -1;
    }
    if (nproc > MAX_RANKS_PER_CORE * cores) {
        snprintf(err, (size_t)errlen, "--nproc %d: at most %ld ranks on this machine (%d x its %ld cores)", nproc,
                 MAX_RANKS_PER_CORE * cores, MAX_RANKS_PER_CORE, cores);
        return -1;
    }
    return 0;
}

int dt_cli_relaunch(int argc, char **argv, int nproc, int threads) {
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) { fprintf(stderr, "dtrain: cannot find own executable for --nproc\n"); return 1; }
    self[n] = 0;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int per_rank = threads > 0 ? threads : (int)(cores / nproc > 0 ? cores / nproc : 1);
    char np[16], th[16];
    snprintf(np, sizeof np, "%d", nproc);
    snprintf(th, sizeof th, "%d", per_rank);
    setenv("OMP_NUM_THREADS", th, 1);
    setenv("DTRAIN_TTY", isatty(STDOUT_FILENO) ? "1" : "0", 1);
    char **av = calloc((size_t)argc + 24, sizeof *av);
    if (!av) return 1;
    int k = 0;
    av[k++] = DT_MPIEXEC;
    av[k++] = "-np";
    av[k++] = np;
    if (nproc > cores) av[k++] = "--oversubscribe";
    if (geteuid() == 0) av[k++] = "--allow-run-as-root";
    /* the GEMM kernel family dt_blas_fix_core chose (or the user's) reaches every rank */
    if (getenv("OPENBLAS_CORETYPE")) { av[k++] = "-x"; av[k++] = "OPENBLAS_CORETYPE"; }
    if (getenv("DTRAIN_BLAS_REEXEC")) { av[k++] = "-x"; av[k++] = "DTRAIN_BLAS_REEXEC"; }
    /* ... and so does the GEMM library choice: every rank must make the same one */
    static const char *const gemm_env[] = {"DTRAIN_GEMM", "ONEDNN_MAX_CPU_ISA", "DTRAIN_CONV"};
    for (size_t e = 0; e < sizeof gemm_env / sizeof *gemm_env; e++)
        if (getenv(gemm_env[e])) { av[k++] = "-x"; av[k++] = (char *)gemm_env[e]; }
    av[k++] = "--bind-to";
    av[k++] = "none";
    /* the ranks report errors and stops themselves (one line per job, exit
     * status 128 + signal): no mpirun banners on top. dtrain reads no stdin,
     * and mpirun runs in a process group of its own (signals.c) */
    av[k++] = "--quiet";
    av[k++] = "--stdin";
    av[k++] = "none";
    av[k++] = self;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--nproc")) { i++; continue; }
        if (!strncmp(argv[i], "--nproc=", 8)) continue;
        av[k++] = argv[i];
    }
    av[k] = NULL;
    fflush(NULL);
    sigset_t stop, old;   /* held until the handlers know mpirun's pid */
    sigemptyset(&stop);
    sigaddset(&stop, SIGTERM);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGUSR1);
    sigprocmask(SIG_BLOCK, &stop, &old);
    pid_t child = fork();
    if (child == 0) {
        setpgid(0, 0);   /* a terminal's Ctrl-C reaches us, not mpirun (signals.c) */
        sigprocmask(SIG_SETMASK, &old, NULL);
        execvp(av[0], av);
        fprintf(stderr, "dtrain: --nproc: cannot run %s: is Open MPI installed (openmpi-bin)?\n", av[0]);
        _exit(127);
    }
    free(av);
    if (child < 0) { perror("dtrain: --nproc: fork"); sigprocmask(SIG_SETMASK, &old, NULL); return 1; }
    int rc = dt_cli_launch_wait((int)child, &old);
    return rc;
}
