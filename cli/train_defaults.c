/* Defaults that depend on other flags, resolved after the one parse of argv:
 * the model's settings take --model's defaults (its registry entry, nn.h
 * section 4b) or, with --resume / --init of a dtrain checkpoint, the model
 * the file records (ckpt_model.c), the optimizer's take --optim's (optim.h:
 * lr and weight decay differ between adamw and sgd; --resume's file names it). A flag given keeps its value, wherever it
 * stands on the command line ("--lr 0.5 --optim sgd" trains at 0.5). */
#include <stdio.h>
#include <string.h>
#include "train_flags.h"

/* A model flag given must be a setting of the model that runs (--hidden
 * with --model gpt2 was accepted and did nothing); the error says whose it is. */
static int model_flags_apply(const cli_flags *f, dt_model_kind kind, char *err, int errlen) {
    const dt_model_builtin *run = dt_model_builtin_of(kind);
    char flag[DT_SETTING_NAME_MAX + 3];
    for (int r = 1; r < f->n_model_rows; r++) {
        if (!f->given[r]) continue;
        const char *name = f->table[r].name;
        int mine = 0;
        for (int k = 0; run && k < run->n_settings && !mine; k++)
            mine = run->settings[k].meta && !dt_cli_model_flag(run->settings[k].key, flag, sizeof flag) &&
                   !strcmp(flag, name);
        if (mine) continue;
        char whose[160] = "";
        for (int i = 0; i < dt_model_builtin_count(); i++) {
            const dt_model_builtin *b = dt_model_builtin_at(i, NULL);
            int has = 0;
            for (int k = 0; k < b->n_settings && !has; k++)
                has = b->settings[k].meta && !dt_cli_model_flag(b->settings[k].key, flag, sizeof flag) &&
                      !strcmp(flag, name);
            if (has) snprintf(whose + strlen(whose), sizeof whose - strlen(whose), "%s%s", whose[0] ? ", " : "", b->name);
        }
        snprintf(err, (size_t)errlen, "%s is not a setting of --model %s (it is %s's)", name, run ? run->name : "?", whose);
        return -1;
    }
    return 0;
}

static int resolve_model(cli_flags *f, char *err, int errlen) {
    dt_model_kind kind = f->o.model.kind;   /* dt_train_opts_default's */
    if (f->model && dt_model_builtin_find(f->model, &kind) != DT_OK) {
        snprintf(err, (size_t)errlen, "--model: %s", dt_error_message());
        return -1;
    }
    if (dt_cli_ckpt_read(f, err, errlen)) return -1;   /* --resume / --init: the file's model */
    if (f->ckpt.builtin) kind = f->ckpt.kind;
    if (model_flags_apply(f, kind, err, errlen)) return -1;
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
    /* another optimizer's setting would do nothing: refused (--momentum with adamw was accepted) */
    static const char *const sgd_only[] = {"--momentum", "--nesterov"}, *const adamw_only[] = {"--beta1", "--beta2", "--eps"};
    const char *const *other = kind == DT_OPTIM_SGD ? adamw_only : sgd_only;
    size_t n_other = kind == DT_OPTIM_SGD ? 3 : 2;
    for (size_t i = 0; i < n_other; i++)
        if (dt_cli_flag_given(f, other[i])) {
            snprintf(err, (size_t)errlen, "%s is %s's setting; this run's optimizer is %s (--optim)", other[i],
                     kind == DT_OPTIM_SGD ? "adamw" : "sgd", kind == DT_OPTIM_SGD ? "sgd" : "adamw");
            return -1;
        }
    /* --resume: the saved run's settings (its lr, momentum, betas, ...), then the flags given */
    dt_optim_cfg c = f->o.resume && f->ckpt.has_optim && f->ckpt.optim.kind == kind ? f->ckpt.optim
                                                                                     : dt_optim_cfg_default(kind);
    dt_args_overlay(f->table, f->n_table, f->given, &f->optim_flags, sizeof f->optim_flags, &c);
    if (f->nesterov) c.nesterov = 1;
    else if (c.momentum == 0) c.nesterov = 0;   /* a resumed Nesterov run given --momentum 0: plain SGD */
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
