/* Defaults that depend on other flags, resolved after the one parse of argv:
 * the model's settings take --model's defaults (its registry entry, nn.h
 * section 4b) or, with --resume / --init of a dtrain checkpoint, the model
 * the file records (ckpt_model.c), the optimizer's take --optim's (optim.h:
 * lr and weight decay differ between adamw and sgd; --resume's file names it). A flag given keeps its value, wherever it
 * stands on the command line ("--lr 0.5 --optim sgd" trains at 0.5). */
#include <stdio.h>
#include <string.h>
#include "train_flags.h"

static int resolve_model(cli_flags *f, char *err, int errlen) {
    dt_model_kind kind = f->o.model.kind;   /* dt_train_opts_default's */
    if (f->model && dt_model_builtin_find(f->model, &kind) != DT_OK) {
        snprintf(err, (size_t)errlen, "--model: %s", dt_error_message());
        return -1;
    }
    if (dt_cli_ckpt_read(f, err, errlen)) return -1;   /* --resume / --init: the file's model */
    dt_model_cfg c = f->ckpt.builtin ? f->ckpt.cfg : dt_model_cfg_default(kind);
    dt_args_overlay(f->table, f->n_table, f->given, &f->model_flags, sizeof f->model_flags, &c);
    for (int j = 0; j < f->n_lists; j++)   /* a list given has at least one value */
        if (f->list_n[j] && dt_model_setting_set_ints(f->list_of[j], &c, f->lists[j], f->list_n[j]) != DT_OK) {
            dt_cli_flag_names(dt_error_message(), err, (size_t)errlen);   /* arch.channels: --channels */
            return -1;
        }
    if (dt_cli_ckpt_check(f, &c, err, errlen) || dt_cli_ckpt_seed(f, err, errlen)) return -1;
    f->o.model = c;
    /* --seq not given: 64, or less when the model's context is shorter */
    int max_seq = dt_model_cfg_max_seq(&c, NULL);
    if (!dt_cli_flag_given(f, "--seq") && max_seq > 0 && f->o.seq > max_seq) f->o.seq = max_seq;
    return 0;
}

/* an unknown --optim keeps the default optimizer here; dt_cli_train_flags
 * refuses it after the other flags' checks */
static int resolve_optim(cli_flags *f, char *err, int errlen) {
    dt_optim_kind kind = f->o.optim.kind;   /* dt_train_opts_default's */
    if (dt_cli_ckpt_optim(f, &kind, err, errlen)) return -1;   /* --resume: the file's */
    if (f->optim && !strcmp(f->optim, "sgd")) kind = DT_OPTIM_SGD;
    else if (f->optim && !strcmp(f->optim, "adamw")) kind = DT_OPTIM_ADAMW;
    dt_optim_cfg c = dt_optim_cfg_default(kind);
    dt_args_overlay(f->table, f->n_table, f->given, &f->optim_flags, sizeof f->optim_flags, &c);
    if (f->nesterov) c.nesterov = 1;
    if (f->optim_state && !strcmp(f->optim_state, "bf16")) c.state_dtype = DT_OPTIM_STATE_BF16;
    else if (f->optim_state && strcmp(f->optim_state, "fp32")) {
        snprintf(err, (size_t)errlen, "--optim-state: '%s' is not one of fp32, bf16", f->optim_state);
        return -1;
    }
    f->o.optim = c;
    return 0;
}

int dt_cli_train_defaults(cli_flags *f, char *err, int errlen) {
    return resolve_model(f, err, errlen) || resolve_optim(f, err, errlen) ? -1 : 0;
}
