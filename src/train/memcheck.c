/* The memory check before allocating: a model that fits the address space
 * but not the machine's (or the job's cgroup's) memory would be killed by the
 * OOM killer with no word, possibly after a long data load. So before the
 * model exists every rank estimates its bytes from the configuration and the
 * strategy's shares, reads what it may still allocate (cgroup limit minus
 * usage, MemAvailable) divided among the ranks on its machine, and refuses
 * when the estimate exceeds it, naming both (no collective: see below). The estimate is a floor (the main tensors only), so a run it
 * refuses would not have fitted; train.no_memory_check skips the check. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "trainer_internal.h"

void dt_train_memory_estimate(const dt_train_opts *o, const dt_strategy *strat, dt_mem_estimate *out) {
    memset(out, 0, sizeof *out);
    if (o->build_model) return;   /* a user's model: no formula */
    double n = (double)dt_model_cfg_num_params(&o->model);
    if (n <= 0) return;
    double div[4];
    for (int k = 0; k < 4; k++) div[k] = strat && strat->mem_div[k] > 1 ? strat->mem_div[k] : 1;
    int train = !o->eval_only, all_train = train && o->n_freeze == 0;
    out->params = 4.0 * n / div[0];
    /* a 16-bit param_dtype: the trainer's working copy beside the masters
     * (one process, DDP), or ZeRO-1/2's owned float32 masters beside the
     * rounded flat copy; ZeRO-3 gathers rounded values into what it has */
    if (train && dt_train_param_dtype(o) != DT_F32)
        out->params += !strat || !strat->owns_optimizer ? 4.0 * n / div[0] : div[2] > div[0] ? 4.0 * n / div[2] : 0;
    out->grads = all_train ? 4.0 * n / div[1] : 0;
    out->optim = all_train ? n * (double)dt_optim_state_bytes(&o->optim) / div[2] : 0;
    out->acts = dt_model_cfg_act_bytes(&o->model, o->seq, o->recompute == DT_RECOMPUTE_BLOCKS,
                                     dt_train_saved_dtype(o) == DT_F32 ? 4 : 2) * (double)o->batch / div[3];
    /* the background save's copy: parameters and optimizer state as written, fp32 (bf16 state is widened) */
    if (train && o->save && !o->save_sync) out->copy = 4.0 * n / div[0] + (all_train ? 4.0 * n * dt_optim_state_per_elem(&o->optim) / div[2] : 0);
    out->total = out->params + out->grads + out->optim + out->acts + out->copy;
}

/* ---- what may still be allocated ---- */

static int read_text(const char *path, char *buf, size_t n) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t k = fread(buf, 1, n - 1, f);
    fclose(f);
    buf[k] = 0;
    return 1;
}

/* a file holding one number ("max" / absurd: unlimited -> 0) */
static int read_num(const char *path, double *v) {
    char buf[64];
    if (!read_text(path, buf, sizeof buf)) return 0;
    char *end;
    double x = strtod(buf, &end);
    if (end == buf || x <= 0 || x >= 9.0e18) return 0;   /* "max", v1's 2^63 - page: no limit */
    *v = x;
    return 1;
}

static void fmt_bytes(double b, char *buf, size_t n) {
    if (b >= 1073741824.0) snprintf(buf, n, "%.1f GiB", b / 1073741824.0);
    else snprintf(buf, n, "%.0f MiB", b / 1048576.0);
}

/* the limit of cgroup directory dir (v2, or v1 when v1) minus its usage, when it has one */
static int cgroup_free(const char *dir, int v1, double *free_b, double *limit, double *used) {
    char p[4400];
    /* a path that does not fit is no limit we can read */
    if (snprintf(p, sizeof p, "%s/%s", dir, v1 ? "memory.limit_in_bytes" : "memory.max") >= (int)sizeof p)
        return 0;
    if (!read_num(p, limit)) return 0;
    if (snprintf(p, sizeof p, "%s/%s", dir, v1 ? "memory.usage_in_bytes" : "memory.current") >= (int)sizeof p
        || !read_num(p, used))
        *used = 0;
    *free_b = *limit > *used ? *limit - *used : 0;
    return 1;
}

dt_status dt_memory_available(const char *root, dt_mem_avail *out) {
    if (!root) root = "";
    out->bytes = -1;
    out->source[0] = 0;
    char path[4400], buf[8192];
    /* MemAvailable */
    snprintf(path, sizeof path, "%s/proc/meminfo", root);
    if (read_text(path, buf, sizeof buf)) {
        const char *m = strstr(buf, "MemAvailable:");
        double kb;
        if (m && sscanf(m + 13, "%lf", &kb) == 1 && kb > 0) {
            out->bytes = kb * 1024.0;
            snprintf(out->source, sizeof out->source, "MemAvailable in /proc/meminfo");
        }
    }
    /* the cgroup: v2 ("0::/path") or v1's memory controller ("N:...memory...:/path") */
    snprintf(path, sizeof path, "%s/proc/self/cgroup", root);
    if (read_text(path, buf, sizeof buf)) {
        char v2[4096] = "", v1[4096] = "";
        int has_v2 = 0, has_v1 = 0;
        for (char *line = strtok(buf, "\n"); line; line = strtok(NULL, "\n")) {
            char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
            if (!c2) continue;
            *c1 = *c2 = 0;   /* line: the hierarchy id */
            const char *ctl = c1 + 1, *cg = c2 + 1;
            if (!strcmp(line, "0") && !*ctl) { snprintf(v2, sizeof v2, "%s", cg); has_v2 = 1; }
            for (const char *q = ctl; *q;) {   /* "memory" in a comma list */
                size_t len = strcspn(q, ",");
                if (len == 6 && !strncmp(q, "memory", 6)) { snprintf(v1, sizeof v1, "%s", cg); has_v1 = 1; }
                q += len + (q[len] == ',');
            }
        }
        for (int ver = 0; ver < 2; ver++) {
            if (ver == 0 ? !has_v2 : !has_v1) continue;
            const char *cg = ver == 0 ? v2 : v1;
            char dir[4400];
            snprintf(dir, sizeof dir, "%s/sys/fs/cgroup%s%s", root, ver == 0 ? "" : "/memory", cg);
            size_t base = strlen(root) + strlen(ver == 0 ? "/sys/fs/cgroup" : "/sys/fs/cgroup/memory");
            for (;;) {   /* this cgroup, then each ancestor (a limit may sit above us) */
                size_t len = strlen(dir);
                while (len > base && dir[len - 1] == '/') dir[--len] = 0;
                double f, lim, used;
                if (cgroup_free(dir, ver == 1, &f, &lim, &used) && (out->bytes < 0 || f < out->bytes)) {
                    char a[32], b[32];
                    fmt_bytes(lim, a, sizeof a);
                    fmt_bytes(used, b, sizeof b);
                    out->bytes = f;
                    snprintf(out->source, sizeof out->source, "cgroup %s %s %s, %s of it in use",
                             len > base ? dir + base : "/", ver == 0 ? "memory.max" : "memory.limit_in_bytes", a, b);
                }
                char *slash = strrchr(dir + base, '/');
                if (!slash || len <= base) break;
                *slash = 0;
            }
        }
    }
    if (out->bytes < 0) return DT_ERR(DT_EIO, "memory available: neither /proc/meminfo nor a memory cgroup is readable");
    return DT_OK;
}

/* ---- the check ---- */

dt_status dt_trainer_check_memory(dt_trainer *t) {
    const dt_train_opts *o = &t->opts;
    dt_mem_estimate e;
    dt_train_memory_estimate(o, &t->strat, &e);
    dt_mem_avail av;
    int known = dt_memory_available(NULL, &av) == DT_OK;
    if (!known) dt_error_clear();
    /* ranks on this machine share what it has. No collective here: this
     * runs before the configuration agreement, and ranks whose settings
     * differ (a pipeline on some, another progress mode) must reach that
     * agreement to be told so, not hang in a collective only some of them
     * call. The ranks of a machine read the same figures and refuse alike
     * (the CLI prints one line); a rank short of memory on another machine
     * refuses alone and its peers are stopped by the CLI's error agreement. */
    int local = 1;
    const char *ls = t->strat.world > 1 ? getenv("OMPI_COMM_WORLD_LOCAL_SIZE") : NULL;   /* Open MPI sets it */
    if (ls && atoi(ls) > 0) local = atoi(ls);
    double per_rank = known ? av.bytes / local : INFINITY;
    if (!known || e.total <= per_rank || o->no_memory_check) return DT_OK;
    char need[32], p[32], g[32], opt[32], act[32], cp[32], have[32], copy[80] = "";
    fmt_bytes(e.total, need, sizeof need);
    fmt_bytes(e.params, p, sizeof p);
    fmt_bytes(e.grads, g, sizeof g);
    fmt_bytes(e.optim, opt, sizeof opt);
    fmt_bytes(e.acts, act, sizeof act);
    fmt_bytes(per_rank, have, sizeof have);
    if (e.copy > 0) {
        fmt_bytes(e.copy, cp, sizeof cp);
        snprintf(copy, sizeof copy, ", background checkpoint copy %s", cp);
    }
    return DT_ERR(DT_ENOMEM, "memory: this run needs about %s per rank (parameters %s, gradients %s, optimizer state %s, "
                  "activations %s%s), %d rank%s on this machine, but only %s per rank is available (%s); refused before "
                  "allocating (train.no_memory_check skips this check)", need, p, g, opt, act, copy, local,
                  local == 1 ? "" : "s", have, av.source);
}
