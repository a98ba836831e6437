/* Preemption: SIGTERM / SIGINT / SIGHUP / SIGUSR1 ask the trainer to stop at the next
 * step boundary (the ranks agree on it, save, and exit with 128 + the signal
 * number, as a shell reports a death by that signal); a second SIGTERM or
 * SIGINT restores the default action and re-raises it: the process dies at
 * once. SIGUSR1 only ever asks: it is what launchers pass on, and repeat
 * (SIGURG is our launcher's SIGUSR1 through mpirun, below). SIGHUP is a
 * closed terminal or ssh session: the run saves and stops as for SIGTERM
 * (exit 129), where its default action lost the steps since the last save
 * and, for the launcher, left mpirun and the ranks running unwatched; like
 * SIGUSR1 it only ever asks (a hang-up arrives twice: from the shell, then
 * the kernel), and under nohup (SIGHUP ignored from the start) it stays
 * ignored.
 *
 * The --nproc launcher (launch.c) runs mpirun as a child in a process group of
 * its own, so a terminal's Ctrl-C reaches only the launcher, and passes the
 * stop on itself. A signal may come at any moment, also before mpirun has
 * started a rank or before a rank could handle it (its default action would
 * kill it; a rank killed while Open MPI starts can leave mpirun hanging), so
 * to ranks on its own machine the launcher passes it itself:
 *   - it shares a private directory with its ranks (DTRAIN_LAUNCH_DIR, made
 *     with mkdtemp): a rank, once its handlers are installed (first thing in
 *     dt_cli_run, before MPI_Init), creates ready.<pid> there, then reads the
 *     file "stop" if it exists and requests that stop itself;
 *   - on its first signal the launcher writes "stop" (the signal's number),
 *     then sends the signal to every rank whose ready file it sees. A rank
 *     ready before that listing gets the signal; one ready after it finds
 *     the file. Either way every rank has the request, whenever it started,
 *     and stops before or after its current step (src/train/run.c).
 * With every rank here, the launcher waits with bounded patience: when every
 * rank has exited but mpirun has not after RANKS_GONE_S, or a stop is pending
 * and no further rank has become ready for STUCK_START_S, or after a second
 * signal (sent on to the ranks, which die at once, and to mpirun as SIGTERM,
 * its abort), it SIGTERMs mpirun, and TERM_GRACE_S later SIGKILLs mpirun's
 * process group and every rank it knows. Its exit status is then 128 + the
 * first signal.
 *
 * With --hosts / --hostfile / Slurm the directory reaches only the ranks on
 * the launcher's machine (DTRAIN_LAUNCH_MACHINE: host name, boot id and pid
 * namespace; a rank elsewhere that sees the path on a shared file system
 * leaves it alone). One rank's request is enough: the ranks agree on a stop at every
 * step boundary (src/train/stop.c), so the others stop at the same step.
 * When ranks are expected here (dt_cli_hosts_here) or some are ready, the
 * first signal goes only through the directory, at any moment of start-up.
 * Otherwise, or when none is ready STUCK_START_S after the stop, it goes to
 * mpirun as SIGURG, which Open MPI 4.1 forwards to the ranks it has started
 * (by default: SIGURG is in ess/base's forwardable table) and a rank sent by
 * kill() takes as SIGUSR1: first when mpirun is MPIRUN_SETTLE_S old (a
 * SIGUSR1 it got in its first ~0.2 s was lost, the job trained to its end, or
 * ended the job at once with status 0: Open MPI 4.1, simulated hosts), then
 * at twice that age up to FORWARD_EVERY_S, then every FORWARD_EVERY_S while
 * the job runs, for ranks on machines whose daemons were not up yet (a
 * repeated ask only asks again). SIGURG, not SIGUSR1, because its default
 * action is to be ignored: a rank that is still loading, before its handlers
 * are installed, lets it pass and takes a later one, where SIGUSR1 killed it
 * and failed the job. (The kernel's own SIGURG, urgent data on a socket that
 * named the process its owner, is no stop: si_code tells them apart.) With
 * ess_base_forward_signals = none (environment or MCA parameter file) mpirun
 * forwards nothing, so the stop goes to it as SIGTERM, its abort, said on
 * stderr. A second signal goes to mpirun as SIGTERM (and SIGKILL
 * TERM_GRACE_S later). mpirun's own SIGTERM / SIGINT handling would instead
 * SIGCONT the ranks, SIGTERM them odls_base_sigkill_timeout (default 1) s
 * later and SIGKILL them after as long again: too short for a checkpoint
 * but for small models.
 * Under a plain `mpirun`, send mpirun SIGUSR1 to stop the job this way, or
 * give the ranks more time with --mca odls_base_sigkill_timeout S (mpirun
 * then takes 2 S to exit). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "cli.h"

#define RANKS_GONE_S 10.0    /* every rank exited, mpirun still running */
#define STUCK_START_S 20.0   /* a stop pending, no new rank ready */
#define TERM_GRACE_S 5.0     /* mpirun SIGTERMed: then SIGKILL */
#define MPIRUN_SETTLE_S 1.0  /* a SIGUSR1 mpirun gets younger is lost or ends it with status 0 */
#define FORWARD_EVERY_S 64.0 /* SIGURG to mpirun at ages 1, 2, 4 ... 64, then every 64 s */

static volatile sig_atomic_t g_seen;    /* signals received (ranks and launcher) */
static volatile sig_atomic_t g_first;   /* the first one's number */
static volatile sig_atomic_t g_last;    /* launcher: the latest one's */

static void die_now(int sig) {
    signal(sig, SIG_DFL);
    raise(sig);
}

static void on_rank_signal(int sig) {
    if (g_seen++) {
        /* (SIGUSR1: a launcher's repeat of the same stop; SIGHUP: a hang-up
         * comes twice, from the shell and from the kernel, and must not turn
         * the save into a kill) */
        if (sig != SIGUSR1 && sig != SIGHUP) die_now(sig);
        return;
    }
    g_first = sig;
    /* mpirun's abort may close our stdout before we have saved: a progress
     * line must not kill us (SIGPIPE) on the way to the checkpoint */
    signal(SIGPIPE, SIG_IGN);
    dt_train_request_stop(sig);
}

/* SIGURG sent by a process (si_code <= 0: kill, tgkill, sigqueue): the
 * launcher's ask through mpirun (above), a SIGUSR1; the kernel's (SI_KERNEL,
 * a socket's urgent data) is none */
static void on_rank_sigurg(int sig, siginfo_t *si, void *ctx) {
    (void)sig;
    (void)ctx;
    if (si && si->si_code <= 0) on_rank_signal(SIGUSR1);
}

/* the launcher only counts: its wait loop acts (kill, files) */
static void on_launcher_signal(int sig) {
    if (g_seen && (sig == SIGUSR1 || sig == SIGHUP)) return;   /* only asks again: not the second signal */
    if (!g_seen) g_first = sig;
    g_last = sig;
    g_seen++;
}

/* the stop signals to fn; SIGURG to urg (ranks) or left alone (NULL: the
 * launcher, to which nothing sends it) */
static void install(void (*fn)(int), void (*urg)(int, siginfo_t *, void *)) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = fn;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    const int sigs[] = {SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGURG};
    for (int i = 0; i < 5; i++) sigaddset(&sa.sa_mask, sigs[i]);   /* one handler at a time */
    for (int i = 0; i < 4; i++) {
        struct sigaction was;   /* nohup (SIGHUP ignored, inherited) keeps the run going as it asked */
        if (sigs[i] == SIGHUP && sigaction(SIGHUP, NULL, &was) == 0 && was.sa_handler == SIG_IGN) continue;
        sigaction(sigs[i], &sa, NULL);
    }
    if (urg) {
        sa.sa_handler = NULL;
        sa.sa_sigaction = urg;
        sa.sa_flags = SA_RESTART | SA_SIGINFO;
        sigaction(SIGURG, &sa, NULL);
    }
}

void dt_cli_signals_install(void) { install(on_rank_signal, on_rank_sigurg); }

int dt_cli_stop_status(void) {
    int code = dt_train_stopped();
    return code ? 128 + code : 0;
}

/* ---- rank side of the launch directory ---- */

int dt_cli_machine_key(char *buf, size_t n) {
    char host[256] = "", boot[64] = "", pidns[64] = "";
    if (gethostname(host, sizeof host - 1)) host[0] = 0;
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        if (!fgets(boot, sizeof boot, f)) boot[0] = 0;
        fclose(f);
        boot[strcspn(boot, "\n")] = 0;
    }
    /* containers on one kernel with one host name: their own process ids */
    ssize_t l = readlink("/proc/self/ns/pid", pidns, sizeof pidns - 1);
    pidns[l > 0 ? l : 0] = 0;
    if (!*host || !*boot || !*pidns) return -1;
    return snprintf(buf, n, "%s/%s/%s", host, boot, pidns) < (int)n ? 0 : -1;
}

void dt_cli_launch_ready(void) {
    const char *dir = getenv(DT_CLI_LAUNCH_DIR_ENV), *machine = getenv(DT_CLI_LAUNCH_MACHINE_ENV);
    char path[4096], me[512];
    if (!dir || !*dir || snprintf(path, sizeof path, "%s/ready.%ld", dir, (long)getpid()) >= (int)sizeof path) return;
    /* on another machine a pid means nothing to the launcher */
    if (machine && (dt_cli_machine_key(me, sizeof me) || strcmp(me, machine))) return;
    int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) return;   /* (not this machine's launcher: it signals through mpirun) */
    close(fd);
    snprintf(path, sizeof path, "%s/stop", dir);
    fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) return;
    char buf[16] = {0};
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    int code = n > 0 ? atoi(buf) : 0;
    if (code < 1 || code > 31) return;
    signal(SIGPIPE, SIG_IGN);   /* as on_rank_signal */
    dt_train_request_stop(code);
}

/* ---- launcher side ---- */

typedef struct launch_watch {
    const char *dir;   /* NULL: none (out of memory; this machine not told apart) */
    int nproc;         /* ranks in the job, on any machine */
    dt_cli_launch_where where;
    pid_t *pid;        /* ranks seen ready, n of them */
    int n;
} launch_watch;

/* adds the ranks that became ready since; 1 if any */
static int scan_ready(launch_watch *w) {
    if (!w->dir || w->n >= w->nproc) return 0;
    DIR *d = opendir(w->dir);
    if (!d) return 0;
    int added = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL && w->n < w->nproc) {
        char *end = NULL;
        if (strncmp(e->d_name, "ready.", 6)) continue;
        long p = strtol(e->d_name + 6, &end, 10);
        if (p <= 0 || !end || *end) continue;
        int known = 0;
        for (int i = 0; i < w->n && !known; i++) known = w->pid[i] == (pid_t)p;
        if (!known) { w->pid[w->n++] = (pid_t)p; added = 1; }
    }
    closedir(d);
    return added;
}

/* running: neither gone nor a zombie waiting for mpirun to reap it */
static int running(pid_t p) {
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%ld/stat", (long)p);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *rp = strrchr(buf, ')');   /* "pid (comm) S ..." */
    return rp && rp[1] == ' ' && rp[2] != 'Z' && rp[2] != 'X';
}

static void signal_ranks(const launch_watch *w, int sig) {
    for (int i = 0; i < w->n; i++) kill(w->pid[i], sig);
}

/* "stop" in the directory, whole or not at all (temp file, rename) */
static void write_stop(const char *dir, int code) {
    char tmp[4096], path[4096], buf[16];
    if (snprintf(tmp, sizeof tmp, "%s/stop.tmp", dir) >= (int)sizeof tmp) return;
    snprintf(path, sizeof path, "%s/stop", dir);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) return;
    int len = snprintf(buf, sizeof buf, "%d\n", code);
    ssize_t wr = write(fd, buf, (size_t)len);
    close(fd);
    if (wr == len) rename(tmp, path);
}

void dt_cli_launch_dir_remove(const char *dir) {
    if (!dir) return;
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d)) != NULL)
            if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) unlinkat(dirfd(d), e->d_name, 0);
        closedir(d);
    }
    rmdir(dir);
}

/* an MCA value (after '=', to a comment or the end) is "none" */
static int param_says_none(const char *value) {
    while (*value == ' ' || *value == '\t') value++;
    size_t n = strcspn(value, " \t\r\n#");
    return n == 4 && !strncmp(value, "none", 4);
}

/* -1: FILE does not set it; else whether it says none */
static int file_says_none(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char line[1024];
    int found = -1;
    while (fgets(line, sizeof line, f)) {
        const char *p = line + strspn(line, " \t");
        static const char *const names[] = {"ess_base_forward_signals", "ess_hnp_forward_signals"};
        for (int i = 0; i < 2; i++) {
            size_t l = strlen(names[i]);
            if (strncmp(p, names[i], l)) continue;
            const char *q = p + l + strspn(p + l, " \t");
            if (*q == '=') found = param_says_none(q + 1);   /* (the last line wins) */
        }
    }
    fclose(f);
    return found;
}

/* (cli.h) The synonym ess_hnp_forward_signals counts too; the environment
 * first, then the user's and the system's file, as Open MPI's precedence. */
int dt_cli_mpirun_forwards_nothing(char *why, size_t n) {
    static const char *const env[] = {"OMPI_MCA_ess_base_forward_signals", "OMPI_MCA_ess_hnp_forward_signals"};
    for (int i = 0; i < 2; i++) {
        const char *v = getenv(env[i]);
        if (v && *v) {
            snprintf(why, n, "%s=%s", env[i], v);
            return param_says_none(v);
        }
    }
    char user[4096] = "";
    const char *home = getenv("HOME");
    if (home && *home) snprintf(user, sizeof user, "%s/.openmpi/mca-params.conf", home);
    const char *files[] = {user, "/etc/openmpi/openmpi-mca-params.conf"};
    for (int i = 0; i < 2; i++) {
        int r = files[i][0] ? file_says_none(files[i]) : -1;
        if (r < 0) continue;
        snprintf(why, n, "ess_base_forward_signals = none in %s", files[i]);
        return r;
    }
    return 0;
}

int dt_cli_launch_wait(int child, const sigset_t *unblock, const char *dir, int nproc, dt_cli_launch_where where) {
    launch_watch w = {.dir = dir, .nproc = nproc, .where = where};
    if (dir && !(w.pid = calloc((size_t)(nproc > 0 ? nproc : 1), sizeof *w.pid))) w.dir = NULL;
    install(on_launcher_signal, NULL);
    sigprocmask(SIG_SETMASK, unblock, NULL);   /* signals held since the fork arrive now */
    if (child <= 0) { free(w.pid); return 1; }
    int st = 0, acted = 0, killed = 0, forward = 0, rc;
    char why[4200] = "";
    int no_forward = -1;   /* the user's "forward nothing": read once a stop must go through mpirun */
    double next_forward = MPIRUN_SETTLE_S;   /* mpirun's age at the next SIGURG */
    double started = dt_cli_mono_s(), last_ready = started, gone_since = 0, term_at = 0, first_at = 0;
    for (;;) {
        pid_t r = waitpid((pid_t)child, &st, WNOHANG);
        if (r == (pid_t)child) break;
        if (r < 0 && errno != EINTR) { st = -1; break; }
        double now = dt_cli_mono_s();
        if (scan_ready(&w)) last_ready = now;
        int seen = g_seen;
        if (seen > acted) {
            if (!acted) {   /* the first: a stop at the next step boundary */
                if (w.dir) {
                    write_stop(w.dir, g_first);
                    scan_ready(&w);   /* after the file: a rank not listed now reads it */
                    signal_ranks(&w, g_first);
                }
                /* no rank of ours here to take it to the others: through mpirun */
                if (!w.dir || (w.where == DT_LAUNCH_ELSEWHERE && w.n == 0)) forward = 1;
                last_ready = first_at = now;
            } else {        /* a second: at once */
                signal_ranks(&w, g_last);
                if (!term_at) { kill((pid_t)child, SIGTERM); term_at = now; }
            }
            acted = seen;
        }
        /* ranks were expected here and none came: the stop goes through mpirun after all */
        if (acted && w.n == 0 && w.where != DT_LAUNCH_ALL_HERE && now - first_at > STUCK_START_S) forward = 1;
        if (forward && no_forward < 0) no_forward = dt_cli_mpirun_forwards_nothing(why, sizeof why);
        if (forward && !term_at && no_forward && now - started >= MPIRUN_SETTLE_S) {
            fprintf(stderr, "dtrain: %s: mpirun passes no signal on to the ranks, so the stop ends the job through "
                            "mpirun's SIGTERM (ranks get odls_base_sigkill_timeout seconds, no checkpoint unless they "
                            "finish it)\n", why);
            kill((pid_t)child, SIGTERM);
            term_at = now;
        }
        if (forward && !term_at && now - started >= next_forward) {
            kill((pid_t)child, SIGURG);
            while (next_forward <= now - started)   /* 1, 2, 4 ... 64 s, then every 64 s */
                next_forward = next_forward < FORWARD_EVERY_S ? 2 * next_forward : next_forward + FORWARD_EVERY_S;
        }
        if (w.dir && w.where == DT_LAUNCH_ALL_HERE && !term_at) {
            int alive = 0;
            for (int i = 0; i < w.n; i++) alive += running(w.pid[i]);
            if (w.n == w.nproc && !alive) {
                if (!gone_since) gone_since = now;
            } else {
                gone_since = 0;
            }
            int stuck = (gone_since && now - gone_since > RANKS_GONE_S) ||
                        (acted && w.n < w.nproc && now - last_ready > STUCK_START_S);
            if (stuck) {
                fprintf(stderr, "dtrain: mpirun %s: terminating it\n",
                        gone_since ? "does not exit after its ranks did" : "has not started every rank");
                kill((pid_t)child, SIGTERM);
                term_at = now;
            }
        }
        if (term_at && !killed && now - term_at > TERM_GRACE_S) {
            kill(-(pid_t)child, SIGKILL);   /* mpirun's process group (launch.c) */
            kill((pid_t)child, SIGKILL);
            signal_ranks(&w, SIGKILL);      /* ranks have process groups of their own */
            killed = 1;
        }
        nanosleep(&(struct timespec){0, 20000000}, NULL);   /* a signal cuts it short */
    }
    int started_here = w.n;
    free(w.pid);
    if (st < 0) return 1;
    rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    /* stopped on the ask we sent (the ranks' SIGUSR1), or ended by us: report the signal we got */
    if (g_seen && (rc == 128 + SIGUSR1 || term_at)) rc = 128 + g_first;
    /* what mpirun --quiet and a rank that died by a signal leave unsaid (a
     * rank's own error, or its stop on a signal sent to it, has printed its
     * line; 125 / 127: the launch's own failure, said where it happened) */
    int sig = rc - 128, stop = sig == SIGTERM || sig == SIGINT || sig == SIGHUP || sig == SIGUSR1;
    if (!g_seen && WIFSIGNALED(st))
        fprintf(stderr, "dtrain: mpirun was ended by signal %d (%s); the job failed\n", WTERMSIG(st),
                strsignal(WTERMSIG(st)));
    else if (!g_seen && sig > 0 && sig <= 64 && !stop)   /* (Linux: signals 1 .. 64) */
        fprintf(stderr, "dtrain: a rank was ended by signal %d (%s)%s; the job failed\n", sig, strsignal(sig),
                sig == SIGKILL ? ": the kernel's out-of-memory killer (see dmesg) or a kill -9" : "");
    else if (!g_seen && rc != 0 && rc != DT_CLI_LAUNCH_FAILED && rc != 127 && dir && where == DT_LAUNCH_ALL_HERE &&
             started_here == 0)
        fprintf(stderr, "dtrain: mpirun failed (exit %d) before any rank started; the command --print-launch shows, "
                        "run without its --quiet, prints mpirun's own message\n", rc);
    return rc;
}

int dt_cli_launcher_signalled(void) { return g_seen != 0; }
