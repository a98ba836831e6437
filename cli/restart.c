/* --max-restarts K: a job launched by this process (--nproc, --hosts,
 * --hostfile, Slurm) that fails — a rank died or hung past
 * --collective-timeout, a machine stopped answering, any error — is started
 * again, up to K times, from the newest complete checkpoint at --save
 * (automatic --resume; a checkpoint whose write did not finish is not
 * complete: files appear by rename, a set by its index). Not restarted: a
 * stop the launcher itself was sent (the user's or the scheduler's), a
 * refusal of bad input (exit 2), success.
 *
 * The ranks tell the launcher how far they got through a progress file
 * (DTRAIN_PROGRESS_FILE: rank 0 rewrites the completed step count after each
 * step, train.progress_file), so the summary can say which steps were
 * computed twice. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "cli.h"

/* Step of the complete checkpoint at path, -1 if there is none. */
static long long ckpt_step(const char *path) {
    dt_ckpt *c;
    if (dt_ckpt_open(path, &c) != DT_OK) {
        dt_error_clear();
        return -1;
    }
    const char *s = dt_ckpt_get_meta(c, "step");
    long long v = s ? atoll(s) : -1;
    dt_ckpt_close(c);
    return v;
}

static long long progress_step(const char *file) {
    FILE *f = fopen(file, "r");
    long long v = -1;
    if (f) {
        if (fscanf(f, "%lld", &v) != 1) v = -1;
        fclose(f);
    }
    return v;
}

/* flag (and its value) that a restart replaces: 2 = "--flag VALUE", 1 = "--flag=VALUE", 0 */
static int replaced(char **argv, int i) {
    static const char *const drop[] = {"--resume", "--init", "--max-restarts"};
    for (size_t j = 0; j < sizeof drop / sizeof *drop; j++) {
        size_t l = strlen(drop[j]);
        if (!strcmp(argv[i], drop[j])) return 2;
        if (!strncmp(argv[i], drop[j], l) && argv[i][l] == '=') return 1;
    }
    return 0;
}

int dt_cli_relaunch_restarting(int argc, char **argv, int nproc, int threads, const dt_cli_hosts *h, int max_restarts,
                               const char *save) {
    char prog[4096];
    const char *tmpdir = getenv("TMPDIR");
    if (!tmpdir || !*tmpdir) tmpdir = "/tmp";
    snprintf(prog, sizeof prog, "%s/dtrain-progress.XXXXXX", tmpdir);
    int fd = mkstemp(prog);
    if (fd < 0) {
        fprintf(stderr, "dtrain: --max-restarts: cannot create a file in %s: %s\n", tmpdir, strerror(errno));
        return 1;
    }
    close(fd);
    setenv(DT_CLI_PROGRESS_ENV, prog, 1);
    char **av = calloc((size_t)argc + 3, sizeof *av);
    long long *resumed = calloc((size_t)max_restarts + 1, sizeof *resumed);
    if (!av || !resumed) {
        free(av);
        free(resumed);
        unlink(prog);
        return 1;
    }
    int rc = 0, restarts = 0;
    long long recomputed = 0;
    for (;;) {
        int k = 0;
        char **use = argv;
        int n = argc;
        if (restarts > 0 && resumed[restarts - 1] >= 0) {   /* the flags, --resume SAVE for --resume / --init */
            av[k++] = argv[0];
            av[k++] = argv[1];
            for (int i = 2; i < argc; i++) {
                int r = replaced(argv, i);
                if (r == 2) i++;
                else if (!r) av[k++] = argv[i];
            }
            av[k++] = "--resume";
            av[k++] = (char *)save;
            av[k] = NULL;
            use = av;
            n = k;
        }
        FILE *pf = fopen(prog, "w");   /* no step yet in this attempt */
        if (pf) fclose(pf);
        rc = dt_cli_relaunch(n, use, nproc, threads, h, 0);
        if (rc == 0 || rc == 2 || dt_cli_launcher_signalled() || restarts == max_restarts) break;
        long long reached = progress_step(prog), from = ckpt_step(save);
        resumed[restarts] = from;
        if (reached >= 0 && from < reached) recomputed += reached - (from > 0 ? from : 0);   /* run again */
        restarts++;
        if (from >= 0)
            fprintf(stderr, "dtrain: the job failed (exit %d)%s; restart %d of %d from %s (step %lld)\n", rc,
                    reached >= 0 ? "" : " before its first step", restarts, max_restarts, save, from);
        else
            fprintf(stderr, "dtrain: the job failed (exit %d) with no complete checkpoint at %s yet; restart %d of %d "
                    "as first launched\n", rc, save, restarts, max_restarts);
        fflush(stderr);
    }
    if (restarts > 0) {
        char list[512] = "";
        size_t o = 0;
        for (int i = 0; i < restarts && o < sizeof list; i++)
            o += (size_t)snprintf(list + o, sizeof list - o, "%s%lld", i ? ", " : "", resumed[i] < 0 ? 0 : resumed[i]);
        fprintf(stderr, "dtrain: %d restart%s (resumed at step %s); %lld step%s computed again; %s\n", restarts,
                restarts == 1 ? "" : "s", list, recomputed, recomputed == 1 ? "" : "s",
                rc == 0 ? "the job completed" : "the job failed");
    }
    unsetenv(DT_CLI_PROGRESS_ENV);
    unlink(prog);
    free(av);
    free(resumed);
    return rc;
}
