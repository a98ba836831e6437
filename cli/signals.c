/* Preemption: SIGTERM / SIGINT / SIGUSR1 ask the trainer to stop at the next
 * step boundary (the ranks agree on it, save, and exit with 128 + the signal
 * number, as a shell reports a death by that signal); a second signal
 * restores the default action and re-raises it: the process dies at once.
 *
 * The --nproc launcher (launch.c) runs mpirun as a child in a process group of
 * its own and turns its first SIGTERM / SIGINT into a SIGUSR1 for mpirun, which
 * Open MPI forwards to every rank at once (ess_base_forward_signals). mpirun's
 * own SIGTERM / SIGINT handling would instead SIGCONT the ranks, SIGTERM them
 * odls_base_sigkill_timeout (default 1) s later and SIGKILL them after as
 * long again: too short for a checkpoint but for small models. A second
 * signal is passed on to mpirun as SIGTERM (its abort: the ranks die).
 * Under a plain `mpirun`, send mpirun SIGUSR1 to stop the job this way, or
 * give the ranks more time with --mca odls_base_sigkill_timeout S (mpirun
 * then takes 2 S to exit). */
#include <errno.h>
#include <signal.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>
#include "cli.h"

static volatile sig_atomic_t g_seen;    /* signals received (ranks and launcher) */
static volatile sig_atomic_t g_first;   /* the first one's number */
static volatile sig_atomic_t g_child;   /* launcher: mpirun's pid */

static void die_now(int sig) {
    signal(sig, SIG_DFL);
    raise(sig);
}

static void on_rank_signal(int sig) {
    if (g_seen++) { die_now(sig); return; }
    g_first = sig;
    /* mpirun's abort may close our stdout before we have saved: a progress
     * line must not kill us (SIGPIPE) on the way to the checkpoint */
    signal(SIGPIPE, SIG_IGN);
    dt_train_request_stop(sig);
}

static void on_launcher_signal(int sig) {
    if (!g_seen++) g_first = sig;
    if (g_child > 0) kill((pid_t)g_child, g_seen == 1 ? SIGUSR1 : SIGTERM);
}

static void install(void (*fn)(int)) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = fn;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    const int sigs[] = {SIGTERM, SIGINT, SIGUSR1};
    for (int i = 0; i < 3; i++) sigaction(sigs[i], &sa, NULL);
}

void dt_cli_signals_install(void) { install(on_rank_signal); }

int dt_cli_stop_status(void) {
    int code = dt_train_stopped();
    return code ? 128 + code : 0;
}

int dt_cli_launch_wait(int child, const sigset_t *unblock) {
    g_child = child;
    install(on_launcher_signal);
    sigprocmask(SIG_SETMASK, unblock, NULL);   /* signals held since the fork arrive now */
    int st;
    pid_t r;
    if (child <= 0) return 1;
    while ((r = waitpid((pid_t)child, &st, 0)) < 0 && errno == EINTR) {}
    if (r < 0) return 1;
    int rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    /* the ranks stopped on the SIGUSR1 we sent: report the signal we got */
    if (g_seen && rc == 128 + SIGUSR1) rc = 128 + g_first;
    return rc;
}
