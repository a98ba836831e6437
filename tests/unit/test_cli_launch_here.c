/* Which ranks a launcher can reach through its launch directory (cli/hosts.c,
 * cli/signals.c): host names that mean this machine, and a rank that takes
 * up the directory only on the machine the launcher names; the signals that
 * reach a rank through mpirun. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <errno.h>
#include <setjmp.h>
#include <cmocka.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/stat.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>
#include "cli.h"
#include "dtrain/train.h"

static void test_names_of_this_machine(void **st) {
    (void)st;
    char me[256] = "", name[300];
    assert_int_equal(gethostname(me, sizeof me - 1), 0);
    assert_true(dt_cli_host_is_here(me));
    assert_true(dt_cli_host_is_here("localhost"));
    assert_true(dt_cli_host_is_here("LocalHost"));
    assert_true(dt_cli_host_is_here("127.0.0.1"));
    assert_true(dt_cli_host_is_here("127.0.1.1"));   /* (Debian's /etc/hosts name for itself) */
    /* case does not matter in a host name */
    snprintf(name, sizeof name, "%s", me);
    for (char *c = name; *c; c++) *c = (char)(*c >= 'a' && *c <= 'z' ? *c - 32 : *c);
    assert_true(dt_cli_host_is_here(name));
    /* the short and the long form name one machine */
    size_t dot = strcspn(me, ".");
    if (me[dot]) {
        snprintf(name, sizeof name, "%.*s", (int)dot, me);
        assert_true(dt_cli_host_is_here(name));
    } else {
        snprintf(name, sizeof name, "%s.cluster.example", me);
        assert_true(dt_cli_host_is_here(name));
    }
    /* other machines */
    snprintf(name, sizeof name, "%sx", me);
    assert_false(dt_cli_host_is_here(name));
    snprintf(name, sizeof name, "x%s", me);
    assert_false(dt_cli_host_is_here(name));
    assert_false(dt_cli_host_is_here("node-that-is-not-here.example"));
    assert_false(dt_cli_host_is_here("192.0.2.77"));   /* TEST-NET-1: never a real interface's */
    assert_false(dt_cli_host_is_here(""));
}

static void test_hosts_with_this_machine(void **st) {
    (void)st;
    char me[256] = "", list[600], err[256];
    assert_int_equal(gethostname(me, sizeof me - 1), 0);
    dt_cli_hosts h;
    snprintf(list, sizeof list, "node-a.example:2,%s:2", me);
    assert_int_equal(dt_cli_hosts_parse(list, NULL, &h, err, sizeof err), 0);
    assert_true(dt_cli_hosts_here(&h, 4));
    assert_true(dt_cli_hosts_here(&h, 3));    /* rank 2 is here */
    assert_false(dt_cli_hosts_here(&h, 2));   /* both on node-a: this machine is a spare */
    dt_cli_hosts_free(&h);
    assert_int_equal(dt_cli_hosts_parse("node-a.example:2,node-b.example:2", NULL, &h, err, sizeof err), 0);
    assert_false(dt_cli_hosts_here(&h, 4));
    dt_cli_hosts_free(&h);
}

static int exists(const char *dir, const char *name) {
    char p[4200];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return access(p, F_OK) == 0;
}

/* A rank makes ready.<pid> and takes up "stop" only where the launcher's
 * machine key is its own: on another machine that sees the directory (a
 * shared file system) its pid would name some other process here. */
static void test_rank_takes_the_directory_only_on_the_launchers_machine(void **st) {
    (void)st;
    char dir[] = "/tmp/dtrain-test-launch.XXXXXX", key[512], ready[64], path[4200];
    assert_non_null(mkdtemp(dir));
    snprintf(ready, sizeof ready, "ready.%ld", (long)getpid());
    snprintf(path, sizeof path, "%s/stop", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("15\n", f);
    fclose(f);
    setenv(DT_CLI_LAUNCH_DIR_ENV, dir, 1);

    setenv(DT_CLI_LAUNCH_MACHINE_ENV, "other-machine/00000000-0000-0000-0000-000000000000", 1);
    dt_cli_launch_ready();
    assert_false(exists(dir, ready));
    assert_int_equal(dt_train_stop_requested(), 0);

    assert_int_equal(dt_cli_machine_key(key, sizeof key), 0);
    assert_non_null(strchr(key, '/'));
    setenv(DT_CLI_LAUNCH_MACHINE_ENV, key, 1);
    dt_cli_launch_ready();
    assert_true(exists(dir, ready));
    assert_int_equal(dt_train_stop_requested(), 15);

    unsetenv(DT_CLI_LAUNCH_MACHINE_ENV);
    unsetenv(DT_CLI_LAUNCH_DIR_ENV);
    dt_cli_launch_dir_remove(dir);
    assert_int_equal(access(dir, F_OK), -1);
}

/* SIGUSR1 is what a launcher passes on, through mpirun and again: a
 * repeat asks for the same stop, it does not kill the rank (a second
 * SIGTERM or SIGINT does) */
static void test_repeated_sigusr1_only_asks(void **st) {
    (void)st;
    dt_cli_signals_install();
    raise(SIGUSR1);
    assert_int_equal(dt_train_stop_requested(), SIGUSR1);
    raise(SIGUSR1);
    raise(SIGUSR1);
    assert_int_equal(dt_train_stop_requested(), SIGUSR1);   /* (alive) */
    signal(SIGUSR1, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGINT, SIG_DFL);
}

static volatile sig_atomic_t g_urg_code = -100;
static void note_sigurg(int sig, siginfo_t *si, void *ctx) {
    (void)sig;
    (void)ctx;
    g_urg_code = si ? si->si_code : -99;
}

/* The kernel's SIGURG: one urgent (out-of-band) byte arriving on a loopback
 * TCP connection whose receiving end names this process its owner (the
 * signal is raised as the byte arrives). 0: it arrived; -1: no loopback
 * networking here, or nothing within 10 s. */
static int kernel_sigurg(void) {
    int l = socket(AF_INET, SOCK_STREAM, 0), c = socket(AF_INET, SOCK_STREAM, 0), a = -1, rc = -1;
    struct sockaddr_in sin;
    memset(&sin, 0, sizeof sin);
    sin.sin_family = AF_INET;
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof sin;
    if (l >= 0 && c >= 0 && !bind(l, (struct sockaddr *)&sin, sizeof sin) && !listen(l, 1) &&
        !getsockname(l, (struct sockaddr *)&sin, &len) && !connect(c, (struct sockaddr *)&sin, sizeof sin) &&
        (a = accept(l, NULL, NULL)) >= 0 && !fcntl(a, F_SETOWN, getpid()) && send(c, "!", 1, MSG_OOB) == 1) {
        struct pollfd pf = {.fd = a, .events = POLLPRI};
        char b;
        int r;
        while ((r = poll(&pf, 1, 10000)) < 0 && errno == EINTR) {}   /* (the SIGURG itself may cut it short) */
        if (r == 1 && recv(a, &b, 1, MSG_OOB) == 1) rc = 0;
    }
    if (a >= 0) close(a);
    if (c >= 0) close(c);
    if (l >= 0) close(l);
    return rc;
}

/* SIGURG is our launcher's SIGUSR1 through mpirun (signals.c): a rank that
 * has no handlers yet ignores it (SIGUSR1 killed it and failed the job), one
 * that has takes it as SIGUSR1, and a repeat only asks again; the kernel's
 * SIGURG (a socket's urgent data) asks nothing. In a child: the handlers'
 * state is per process. */
static void test_sigurg_is_the_launchers_ask(void **st) {
    (void)st;
    pid_t p = fork();
    assert_true(p >= 0);
    if (p == 0) {
        raise(SIGURG);   /* still loading: passes */
        if (dt_train_stop_requested()) _exit(2);
        /* the kernel's SIGURG exists here and says so in si_code */
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = note_sigurg;
        sa.sa_flags = SA_SIGINFO;
        sigaction(SIGURG, &sa, NULL);
        if (kernel_sigurg()) _exit(77);   /* (no loopback TCP here) */
        if (g_urg_code <= 0) _exit(5);
        dt_cli_signals_install();
        if (kernel_sigurg()) _exit(77);
        if (dt_train_stop_requested()) _exit(6);   /* no stop from a socket */
        raise(SIGURG);
        if (dt_train_stop_requested() != SIGUSR1) _exit(3);
        raise(SIGURG);
        raise(SIGURG);
        _exit(dt_train_stop_requested() == SIGUSR1 ? 0 : 4);
    }
    int status = 0;
    assert_int_equal(waitpid(p, &status, 0), p);
    assert_true(WIFEXITED(status));
    if (WEXITSTATUS(status) == 77) skip();   /* no loopback TCP to raise the kernel's SIGURG */
    assert_int_equal(WEXITSTATUS(status), 0);
}

/* "Forward no signal" reaches the launcher from the environment (either
 * name) before the user's MCA parameter file, which it reads as Open MPI
 * does; anything but none leaves SIGURG forwarded. */
static void test_forward_nothing_where_set(void **st) {
    (void)st;
    char why[4200];
    char home[] = "/tmp/dt_fwd_home_XXXXXX", dir[256], conf[320];
    assert_non_null(mkdtemp(home));
    snprintf(dir, sizeof dir, "%s/.openmpi", home);
    snprintf(conf, sizeof conf, "%s/mca-params.conf", dir);
    char *old_home = getenv("HOME") ? strdup(getenv("HOME")) : NULL;
    setenv("HOME", home, 1);
    unsetenv("OMPI_MCA_ess_base_forward_signals");
    unsetenv("OMPI_MCA_ess_hnp_forward_signals");
    int sys_none = dt_cli_mpirun_forwards_nothing(why, sizeof why);   /* this machine's own file */
    if (!sys_none) {
        assert_int_equal(mkdir(dir, 0700), 0);
        FILE *f = fopen(conf, "w");
        assert_non_null(f);
        fputs("# off\n  ess_base_forward_signals = none   # no forwarding\n", f);
        fclose(f);
        assert_int_equal(dt_cli_mpirun_forwards_nothing(why, sizeof why), 1);
        assert_non_null(strstr(why, conf));
        f = fopen(conf, "w");
        fputs("ess_hnp_forward_signals=SIGQUIT\n", f);
        fclose(f);
        assert_int_equal(dt_cli_mpirun_forwards_nothing(why, sizeof why), 0);
        f = fopen(conf, "w");
        fputs("ess_base_forward_signals = none\n", f);
        fclose(f);
        setenv("OMPI_MCA_ess_base_forward_signals", "SIGQUIT", 1);   /* the environment wins */
        assert_int_equal(dt_cli_mpirun_forwards_nothing(why, sizeof why), 0);
        unsetenv("OMPI_MCA_ess_base_forward_signals");
        setenv("OMPI_MCA_ess_hnp_forward_signals", "none", 1);
        assert_int_equal(dt_cli_mpirun_forwards_nothing(why, sizeof why), 1);
        assert_string_equal(why, "OMPI_MCA_ess_hnp_forward_signals=none");
        unsetenv("OMPI_MCA_ess_hnp_forward_signals");
        unlink(conf);
        rmdir(dir);
    }
    rmdir(home);
    if (old_home) setenv("HOME", old_home, 1);
    else unsetenv("HOME");
    free(old_home);
    if (sys_none) skip();   /* (why: this machine's own setting says none) */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sigurg_is_the_launchers_ask),   /* (first: no handler and no stop request here yet) */
        cmocka_unit_test(test_names_of_this_machine),
        cmocka_unit_test(test_hosts_with_this_machine),
        cmocka_unit_test(test_rank_takes_the_directory_only_on_the_launchers_machine),
        cmocka_unit_test(test_repeated_sigusr1_only_asks),
        cmocka_unit_test(test_forward_nothing_where_set),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
