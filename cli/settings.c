/* The library names its settings by their option fields ("train.steps",
 * "dp.bucket_bytes (MiB)", "pipe.stages"), in errors, in the configuration
 * agreement and in its start-up lines; a CLI user knows flags. Every library
 * text the CLI prints (errors.c, output.c, cmd_train.c) goes through
 * dt_cli_flag_names, which writes each setting as the flag that sets it.
 *
 * One table, in any order: it is matched longest setting first, so a name
 * never matches inside a longer one ("train.save" inside "train.save_every").
 * A setting with its value comes first where the flag says both ("dp.shm off"
 * is --no-shm). A setting a flag sets must be here, or CLI users read the
 * field's name. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include "cli.h"

typedef struct setting_flag { const char *setting, *flag; } setting_flag;

static const setting_flag k_flags[] = {
    /* data-parallel options (parallel.h dt_dp_opts) and the strategies' own */
    {"dp.shm off", "--no-shm"},
    {"dp.wire f32", "--compress none"},
    {"dp.first_bucket_bytes (MiB)", "--first-bucket-mb"},
    {"dp.bucket_bytes (MiB)", "--bucket-mb"},
    {"dp.first_bucket_bytes", "--first-bucket-mb"},
    {"dp.bucket_bytes", "--bucket-mb"},
    {"dp.find_unused_params", "--find-unused"},
    {"dp.broadcast_buffers", "broadcast buffers (--no-broadcast-buffers)"},
    {"dp.deterministic", "--deterministic"},
    {"dp.sync_bn", "--sync-bn"},
    {"dp.join", "join (--uneven)"},
    {"dp.wire", "--compress"},
    {"dp.shm", "shared memory (--no-shm)"},
    {"ddp.no_overlap", "--no-overlap"},
    {"ddp.hook", "DDP communication hook"},
    {"ddp.static_graph", "DDP static_graph"},
    {"ddp.params_to_ignore", "DDP parameters to ignore"},
    {"zero.stage", "--zero"},
    {"zero.overlap_step", "--overlap-step"},
    {"zero.prefetch", "--zero-prefetch"},
    {"zero.save_format", "--save-format"},
    {"pipe.stages", "--pp"},
    {"pipe.schedule", "--schedule"},
    {"pipe.virtual_stages", "--virtual-stages"},
    {"pipe.max_outstanding", "--max-outstanding"},
    {"pipe.split", "--pp-split"},
    {"pipe.zero_stage", "--zero (per stage)"},
    /* the process group layer (dist.h dt_dist_opts) */
    {"dist.progress", "--progress"},
    {"dist.collective_timeout_s", "--collective-timeout"},
    {"dist.debug_collectives", "--debug-collectives"},
    /* training (train.h dt_train_opts) */
    {"train.data_path", "--data-path"},
    {"train.val_path", "--val-path"},
    {"train.data", "--data"},
    {"train.batch", "--batch"},
    {"train.seq", "--seq"},
    {"train.steps", "--steps"},
    {"train.epochs", "--epochs"},
    {"train.accum", "--accum"},
    {"train.optim.lr", "--lr"},
    {"train.keep_denormals", "--keep-denormals"},
    {"train.save_every", "--save-every"},
    {"train.save", "--save"},
    {"train.resume", "--resume"},
    {"train.metrics", "--metrics"},
    {"train.trace", "--trace"},
    {"train.freeze", "--freeze"},
    {"train.unfreeze_at", "--unfreeze-at"},
    {"train.uneven", "--uneven"},
};
#define N_FLAGS ((int)(sizeof k_flags / sizeof k_flags[0]))

static int longer_first(const void *a, const void *b) {
    size_t x = strlen(((const setting_flag *)a)->setting), y = strlen(((const setting_flag *)b)->setting);
    return x < y ? 1 : x > y ? -1 : 0;
}

static setting_flag g_sorted[N_FLAGS];
static pthread_once_t g_sort_once = PTHREAD_ONCE_INIT;
static void sort_flags(void) {
    memcpy(g_sorted, k_flags, sizeof k_flags);
    qsort(g_sorted, N_FLAGS, sizeof g_sorted[0], longer_first);
}

/* (a progress thread may log too: the table is sorted once, then read-only) */
size_t dt_cli_flag_names(const char *in, char *out, size_t n) {
    pthread_once(&g_sort_once, sort_flags);
    size_t need = 0;   /* the whole result's length, written or not */
    while (*in) {
        const char *piece = in;
        size_t len = 1;
        for (int k = 0; k < N_FLAGS; k++) {
            size_t l = strlen(g_sorted[k].setting);
            if (!strncmp(in, g_sorted[k].setting, l)) { piece = g_sorted[k].flag; len = strlen(piece); in += l - 1; break; }
        }
        in++;
        for (size_t i = 0; i < len; i++, need++)
            if (need + 1 < n) out[need] = piece[i];
    }
    if (n) out[need < n ? need : n - 1] = 0;
    return need;
}

char *dt_cli_flag_text(const char *in, char *buf, size_t n) {
    size_t need = dt_cli_flag_names(in, buf, n);
    if (need < n) return buf;
    char *big = malloc(need + 1);
    if (!big) return buf;   /* truncated beats nothing */
    dt_cli_flag_names(in, big, need + 1);
    return big;
}
