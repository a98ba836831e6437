/* The flag table of dtrain train / eval: --model and every settable setting
 * of a built-in model (from the model registry, nn.h section 4b: the library
 * names it "arch.max_t", the flag is --max-t), then the other flags. The same rows parse argv and print --help (args.h).
 * Flags whose defaults depend on another flag point into cli_flags' staging
 * copies (optim_flags, model_flags); train_defaults.c resolves them. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include "train_flags.h"

#define N_ARGS(t) ((int)(sizeof(t) / sizeof((t)[0])))

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

/* --model and every setting of a built-in with a meta (settable), from the
 * model registry: its flag is spelled from its name ("arch.max_t": --max-t;
 * a setting two models share is one row); -1 with err */
static int model_rows(cli_flags *f, dt_arg *t, int cap, char *err, int errlen) {
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
            if (!s->meta) continue;
            if (n == cap || (s->type == DT_SETTING_INTS && f->n_lists == N_ARGS(f->lists))) {
                snprintf(err, (size_t)errlen, "internal: more flags than the table's %d rows", cap);
                return -1;
            }
            char *flag = f->flag_names[n];   /* row n's, if it becomes one */
            if (dt_cli_model_flag(s->key, flag, sizeof f->flag_names[n])) {
                snprintf(err, (size_t)errlen, "internal: model %s's setting '%s' makes no flag", b->name, s->key);
                return -1;
            }
            if (has_row(t, n, flag)) continue;
            void *field = (char *)&f->model_flags + s->at;   /* laid over the chosen model's defaults */
            if (s->type == DT_SETTING_INTS) {
                int j = f->n_lists++;
                f->list_of[j] = s;
                t[n++] = (dt_arg){flag, DT_ARG_LIST, &f->list_n[j], s->meta, s->help, f->lists[j], s->n_max};
            } else {
                t[n++] = (dt_arg){flag, s->type == DT_SETTING_INT ? DT_ARG_INT : DT_ARG_FLOAT, field, s->meta, s->help, 0, 0};
            }
        }
    }
    return n;
}

int dt_cli_train_table(cli_flags *f, char *err, int errlen) {
    dt_train_opts *o = &f->o;
    dt_optim_cfg *opt = &f->optim_flags;   /* laid over the chosen optimizer's defaults */
    dt_arg *t = f->table;
    int cap = N_ARGS(f->table);
    int nm = model_rows(f, t, cap, err, errlen);
    if (nm < 0) return -1;
    f->n_model_rows = nm;
    dt_arg a[] = {
        {"--data", DT_ARG_STR, &f->data, "KIND", f->data_help, 0, 0},
        {"--data-path", DT_ARG_STR, &o->data_path, "PATH", "dataset dir/file; shard: a .bin file or a directory of them; a text directory: every file but *.dat and *.u8 (fortune indexes and twins); in a directory, links to files count, each file once, subdirectories not read (defaults: " DT_FASHION_MNIST_DIR ", " DT_FORTUNES_DIR ")", 0, 0},
        {"--val-path", DT_ARG_STR, &o->val_path, "PATH", "LM validation file or directory (default: the last 10% of the data); a file inside --data-path's directory is left out of training", 0, 0},
        {"--batch", DT_ARG_I64, &o->batch, "B", "batch size per rank and micro-step; with --pp per replica and step, split into --microbatches (default 64)", 0, 0},
        {"--seq", DT_ARG_I64, &o->seq, "T", "LM sequence length (default 64, at most the model's --max-t)", 0, 0},
        {"--steps", DT_ARG_I64, &o->steps, "N", "optimizer steps (overrides --epochs; 0: not given)", 0, 0},
        {"--epochs", DT_ARG_INT, &o->epochs, "N", "epochs when --steps is not given (default 1); an epoch is its whole steps (of --batch x --accum per rank), the samples left over are skipped, in every layout alike", 0, 0},
        {"--recompute", DT_ARG_STR, &f->recompute, "none|blocks", "activation recompute: blocks keeps only the input of every block but the last and re-runs its forward in backward (less memory, ~1/3 more compute; default none)", 0, 0},
        {"--accum", DT_ARG_INT, &o->accum, "K", "micro-steps per optimizer step (gradient accumulation, default 1)", 0, 0},
        {"--optim", DT_ARG_STR, &f->optim, "adamw|sgd", "optimizer (default adamw)", 0, 0},
        {"--lr", DT_ARG_FLOAT, &opt->lr, "LR", "learning rate (default 1e-3 adamw, 1e-2 sgd)", 0, 0},
        {"--min-lr", DT_ARG_FLOAT, &o->min_lr, "LR", "the learning rate the schedule decays to: either this or --warmup turns on linear warm-up (if any) then cosine decay from --lr to --min-lr over the run; neither: constant --lr (default 0)", 0, 0},
        {"--warmup", DT_ARG_I64, &o->warmup, "N", "linear warm-up steps, followed by cosine decay to --min-lr (default 0: no warm-up, and no decay unless --min-lr is given)", 0, 0},
        {"--wd", DT_ARG_FLOAT, &opt->weight_decay, "W", "weight decay, matrices only (default 0.01 adamw, 0 sgd)", 0, 0},
        {"--momentum", DT_ARG_FLOAT, &opt->momentum, "M", "SGD momentum (default 0)", 0, 0},
        {"--nesterov", DT_ARG_FLAG, &f->nesterov, NULL, "SGD Nesterov momentum", 0, 0},
        {"--beta1", DT_ARG_FLOAT, &opt->beta1, "B1", "AdamW beta1 (default 0.9)", 0, 0},
        {"--beta2", DT_ARG_FLOAT, &opt->beta2, "B2", "AdamW beta2 (default 0.999)", 0, 0},
        {"--eps", DT_ARG_FLOAT, &opt->eps, "E", "AdamW epsilon (default 1e-8)", 0, 0},
        {"--freeze", DT_ARG_STRS, &o->n_freeze, "PATTERN", "freeze the parameters whose names match a glob (repeatable; e.g. 'fc1.*'): "
         "not trained, their values kept exactly; a pattern matching none is an error", f->freeze, 64},
        {"--unfreeze-at", DT_ARG_I64, &o->unfreeze_at, "STEP", "the --freeze parameters train from this step on, with "
         "fresh optimizer state (DDP re-cuts buckets, ZeRO re-partitions; not with --pp; default 0: never)", 0, 0},
        {"--no-decay", DT_ARG_STRS, &f->n_no_decay, "PATTERN", "no weight decay for the parameters matching a glob (repeatable; "
         "e.g. '*.bias'). By default matrices decay, vectors (biases, norms) do not", f->no_decay, 64},
        {"--lr-scale", DT_ARG_STRS, &f->n_lr_scale, "PATTERN=F", "multiply the learning rate of the parameters matching a glob "
         "by F (repeatable, a later match wins; e.g. 'h.0.*=0.1')", f->lr_scale, 64},
        {"--clip", DT_ARG_FLOAT, &o->clip, "NORM", "clip the global gradient norm (default 0: off)", 0, 0},
        {"--seed", DT_ARG_U64, &o->seed, "S", "seed for init, shuffling, dropout (default 1; with --resume the checkpoint's)", 0, 0},
        {"--threads", DT_ARG_INT, &o->threads, "N", "OpenMP/OpenBLAS threads per rank (default: cores / ranks)", 0, 0},
        {"--precision", DT_ARG_STR, &f->precision, "P", "fp32 (default), bf16 or fp16: matrix products take 16-bit-rounded inputs with fp32 accumulation; LayerNorm, softmax, the loss and the optimizer compute in fp32 and the optimizer steps fp32 weights, which every other op reads too (a 16-bit working copy on request: --param-dtype); the activations backward reads are kept in 16 bits where the products run in 16 bits (--saved-activations). bf16 products only where that is faster (oneDNN on AMX; the start-up line says which runs); fp16 on every CPU, computed by the fp32 GEMM (fp16's numerics, fp32's speed: oneDNN 2.6 has no fp16 matmul on CPU), with dynamic loss scaling", 0, 0},
        {"--param-dtype", DT_ARG_STR, &f->param_dtype, "D", "fp32, bf16 or fp16: the weights forward and backward compute with -- every op, not only the products -- as a 16-bit working copy of the fp32 masters the optimizer steps and checkpoints hold (a 16-bit run resumes in fp32 and back); 1-D parameters (biases, LayerNorm's) stay fp32 in it. ZeRO gathers the copy in 16 bits (about half the bytes), and every layout computes with the same weights: DDP, ZeRO-1/2/3 and pipelines agree bit for bit. Costs a rounding pass per step; DDP and one process keep a full fp32-sized copy (+4 bytes per parameter), ZeRO-1/2 a master per owned element, ZeRO-3 nothing. fp16 stops, naming the parameter, at a weight beyond 65504. Default fp32, whatever --precision: the products round their own inputs, so the copy buys one process and DDP nothing (docs/PERFORMANCE.md); ask for it where ZeRO's gathers cross a slow link", 0, 0},
        {"--saved-activations", DT_ARG_STR, &f->saved_acts, "D", "fp32, bf16 or fp16: the activations each block's backward reads, kept in that type from forward to backward (about half of GPT-2's activation memory in 16 bits; not the CNN's, most of which is BatchNorm's input, kept exact for its gradients; the forward and the loss are unchanged, the gradients see the rounding). fp16 needs loss scaling (beyond 65504 an activation is kept as inf and the step must be skipped). Default: fp16 with --precision fp16 and loss scaling; bf16 with --precision bf16 where its products run in bf16 (AMX), else fp32 (there the packing, ~10% of a W1 step, is not won back by faster products); fp32 with fp32. Blocks under --recompute keep only their input", 0, 0},
        {"--optim-state", DT_ARG_STR, &f->optim_state, "fp32|bf16", "how the optimizer's per-element state (AdamW m and v, "
         "SGD momentum) is stored: fp32 (default) or bf16, half the optimizer memory (ZeRO shards it as before). "
         "Updates compute in fp32 and round to nearest even on every store; parameters stay fp32; checkpoints hold "
         "the state as fp32, so either resumes from either (a bf16 run rounds it on load)", 0, 0},
        {"--loss-scale", DT_ARG_STR, &f->loss_scale, "dynamic|off|S", "multiply the loss gradient by a scale and divide the gradients by it before clipping and the step; a step with an inf/nan gradient on any rank is skipped on every rank (counted in the metrics' \"skipped\"; it still counts toward --steps). dynamic (default with fp16; off otherwise): halve on overflow, double after --loss-scale-window clean steps; S: a fixed scale", 0, 0},
        {"--loss-scale-init", DT_ARG_FLOAT, &o->loss_scale_init, "S", "the dynamic loss scale's first value (default 65536); a run resumed from a checkpoint that recorded a scale continues from it, as a restart must (this flag then has no effect)", 0, 0},
        {"--loss-scale-window", DT_ARG_INT, &o->loss_scale_window, "N", "clean steps before the dynamic loss scale doubles (default 2000)", 0, 0},
        {"--keep-denormals", DT_ARG_FLAG, &o->keep_denormals, NULL,
         "IEEE denormals (default: flush to zero; denormal arithmetic is many times slower)", 0, 0},
        {"--init", DT_ARG_STR, &o->init, "FILE|DIR", "start from parameters in a safetensors file or checkpoint set (e.g. HF GPT-2); "
         "a dtrain checkpoint names the model: model flags are not needed, one that contradicts it is refused", 0, 0},
        {"--save", DT_ARG_STR, &o->save, "FILE", "write a checkpoint at the end (atomically; the path is checked writable at start-up)", 0, 0},
        {"--save-every", DT_ARG_I64, &o->save_every, "N", "also checkpoint every N steps (written in the background while training goes on)", 0, 0},
        {"--save-sync", DT_ARG_FLAG, &o->save_sync, NULL, "write every checkpoint before training goes on (no background writer)", 0, 0},
        {"--resume", DT_ARG_STR, &o->resume, "FILE|DIR", "continue from a checkpoint file or set (bit-for-bit; the model, its settings, --seed and --optim come from it: "
         "a flag that contradicts them is refused; so do --lr, --wd, --momentum, --nesterov, --beta1, --beta2 and --eps, "
         "which a flag given overrides; --steps must be at least its step)", 0, 0},
        {"--metrics", DT_ARG_STR, &o->metrics, "FILE", "append one JSON line per training step and one per evaluation (step, eval_loss, eval_accuracy; dtrain eval too); checked writable at start-up", 0, 0},
        {"--trace", DT_ARG_STR, &o->trace, "FILE", "write a Chrome/Perfetto trace (per rank: FILE.rankN)", 0, 0},
        {"--log-every", DT_ARG_I64, &o->log_every, "N", "progress line interval when not on a terminal (default 0: about 20 lines a run)", 0, 0},
        {"--eval-batches", DT_ARG_I64, &o->eval_batches, "N", "LM evaluation: the first N batches of --batch sequences of the validation split, the same sequences whatever --nproc, --pp or --microbatches (default: all)", 0, 0},
        {"--sample-every", DT_ARG_I64, &o->sample_every, "K", "GPT-2: every K steps print a sample from the model "
         "(--sample-tokens after the validation split's first 8 tokens; temperature 0.8, top-k 40; one process or DDP)", 0, 0},
        {"--sample-tokens", DT_ARG_INT, &o->sample_tokens, "N", "tokens per --sample-every sample (default and 0: 64)", 0, 0},
        {"--stop-after", DT_ARG_I64, &o->stop_after, "N", "stop after N steps without the final save (simulates a crash)", 0, 0},
        {"--quiet", DT_ARG_FLAG, &o->quiet, NULL, "no start-up or progress lines (the final evaluation's result, stops and errors still print)", 0, 0},
        {"--no-memory-check", DT_ARG_FLAG, &o->no_memory_check, NULL, "start even when the estimated memory per rank "
         "(parameters, gradients, optimizer state, activations) exceeds what the machine or the job's cgroup has free "
         "for its ranks (default: refused before allocating)", 0, 0},
        {"--max-restarts", DT_ARG_INT, &f->max_restarts, "K", "with --nproc / --hosts / --hostfile: when the job fails (a rank dies or hangs, a machine is lost), start it again from the newest complete checkpoint this job saved at --save, at most K times (default 0; at most 1000); not after a refusal of bad input or a failure of the launch itself", 0, 0},
        {"--min-nproc", DT_ARG_INT, &f->min_nproc, "M", "with --max-restarts and --hosts / --hostfile: before a restart the hosts are probed (DTRAIN_HOST_PROBE_TIMEOUT s, default 30); the job continues on those that answer, spare hosts first, down to M ranks, keeping the global batch (more --accum, or --microbatches with --pp). Default: the job's own --nproc (spare hosts only)", 0, 0},
        {"--nproc", DT_ARG_INT, &f->nproc, "N", "ranks: re-launches under mpirun, on this machine (1..8 x cores), on --hosts / --hostfile, or on the Slurm allocation dtrain runs in (default there: all its tasks)", 0, 0},
        {"--hosts", DT_ARG_STR, &f->hosts, "H:N,...", "machines and ranks per machine (e.g. node1:4,node2:4; reached by ssh; ranks fill one machine after another; --nproc defaults to the sum)", 0, 0},
        {"--hostfile", DT_ARG_STR, &f->hostfile, "FILE", "machines as an Open MPI hostfile (\"host slots=N\" per line)", 0, 0},
        {"--print-launch", DT_ARG_FLAG, &f->print_launch, NULL, "print the mpirun command (and the environment passed to every rank) that --nproc / --hosts would run, and exit", 0, 0},
        {"--bucket-mb", DT_ARG_FLOAT, &f->bucket_mb, "MB", "gradient bucket size, > 0 (default: DDP 1, ZeRO 4)", 0, 0},
        {"--first-bucket-mb", DT_ARG_FLOAT, &f->first_bucket_mb, "MB", "first (last layers') gradient bucket size (default 1)", 0, 0},
        {"--find-unused", DT_ARG_FLAG, &f->dp.find_unused_params, NULL, "DDP: parameters without gradient are reduced as zeros", 0, 0},
        {"--no-broadcast-buffers", DT_ARG_FLAG, &f->no_bcast, NULL, "DDP: do not broadcast rank 0's buffers before each forward", 0, 0},
        {"--sync-bn", DT_ARG_FLAG, &f->dp.sync_bn, NULL, "DDP or ZeRO: SyncBatchNorm (batch statistics over all ranks)", 0, 0},
        {"--uneven", DT_ARG_FLAG, &f->o.uneven, NULL, "each rank trains on its own part of the data, so ranks hold "
         "different numbers of batches: from a directory (--data text, or shard: *.bin files) rank r takes the files k "
         "with k mod ranks = r (name order); from one file and fashion-mnist a contiguous range in proportion to r + 1 "
         "(2 ranks: 1/3 and 2/3; 4 ranks: 1/10 .. 4/10). Each makes --epochs passes over its own part (at most --steps steps) and a rank whose data runs out joins (DDP, --zero 1 or 2) until all have: "
         "every rank ends at the largest step count. The loss is averaged over ranks while all train, then it is the "
         "reporting rank's own; the validation split is shared. Not with --pp, --zero 3, --sync-bn, --resume, "
         "--save-every, --stop-after; a stop signal after the first rank ran out is not agreed", 0, 0},
        {"--no-overlap", DT_ARG_FLAG, &f->dist.ddp.no_overlap, NULL, "DDP: reduce gradients only after backward", 0, 0},
        {"--deterministic", DT_ARG_FLAG, &f->dp.deterministic, NULL, "DDP: fixed rank-order summation (bitwise reproducible at any world size)", 0, 0},
        {"--no-shm", DT_ARG_FLAG, &f->no_shm, NULL, "DDP, ZeRO: MPI collectives even when all ranks share this machine (default: DDP without --compress keeps gradients in MPI shared memory, ZeRO-1/2 gathers through it)", 0, 0},
        {"--compress", DT_ARG_STR, &f->compress, "none|bf16|fp16", "DDP: gradient compression on the wire; ZeRO: gradients and gathered parameters on the wire, fp32 master shards (default none)", 0, 0},
        {"--progress", DT_ARG_STR, &f->progress, "poll|thread", "MPI progress engine (default: see dist.h)", 0, 0},
        {"--zero", DT_ARG_INT, &f->dist.zero_stage, "0|1|2|3", "ZeRO stage: shard optimizer state (1), + gradients (2), + parameters (3); 0 = DDP (default); with --pp: per stage, over the stage's replicas; with --tp: each tensor-parallel rank's part over its replicas (saves one file of whole tensors)", 0, 0},
        {"--overlap-step", DT_ARG_STR, &f->overlap_step, "MODE", "ZeRO: interleaved | after-backward (default) | off: when shards are stepped", 0, 0},
        {"--node-params", DT_ARG_FLAG, &f->dist.zero.node_params, NULL, "ZeRO: parameters once per machine in memory its ranks share; shards gathered into each machine once per step (stage 3 keeps them whole, as stage 2)", 0, 0},
        {"--zero-prefetch", DT_ARG_INT, &f->zero_prefetch, "N", "ZeRO-3: modules whose parameters are gathered ahead (default 2; 0 = none)", 0, 0},
        {"--pp", DT_ARG_INT, &f->dist.pipe.stages, "P", "pipeline stages: the model's blocks cut into P stages on P ranks (--nproc = P x data-parallel replicas; default 1)", 0, 0},
        {"--tp", DT_ARG_INT, &f->dist.tp.size, "T", "tensor parallelism (gpt2 only): attention split by heads and the MLP by columns over T consecutive ranks (--nproc = data-parallel replicas x --pp x T, tp innermost; heads and 4 x --embd divisible by T); wte, the tied lm-head and the cross-entropy split by vocabulary (V/T rows each, the logits never whole on a rank); wpe and LayerNorms whole on every rank; with --pp every stage is split T ways; with --zero S, ZeRO instead of DDP across the replicas; not with --uneven or --node-params (default 1)", 0, 0},
        {"--sequence-parallel", DT_ARG_FLAG, &f->dist.tp.sequence_parallel, NULL, "with --tp T > 1 (Megatron-LM's sequence parallelism): outside attention and the MLP (LayerNorms, dropout, residual adds, the embedding sum, ln_f) each tensor-parallel rank holds only --seq / T of the positions; an all-gather before the column-parallel layers and a reduce-scatter after the row-parallel ones replace the all-reduces (the same bytes), so those activations take 1/T of the memory per rank; wpe, LayerNorm and bias gradients are summed over the group after backward; same losses and dropout masks as one process; --seq divisible by T; with --pp the stages send each other these shards; with --zero S the sum runs on ZeRO's owned gradient shards (not with --overlap-step interleaved)", 0, 0},
        {"--microbatches", DT_ARG_INT, &f->microbatches, "M", "pipeline: --batch splits into M micro-batches streamed through the stages (default P)", 0, 0},
        {"--schedule", DT_ARG_STR, &f->schedule, "KIND", "pipeline schedule: gpipe | 1f1b | interleaved | zb-h1 (default 1f1b)", 0, 0},
        {"--virtual-stages", DT_ARG_INT, &f->dist.pipe.virtual_stages, "V", "interleaved: model chunks per rank (default 2)", 0, 0},
        {"--max-outstanding", DT_ARG_INT, &f->dist.pipe.max_outstanding, "N", "gpipe: micro-batches in flight per stage (default: all)", 0, 0},
        {"--pp-wire", DT_ARG_STR, &f->pp_wire, "fp32|bf16|fp16", "pipeline: what activations and their gradients travel between stages as; bf16 or fp16 halve the bytes on every pipeline link (rounded by the sender, computed in fp32 by the receiver), but the run then no longer equals one process bit for bit (it still equals itself under every schedule and replica count with the same cut: give --pp-split, as the default cut follows a timing probe); fp16 overflows to inf from 65520 and wants --precision fp16's loss scaling for small gradients; tied-parameter rows always travel as fp32, and the data-parallel reductions follow --compress. Default fp32", 0, 0},
        {"--pp-split", DT_ARG_LIST, &f->dist.pipe.n_split, "N,N,..", "pipeline: blocks per (virtual) stage (default: balanced by measured cost)", f->dist.pipe.split, DT_PIPE_MAX_VSTAGES},
        {"--stall-warn", DT_ARG_FLOAT, &f->dist.stall_warn, "S", "warn when a collective waits S seconds, naming it and the ranks not joined (default 60; 0 = off)", 0, 0},
        {"--collective-timeout", DT_ARG_FLOAT, &f->dist.collective_timeout, "S", "fail when a collective waits S seconds; the job ends 11-25 s later, after the time a peer that failed would take to report its own error, with one error line (default: off)", 0, 0},
        {"--debug-collectives", DT_ARG_FLAG, &f->dist.debug_collectives, NULL, "compare every collective across ranks before it runs; fail at the first divergence (slow)", 0, 0},
        {"--save-format", DT_ARG_STR, &f->save_format, "sharded|consolidated", "ZeRO checkpoints: a directory of per-rank shards (default) or one file (not with --pp: a pipeline saves shards)", 0, 0},
    };
    if (nm + N_ARGS(a) > cap) {
        snprintf(err, (size_t)errlen, "internal: more flags than the table's %d rows", cap);
        return -1;
    }
    for (int k = 0; k < N_ARGS(a); k++)
        if (has_row(t, nm, a[k].name)) {   /* a model setting must not take another flag's name */
            snprintf(err, (size_t)errlen, "internal: flag %s is both a model setting and an option", a[k].name);
            return -1;
        }
    memcpy(t + nm, a, sizeof a);
    f->n_table = nm + N_ARGS(a);
    return 0;
}
