/* dtrain train / dtrain eval: flags -> dt_train_opts -> trainer. One parse
 * of argv (the table: train_table.c), the defaults that depend on other flags
 * (train_defaults.c), then the checks and conversions of the other flags
 * here. */
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dtrain/parallel.h"
#include "train_flags.h"

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
static const cli_name k_param_dtype[] = {{"fp32", DT_PARAMS_FP32}, {"bf16", DT_PARAMS_BF16}, {"fp16", DT_PARAMS_FP16}};
static const cli_name k_pp_wire[] = {{"fp32", DT_F32}, {"bf16", DT_BF16}, {"fp16", DT_F16}};

/* --pp P --microbatches M --batch B: micro-batches of B / M, M per step. */
static int pipe_flags(cli_flags *f, char *err, int errlen) {
    dt_pipe_opts *p = &f->dist.pipe;
    if (dt_cli_flag_given(f, "--virtual-stages") && p->virtual_stages < 1) {   /* (0 also means "not given") */
        snprintf(err, (size_t)errlen, "--virtual-stages %d must be >= 1", p->virtual_stages);
        return -1;
    }
    int piped = p->stages != 1 || f->schedule || f->microbatches != INT_MIN || p->n_split || p->max_outstanding ||
                p->virtual_stages || f->pp_wire;
    dt_cli_flag_names_pipeline(0);
    if (!piped) return 0;
    int w = DT_F32;
    if (f->pp_wire && name_flag("--pp-wire", f->pp_wire, CLI_NAMES(k_pp_wire), &w, err, errlen)) return -1;
    p->wire = (dt_dtype)w;
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
    if (f->save_format && f->dist.save_format == DT_ZERO_CKPT_CONSOLIDATED) {   /* else ignored: saved as a set */
        snprintf(err, (size_t)errlen, "--save-format consolidated does not combine with --pp: a pipeline saves a "
                 "sharded set (any layout, ZeRO or one process resumes it)");
        return -1;
    }
    /* data parallel across each stage's replicas: DDP or ZeRO 1/2/3 with the same options */
    p->zero_stage = f->dist.zero_stage;
    p->ddp = f->dist.ddp;
    p->zero = f->dist.zero;
    /* the library's train.batch is the micro-batch: --eval-batches still
     * counts batches of --batch (the same sequences as without a pipeline) */
    if (f->o.eval_batches > INT64_MAX / M) {
        snprintf(err, (size_t)errlen, "--eval-batches %lld is too large (0: all)", (long long)f->o.eval_batches);
        return -1;
    }
    if (f->o.eval_batches > 0) f->o.eval_batches *= M;   /* (a negative count is refused as given) */
    f->o.batch /= M;
    f->o.accum = M;
    dt_cli_flag_names_pipeline(1);
    return 0;
}

/* --tp T: what tensor parallelism does not combine with yet is refused here,
 * before anything starts; the world size is checked again by the strategy. */
static int tp_flags(cli_flags *f, char *err, int errlen) {
    int T = f->dist.tp.size;
    if (T < 1) { snprintf(err, (size_t)errlen, "--tp must be >= 1 (got %d)", T); return -1; }
    int sp = f->dist.tp.sequence_parallel;
    if (sp && T == 1) {
        snprintf(err, (size_t)errlen, "--sequence-parallel needs --tp T > 1 (it splits the sequence positions over the "
                 "tensor-parallel group)");
        return -1;
    }
    if (T == 1) return 0;
    int P = f->dist.pipelined ? f->dist.pipe.stages : 1;
    /* --zero S: ZeRO over the replicas in place of DDP (with --pp: of each tensor-parallel stage) */
    const char *bad = f->o.uneven ? "--uneven"
                    : f->dist.zero_stage && f->save_format && !f->dist.pipelined ? "--save-format (with --zero it saves "
                      "one file of whole tensors, as any --tp run)"
                    : f->dist.zero_stage && f->dist.zero.node_params ? "--node-params (each machine's tensor-parallel "
                      "ranks hold different parts)" : NULL;
    if (bad) { snprintf(err, (size_t)errlen, "--tp %d does not combine with %s", T, bad); return -1; }
    if (f->o.model.kind != DT_MODEL_GPT2) {
        snprintf(err, (size_t)errlen, "--tp %d: tensor parallelism is built for --model gpt2 only (got %s)", T,
                 dt_model_kind_name(f->o.model.kind));
        return -1;
    }
    if (sp && f->o.seq % T) {
        snprintf(err, (size_t)errlen, "--sequence-parallel: --seq %lld is not divisible by --tp %d (each tensor-parallel "
                 "rank holds --seq / --tp positions)", (long long)f->o.seq, T);
        return -1;
    }
    if (P > 1 && f->nproc != INT_MIN && f->nproc % (P * T)) {   /* the mesh dp x pp x tp */
        snprintf(err, (size_t)errlen, "--tp %d x --pp %d = %d ranks per replica does not divide --nproc %d (ranks = "
                 "data-parallel replicas x --pp x --tp)", T, P, P * T, f->nproc);
        return -1;
    }
    if (f->nproc != INT_MIN && f->nproc % T) {
        snprintf(err, (size_t)errlen, "--tp %d does not divide --nproc %d (ranks = data-parallel replicas x --tp)", T, f->nproc);
        return -1;
    }
    f->dist.tp.ddp = f->dist.ddp;   /* DDP across the replicas (or ZeRO: f->dist.zero, cli/run.c) */
    f->dist.pipe.tp_size = T;       /* a pipeline of tensor-parallel stages */
    f->dist.pipe.sequence_parallel = sp;   /* their activations and sends: this rank's positions */
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
                f->dist.pipe.max_outstanding || f->dist.pipe.virtual_stages || f->pp_wire;
    const char *bad = piped ? "a pipeline (--pp and its flags)"
                    : f->dist.zero_stage == 3 ? "--zero 3 (its parameter gathers run in module hooks a rank without data does not run)"
                    : f->dp.sync_bn ? "--sync-bn (its collectives run inside forward and backward)" : NULL;
    if (bad) { snprintf(err, (size_t)errlen, "--uneven does not combine with %s", bad); return -1; }
    f->dp.join = 1;
    return 0;
}

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
    o->data = f->data ? f->data : dt_model_builtin_of(o->model.kind)->data;   /* the model's own */
    if (dt_dataset_check_name(o->data) != DT_OK) { dt_cli_flag_names(dt_error_message(), err, (size_t)errlen); return -1; }
    if (f->recompute && dt_recompute_parse(f->recompute, &o->recompute)) {
        snprintf(err, (size_t)errlen, "--recompute: unknown mode '%s' (none, blocks)", f->recompute);
        return -1;
    }
    if (f->precision) {
        if (!strcmp(f->precision, "fp32")) o->precision = DT_PREC_FP32;
        else if (!strcmp(f->precision, "bf16")) o->precision = DT_PREC_BF16;
        else if (!strcmp(f->precision, "fp16")) o->precision = DT_PREC_FP16;
        else {
            snprintf(err, (size_t)errlen, "--precision: '%s' is not one of fp32, bf16, fp16", f->precision);
            return -1;
        }
    }
    if (f->saved_acts) {
        if (!strcmp(f->saved_acts, "fp32")) o->saved_activations = DT_SAVED_FP32;
        else if (!strcmp(f->saved_acts, "bf16")) o->saved_activations = DT_SAVED_BF16;
        else if (!strcmp(f->saved_acts, "fp16")) o->saved_activations = DT_SAVED_FP16;
        else {
            snprintf(err, (size_t)errlen, "--saved-activations: '%s' is not one of fp32, bf16, fp16", f->saved_acts);
            return -1;
        }
    }
    if (f->param_dtype && name_flag("--param-dtype", f->param_dtype, CLI_NAMES(k_param_dtype), &o->param_dtype, err, errlen))
        return -1;
    if (f->loss_scale) {   /* dynamic | off | a fixed scale S (the same field as --loss-scale-init) */
        char *end;
        double v = strtod(f->loss_scale, &end);
        if (!strcmp(f->loss_scale, "dynamic")) o->loss_scale = DT_LOSS_SCALE_DYNAMIC;
        else if (!strcmp(f->loss_scale, "off")) o->loss_scale = DT_LOSS_SCALE_OFF;
        else if (*f->loss_scale && !*end && v >= (double)FLT_MIN && v <= (double)DT_LOSS_SCALE_MAX) {
            if (o->loss_scale_init > 0 || o->loss_scale_window > 0) {
                snprintf(err, (size_t)errlen, "%s applies to --loss-scale dynamic, not to a fixed scale",
                         o->loss_scale_init > 0 ? "--loss-scale-init" : "--loss-scale-window");
                return -1;
            }
            o->loss_scale = DT_LOSS_SCALE_FIXED;
            o->loss_scale_init = (float)v;
        } else {
            snprintf(err, (size_t)errlen, "--loss-scale: '%s' is not dynamic, off or a number from 1.2e-38 up to "
                     "2^64 (1.8e19)", f->loss_scale);
            return -1;
        }
    }
    if ((o->loss_scale_init > 0 || o->loss_scale_window > 0) && o->loss_scale != DT_LOSS_SCALE_FIXED &&
        !dt_train_loss_scaling(o)) {
        snprintf(err, (size_t)errlen, "%s needs loss scaling (--precision fp16, or --loss-scale dynamic)",
                 o->loss_scale_init > 0 ? "--loss-scale-init" : "--loss-scale-window");
        return -1;
    }
    o->freeze = f->freeze;
    if (param_groups(f, err, errlen)) return -1;
    if (f->nproc != INT_MIN && f->nproc < 1) {   /* (wherever the ranks go) */
        snprintf(err, (size_t)errlen, "--nproc must be >= 1 (got %d)", f->nproc);
        return -1;
    }
    /* on this machine: at most 8 x its cores (a host list or a Slurm allocation counts its own slots) */
    if (f->nproc != INT_MIN && !f->hosts && !f->hostfile && !(getenv("SLURM_JOB_ID") && getenv("SLURM_JOB_NODELIST")) &&
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
    if (z->node_params && !f->dist.zero_stage) {
        snprintf(err, (size_t)errlen, "--node-params applies to ZeRO (add --zero 1, 2 or 3)");
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
    if (tp_flags(f, err, errlen)) return -1;
    if (f->progress) {
        if (name_flag("--progress", f->progress, CLI_NAMES(k_progress), &v, err, errlen)) return -1;
        f->dist.progress = (dt_progress_mode)v;
    }
    return 0;
}

int dt_cli_train_flags(cli_flags *f, int argc, char **argv, char *err, int errlen) {
    memset(f, 0, sizeof *f);
    dt_train_opts_default(&f->o);
    dt_ddp_opts_default(&f->dist.ddp);
    dt_zero_opts_default(&f->dist.zero);
    dt_dp_opts_default(&f->dp);
    f->zero_prefetch = INT_MIN;
    f->nproc = INT_MIN;   /* not given */
    f->bucket_mb = f->first_bucket_mb = NAN;   /* not given: the strategy's defaults */
    f->microbatches = INT_MIN;   /* not given: --pp */
    f->dist.stall_warn = 60.0f;
    dt_pipe_opts_default(&f->dist.pipe);
    f->dist.pipe.virtual_stages = 0;   /* 0: not given (default by schedule) */
    f->dist.tp.size = 1;
    if (dt_cli_train_table(f, err, errlen)) return -1;
    int r = dt_args_parse(f->table, f->n_table, argc, argv, 2, f->given, err, errlen);
    if (r) return r;
    if (dt_cli_train_defaults(f, err, errlen) || finish_flags(f, err, errlen)) return -1;
    if (f->optim && strcmp(f->optim, "adamw") && strcmp(f->optim, "sgd")) {
        snprintf(err, (size_t)errlen, "--optim: unknown optimizer '%s' (adamw, sgd)", f->optim);
        return -1;
    }
    return 0;
}

/* --nproc / --hosts / --hostfile / Slurm: where the ranks go; then mpirun. */
static int launch(int argc, char **argv, const cli_flags *f) {
    char err[512];
    dt_cli_hosts h;
    if (dt_cli_hosts_parse(f->hosts, f->hostfile, &h, err, sizeof err)) {
        fprintf(stderr, "dtrain: %s\n", err);
        dt_cli_hosts_free(&h);   /* (what was parsed before the fault) */
        return 2;
    }
    int np = f->nproc != INT_MIN ? f->nproc : h.total > 0 ? h.total : 1;
    int rc = 0;
    if (h.total > 0 && (np < 1 || np > h.total)) {
        fprintf(stderr, "dtrain: --nproc %d: %s has %d slot%s\n", np, h.desc, h.total, h.total == 1 ? "" : "s");
        rc = 2;
    } else if (f->min_nproc > np) {
        fprintf(stderr, "dtrain: --min-nproc %d is more than the job's %d ranks\n", f->min_nproc, np);
        rc = 2;
    } else if (!f->print_launch && dt_cli_hosts_resolve(&h, err, sizeof err)) {
        fprintf(stderr, "dtrain: %s\n", err);
        rc = 2;
    } else {
        dt_cli_restart rs = {.max_restarts = f->max_restarts, .min_nproc = f->min_nproc, .save = f->o.save,
                             .stages = f->dist.pipe.stages, .tp = f->dist.tp.size, .accum = f->o.accum, .batch = f->o.batch,
                             .piped = f->dist.pipelined,
                             .microbatch_multiple = f->dist.pipe.schedule == DT_PIPE_INTERLEAVED ? f->dist.pipe.stages : 1,
                             .eval_batches = f->o.eval_batches, .metrics = f->o.metrics};
        rc = f->max_restarts > 0 && !f->print_launch
                 ? dt_cli_relaunch_restarting(argc, argv, np, f->o.threads, &h, &rs)
                 : dt_cli_relaunch(argc, argv, np, f->o.threads, &h, f->print_launch);
    }
    dt_cli_hosts_free(&h);
    return rc;
}

/* Flags of training alone: `dtrain eval` lists none of them and refuses each
 * one given (it trains nothing and writes no checkpoint; they were accepted
 * and ignored once, --save even creating its directory's lock). Evaluation
 * has no optimizer (--optim), draws no random numbers (--seed: the split is
 * read in order, dropout is off), keeps nothing for a backward
 * (--saved-activations), prints no progress lines (--log-every) and runs a
 * pipeline's batches forward in order (--max-outstanding). (--deterministic
 * stays: it orders the metric's sums and tensor parallelism's reductions.) */
static const char *const train_only[] = {
    "--steps", "--epochs", "--accum", "--recompute", "--optim", "--lr", "--min-lr", "--warmup", "--wd", "--momentum",
    "--nesterov", "--beta1", "--beta2", "--eps", "--freeze", "--unfreeze-at", "--no-decay", "--lr-scale", "--clip",
    "--optim-state", "--loss-scale", "--loss-scale-init", "--loss-scale-window", "--seed", "--saved-activations",
    "--save", "--save-every", "--save-sync", "--save-format", "--log-every", "--sample-every", "--sample-tokens",
    "--stop-after", "--max-restarts", "--min-nproc", "--bucket-mb", "--first-bucket-mb", "--find-unused",
    "--no-overlap", "--overlap-step", "--uneven", "--sync-bn", "--no-broadcast-buffers", "--max-outstanding"};

static int is_train_only(const char *flag) {
    for (size_t i = 0; i < sizeof train_only / sizeof *train_only; i++)
        if (!strcmp(flag, train_only[i])) return 1;
    return 0;
}

int dt_cli_train(int argc, char **argv, int eval_only) {
    static cli_flags f;   /* large (pattern buffers, the table); one per process */
    char err[512];
    int r = dt_cli_train_flags(&f, argc, argv, err, sizeof err);
    if (r == 1 && eval_only) {   /* eval's own flags only */
        int n = 0;
        for (int k = 0; k < f.n_table; k++)
            if (!is_train_only(f.table[k].name)) f.table[n++] = f.table[k];
        f.n_table = n;
    }
    if (r == 1) {
        dt_args_help(f.table, f.n_table, eval_only
            ? "usage: dtrain eval --init FILE|DIR [options]\n       dtrain eval --resume FILE|DIR [options]\n\nEvaluate a model (weights from --init or --resume: a file or a ZeRO / pipeline set) on the test/validation split\n(Fashion-MNIST: its test set; text and shards: --val-path, else the last 10% of --data-path, as training held out).\nA dtrain checkpoint names its model and settings: give no model flags (one that contradicts the file is refused);\nweights without them (Hugging Face) need --model and its flags."
            : "usage: dtrain train [options]\n       mpirun -np N dtrain train [options]\n\nTrain a model; prints a progress line per step and the test accuracy (images) or validation loss (text) at the end.",
            "data: fashion-mnist (IDX, gzip) | text (bytes of a file or a directory of files) | shard (llm.c .bin tokens)\n");
        return 0;
    }
    if (r < 0) { fprintf(stderr, "dtrain: %s\n", err); return 2; }
    for (int k = 0; eval_only && k < f.n_table; k++)
        if (f.given[k] && is_train_only(f.table[k].name)) {
            fprintf(stderr, "dtrain: %s applies to dtrain train: eval trains nothing and writes no checkpoint\n",
                    f.table[k].name);
            return 2;
        }
    /* inside a Slurm allocation (not in one of its srun steps) the default is all its tasks */
    int slurm = getenv("SLURM_JOB_ID") && getenv("SLURM_JOB_NODELIST") && !getenv("SLURM_STEP_ID") &&
                !getenv("SLURM_STEPID");
    int launching = f.hosts || f.hostfile || f.print_launch || (f.nproc != INT_MIN ? f.nproc > 1 : slurm);
    if (f.max_restarts) {
        const char *bad = f.max_restarts < 0 ? "must be >= 0"
                        : f.max_restarts > DT_CLI_MAX_RESTARTS ? "is more than 1000 (a job failing that often "
                                                                 "needs looking at, not restarting)"
                        : eval_only ? "applies to dtrain train"
                        : !f.o.save ? "needs --save PATH (each restart resumes from it)"
                        : f.o.uneven ? "does not combine with --uneven (which cannot resume)"
                        : !launching ? "needs a job dtrain launches (--nproc N > 1, --hosts, --hostfile or a Slurm allocation)"
                        : NULL;
        if (bad) { fprintf(stderr, "dtrain: --max-restarts %d %s\n", f.max_restarts, bad); return 2; }
    }
    if (f.min_nproc) {   /* elastic: continue on the machines that are left (restart.c) */
        const char *bad = f.min_nproc < 0 ? "must be >= 1"
                        : !f.max_restarts ? "needs --max-restarts K (it applies when the job restarts)"
                        : !f.hosts && !f.hostfile ? "needs a host list (--hosts or --hostfile): on one machine the "
                                                    "ranks restart where they were"
                        : NULL;
        if (bad) { fprintf(stderr, "dtrain: --min-nproc %d %s\n", f.min_nproc, bad); return 2; }
    }
    if (!dt_cli_under_mpi() && launching) return launch(argc, argv, &f);
    f.o.progress_file = getenv(DT_CLI_PROGRESS_ENV);   /* set by a restarting launcher */
    if (eval_only) {
        if (!f.o.init && !f.o.resume) { fprintf(stderr, "dtrain: eval needs --init FILE or --resume FILE\n"); return 2; }
        f.o.steps = 1;
        f.o.eval_only = 1;   /* a checkpoint past step 1 evaluates too */
    }
    return dt_cli_run(&f.o, &f.dist, eval_only);
}
