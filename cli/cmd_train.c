/* dtrain train / dtrain eval: flags -> dt_train_opts -> trainer. */
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "args.h"
#include "cli.h"
#include "dtrain/parallel.h"

typedef struct cli_flags {
    dt_train_opts o;
    const char *model, *data, *optim;
    /* the built-in models' flags come from the model registry (nn.h section
     * 4b); list-valued ones are parsed here, then set through the registry */
    char model_meta[256], model_help[64], data_help[256];
    int n_lists, list_n[16], lists[16][DT_SETTING_INTS_MAX];
    const dt_model_setting *list_of[16];
    int nproc;
    const char *hosts, *hostfile;   /* where --nproc ranks run (hosts.c) */
    int print_launch;
    int nesterov;
    dt_cli_dist dist;
    dt_dp_opts dp;       /* one set for DDP, ZeRO and a pipeline's replicas (parallel.h) */
    float bucket_mb, first_bucket_mb;
    const char *compress, *progress, *overlap_step, *save_format, *recompute, *schedule;
    int microbatches;
    int zero_prefetch;   /* INT_MIN: not given */
    int no_bcast;
    int no_shm;
    const char *freeze[64];
    const char *no_decay[64], *lr_scale[64];   /* --no-decay, --lr-scale (PATTERN=F) */
    int n_no_decay, n_lr_scale;
    char lr_pattern[64][256];                  /* --lr-scale's patterns, split off their =F */
    dt_optim_group groups[128];
} cli_flags;

#define N_ARGS(t) ((int)(sizeof(t) / sizeof((t)[0])))

/* --no-decay and --lr-scale as parameter groups (optim.h): the decay groups
 * first, then the LR scales, each in command-line order; the library checks
 * that each pattern matches some parameter. */
static int param_groups(cli_flags *f, char *err, int errlen) {
    int n = 0;
    for (int k = 0; k < f->n_no_decay; k++) {
        dt_optim_group g = dt_optim_group_make(f->no_decay[k]);
        g.weight_decay = 0.0f;
        g.who = "--no-decay";
        f->groups[n++] = g;
    }
    for (int k = 0; k < f->n_lr_scale; k++) {
        const char *v = f->lr_scale[k], *eq = strrchr(v, '=');
        char *end = NULL;
        double x = eq ? strtod(eq + 1, &end) : 0.0;
        size_t len = eq ? (size_t)(eq - v) : 0;
        if (!eq || len == 0 || end == eq + 1 || *end || !isfinite(x) || x < 0.0 || len >= sizeof f->lr_pattern[k]) {
            snprintf(err, (size_t)errlen, "--lr-scale '%s': expected PATTERN=F with F a number >= 0 (e.g. 'h.0.*=0.1')", v);
            return -1;
        }
        memcpy(f->lr_pattern[k], v, len);
        f->lr_pattern[k][len] = 0;
        dt_optim_group g = dt_optim_group_make(f->lr_pattern[k]);
        g.lr_scale = (float)x;
        g.who = "--lr-scale";
        f->groups[n++] = g;
    }
    f->o.groups = f->groups;
    f->o.n_groups = n;
    return 0;
}

static int has_row(const dt_arg *t, int n, const char *name) {
    for (int k = 0; k < n; k++)
        if (!strcmp(t[k].name, name)) return 1;
    return 0;
}

/* printf at buf + *k, at most up to cap; *k stays <= cap - 1 */
static void append(char *buf, size_t cap, size_t *k, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void append(char *buf, size_t cap, size_t *k, const char *fmt, ...) {
    if (*k + 1 >= cap) return;
    va_list ap;
    va_start(ap, fmt);
    int w = vsnprintf(buf + *k, cap - *k, fmt, ap);
    va_end(ap);
    *k = w < 0 ? *k : *k + (size_t)w < cap ? *k + (size_t)w : cap - 1;
}

/* --data's help: "(default fashion-mnist; text for gpt2)": the default
 * model's data set, then each other one with the models that train on it
 * when --data is not given */
static void data_help(cli_flags *f, dt_model_kind def) {
    char *h = f->data_help;
    size_t cap = sizeof f->data_help, k = 0;
    const char *first = dt_model_builtin_of(def)->data;
    int nb = dt_model_builtin_count();
    append(h, cap, &k, "fashion-mnist | text | shard (default %s", first);
    for (int i = 0; i < nb; i++) {
        const char *d = dt_model_builtin_at(i, NULL)->data;
        int seen = !strcmp(d, first);
        for (int j = 0; j < i && !seen; j++) seen = !strcmp(dt_model_builtin_at(j, NULL)->data, d);
        if (seen) continue;
        append(h, cap, &k, "; %s for", d);
        for (int j = i, first_model = 1; j < nb; j++)
            if (!strcmp(dt_model_builtin_at(j, NULL)->data, d)) {
                append(h, cap, &k, "%s%s", first_model ? " " : ", ", dt_model_builtin_at(j, NULL)->name);
                first_model = 0;
            }
    }
    append(h, cap, &k, ")");
}

/* --model and every setting of a built-in that has a flag (a flag two models
 * share is one row), from the model registry; -1 when the table is full */
static int model_rows(cli_flags *f, dt_arg *t, int cap) {
    dt_train_opts def;
    dt_train_opts_default(&def);
    dt_model_builtin_names(f->model_meta, sizeof f->model_meta, "|");
    snprintf(f->model_help, sizeof f->model_help, "model (default %s)", dt_model_kind_name(def.model.kind));
    data_help(f, def.model.kind);
    int n = 0;
    t[n++] = (dt_arg){"--model", DT_ARG_STR, &f->model, f->model_meta, f->model_help, 0, 0};
    for (int i = 0; i < dt_model_builtin_count(); i++) {
        const dt_model_builtin *b = dt_model_builtin_at(i, NULL);
        for (int k = 0; k < b->n_settings; k++) {
            const dt_model_setting *s = &b->settings[k];
            if (!s->meta || has_row(t, n, s->flag)) continue;
            if (n == cap || (s->type == DT_SETTING_INTS && f->n_lists == N_ARGS(f->lists))) return -1;
            void *field = (char *)&f->o.model + s->at;
            if (s->type == DT_SETTING_INTS) {
                int j = f->n_lists++;
                f->list_of[j] = s;
                t[n++] = (dt_arg){s->flag, DT_ARG_LIST, &f->list_n[j], s->meta, s->help, f->lists[j], s->n_max};
            } else {
                t[n++] = (dt_arg){s->flag, s->type == DT_SETTING_INT ? DT_ARG_INT : DT_ARG_FLOAT, field, s->meta, s->help, 0, 0};
            }
        }
    }
    return n;
}

/* The flag table: --model and the models' flags (model_rows), then the rest.
 * Returns the row count, or -1 with err set. */
static int build_table(cli_flags *f, dt_arg *t, int cap, char *err, int errlen) {
    dt_train_opts *o = &f->o;
    int nm = model_rows(f, t, cap);
    dt_arg a[] = {
        {"--data", DT_ARG_STR, &f->data, "KIND", f->data_help, 0, 0},
        {"--data-path", DT_ARG_STR, &o->data_path, "PATH", "dataset dir/file (defaults: " DT_FASHION_MNIST_DIR ", " DT_FORTUNES_DIR ")", 0, 0},
        {"--val-path", DT_ARG_STR, &o->val_path, "PATH", "LM validation file (default: last 10% of the data)", 0, 0},
        {"--batch", DT_ARG_I64, &o->batch, "B", "batch size per rank and micro-step; with --pp per replica and step, split into --microbatches (default 64)", 0, 0},
        {"--seq", DT_ARG_I64, &o->seq, "T", "LM sequence length (default 64)", 0, 0},
        {"--steps", DT_ARG_I64, &o->steps, "N", "optimizer steps (overrides --epochs)", 0, 0},
        {"--epochs", DT_ARG_INT, &o->epochs, "N", "epochs when --steps is not given (default 1)", 0, 0},
        {"--recompute", DT_ARG_STR, &f->recompute, "none|blocks", "activation recompute: blocks keeps only the input of every block but the last and re-runs its forward in backward (less memory, ~1/3 more compute; default none)", 0, 0},
        {"--accum", DT_ARG_INT, &o->accum, "K", "micro-steps per optimizer step (gradient accumulation, default 1)", 0, 0},
        {"--optim", DT_ARG_STR, &f->optim, "adamw|sgd", "optimizer (default adamw)", 0, 0},
        {"--lr", DT_ARG_FLOAT, &o->optim.lr, "LR", "learning rate (default 1e-3 adamw, 1e-2 sgd)", 0, 0},
        {"--min-lr", DT_ARG_FLOAT, &o->min_lr, "LR", "cosine schedule floor; with --warmup enables the schedule (default 0)", 0, 0},
        {"--warmup", DT_ARG_I64, &o->warmup, "N", "linear warm-up steps (default 0)", 0, 0},
        {"--wd", DT_ARG_FLOAT, &o->optim.weight_decay, "W", "weight decay, matrices only (default 0.01 adamw, 0 sgd)", 0, 0},
        {"--momentum", DT_ARG_FLOAT, &o->optim.momentum, "M", "SGD momentum (default 0)", 0, 0},
        {"--nesterov", DT_ARG_FLAG, &f->nesterov, NULL, "SGD Nesterov momentum", 0, 0},
        {"--beta1", DT_ARG_FLOAT, &o->optim.beta1, "B1", "AdamW beta1 (default 0.9)", 0, 0},
        {"--beta2", DT_ARG_FLOAT, &o->optim.beta2, "B2", "AdamW beta2 (default 0.999)", 0, 0},
        {"--eps", DT_ARG_FLOAT, &o->optim.eps, "E", "AdamW epsilon (default 1e-8)", 0, 0},
        {"--freeze", DT_ARG_STRS, &o->n_freeze, "PATTERN", "freeze the parameters whose names match a glob (repeatable; e.g. 'fc1.*'): "
         "not trained, their values kept exactly; a pattern matching none is an error", f->freeze, 64},
        {"--unfreeze-at", DT_ARG_I64, &o->unfreeze_at, "STEP", "the --freeze parameters train from this step on, with "
         "fresh optimizer state (DDP re-cuts buckets, ZeRO re-partitions; default 0: never)", 0, 0},
        {"--no-decay", DT_ARG_STRS, &f->n_no_decay, "PATTERN", "no weight decay for the parameters matching a glob (repeatable; "
         "e.g. '*.bias'). By default matrices decay, vectors (biases, norms) do not", f->no_decay, 64},
        {"--lr-scale", DT_ARG_STRS, &f->n_lr_scale, "PATTERN=F", "multiply the learning rate of the parameters matching a glob "
         "by F (repeatable, a later match wins; e.g. 'h.0.*=0.1')", f->lr_scale, 64},
        {"--clip", DT_ARG_FLOAT, &o->clip, "NORM", "clip the global gradient norm (default 0: off)", 0, 0},
        {"--seed", DT_ARG_U64, &o->seed, "S", "seed for init, shuffling, dropout (default 1)", 0, 0},
        {"--threads", DT_ARG_INT, &o->threads, "N", "OpenMP/OpenBLAS threads per rank (default: cores / ranks)", 0, 0},
        {"--keep-denormals", DT_ARG_FLAG, &o->keep_denormals, NULL,
         "IEEE denormals (default: flush to zero; denormal arithmetic is many times slower)", 0, 0},
        {"--init", DT_ARG_STR, &o->init, "FILE", "start from parameters in a safetensors file (e.g. HF GPT-2)", 0, 0},
        {"--save", DT_ARG_STR, &o->save, "FILE", "write a checkpoint at the end (atomically; the path is checked writable at start-up)", 0, 0},
        {"--save-every", DT_ARG_I64, &o->save_every, "N", "also checkpoint every N steps", 0, 0},
        {"--resume", DT_ARG_STR, &o->resume, "FILE", "continue from a checkpoint (bit-for-bit; the model flags must match the checkpoint's and --steps be at least its step)", 0, 0},
        {"--metrics", DT_ARG_STR, &o->metrics, "FILE", "append one JSON line per step (checked writable at start-up)", 0, 0},
        {"--trace", DT_ARG_STR, &o->trace, "FILE", "write a Chrome/Perfetto trace (per rank: FILE.rankN)", 0, 0},
        {"--log-every", DT_ARG_I64, &o->log_every, "N", "progress line interval when not on a terminal", 0, 0},
        {"--eval-batches", DT_ARG_I64, &o->eval_batches, "N", "LM evaluation batches (default: all)", 0, 0},
        {"--stop-after", DT_ARG_I64, &o->stop_after, "N", "stop after N steps without the final save (simulates a crash)", 0, 0},
        {"--quiet", DT_ARG_FLAG, &o->quiet, NULL, "no progress output", 0, 0},
        {"--nproc", DT_ARG_INT, &f->nproc, "N", "ranks: re-launches under mpirun, on this machine (1..8 x cores), on --hosts / --hostfile, or on the Slurm allocation dtrain runs in (default there: all its tasks)", 0, 0},
        {"--hosts", DT_ARG_STR, &f->hosts, "H:N,...", "machines and ranks per machine (e.g. node1:4,node2:4; reached by ssh; ranks fill one machine after another; --nproc defaults to the sum)", 0, 0},
        {"--hostfile", DT_ARG_STR, &f->hostfile, "FILE", "machines as an Open MPI hostfile (\"host slots=N\" per line)", 0, 0},
        {"--print-launch", DT_ARG_FLAG, &f->print_launch, NULL, "print the mpirun command (and the environment passed to every rank) that --nproc / --hosts would run, and exit", 0, 0},
        {"--bucket-mb", DT_ARG_FLOAT, &f->bucket_mb, "MB", "gradient bucket size, > 0 (default: DDP 1, ZeRO 4)", 0, 0},
        {"--first-bucket-mb", DT_ARG_FLOAT, &f->first_bucket_mb, "MB", "first (last layers') gradient bucket size (default 1)", 0, 0},
        {"--find-unused", DT_ARG_FLAG, &f->dp.find_unused_params, NULL, "DDP: parameters without gradient are reduced as zeros", 0, 0},
        {"--no-broadcast-buffers", DT_ARG_FLAG, &f->no_bcast, NULL, "DDP: do not broadcast rank 0's buffers before each forward", 0, 0},
        {"--sync-bn", DT_ARG_FLAG, &f->dp.sync_bn, NULL, "DDP or ZeRO: SyncBatchNorm (batch statistics over all ranks)", 0, 0},
        {"--uneven", DT_ARG_FLAG, &f->o.uneven, NULL, "--data text from a directory: rank r trains only on the files k with "
         "k mod ranks = r (name order), so ranks hold different numbers of batches; each makes --epochs passes over its "
         "own files (at most --steps steps) and a rank whose data runs out joins (DDP, --zero 1 or 2) until all have: "
         "every rank ends at the largest step count. The loss is averaged over ranks while all train, then it is the "
         "reporting rank's own; the validation split is shared. Not with --pp, --zero 3, --sync-bn, --resume, "
         "--save-every, --stop-after; a stop signal after the first rank ran out is not agreed", 0, 0},
        {"--no-overlap", DT_ARG_FLAG, &f->dist.ddp.no_overlap, NULL, "DDP: reduce gradients only after backward", 0, 0},
        {"--deterministic", DT_ARG_FLAG, &f->dp.deterministic, NULL, "DDP: fixed rank-order summation (bitwise reproducible at any world size)", 0, 0},
        {"--no-shm", DT_ARG_FLAG, &f->no_shm, NULL, "DDP, ZeRO: MPI collectives even when all ranks share this machine (default: DDP without --compress keeps gradients in MPI shared memory, ZeRO-1/2 gathers through it)", 0, 0},
        {"--compress", DT_ARG_STR, &f->compress, "none|bf16|fp16", "DDP: gradient compression on the wire; ZeRO: gradients and gathered parameters on the wire, fp32 master shards (default none)", 0, 0},
        {"--progress", DT_ARG_STR, &f->progress, "poll|thread", "MPI progress engine (default: see dist.h)", 0, 0},
        {"--zero", DT_ARG_INT, &f->dist.zero_stage, "0|1|2|3", "ZeRO stage: shard optimizer state (1), + gradients (2), + parameters (3); 0 = DDP (default); with --pp: per stage, 1 or 2", 0, 0},
        {"--overlap-step", DT_ARG_STR, &f->overlap_step, "MODE", "ZeRO: interleaved | after-backward (default) | off: when shards are stepped", 0, 0},
        {"--zero-prefetch", DT_ARG_INT, &f->zero_prefetch, "N", "ZeRO-3: modules whose parameters are gathered ahead (default 2; 0 = none)", 0, 0},
        {"--pp", DT_ARG_INT, &f->dist.pipe.stages, "P", "pipeline stages: the model's blocks cut into P stages on P ranks (--nproc = P x data-parallel replicas; default 1)", 0, 0},
        {"--microbatches", DT_ARG_INT, &f->microbatches, "M", "pipeline: --batch splits into M micro-batches streamed through the stages (default P)", 0, 0},
        {"--schedule", DT_ARG_STR, &f->schedule, "KIND", "pipeline schedule: gpipe | 1f1b | interleaved | zb-h1 (default 1f1b)", 0, 0},
        {"--virtual-stages", DT_ARG_INT, &f->dist.pipe.virtual_stages, "V", "interleaved: model chunks per rank (default 2)", 0, 0},
        {"--max-outstanding", DT_ARG_INT, &f->dist.pipe.max_outstanding, "N", "gpipe: micro-batches in flight per stage (default: all)", 0, 0},
        {"--pp-split", DT_ARG_LIST, &f->dist.pipe.n_split, "N,N,..", "pipeline: blocks per (virtual) stage (default: balanced by measured cost)", f->dist.pipe.split, DT_PIPE_MAX_VSTAGES},
        {"--stall-warn", DT_ARG_FLOAT, &f->dist.stall_warn, "S", "warn when a collective waits S seconds, naming it and the ranks not joined (default 60; 0 = off)", 0, 0},
        {"--collective-timeout", DT_ARG_FLOAT, &f->dist.collective_timeout, "S", "fail when a collective waits S seconds (default: off)", 0, 0},
        {"--debug-collectives", DT_ARG_FLAG, &f->dist.debug_collectives, NULL, "compare every collective across ranks before it runs; fail at the first divergence (slow)", 0, 0},
        {"--save-format", DT_ARG_STR, &f->save_format, "sharded|consolidated", "ZeRO checkpoints: a directory of per-rank shards (default) or one file", 0, 0},
    };
    if (nm < 0 || nm + N_ARGS(a) > cap) {
        snprintf(err, (size_t)errlen, "internal: more flags than the table's %d rows", cap);
        return -1;
    }
    for (int k = 0; k < N_ARGS(a); k++)
        if (has_row(t, nm, a[k].name)) {   /* a model setting must not take another flag's name */
            snprintf(err, (size_t)errlen, "internal: flag %s is both a model setting and an option", a[k].name);
            return -1;
        }
    memcpy(t + nm, a, sizeof a);
    return nm + N_ARGS(a);
}

/* --pp P --microbatches M --batch B: micro-batches of B / M, M per step. */
static int pipe_flags(cli_flags *f, char *err, int errlen) {
    dt_pipe_opts *p = &f->dist.pipe;
    int piped = p->stages != 1 || f->schedule || f->microbatches != INT_MIN || p->n_split || p->max_outstanding ||
                p->virtual_stages;
    if (!piped) return 0;
    f->dist.pipelined = 1;
    if (p->stages < 1) { snprintf(err, (size_t)errlen, "--pp must be >= 1 (got %d)", p->stages); return -1; }
    if (f->schedule && dt_pipe_kind_parse(f->schedule, &p->schedule)) {
        snprintf(err, (size_t)errlen, "--schedule: unknown '%s' (gpipe, 1f1b, interleaved, zb-h1)", f->schedule);
        return -1;
    }
    if (!p->virtual_stages) p->virtual_stages = p->schedule == DT_PIPE_INTERLEAVED ? 2 : 1;
    if (p->virtual_stages < 1 || (p->virtual_stages > 1 && p->schedule != DT_PIPE_INTERLEAVED)) {
        snprintf(err, (size_t)errlen, "--virtual-stages %d: more than 1 needs --schedule interleaved", p->virtual_stages);
        return -1;
    }
    if (p->max_outstanding < 0 || (p->max_outstanding && p->schedule != DT_PIPE_GPIPE)) {
        snprintf(err, (size_t)errlen, "--max-outstanding applies to --schedule gpipe (>= 1)");
        return -1;
    }
    int M = f->microbatches != INT_MIN ? f->microbatches : p->stages;
    if (M < 1) { snprintf(err, (size_t)errlen, "--microbatches must be >= 1 (got %d)", M); return -1; }
    if (f->o.accum != 1) {
        snprintf(err, (size_t)errlen, "--accum does not combine with a pipeline: its micro-batches are --microbatches");
        return -1;
    }
    if (f->o.batch % M) {
        snprintf(err, (size_t)errlen, "--batch %lld does not split into --microbatches %d equal micro-batches",
                 (long long)f->o.batch, M);
        return -1;
    }
    if (f->dist.zero_stage == 3) {
        snprintf(err, (size_t)errlen, "--zero 3 does not combine with --pp (stage 3 gathers parameters from module hooks "
                 "that a stage's part of the model does not all run); use --zero 1 or 2");
        return -1;
    }
    /* data parallel across each stage's replicas: DDP or ZeRO 1/2 with the same options */
    p->zero_stage = f->dist.zero_stage;
    p->ddp = f->dist.ddp;
    p->zero = f->dist.zero;
    f->o.batch /= M;
    f->o.accum = M;
    return 0;
}

/* --bucket-mb / --first-bucket-mb: not given (NaN), or MB in [1 float, 64 GiB] */
#define MAX_BUCKET_MB 65536.0
static int bucket_flag(const char *flag, float mb, char *err, int errlen) {
    if (isnan(mb) || (mb * 1048576.0 >= 4.0 && mb <= MAX_BUCKET_MB)) return 0;
    snprintf(err, (size_t)errlen, "%s %g: must be at least 4 bytes (%.7f) and at most %.0f MB", flag, (double)mb,
             4.0 / 1048576.0, MAX_BUCKET_MB);
    return -1;
}

/* --uneven: ranks run different numbers of steps, finished through join */
static int uneven_flags(cli_flags *f, char *err, int errlen) {
    int piped = f->dist.pipe.stages != 1 || f->schedule || f->microbatches != INT_MIN || f->dist.pipe.n_split ||
                f->dist.pipe.max_outstanding || f->dist.pipe.virtual_stages;
    const char *bad = piped ? "a pipeline (--pp and its flags)"
                    : f->dist.zero_stage == 3 ? "--zero 3 (its parameter gathers run in module hooks a rank without data does not run)"
                    : f->dp.sync_bn ? "--sync-bn (its collectives run inside forward and backward)" : NULL;
    if (bad) { snprintf(err, (size_t)errlen, "--uneven does not combine with %s", bad); return -1; }
    f->dp.join = 1;
    return 0;
}

/* A flag whose value is one of a few names: the table maps each to its value,
 * and an unknown name is refused listing them. */
typedef struct cli_name { const char *name; int value; } cli_name;
#define CLI_NAMES(t) (t), N_ARGS(t)

static int name_flag(const char *flag, const char *v, const cli_name *t, int n, int *out, char *err, int errlen) {
    for (int i = 0; i < n; i++)
        if (!strcmp(v, t[i].name)) { *out = t[i].value; return 0; }
    int k = snprintf(err, (size_t)errlen, "%s: unknown '%s' (", flag, v);
    for (int i = 0; i < n && k > 0 && k < errlen; i++) k += snprintf(err + k, (size_t)(errlen - k), "%s%s", i ? ", " : "", t[i].name);
    if (k > 0 && k < errlen) snprintf(err + k, (size_t)(errlen - k), ")");
    return -1;
}

static const cli_name k_wire[] = {{"none", DT_F32}, {"bf16", DT_BF16}, {"fp16", DT_F16}};
static const cli_name k_overlap[] = {{"interleaved", DT_ZERO_OVERLAP_INTERLEAVED},
                                     {"after-backward", DT_ZERO_OVERLAP_AFTER_BACKWARD}, {"off", DT_ZERO_OVERLAP_OFF}};
static const cli_name k_save_format[] = {{"sharded", DT_ZERO_CKPT_SHARDED}, {"consolidated", DT_ZERO_CKPT_CONSOLIDATED}};
static const cli_name k_progress[] = {{"poll", DT_PROGRESS_POLL}, {"thread", DT_PROGRESS_THREAD}};

/* The data-parallel flags into f->dp, then into DDP's and ZeRO's options
 * (a pipeline copies those in pipe_flags); --bucket-mb not given leaves each
 * strategy its own default. */
static int dp_flags(cli_flags *f, char *err, int errlen) {
    dt_dp_opts *dp = &f->dp;
    if (bucket_flag("--bucket-mb", f->bucket_mb, err, errlen) || bucket_flag("--first-bucket-mb", f->first_bucket_mb, err, errlen))
        return -1;
    if (f->first_bucket_mb > 0) dp->first_bucket_bytes = (size_t)(f->first_bucket_mb * 1048576.0);
    if (f->no_bcast) dp->broadcast_buffers = 0;
    if (f->no_shm) dp->shm = DT_DP_SHM_OFF;
    int v = 0;
    if (f->compress) {
        if (name_flag("--compress", f->compress, CLI_NAMES(k_wire), &v, err, errlen)) return -1;
        dp->wire = (dt_dtype)v;
    }
    if (f->o.uneven && uneven_flags(f, err, errlen)) return -1;
    size_t ddp_bucket = f->dist.ddp.dp.bucket_bytes, zero_bucket = f->dist.zero.dp.bucket_bytes;
    f->dist.ddp.dp = f->dist.zero.dp = *dp;
    f->dist.ddp.dp.bucket_bytes = ddp_bucket;
    f->dist.zero.dp.bucket_bytes = zero_bucket;
    if (f->bucket_mb > 0) f->dist.ddp.dp.bucket_bytes = f->dist.zero.dp.bucket_bytes = (size_t)(f->bucket_mb * 1048576.0);
    return 0;
}

static int finish_flags(cli_flags *f, char *err, int errlen) {
    dt_train_opts *o = &f->o;
    if (f->model && dt_model_builtin_find(f->model, &o->model.kind) != DT_OK) {
        snprintf(err, (size_t)errlen, "--model: %s", dt_error_message());
        return -1;
    }
    for (int j = 0; j < f->n_lists; j++)
        if (f->list_n[j] && dt_model_setting_set_ints(f->list_of[j], &o->model, f->lists[j], f->list_n[j]) != DT_OK) {
            snprintf(err, (size_t)errlen, "%s", dt_error_message());
            return -1;
        }
    o->data = f->data ? f->data : dt_model_builtin_of(o->model.kind)->data;   /* the model's own */
    if (dt_dataset_check_name(o->data) != DT_OK) { dt_cli_flag_names(dt_error_message(), err, (size_t)errlen); return -1; }
    if (f->recompute && dt_recompute_parse(f->recompute, &o->recompute)) {
        snprintf(err, (size_t)errlen, "--recompute: unknown mode '%s' (none, blocks)", f->recompute);
        return -1;
    }
    if (f->nesterov) o->optim.nesterov = 1;
    o->freeze = f->freeze;
    if (param_groups(f, err, errlen)) return -1;
    if (f->nproc != INT_MIN && !f->hosts && !f->hostfile && !getenv("SLURM_JOB_ID") &&
        dt_cli_nproc_check(f->nproc, err, errlen))
        return -1;
    if (f->dist.zero_stage < 0 || f->dist.zero_stage > 3) {
        snprintf(err, (size_t)errlen, "--zero: stage must be 0, 1, 2 or 3 (got %d)", f->dist.zero_stage);
        return -1;
    }
    dt_zero_opts *z = &f->dist.zero;
    z->stage = f->dist.zero_stage ? f->dist.zero_stage : 1;
    int v = 0;
    if (f->overlap_step) {
        if (name_flag("--overlap-step", f->overlap_step, CLI_NAMES(k_overlap), &v, err, errlen)) return -1;
        z->overlap_step = (dt_zero_overlap)v;
    }
    if (f->save_format) {
        if (name_flag("--save-format", f->save_format, CLI_NAMES(k_save_format), &v, err, errlen)) return -1;
        f->dist.save_format = (dt_zero_ckpt_format)v;
    }
    if (!f->dist.zero_stage && (f->overlap_step || f->save_format)) {
        snprintf(err, (size_t)errlen, "%s applies to ZeRO only (add --zero 1, 2 or 3)", f->overlap_step ? "--overlap-step" : "--save-format");
        return -1;
    }
    if (f->zero_prefetch != INT_MIN) {
        if (f->dist.zero_stage != 3) { snprintf(err, (size_t)errlen, "--zero-prefetch applies to ZeRO stage 3 only (add --zero 3)"); return -1; }
        if (f->zero_prefetch < 0) { snprintf(err, (size_t)errlen, "--zero-prefetch must be >= 0 (got %d)", f->zero_prefetch); return -1; }
        z->prefetch = f->zero_prefetch;
    }
    if (f->dist.zero_stage && f->dist.ddp.no_overlap) {
        snprintf(err, (size_t)errlen, "--no-overlap (use --overlap-step off) is a DDP option and is not supported with --zero");
        return -1;
    }
    if (dp_flags(f, err, errlen)) return -1;
    if (f->dist.stall_warn < 0 || f->dist.collective_timeout < 0) {
        snprintf(err, (size_t)errlen, "%s must be >= 0 seconds", f->dist.stall_warn < 0 ? "--stall-warn" : "--collective-timeout");
        return -1;
    }
    if (pipe_flags(f, err, errlen)) return -1;
    if (f->progress) {
        if (name_flag("--progress", f->progress, CLI_NAMES(k_progress), &v, err, errlen)) return -1;
        f->dist.progress = (dt_progress_mode)v;
    }
    return 0;
}

/* Optimizer defaults depend on --optim, so parse it first. */
static void pre_scan(int argc, char **argv, cli_flags *f) {
    for (int i = 2; i < argc; i++) {
        const char *v = NULL;
        if (!strcmp(argv[i], "--optim") && i + 1 < argc) v = argv[i + 1];
        else if (!strncmp(argv[i], "--optim=", 8)) v = argv[i] + 8;
        if (v && !strcmp(v, "sgd")) f->o.optim = dt_optim_cfg_default(DT_OPTIM_SGD);
        if (!strcmp(argv[i], "--model") && i + 1 < argc) {
            dt_model_kind k;
            if (!dt_model_kind_parse(argv[i + 1], &k)) f->o.model = dt_model_cfg_default(k);
        }
    }
}

/* --nproc / --hosts / --hostfile / Slurm: where the ranks go; then mpirun. */
static int launch(int argc, char **argv, const cli_flags *f) {
    char err[512];
    dt_cli_hosts h;
    if (dt_cli_hosts_parse(f->hosts, f->hostfile, &h, err, sizeof err)) {
        fprintf(stderr, "dtrain: %s\n", err);
        return 2;
    }
    int np = f->nproc != INT_MIN ? f->nproc : h.total > 0 ? h.total : 1;
    int rc = 0;
    if (h.total > 0 && (np < 1 || np > h.total)) {
        fprintf(stderr, "dtrain: --nproc %d: %s has %d slot%s\n", np, h.desc, h.total, h.total == 1 ? "" : "s");
        rc = 2;
    } else if (!f->print_launch && dt_cli_hosts_resolve(&h, err, sizeof err)) {
        fprintf(stderr, "dtrain: %s\n", err);
        rc = 2;
    } else {
        rc = dt_cli_relaunch(argc, argv, np, f->o.threads, &h, f->print_launch);
    }
    dt_cli_hosts_free(&h);
    return rc;
}

int dt_cli_train(int argc, char **argv, int eval_only) {
    cli_flags f;
    memset(&f, 0, sizeof f);
    dt_train_opts_default(&f.o);
    dt_ddp_opts_default(&f.dist.ddp);
    dt_zero_opts_default(&f.dist.zero);
    dt_dp_opts_default(&f.dp);
    f.zero_prefetch = INT_MIN;
    f.nproc = INT_MIN;   /* not given */
    f.bucket_mb = f.first_bucket_mb = NAN;   /* not given: the strategy's defaults */
    f.microbatches = INT_MIN;   /* not given: --pp */
    f.dist.stall_warn = 60.0f;
    dt_pipe_opts_default(&f.dist.pipe);
    f.dist.pipe.virtual_stages = 0;   /* 0: not given (default by schedule) */
    pre_scan(argc, argv, &f);
    dt_arg table[128];
    char err[512];
    int n = build_table(&f, table, N_ARGS(table), err, sizeof err);
    if (n < 0) { fprintf(stderr, "dtrain: %s\n", err); return 2; }
    int r = dt_args_parse(table, n, argc, argv, 2, err, sizeof err);
    if (r == 1) {
        dt_args_help(table, n, eval_only
            ? "usage: dtrain eval --model KIND --init FILE [options]\n\nEvaluate a model (weights from --init or --resume) on the test/validation split."
            : "usage: dtrain train [options]\n       mpirun -np N dtrain train [options]\n\nTrain a model; prints a progress line per step and the test accuracy (images) or validation loss (text) at the end.",
            "data: fashion-mnist (IDX, gzip) | text (bytes of a file or a directory of files) | shard (llm.c .bin tokens)\n");
        return 0;
    }
    if (r < 0 || finish_flags(&f, err, sizeof err)) { fprintf(stderr, "dtrain: %s\n", err); return 2; }
    if (f.optim && strcmp(f.optim, "adamw") && strcmp(f.optim, "sgd")) {
        fprintf(stderr, "dtrain: --optim: unknown optimizer '%s' (adamw, sgd)\n", f.optim);
        return 2;
    }
    if (!dt_cli_under_mpi() && (f.hosts || f.hostfile || f.print_launch || (f.nproc != INT_MIN && f.nproc > 1)))
        return launch(argc, argv, &f);
    if (eval_only) {
        if (!f.o.init && !f.o.resume) { fprintf(stderr, "dtrain: eval needs --init FILE or --resume FILE\n"); return 2; }
        f.o.steps = 1;
    }
    return dt_cli_run(&f.o, &f.dist, eval_only);
}
