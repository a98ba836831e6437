/* Strategy options in the configuration agreement: every option that changes
 * which collectives a rank issues, their sizes or their results. */
#include <stdio.h>
#include <string.h>
#include "common_internal.h"

static double mib(size_t bytes) { return (double)bytes / 1048576.0; }

void dt_par_describe_ddp(const dt_ddp_opts *o, dt_agree *a) {
    static const char *comp[] = {"none", "bf16", "fp16"}, *shm[] = {"auto", "off (--no-shm)", "required"};
    dt_agree_add(a, "--first-bucket-mb", "%.9g", mib(o->first_bucket_bytes));
    dt_agree_add(a, "--bucket-mb", "%.9g", mib(o->bucket_bytes));
    dt_agree_add(a, "--find-unused", "%d", o->find_unused_params != 0);
    dt_agree_add(a, "--no-broadcast-buffers", "%d", !o->broadcast_buffers);
    dt_agree_add(a, "--sync-bn", "%d", o->sync_bn != 0);
    dt_agree_add(a, "--no-overlap", "%d", o->no_overlap != 0);
    dt_agree_add(a, "--deterministic", "%d", o->deterministic != 0);
    dt_agree_add(a, "--compress", "%s", (unsigned)o->compress < 3 ? comp[o->compress] : "?");
    dt_agree_add(a, "ddp communication hook", "%s", o->hook ? "custom" : "none");
    dt_agree_add(a, "ddp join", "%d", o->join != 0);
    dt_agree_add(a, "ddp shared memory", "%s", (unsigned)o->shm < 3 ? shm[o->shm] : "?");
    dt_agree_add(a, "ddp static_graph", "%d", o->static_graph != 0);
    dt_agree_add(a, "ddp parameters to ignore", "%d", o->n_params_to_ignore);
    char key[64];
    for (int k = 0; k < o->n_params_to_ignore && o->params_to_ignore; k++) {
        snprintf(key, sizeof key, "ddp parameters to ignore: pattern %d", k + 1);
        dt_agree_add(a, key, "%s", o->params_to_ignore[k] ? o->params_to_ignore[k] : "");
    }
}

void dt_par_describe_zero(const dt_zero_opts *o, dt_agree *a) {
    static const char *ov[] = {"off", "after-backward", "interleaved"};
    dt_agree_add(a, "--zero", "%d", o->stage);
    dt_agree_add(a, "--first-bucket-mb", "%.9g", mib(o->first_bucket_bytes));
    dt_agree_add(a, "--bucket-mb", "%.9g", mib(o->bucket_bytes));
    dt_agree_add(a, "--overlap-step", "%s", (unsigned)o->overlap_step < 3 ? ov[o->overlap_step] : "?");
    dt_agree_add(a, "--find-unused", "%d", o->find_unused_params != 0);
    dt_agree_add(a, "--no-broadcast-buffers", "%d", !o->broadcast_buffers);
    dt_agree_add(a, "--deterministic", "%d", o->deterministic != 0);
    dt_agree_add(a, "--zero-prefetch", "%d", o->prefetch);
    dt_agree_add(a, "--sync-bn", "%d", o->sync_bn != 0);
    dt_agree_add(a, "zero join", "%d", o->join != 0);
    dt_agree_add(a, "--compress (zero wire)", "%s", dt_dtype_name(o->wire));
    dt_agree_add(a, "--no-shm", "%d", o->no_shm != 0);
}

void dt_par_describe_pipe(const dt_pipe_opts *o, dt_agree *a) {
    char split[16 * DT_PIPE_MAX_VSTAGES] = "balanced";
    size_t at = 0;
    for (int v = 0; v < o->n_split && at < sizeof split; v++)
        at += (size_t)snprintf(split + at, sizeof split - at, v ? ",%d" : "%d", o->split[v]);
    dt_agree_add(a, "--pp", "%d", o->stages);
    dt_agree_add(a, "--schedule", "%s", dt_pipe_kind_name(o->schedule));
    dt_agree_add(a, "--virtual-stages", "%d", o->virtual_stages);
    dt_agree_add(a, "--max-outstanding", "%d", o->max_outstanding);
    dt_agree_add(a, "--pp-split", "%s", split);
    dt_agree_add(a, "--zero (per stage)", "%d", o->zero_stage);
    if (o->zero_stage) dt_par_describe_zero(&o->zero, a);
    else dt_par_describe_ddp(&o->ddp, a);
}
