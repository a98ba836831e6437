/* --resume / --init FILE|DIR name the model: a dtrain checkpoint records its
 * built-in model and settings (arch.*) and its optimizer, so no model flag
 * needs repeating (train.h, dt_checkpoint_read_model). A flag given on top
 * that the file records must agree with it: one that contradicts it is
 * refused naming both values; a setting the file does not record (an older
 * checkpoint) is taken from its flag as before. A file that names no built-in
 * (Hugging Face weights) leaves every flag as it is. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "train_flags.h"

static int row_of(const cli_flags *f, const char *flag) {
    for (int k = 0; k < f->n_table; k++)
        if (!strcmp(f->table[k].name, flag)) return k;
    return -1;
}

int dt_cli_flag_given(const cli_flags *f, const char *flag) {
    int k = row_of(f, flag);
    return k >= 0 && f->given[k];
}

static const char *ckpt_path(const cli_flags *f) { return f->o.resume ? f->o.resume : f->o.init; }

int dt_cli_ckpt_read(cli_flags *f, char *err, int errlen) {
    memset(&f->ckpt, 0, sizeof f->ckpt);
    const char *path = ckpt_path(f);
    /* both: the library refuses the pair; a file that cannot be opened or
     * read: the trainer says why on every rank, as for any checkpoint error */
    if (!path || (f->o.resume && f->o.init)) return 0;
    dt_status s = dt_checkpoint_read_model(path, &f->ckpt);
    if (s != DT_OK) {
        memset(&f->ckpt, 0, sizeof f->ckpt);
        if (s == DT_EIO) return 0;
        /* a file that opens but whose record is bad (a setting that is not a
         * number, ...): said here, or the run is built from default flags and
         * refused for a model flag the user never gave */
        char msg[384];
        dt_cli_flag_names(dt_error_message(), msg, sizeof msg);
        snprintf(err, (size_t)errlen, "%s: %s", f->o.resume ? "--resume" : "--init", msg);
        return -1;
    }
    if (f->ckpt.builtin && f->model && strcmp(f->model, f->ckpt.name)) {
        snprintf(err, (size_t)errlen, "--model %s contradicts %s, a checkpoint of --model %s (leave --model out: "
                 "the model comes from the file)", f->model, path, f->ckpt.name);
        return -1;
    }
    return 0;
}

/* a setting's text for a message: floats as %g ("0.1", not "0.100000001") */
static void shown(const dt_model_setting *s, const char *text, char *buf, size_t n) {
    if (s->type == DT_SETTING_FLOAT) snprintf(buf, n, "%g", strtod(text, NULL));
    else snprintf(buf, n, "%s", text);
}

int dt_cli_ckpt_check(const cli_flags *f, const dt_model_cfg *c, char *err, int errlen) {
    if (!f->ckpt.builtin) return 0;
    const dt_model_builtin *b = dt_model_builtin_of(f->ckpt.kind);
    dt_arch_field mine[DT_ARCH_FIELDS_MAX];
    int nm = dt_model_settings(c, mine);
    for (int k = 0; k < b->n_settings; k++) {
        const dt_model_setting *s = &b->settings[k];
        char flag[DT_SETTING_NAME_MAX + 3];
        if (!s->meta || dt_cli_model_flag(s->key, flag, sizeof flag) || !dt_cli_flag_given(f, flag)) continue;
        const char *file = NULL, *have = NULL;
        for (int i = 0; i < f->ckpt.n_fields; i++)
            if (!strcmp(f->ckpt.fields[i].key, s->key)) file = f->ckpt.fields[i].value;
        for (int i = 0; i < nm; i++)
            if (!strcmp(mine[i].key, s->key)) have = mine[i].value;
        if (!file || !have || !strcmp(file, have)) continue;   /* not recorded: the flag's */
        char a[192], w[192];
        shown(s, have, a, sizeof a);
        shown(s, file, w, sizeof w);
        snprintf(err, (size_t)errlen, "%s %s contradicts %s, saved with %s %s (leave %s out: the model comes from the file)",
                 flag, a, ckpt_path(f), flag, w, flag);
        return -1;
    }
    return 0;
}

/* --resume continues the saved run bit for bit, so its data order and
 * dropout masks (train.seed) come from the file: --seed not given takes the
 * file's, one that contradicts it is refused. (--init starts a new run: its
 * --seed is free.) */
int dt_cli_ckpt_seed(cli_flags *f, char *err, int errlen) {
    if (!f->o.resume || !f->ckpt.has_seed) return 0;
    if (dt_cli_flag_given(f, "--seed") && f->o.seed != f->ckpt.seed) {
        snprintf(err, (size_t)errlen, "--seed %llu contradicts %s, saved with --seed %llu (leave --seed out: a resumed "
                 "run keeps its data order)", (unsigned long long)f->o.seed, f->o.resume,
                 (unsigned long long)f->ckpt.seed);
        return -1;
    }
    f->o.seed = f->ckpt.seed;
    return 0;
}

int dt_cli_ckpt_optim(const cli_flags *f, dt_optim_kind *kind, char *err, int errlen) {
    const char *file = f->o.resume ? f->ckpt.optimizer : "";   /* --init takes parameters only */
    dt_optim_kind k;
    if (!strcmp(file, "adamw")) k = DT_OPTIM_ADAMW;
    else if (!strcmp(file, "sgd")) k = DT_OPTIM_SGD;
    else return 0;   /* not recorded */
    if (f->optim && (!strcmp(f->optim, "adamw") || !strcmp(f->optim, "sgd")) && strcmp(f->optim, file)) {
        snprintf(err, (size_t)errlen, "--optim %s contradicts %s, saved with --optim %s (leave --optim out: it comes "
                 "from the checkpoint)", f->optim, f->o.resume, file);
        return -1;
    }
    *kind = k;
    return 0;
}
