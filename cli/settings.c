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
 * field's name.
 *
 * The built-in models' settings ("arch.max_t", nn.h section 4b) are not in
 * the table: their flags follow from their names by one rule (dt_cli_model_flag:
 * "arch.max_t" is --max-t), and a setting without a flag (the library sizes
 * it from the data) is written as what it is, its help ("MLP input size"). */
#include <ctype.h>
#include <pthread.h>
#include <stdio.h>
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
    {"zero.node_params", "--node-params"},
    {"zero.param_dtype", "--param-dtype"},
    {"zero.save_format", "--save-format"},
    {"pipe.stages", "--pp"},
    {"pipe.schedule", "--schedule"},
    {"pipe.virtual_stages", "--virtual-stages"},
    {"pipe.max_outstanding", "--max-outstanding"},
    {"pipe.split", "--pp-split"},
    {"pipe.wire", "--pp-wire"},
    {"pipe.zero_stage", "--zero (per stage)"},
    {"tp.size", "--tp"},
    {"tp.sequence_parallel", "--sequence-parallel"},
    /* the process group layer (dist.h dt_dist_opts) */
    {"dist.progress", "--progress"},
    {"dist.collective_timeout_s", "--collective-timeout"},
    {"dist.debug_collectives", "--debug-collectives"},
    /* training (train.h dt_train_opts) */
    {"train.model.kind", "--model"},
    {"train.recompute", "--recompute"},
    {"train.data_path", "--data-path"},
    {"train.val_path", "--val-path"},
    {"train.data", "--data"},
    {"train.batch", "--batch"},
    {"train.seq", "--seq"},
    {"train.steps", "--steps"},
    {"train.epochs", "--epochs"},
    {"train.accum", "--accum"},
    {"train.optim.kind", "--optim"},
    {"train.optim.lr", "--lr"},
    {"train.optim.weight_decay", "--wd"},
    {"train.optim.momentum", "--momentum"},
    {"train.optim.nesterov", "--nesterov"},
    {"train.optim.beta1", "--beta1"},
    {"train.optim.beta2", "--beta2"},
    {"train.optim.eps", "--eps"},
    {"train.optim.state_dtype", "--optim-state"},
    /* the optimizer's own checks name its fields (optim.h dt_optim_cfg) */
    {"optim.lr", "--lr"},
    {"optim.weight_decay", "--wd"},
    {"optim.momentum", "--momentum"},
    {"optim.nesterov", "--nesterov"},
    {"optim.beta1", "--beta1"},
    {"optim.beta2", "--beta2"},
    {"optim.eps", "--eps"},
    {"train.min_lr", "--min-lr"},
    {"train.warmup", "--warmup"},
    {"train.clip", "--clip"},
    {"train.seed", "--seed"},
    {"train.threads", "--threads"},
    {"train.keep_denormals", "--keep-denormals"},
    {"train.precision", "--precision"},
    {"train.saved_activations", "--saved-activations"},
    {"train.param_dtype", "--param-dtype"},
    {"train.loss_scale", "--loss-scale"},
    {"train.loss_scale_init", "--loss-scale-init"},
    {"train.loss_scale_window", "--loss-scale-window"},
    {"train.init", "--init"},
    {"train.save_every", "--save-every"},
    {"train.save_sync", "--save-sync"},
    {"train.no_memory_check", "--no-memory-check"},
    {"train.save", "--save"},
    {"train.resume", "--resume"},
    {"train.metrics", "--metrics"},
    {"train.trace", "--trace"},
    {"train.log_every", "--log-every"},
    {"train.eval_batches", "--eval-batches"},
    {"train.stop_after", "--stop-after"},
    {"train.freeze", "--freeze"},
    {"train.unfreeze_at", "--unfreeze-at"},
    {"train.uneven", "--uneven"},
    {"train.sample_every", "--sample-every"},
    {"train.sample_tokens", "--sample-tokens"},
};
#define N_FLAGS ((int)(sizeof k_flags / sizeof k_flags[0]))

/* Under a pipeline the CLI hands the library micro-batches (pipe_flags in
 * cmd_train.c): its train.batch is --batch / --microbatches, its
 * train.accum --microbatches, its train.eval_batches counts micro-batches.
 * Those settings are named as what they are, so a message never quotes a
 * --batch the user did not give. */
static const setting_flag k_pipe_flags[] = {
    {"train.batch", "the micro-batch (--batch / --microbatches)"},
    {"train.accum", "--microbatches"},
    {"train.eval_batches", "the evaluation's micro-batches (--eval-batches x --microbatches)"},
};
static int g_pipelined;
void dt_cli_flag_names_pipeline(int on) { g_pipelined = on; }

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

int dt_cli_model_flag(const char *key, char *buf, size_t n) {
    if (strncmp(key, "arch.", 5) || n < 3 || strlen(key + 5) > n - 3) return -1;
    size_t k = 0;
    buf[k++] = '-';
    buf[k++] = '-';
    for (const char *p = key + 5; *p; p++) buf[k++] = *p == '_' ? '-' : *p;
    buf[k] = 0;
    return 0;
}

#define ARCH_NAME "abcdefghijklmnopqrstuvwxyz0123456789_"

/* "arch.<name>" at in, a setting of some built-in: its length, and in buf
 * its flag or what it is; 0 otherwise */
static size_t model_setting(const char *in, char *buf, size_t n) {
    if (strncmp(in, "arch.", 5)) return 0;
    size_t len = 5 + strspn(in + 5, ARCH_NAME);
    for (int i = 0; i < dt_model_builtin_count(); i++) {
        const dt_model_builtin *b = dt_model_builtin_at(i, NULL);
        for (int k = 0; k < b->n_settings; k++) {
            const dt_model_setting *s = &b->settings[k];
            if (strlen(s->key) != len || strncmp(s->key, in, len)) continue;
            if (s->meta && !dt_cli_model_flag(s->key, buf, n)) return len;
            if (!s->meta && s->help) { snprintf(buf, n, "%s", s->help); return len; }
        }
    }
    return 0;
}

/* (a progress thread may log too: the table is sorted once, then read-only;
 * so is the model registry once running) */
/* c continues a name (a tensor's "optim.momentum.fc1.weight", a path's
 * "/runs/train.steps"): a setting is replaced only as a whole word */
static int name_char(char c) { return isalnum((unsigned char)c) || c == '_'; }
static int joins_before(const char *start, const char *p) {
    return p > start && (name_char(p[-1]) || p[-1] == '.' || p[-1] == '/' || p[-1] == '-');
}
static int joins_after(const char *p) {
    return name_char(*p) || ((*p == '.' || *p == '/') && name_char(p[1]));
}

size_t dt_cli_flag_names(const char *in, char *out, size_t n) {
    pthread_once(&g_sort_once, sort_flags);
    size_t need = 0;   /* the whole result's length, written or not */
    char model[256];
    const char *start = in;
    while (*in) {
        const char *piece = in;
        int word = !joins_before(start, in);
        size_t len = 1, skip = word ? model_setting(in, model, sizeof model) : 0;   /* characters of in replaced */
        if (skip && joins_after(in + skip)) skip = 0;
        if (skip) { piece = model; len = strlen(model); }
        for (size_t k = 0; g_pipelined && k < sizeof k_pipe_flags / sizeof *k_pipe_flags && !skip && word; k++) {
            size_t l = strlen(k_pipe_flags[k].setting);
            if (!strncmp(in, k_pipe_flags[k].setting, l) && !joins_after(in + l)) {
                piece = k_pipe_flags[k].flag;
                len = strlen(piece);
                skip = l;
            }
        }
        for (int k = 0; k < N_FLAGS && !skip && word; k++) {
            size_t l = strlen(g_sorted[k].setting);
            if (!strncmp(in, g_sorted[k].setting, l) && !joins_after(in + l)) {
                piece = g_sorted[k].flag;
                len = strlen(piece);
                skip = l;
            }
        }
        in += skip ? skip : 1;
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
