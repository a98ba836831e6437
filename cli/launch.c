/* --nproc N [--hosts LIST | --hostfile F | inside Slurm]: re-launch this
 * command under mpirun, on this machine or across machines. The environment
 * that decides what every rank computes (DTRAIN_*, OPENBLAS_*, ONEDNN_*,
 * DNNL_*, OMP_NUM_THREADS) is passed to every rank with -x, so remote hosts
 * make the same GEMM and kernel choices as this one. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif
#include "cli.h"

extern char **environ;

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

static int forwarded(const char *kv) {
    static const char *const pre[] = {"DTRAIN_", "OPENBLAS_", "ONEDNN_", "DNNL_", "OMP_NUM_THREADS="};
    for (size_t i = 0; i < sizeof pre / sizeof *pre; i++)
        if (!strncmp(kv, pre[i], strlen(pre[i]))) return 1;
    return 0;
}

/* 'word' for a shell, when it needs quoting */
static void print_word(const char *w) {
    if (*w && strspn(w, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./:=,@%+") == strlen(w)) {
        fputs(w, stdout);
        return;
    }
    putchar('\'');
    for (; *w; w++) {
        if (*w == '\'') fputs("'\\''", stdout);
        else putchar(*w);
    }
    putchar('\'');
}

int dt_cli_relaunch(int argc, char **argv, int nproc, int threads, const dt_cli_hosts *h, int print_only) {
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) { fprintf(stderr, "dtrain: cannot find own executable for --nproc\n"); return DT_CLI_LAUNCH_FAILED; }
    self[n] = 0;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (cores < 1) cores = 1;
    int local = h->n == 0 && !h->slurm;
    /* threads per rank: this machine's cores over the ranks on the fullest
     * machine (remote machines are assumed to have as many cores) */
    int per_host = local ? nproc : h->n ? dt_cli_hosts_max_slots(h) : 1;
    if (h->slurm) {
        const char *c = getenv("SLURM_CPUS_ON_NODE");
        long cpus = c ? strtol(c, NULL, 10) : cores;
        if (cpus > 0) cores = cpus;
        per_host = h->slurm_per_node;
    }
    int per_rank = threads > 0 ? threads : (int)(cores / per_host > 0 ? cores / per_host : 1);
    char np[16], th[16];
    snprintf(np, sizeof np, "%d", nproc);
    snprintf(th, sizeof th, "%d", per_rank);
    setenv("OMP_NUM_THREADS", th, 1);
    setenv("DTRAIN_TTY", isatty(STDOUT_FILENO) ? "1" : "0", 1);
    /* the launcher and its ranks on this machine share a directory for stop
     * requests (signals.c); it reaches them with the environment (DTRAIN_*) */
    char dir[4096] = "", machine[512];
    unsetenv(DT_CLI_LAUNCH_DIR_ENV);
    unsetenv(DT_CLI_LAUNCH_MACHINE_ENV);
    /* (with other machines only where this one can be told apart) */
    if (!print_only && (local || !dt_cli_machine_key(machine, sizeof machine))) {
        const char *tmpdir = getenv("TMPDIR");
        if (!tmpdir || !*tmpdir) tmpdir = "/tmp";
        if (snprintf(dir, sizeof dir, "%s/dtrain-launch.XXXXXX", tmpdir) >= (int)sizeof dir || !mkdtemp(dir)) {
            fprintf(stderr, "dtrain: --nproc: cannot create a directory in %s: %s\n", tmpdir, strerror(errno));
            return DT_CLI_LAUNCH_FAILED;
        }
        setenv(DT_CLI_LAUNCH_DIR_ENV, dir, 1);
        if (!local) setenv(DT_CLI_LAUNCH_MACHINE_ENV, machine, 1);
    }
    size_t nenv = 0;
    for (char **e = environ; *e; e++) nenv += forwarded(*e);
    char **av = calloc((size_t)argc + 32 + 2 * nenv, sizeof *av);
    char **names = calloc(nenv + 1, sizeof *names);
    char *hostlist = NULL;
    if (!av || !names) {
        fprintf(stderr, "dtrain: --nproc: out of memory\n");
        free(av); free(names); dt_cli_launch_dir_remove(*dir ? dir : NULL);
        return DT_CLI_LAUNCH_FAILED;
    }
    int k = 0;
    av[k++] = DT_MPIEXEC;
    av[k++] = "-np";
    av[k++] = np;
    if (local && nproc > cores) av[k++] = "--oversubscribe";
    if (geteuid() == 0) av[k++] = "--allow-run-as-root";
    if (h->hostfile) {
        av[k++] = "--hostfile";
        av[k++] = (char *)h->hostfile;
    } else if (h->n) {
        size_t len = 1;
        for (int i = 0; i < h->n; i++) len += strlen(h->name[i]) + 16;
        hostlist = malloc(len);
        if (!hostlist) {
            fprintf(stderr, "dtrain: --nproc: out of memory\n");
            free(av); free(names); dt_cli_launch_dir_remove(*dir ? dir : NULL);
            return DT_CLI_LAUNCH_FAILED;
        }
        size_t o = 0;
        for (int i = 0; i < h->n; i++) o += (size_t)snprintf(hostlist + o, len - o, "%s%s:%d", i ? "," : "", h->name[i], h->slots[i]);
        av[k++] = "--host";
        av[k++] = hostlist;
    }
    if (!local) { av[k++] = "--map-by"; av[k++] = "slot"; }   /* machine by machine: consecutive ranks share one */
    /* a machine that goes silent (power, network) sends no reset: mpirun
     * notices its daemon is gone only by TCP keepalives on their control
     * connection, after 300 + 9 x 20 s by default; here after about 20 s, so
     * the job ends (and --max-restarts restarts it) instead of hanging.
     * OMPI_MCA_oob_tcp_keepalive_* set by the user win. */
    if (!local && !getenv("OMPI_MCA_oob_tcp_keepalive_time")) {
        static char *const keep[] = {"--mca", "oob_tcp_keepalive_time", "10", "--mca", "oob_tcp_keepalive_intvl", "2",
                                     "--mca", "oob_tcp_keepalive_probes", "5"};
        for (size_t i = 0; i < sizeof keep / sizeof *keep; i++) av[k++] = keep[i];
    }
    /* what every rank must decide alike (GEMM library and kernels, threads) */
    size_t ne = 0;
    for (char **e = environ; *e; e++) {
        if (!forwarded(*e)) continue;
        size_t nl = strcspn(*e, "=");
        names[ne] = strndup(*e, nl);
        if (!names[ne]) break;
        av[k++] = "-x";
        av[k++] = names[ne++];
    }
    av[k++] = "--bind-to";
    av[k++] = "none";
    /* the ranks report errors and stops themselves (one line per job, exit
     * status 128 + signal): no mpirun banners on top. dtrain reads no stdin,
     * and mpirun runs in a process group of its own (signals.c) */
    av[k++] = "--quiet";
    av[k++] = "--stdin";
    av[k++] = "none";
    av[k++] = self;
    static const char *const ours[] = {"--nproc", "--hosts", "--hostfile", "--max-restarts", "--min-nproc"};
    for (int i = 1; i < argc; i++) {
        int skip = 0;
        for (size_t j = 0; j < sizeof ours / sizeof *ours && !skip; j++) {
            size_t l = strlen(ours[j]);
            if (!strcmp(argv[i], ours[j])) skip = 2;
            else if (!strncmp(argv[i], ours[j], l) && argv[i][l] == '=') skip = 1;
        }
        if (!strcmp(argv[i], "--print-launch")) skip = 1;
        if (skip == 2) i++;
        if (!skip) av[k++] = argv[i];
    }
    av[k] = NULL;
    if (print_only) {
        for (char **e = environ; *e; e++)   /* NAME='value': a quoted NAME=value is no assignment */
            if (forwarded(*e)) {
                size_t nl = strcspn(*e, "=");
                printf("%.*s=", (int)nl, *e);
                print_word((*e)[nl] ? *e + nl + 1 : "");
                putchar(' ');
            }
        for (int i = 0; av[i]; i++) { print_word(av[i]); putchar(av[i + 1] ? ' ' : '\n'); }
        for (size_t i = 0; i < ne; i++) free(names[i]);
        free(names);
        free(hostlist);
        free(av);
        return 0;
    }
    fflush(NULL);
    sigset_t stop, old;   /* held until the handlers know mpirun's pid */
    sigemptyset(&stop);
    sigaddset(&stop, SIGTERM);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGHUP);
    sigaddset(&stop, SIGUSR1);
    sigprocmask(SIG_BLOCK, &stop, &old);
    pid_t parent = getpid();
    pid_t child = fork();
    if (child == 0) {
        setpgid(0, 0);   /* a terminal's Ctrl-C reaches us, not mpirun (signals.c) */
#ifdef __linux__
        /* a launcher killed outright (SIGKILL, the OOM killer) leaves no one
         * to stop the job: mpirun then gets SIGTERM, its abort, which ends
         * the ranks, instead of running on unwatched */
        if (prctl(PR_SET_PDEATHSIG, SIGTERM) != 0) {
            fprintf(stderr, "dtrain: --nproc: cannot tie mpirun to the launcher (prctl): %s\n", strerror(errno));
            _exit(DT_CLI_LAUNCH_FAILED);
        }
        if (getppid() != parent) _exit(DT_CLI_LAUNCH_FAILED);   /* the launcher is gone already */
#else
        (void)parent;
#endif
        sigprocmask(SIG_SETMASK, &old, NULL);
        execvp(av[0], av);
        fprintf(stderr, "dtrain: --nproc: cannot run %s: is Open MPI installed (openmpi-bin)?\n", av[0]);
        _exit(127);
    }
    for (size_t i = 0; i < ne; i++) free(names[i]);
    free(names);
    free(hostlist);
    free(av);
    if (child < 0) {
        perror("dtrain: --nproc: fork");
        sigprocmask(SIG_SETMASK, &old, NULL);
        dt_cli_launch_dir_remove(*dir ? dir : NULL);
        return DT_CLI_LAUNCH_FAILED;
    }
    dt_cli_launch_where where = local ? DT_LAUNCH_ALL_HERE : dt_cli_hosts_here(h, nproc) ? DT_LAUNCH_SOME_HERE : DT_LAUNCH_ELSEWHERE;
    int rc = dt_cli_launch_wait((int)child, &old, *dir ? dir : NULL, nproc, where);
    dt_cli_launch_dir_remove(*dir ? dir : NULL);
    return rc;
}
