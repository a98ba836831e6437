/* The library names its settings by their option fields ("dp.bucket_bytes
 * (MiB)", "pipe.stages"), in errors, in the configuration agreement and in
 * its start-up lines; a CLI user knows flags. Every library text the CLI
 * prints (errors.c, output.c) goes through dt_cli_flag_names, which writes
 * each setting as the flag that sets it. One table, longest names first so
 * that a name never matches inside a longer one. */
#include <string.h>
#include "cli.h"

static const struct { const char *setting, *flag; } k_flags[] = {
    /* a setting with its value, where the flag says both */
    {"dp.shm off", "--no-shm"},
    {"dp.wire f32", "--compress none"},
    /* settings */
    {"dp.first_bucket_bytes (MiB)", "--first-bucket-mb"},
    {"dp.bucket_bytes (MiB)", "--bucket-mb"},
    {"dp.first_bucket_bytes", "--first-bucket-mb"},
    {"dp.find_unused_params", "--find-unused"},
    {"dp.broadcast_buffers", "broadcast buffers (--no-broadcast-buffers)"},
    {"ddp.params_to_ignore", "DDP parameters to ignore"},
    {"zero.overlap_step", "--overlap-step"},
    {"pipe.max_outstanding", "--max-outstanding"},
    {"pipe.virtual_stages", "--virtual-stages"},
    {"pipe.zero_stage", "--zero (per stage)"},
    {"dp.deterministic", "--deterministic"},
    {"dp.bucket_bytes", "--bucket-mb"},
    {"ddp.static_graph", "DDP static_graph"},
    {"ddp.no_overlap", "--no-overlap"},
    {"pipe.schedule", "--schedule"},
    {"zero.prefetch", "--zero-prefetch"},
    {"pipe.stages", "--pp"},
    {"pipe.split", "--pp-split"},
    {"zero.stage", "--zero"},
    {"dp.sync_bn", "--sync-bn"},
    {"ddp.hook", "DDP communication hook"},
    {"dp.join", "join (--uneven)"},
    {"dp.wire", "--compress"},
    {"dp.shm", "shared memory (--no-shm)"},
};

void dt_cli_flag_names(const char *in, char *out, size_t n) {
    size_t at = 0;
    while (*in && at + 1 < n) {
        size_t k = 0, len = 0;
        for (; k < sizeof k_flags / sizeof k_flags[0]; k++) {
            len = strlen(k_flags[k].setting);
            if (!strncmp(in, k_flags[k].setting, len)) break;
        }
        if (k < sizeof k_flags / sizeof k_flags[0]) {
            for (const char *f = k_flags[k].flag; *f && at + 1 < n;) out[at++] = *f++;
            in += len;
        } else {
            out[at++] = *in++;
        }
    }
    out[at] = 0;
}
