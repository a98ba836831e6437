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
 * computed twice; with ranks on other machines it lies beside the
 * checkpoint, which they all see (progress_dir). */
#define _XOPEN_SOURCE 700   /* realpath */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
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

/* Which checkpoint is at path: its file (a set: its index), by device,
 * inode, size and modification time. Every save makes a new file by rename,
 * so a checkpoint this job wrote differs from what was there at launch. */
typedef struct ckpt_ident { int exists; dev_t dev; ino_t ino; off_t size; struct timespec mtime; } ckpt_ident;

static ckpt_ident ident_of(const char *path) {
    ckpt_ident id = {0};
    char idx[PATH_MAX + 16];
    struct stat sb;
    if (stat(path, &sb) != 0) return id;
    if (S_ISDIR(sb.st_mode)) {
        snprintf(idx, sizeof idx, "%s/index.json", path);
        if (stat(idx, &sb) != 0) return id;
    }
    id = (ckpt_ident){.exists = 1, .dev = sb.st_dev, .ino = sb.st_ino, .size = sb.st_size, .mtime = sb.st_mtim};
    return id;
}

static int same_ident(const ckpt_ident *a, const ckpt_ident *b) {
    return a->exists && b->exists && a->dev == b->dev && a->ino == b->ino && a->size == b->size &&
           a->mtime.tv_sec == b->mtime.tv_sec && a->mtime.tv_nsec == b->mtime.tv_nsec;
}

/* a and b name one file or directory ("./ck.st" and "ck.st"), or the same text */
static int same_path(const char *a, const char *b) {
    struct stat x, y;
    if (!strcmp(a, b)) return 1;
    return stat(a, &x) == 0 && stat(b, &y) == 0 && x.st_dev == y.st_dev && x.st_ino == y.st_ino;
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

/* Where the progress file goes: on this machine $TMPDIR (or /tmp); with ranks
 * on other machines (rank 0 among them, wherever it lands) the directory of
 * --save, which every machine reads (restarts resume from it), as an
 * absolute path (a remote rank's working directory may differ). */
static int progress_dir(const dt_cli_hosts *h, const char *save, char *out, size_t len) {
    if (h->n == 0 && !h->slurm) {
        const char *tmpdir = getenv("TMPDIR");
        snprintf(out, len, "%s", tmpdir && *tmpdir ? tmpdir : "/tmp");
        return 0;
    }
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", save);
    for (size_t l = strlen(dir); l > 1 && dir[l - 1] == '/'; l--) dir[l - 1] = 0;   /* "ck/": a set's directory */
    char *sl = strrchr(dir, '/');
    if (!sl) snprintf(dir, sizeof dir, ".");
    else if (sl == dir) sl[1] = 0;
    else *sl = 0;
    if (!realpath(dir, out) || strlen(out) >= len) {
        fprintf(stderr, "dtrain: --max-restarts: the directory of --save %s: %s\n", save, strerror(errno));
        return -1;
    }
    return 0;
}

/* flag (and its value) that a restart replaces: 2 = "--flag VALUE", 1 =
 * "--flag=VALUE", 0. resize: the world changes, and with it the micro-steps
 * (--accum; a pipeline's --batch and --microbatches, and --eval-batches,
 * which counts batches of --batch: evalb, when it is given) */
static int replaced(char **argv, int i, int ckpt, int resize, int piped, int evalb) {
    static const char *const drop[] = {"--max-restarts", "--min-nproc", "--resume", "--init",
                                       "--accum", "--batch", "--microbatches", "--eval-batches"};
    for (size_t j = 0; j < sizeof drop / sizeof *drop; j++) {
        if ((j == 2 || j == 3) && !ckpt) continue;               /* no checkpoint yet: the job's own */
        if (j >= 4 && j < 7 && (!resize || (j == 4) == piped)) continue;  /* --accum, or a pipeline's two */
        if (j == 7 && (!resize || !piped || !evalb)) continue;
        size_t l = strlen(drop[j]);
        if (!strcmp(argv[i], drop[j])) return 2;
        if (!strncmp(argv[i], drop[j], l) && argv[i][l] == '=') return 1;
    }
    return 0;
}

/* The size of the metrics file (-1: none), and back to it: an attempt
 * that starts over from step 0 (the job resumes nothing, and no checkpoint
 * of its own is there yet) logs its steps again, so what the failed
 * attempts appended goes; a resumed attempt's trainer drops its own stale
 * lines, which may leave the file shorter than at launch: never grown back
 * (that would pad it with NULs). The launcher sees the file where the
 * ranks write it when rank 0 runs here or the file system is shared. */
static long long file_size(const char *path) {
    struct stat sb;
    return path && stat(path, &sb) == 0 && S_ISREG(sb.st_mode) ? (long long)sb.st_size : -1;
}

static void metrics_back_to(const char *path, long long size) {
    if (!path || file_size(path) < 0 || file_size(path) == size) return;
    if (size >= 0 && file_size(path) < size) return;   /* (not this job's lines: left alone) */
    if (size < 0) {
        if (unlink(path) != 0) fprintf(stderr, "dtrain: warning: --metrics %s: %s\n", path, strerror(errno));
        return;
    }
    int fd = open(path, O_WRONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0 || ftruncate(fd, (off_t)size) != 0)
        fprintf(stderr, "dtrain: warning: --metrics %s: cannot drop the failed attempts' lines: %s\n", path,
                strerror(errno));
    if (fd >= 0) close(fd);
}

/* the hosts that did not answer, "b, c" */
static void lost_list(const dt_cli_hosts *h, const int *alive, char *out, size_t len) {
    size_t o = 0;
    out[0] = 0;
    for (int i = 0; i < h->n && o < len; i++)
        if (!alive[i]) o += (size_t)snprintf(out + o, len - o, "%s%s", o ? ", " : "", h->name[i]);
}

/* The flags of a restart (see cli.h): argv without what the new attempt
 * replaces, then the micro-steps of a resized world, then --resume save. */
int dt_cli_restart_argv(int argc, char **argv, const dt_cli_restart *r, int resize, int accum, int resume,
                        char **av, dt_cli_restart_vals *v) {
    int k = 0, piped = r->piped;
    long long evalb = piped ? r->eval_batches : 0;
    av[k++] = argv[0];
    av[k++] = argv[1];
    for (int i = 2; i < argc; i++) {
        int rp = replaced(argv, i, resume, resize, piped, evalb > 0);
        if (rp == 2) i++;
        else if (!rp) av[k++] = argv[i];
    }
    if (resize) {
        snprintf(v->accum, sizeof v->accum, "%d", accum);
        snprintf(v->batch, sizeof v->batch, "%lld", r->batch * accum);
        if (piped) {
            if (evalb > 0) {
                snprintf(v->eval, sizeof v->eval, "%lld", (evalb + accum - 1) / accum);
                av[k++] = "--eval-batches";
                av[k++] = v->eval;
            }
            av[k++] = "--batch";
            av[k++] = v->batch;
            av[k++] = "--microbatches";
        } else {
            av[k++] = "--accum";
        }
        av[k++] = v->accum;
    }
    if (resume) {
        av[k++] = "--resume";
        av[k++] = (char *)r->save;
    }
    av[k] = NULL;
    return k;
}

int dt_cli_relaunch_restarting(int argc, char **argv, int nproc, int threads, const dt_cli_hosts *h,
                               const dt_cli_restart *r) {
    const char *save = r->save;
    int max_restarts = r->max_restarts;
    char pdir[PATH_MAX], prog[PATH_MAX + 32];
    if (progress_dir(h, save, pdir, sizeof pdir)) return 1;
    snprintf(prog, sizeof prog, "%s/.dtrain-progress.XXXXXX", pdir);
    int fd = mkstemp(prog);
    if (fd < 0) {
        fprintf(stderr, "dtrain: --max-restarts: cannot create a file in %s: %s\n", pdir, strerror(errno));
        return 1;
    }
    close(fd);
    setenv(DT_CLI_PROGRESS_ENV, prog, 1);
    char **av = calloc((size_t)argc + 9, sizeof *av);
    long long *resumed = calloc((size_t)max_restarts + 1, sizeof *resumed);
    int *worlds = calloc((size_t)max_restarts + 1, sizeof *worlds);
    int *alive = calloc((size_t)(h->n > 0 ? h->n : 1), sizeof *alive);
    int *ran_on = calloc((size_t)(h->n > 0 ? h->n : 1), sizeof *ran_on);   /* the hosts of the last attempt */
    char *own = calloc((size_t)max_restarts + 1, 1);   /* [i]: restart i resumed a save of this job's */
    if (!av || !resumed || !worlds || !alive || !ran_on || !own) {
        fprintf(stderr, "dtrain: --max-restarts: out of memory\n");
        free(av);
        free(resumed);
        free(worlds);
        free(alive);
        free(ran_on);
        free(own);
        unlink(prog);
        return 1;
    }
    int piped = r->piped;
    dt_cli_elastic el = {.nproc = nproc, .min_nproc = r->min_nproc > 0 ? r->min_nproc : nproc,
                         .stages = piped ? r->stages : 1, .accum = r->accum, .tp = r->tp,
                         .accum_multiple = piped ? r->microbatch_multiple : 1};
    dt_cli_hosts sub = {0};
    const dt_cli_hosts *where = h;
    int world = nproc, accum = r->accum;
    dt_cli_restart_vals vals;
    /* a pipeline's evaluation set, eval_batches micro-batches, kept when
     * --batch changes (rounded up to whole batches of the new --batch) */
    long long evalb = piped ? r->eval_batches : 0;
    int rc = 0, restarts = 0;
    long long recomputed = 0;
    /* a checkpoint already at --save when the job started (another run's, or
     * the one this job resumes): a restart resumes only from a save of this
     * job's own; until then it runs the job as first launched */
    const ckpt_ident before = ident_of(save);
    int before_first = 0;   /* the last attempt failed before its first step */
    /* the job's own flags resume --save itself (--resume SAVE): a restart
     * before its first save starts where the job did */
    int job_resumes_save = 0, job_resumes = 0;   /* ... --resume SAVE; --resume anything */
    for (int i = 2; i < argc; i++) {
        size_t l = strlen("--resume");
        if (!strcmp(argv[i], "--resume") && i + 1 < argc && same_path(argv[i + 1], save)) job_resumes_save = 1;
        if (!strncmp(argv[i], "--resume=", l + 1) && same_path(argv[i] + l + 1, save)) job_resumes_save = 1;
        if (!strcmp(argv[i], "--resume") || !strncmp(argv[i], "--resume=", l + 1)) job_resumes = 1;
    }
    for (int i = 0; i < h->n; i++) ran_on[i] = 1;
    const long long metrics_at_launch = file_size(r->metrics);
    for (;;) {
        char **use = argv;
        int n = argc;
        if (restarts > 0 && !own[restarts - 1] && !job_resumes) metrics_back_to(r->metrics, metrics_at_launch);
        if (restarts > 0) {   /* the flags, --resume SAVE for --resume / --init, the micro-steps of this world */
            n = dt_cli_restart_argv(argc, argv, r, world != nproc, accum, own[restarts - 1], av, &vals);
            use = av;
        }
        FILE *pf = fopen(prog, "w");   /* no step yet in this attempt */
        if (pf) fclose(pf);
        rc = dt_cli_relaunch(n, use, world, threads, where, 0);
        if (rc == 0 || rc == 2 || dt_cli_launcher_signalled() || restarts == max_restarts) break;
        if (rc == DT_CLI_LAUNCH_FAILED || rc == 127) {   /* the launcher's own failure, or no mpirun: said above */
            fprintf(stderr, "dtrain: the launch itself failed (exit %d); not restarting\n", rc);
            break;
        }
        long long reached = progress_step(prog), from = ckpt_step(save);
        const ckpt_ident now_at = ident_of(save);
        int old_ckpt = from >= 0 && same_ident(&before, &now_at), mine = from >= 0 && !old_ckpt;
        /* where the next attempt starts: this job's save, else as launched
         * (at --save's step when the job resumes it, else from the start) */
        if (old_ckpt && !job_resumes_save) from = -1;
        if (reached >= 0 && from < reached) recomputed += reached - (from > 0 ? from : 0);   /* run again */
        char why[400];   /* the exit, then which hosts did not answer (lost: < 300) */
        snprintf(why, sizeof why, "the job failed (exit %d)%s", rc, reached >= 0 ? "" : " before its first step");
        /* where the next attempt runs: the hosts that answer */
        char on[400] = "";
        int moved = 0;   /* the next attempt runs elsewhere or on another world */
        if (h->n > 0) {
            double t = dt_cli_probe_timeout();
            if (dt_cli_hosts_probe(h, alive, t) < 0) break;
            if (dt_cli_launcher_signalled()) break;
            int slots = 0, all = 1;
            for (int i = 0; i < h->n; i++) {
                slots += alive[i] ? h->slots[i] : 0;
                all &= alive[i];
            }
            char lost[300];
            lost_list(h, alive, lost, sizeof lost);
            int acc = 0, W = dt_cli_elastic_world(&el, slots, &acc);
            if (!W) {
                fprintf(stderr, "dtrain: %s; %s did not answer within %.0f s: %d slot%s left, %s; not restarting\n",
                        why, lost, t, slots, slots == 1 ? "" : "s",
                        slots >= el.min_nproc ? "no world among them splits the global batch evenly"
                        : el.min_nproc == nproc ? "fewer than the job's ranks (--min-nproc M lets it continue on fewer)"
                                               : "fewer than --min-nproc");
                break;
            }
            dt_cli_hosts_free(&sub);
            where = h;
            if (!all) {
                if (dt_cli_hosts_subset(h, alive, &sub)) break;
                where = &sub;
                snprintf(why + strlen(why), sizeof why - strlen(why), "; %s did not answer within %.0f s", lost, t);
            }
            if (W != world || !all)
                snprintf(on, sizeof on, " on %d rank%s (%s)", W, W == 1 ? "" : "s", where->desc);
            if (acc != accum)
                snprintf(on + strlen(on), sizeof on - strlen(on), ", %s %d keeps the global batch",
                         piped ? "--microbatches" : "--accum", acc);
            if (acc != accum && evalb > 0)
                snprintf(on + strlen(on), sizeof on - strlen(on), " and --eval-batches %lld the evaluation%s",
                         (evalb + acc - 1) / acc, evalb % acc ? " (rounded up to whole batches)" : "");
            moved = W != world;
            for (int i = 0; i < h->n; i++) {
                moved |= alive[i] != ran_on[i];
                ran_on[i] = alive[i];
            }
            world = W;
            accum = acc;
        }
        /* failed twice before its first step, from the same start, on the
         * same ranks: a missing file, a model that does not fit -- what a
         * restart cannot mend (the ranks said why above) */
        if (reached < 0 && restarts > 0 && resumed[restarts - 1] == from && before_first && !moved) {
            fprintf(stderr, "dtrain: %s again, from the same start as the attempt before; not restarting (a failure "
                    "that repeats before the first step is not one a restart mends)\n", why);
            break;
        }
        before_first = reached < 0;
        own[restarts] = (char)mine;
        resumed[restarts] = from;
        worlds[restarts] = world;
        restarts++;
        if (from >= 0)
            fprintf(stderr, "dtrain: %s; restart %d of %d from %s (step %lld)%s\n", why, restarts, max_restarts, save,
                    from, on);
        else
            fprintf(stderr, "dtrain: %s with no complete checkpoint %sat %s yet; restart %d of %d as first launched%s\n",
                    why, old_ckpt ? "of this job's " : "", save, restarts, max_restarts, on);
        fflush(stderr);
    }
    if (restarts > 0) {
        char list[640] = "";
        size_t o = 0;
        int said_step = 0;
        for (int i = 0; i < restarts && o < sizeof list; i++) {
            if (resumed[i] < 0) o += (size_t)snprintf(list + o, sizeof list - o, "%sthe start", i ? ", " : "");
            else o += (size_t)snprintf(list + o, sizeof list - o, "%s%s%lld", i ? ", " : "", said_step++ ? "" : "step ",
                                       resumed[i]);   /* "step 10, 22, 32" */
            if (o < sizeof list && worlds[i] != (i ? worlds[i - 1] : nproc))
                o += (size_t)snprintf(list + o, sizeof list - o, " on %d rank%s", worlds[i], worlds[i] == 1 ? "" : "s");
        }
        fprintf(stderr, "dtrain: %d restart%s (resumed at %s); %lld step%s computed again; %s\n", restarts,
                restarts == 1 ? "" : "s", list, recomputed, recomputed == 1 ? "" : "s",
                rc == 0 ? "the job completed" : "the job failed");
    }
    dt_cli_hosts_free(&sub);
    unsetenv(DT_CLI_PROGRESS_ENV);
    unlink(prog);
    free(av);
    free(resumed);
    free(worlds);
    free(alive);
    free(ran_on);
    free(own);
    return rc;
}
