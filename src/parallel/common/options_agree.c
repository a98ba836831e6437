/* Strategy options in the configuration agreement: every option that changes
 * which collectives a rank issues, their sizes or their results, named by its
 * field (the CLI writes each as its flag: cli/settings.c). */
#include <stdio.h>
#include <string.h>
#include "common_internal.h"

static double mib(size_t bytes) { return (double)bytes / 1048576.0; }

void dt_par_describe_dp(const dt_dp_opts *o, dt_agree *a) {
    static const char *shm[] = {"auto", "off", "required"};
    dt_agree_add(a, "dp.first_bucket_bytes (MiB)", "%.9g", mib(o->first_bucket_bytes));
    dt_agree_add(a, "dp.bucket_bytes (MiB)", "%.9g", mib(o->bucket_bytes));
    dt_agree_add(a, "dp.find_unused_params", "%d", o->find_unused_params != 0);
    dt_agree_add(a, "dp.broadcast_buffers", "%d", o->broadcast_buffers != 0);
    dt_agree_add(a, "dp.sync_bn", "%d", o->sync_bn != 0);
    dt_agree_add(a, "dp.deterministic", "%d", o->deterministic != 0);
    dt_agree_add(a, "dp.join", "%d", o->join != 0);
    dt_agree_add(a, "dp.wire", "%s", dt_par_wire_name(o->wire));
    dt_agree_add(a, "dp.shm", "%s", (unsigned)o->shm < 3 ? shm[o->shm] : "?");
}

void dt_par_describe_ddp(const dt_ddp_opts *o, dt_agree *a) {
    dt_par_describe_dp(&o->dp, a);
    dt_agree_add(a, "ddp.no_overlap", "%d", o->no_overlap != 0);
    dt_agree_add(a, "ddp.hook", "%s", o->hook ? "custom" : "none");
    dt_agree_add(a, "ddp.static_graph", "%d", o->static_graph != 0);
    dt_agree_add(a, "ddp.params_to_ignore", "%d", o->n_params_to_ignore);
    char key[64];
    for (int k = 0; k < o->n_params_to_ignore && o->params_to_ignore; k++) {
        snprintf(key, sizeof key, "ddp.params_to_ignore[%d]", k);
        dt_agree_add(a, key, "%s", o->params_to_ignore[k] ? o->params_to_ignore[k] : "");
    }
}

void dt_par_describe_zero(const dt_zero_opts *o, dt_agree *a) {
    static const char *ov[] = {"off", "after-backward", "interleaved"};
    dt_agree_add(a, "zero.stage", "%d", o->stage);
    dt_par_describe_dp(&o->dp, a);
    dt_agree_add(a, "zero.overlap_step", "%s", (unsigned)o->overlap_step < 3 ? ov[o->overlap_step] : "?");
    dt_agree_add(a, "zero.prefetch", "%d", o->prefetch);
    dt_agree_add(a, "zero.node_params", "%d", o->node_params);
}

void dt_par_describe_pipe(const dt_pipe_opts *o, dt_agree *a) {
    char split[16 * DT_PIPE_MAX_VSTAGES] = "balanced";
    size_t at = 0;
    for (int v = 0; v < o->n_split && at < sizeof split; v++)
        at += (size_t)snprintf(split + at, sizeof split - at, v ? ",%d" : "%d", o->split[v]);
    dt_agree_add(a, "pipe.stages", "%d", o->stages);
    dt_agree_add(a, "pipe.schedule", "%s", dt_pipe_kind_name(o->schedule));
    dt_agree_add(a, "pipe.virtual_stages", "%d", o->virtual_stages);
    dt_agree_add(a, "pipe.max_outstanding", "%d", o->max_outstanding);
    dt_agree_add(a, "pipe.split", "%s", split);
    dt_agree_add(a, "pipe.zero_stage", "%d", o->zero_stage);
    dt_agree_add(a, "pipe.wire", "%s", o->wire == DT_F32 ? "fp32" : dt_par_wire_name(o->wire));   /* as --pp-wire */
    dt_agree_add(a, "tp.size", "%d", o->tp_size > 1 ? o->tp_size : 1);
    dt_agree_add(a, "tp.sequence_parallel", "%d", o->sequence_parallel ? 1 : 0);
    if (o->zero_stage) dt_par_describe_zero(&o->zero, a);
    else dt_par_describe_ddp(&o->ddp, a);
}
