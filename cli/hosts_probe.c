/* Which of a job's machines still answer: before an elastic restart
 * (restart.c), each host of the list is asked to run one process through
 * Open MPI's own launch path (`mpirun -np 1 --host H:1 true`: ssh or the
 * user's rsh agent, a daemon there that connects back to this machine), all
 * hosts at once. A host answers when that ends with status 0 within the
 * timeout; a machine that crashed, lost its network or cannot start a daemon
 * does not (mpirun then waits for a daemon that never calls back: it is
 * killed at the timeout). This machine answers without being asked.
 *
 * The probe launches no dtrain and touches no file: it only tells whether
 * the next job could start a rank there. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "cli.h"

#ifndef DT_MPIEXEC
#define DT_MPIEXEC "mpirun"
#endif

double dt_cli_probe_timeout(void) {
    const char *e = getenv(DT_CLI_PROBE_TIMEOUT_ENV);
    double t = e && *e ? strtod(e, NULL) : 30.0;
    return t > 0 ? t : 30.0;
}

int dt_cli_hosts_probe(const dt_cli_hosts *h, int *alive, double timeout_s) {
    pid_t *pid = calloc((size_t)(h->n > 0 ? h->n : 1), sizeof *pid);
    if (!pid) return -1;
    int answering = 0;
    fflush(NULL);
    for (int i = 0; i < h->n; i++) {
        alive[i] = 0;
        if (dt_cli_host_is_here(h->name[i])) {
            alive[i] = 1;
            continue;
        }
        char host[300];
        snprintf(host, sizeof host, "%s:1", h->name[i]);
        pid[i] = fork();
        if (pid[i] == 0) {
            setpgid(0, 0);   /* killed as a group at the timeout: mpirun and its ssh / agent */
            int null = open("/dev/null", O_RDWR);
            if (null >= 0) { dup2(null, 0); dup2(null, 1); dup2(null, 2); }
            const char *av[12];
            int k = 0;
            av[k++] = DT_MPIEXEC;
            av[k++] = "-np";
            av[k++] = "1";
            av[k++] = "--host";
            av[k++] = host;
            if (geteuid() == 0) av[k++] = "--allow-run-as-root";
            av[k++] = "--quiet";
            av[k++] = "true";
            av[k] = NULL;
            execvp(av[0], (char **)av);
            _exit(127);
        }
        if (pid[i] > 0) setpgid(pid[i], pid[i]);
    }
    double end = dt_cli_mono_s() + timeout_s;
    for (;;) {
        int pending = 0;
        for (int i = 0; i < h->n; i++) {
            if (pid[i] <= 0) continue;
            int st;
            pid_t r = waitpid(pid[i], &st, WNOHANG);
            if (r == pid[i]) {
                alive[i] = WIFEXITED(st) && WEXITSTATUS(st) == 0;
                pid[i] = 0;
            } else if (r < 0 && errno != EINTR) {
                pid[i] = 0;
            } else {
                pending++;
            }
        }
        if (!pending) break;
        if (dt_cli_mono_s() >= end) {   /* no answer in time: not alive */
            for (int i = 0; i < h->n; i++)
                if (pid[i] > 0) kill(-pid[i], SIGKILL);
            for (int i = 0; i < h->n; i++)
                if (pid[i] > 0) waitpid(pid[i], NULL, 0);
            break;
        }
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    for (int i = 0; i < h->n; i++) answering += alive[i];
    free(pid);
    return answering;
}
