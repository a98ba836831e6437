/* dtrain train / eval: argv is parsed once, through one table (args.h), into
 * cli_flags; the defaults that depend on other flags (the optimizer's, the
 * model's) are resolved after that parse, and a flag given keeps its value
 * whatever its place on the command line. */
#ifndef DT_CLI_TRAIN_FLAGS_H
#define DT_CLI_TRAIN_FLAGS_H
#include "args.h"
#include "cli.h"

#define DT_CLI_MAX_ROWS 128

typedef struct cli_flags {
    dt_train_opts o;     /* the result; o.optim and o.model are resolved by dt_cli_train_defaults */
    const char *model, *data, *optim;
    /* Flags whose defaults depend on another flag are parsed into a staging
     * copy; after the parse, the defaults of the optimizer and model chosen
     * are taken and each flag given is laid over them (dt_args_overlay). */
    dt_optim_cfg optim_flags;   /* --lr, --wd, --momentum, --beta1, --beta2, --eps */
    dt_model_cfg model_flags;   /* the built-ins' one-value settings (--layers, --fc, ...) */
    /* the built-in models' flags come from the model registry (nn.h section
     * 4b); list-valued ones are parsed here, then set through the registry */
    char model_meta[256], model_help[64], data_help[256];
    char flag_names[DT_CLI_MAX_ROWS][DT_SETTING_NAME_MAX + 3];   /* the model rows' ("--max-t") */
    int n_model_rows;           /* table rows 1 .. n_model_rows - 1: the built-ins' settings (0: --model) */
    int n_lists, list_n[16], lists[16][DT_SETTING_INTS_MAX];
    const dt_model_setting *list_of[16];
    int nproc;
    int max_restarts;               /* --max-restarts (launcher); 0: none */
    int min_nproc;                  /* --min-nproc (elastic restarts); 0: the job's own world */
    const char *hosts, *hostfile;   /* where --nproc ranks run (hosts.c) */
    int print_launch;
    int nesterov;
    dt_cli_dist dist;
    dt_dp_opts dp;       /* one set for DDP, ZeRO and a pipeline's replicas (parallel.h) */
    float bucket_mb, first_bucket_mb;
    const char *precision;          /* --precision fp32|bf16|fp16 */
    const char *saved_acts;         /* --saved-activations fp32|bf16|fp16 */
    const char *param_dtype;        /* --param-dtype fp32|bf16|fp16 */
    const char *optim_state;        /* --optim-state fp32|bf16 */
    const char *loss_scale;         /* --loss-scale dynamic|off|S */
    const char *compress, *progress, *overlap_step, *save_format, *recompute, *schedule, *pp_wire;
    int microbatches;
    int zero_prefetch;   /* INT_MIN: not given */
    int no_bcast;
    int no_shm;
    const char *freeze[64];
    const char *no_decay[64], *lr_scale[64];   /* --no-decay, --lr-scale (PATTERN=F) */
    int n_no_decay, n_lr_scale;
    char lr_pattern[64][256];                  /* --lr-scale's patterns, split off their =F */
    dt_optim_group groups[128];
    /* the table that parses and prints --help, and which of its rows were given */
    dt_arg table[DT_CLI_MAX_ROWS];
    unsigned char given[DT_CLI_MAX_ROWS];
    int n_table;
    dt_ckpt_model ckpt;  /* the model --resume / --init records (ckpt_model.c); .builtin 0: none */
} cli_flags;

/* cmd_train.c: argv[2..argc) into f (argv[1] is the command): 0, 1 when
 * --help was given (f->table then holds the rows to print), or -1 with one
 * line in err. */
int dt_cli_train_flags(cli_flags *f, int argc, char **argv, char *err, int errlen);
/* train_table.c: f->table: --model and every built-in's settings with a flag
 * (from the model registry), then the other flags; -1 with err when it does
 * not fit. */
int dt_cli_train_table(cli_flags *f, char *err, int errlen);
/* train_defaults.c: after the parse, --model's and --optim's defaults with the
 * flags given laid over them, into f->o.model and f->o.optim; -1 with err
 * (an unknown model, a list of the wrong length). */
int dt_cli_train_defaults(cli_flags *f, char *err, int errlen);
/* ckpt_model.c: the model and optimizer --resume / --init FILE records.
 * dt_cli_ckpt_read: into f->ckpt (nothing without either flag, with both,
 * or when the file cannot be read: the trainer reports that); -1 with err
 * when --model contradicts it.
 * dt_cli_ckpt_check: -1 with err naming the flag, its value and the file's
 * when a model flag given contradicts a setting the file records (c: the
 * file's model with the flags given laid over it).
 * dt_cli_ckpt_optim: --resume's optimizer into *kind when the file records
 * one; -1 with err when --optim names the other. */
int dt_cli_ckpt_read(cli_flags *f, char *err, int errlen);
int dt_cli_ckpt_check(const cli_flags *f, const dt_model_cfg *c, char *err, int errlen);
/* --resume: the file's train.seed unless --seed is given (then they must agree) */
int dt_cli_ckpt_seed(cli_flags *f, char *err, int errlen);
int dt_cli_ckpt_optim(const cli_flags *f, dt_optim_kind *kind, char *err, int errlen);
/* the row of flag ("--seq") was given on the command line */
int dt_cli_flag_given(const cli_flags *f, const char *flag);
#endif
