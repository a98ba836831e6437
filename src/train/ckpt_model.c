/* The model a checkpoint records (train.h, dt_checkpoint_read_model): its
 * built-in's name and arch.* settings, read from the metadata of a file or a
 * sharded set's index, so a caller can build it again without describing it. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dtrain/train.h"

/* "lr=0.05,weight_decay=0,momentum=0.9,nesterov=0" over kind's defaults
 * (a key this version does not know is left alone: a newer writer's) */
static dt_status read_optim(const char *v, const char *path, dt_optim_kind kind, dt_optim_cfg *out) {
    *out = dt_optim_cfg_default(kind);
    for (const char *p = v; *p;) {
        size_t kl = strcspn(p, "=,");
        if (p[kl] != '=')
            return DT_ERR(DT_EFORMAT, "checkpoint %s: metadata 'optimizer_settings' = '%s': '%.*s' has no value", path, v,
                          (int)kl, p);
        char *end;
        errno = 0;
        double x = strtod(p + kl + 1, &end);
        if (end == p + kl + 1 || (*end && *end != ',') || errno || !isfinite(x))
            return DT_ERR(DT_EFORMAT, "checkpoint %s: metadata 'optimizer_settings' = '%s': '%.*s' is not a number", path,
                          v, (int)kl, p);
        float f = (float)x;
        if (kl == 2 && !strncmp(p, "lr", 2)) out->lr = f;
        else if (kl == 12 && !strncmp(p, "weight_decay", 12)) out->weight_decay = f;
        else if (kl == 8 && !strncmp(p, "momentum", 8)) out->momentum = f;
        else if (kl == 8 && !strncmp(p, "nesterov", 8)) out->nesterov = x != 0;
        else if (kl == 5 && !strncmp(p, "beta1", 5)) out->beta1 = f;
        else if (kl == 5 && !strncmp(p, "beta2", 5)) out->beta2 = f;
        else if (kl == 3 && !strncmp(p, "eps", 3)) out->eps = f;
        p = *end ? end + 1 : end;
    }
    if (dt_optim_cfg_validate(out) != DT_OK) {
        char why[256];
        snprintf(why, sizeof why, "%s", dt_error_message());
        return DT_ERR(DT_EFORMAT, "checkpoint %s: metadata 'optimizer_settings' = '%s': %s", path, v, why);
    }
    return DT_OK;
}

static dt_status read_model(const dt_ckpt *c, const char *path, dt_ckpt_model *out) {
    const char *name = dt_ckpt_get_meta(c, "model"), *opt = dt_ckpt_get_meta(c, "optimizer");
    if (opt) snprintf(out->optimizer, sizeof out->optimizer, "%s", opt);
    const char *os = dt_ckpt_get_meta(c, "optimizer_settings");
    if (os && opt && (!strcmp(opt, "sgd") || !strcmp(opt, "adamw"))) {   /* (saved before it existed: none) */
        DT_TRY(read_optim(os, path, !strcmp(opt, "sgd") ? DT_OPTIM_SGD : DT_OPTIM_ADAMW, &out->optim));
        out->has_optim = 1;
    }
    const char *data = dt_ckpt_get_meta(c, "data");
    if (data) snprintf(out->data, sizeof out->data, "%s", data);
    const char *seed = dt_ckpt_get_meta(c, "seed");
    if (seed) {
        char *end;
        errno = 0;
        unsigned long long v = strtoull(seed, &end, 10);
        if (!*seed || *end || errno || *seed == '-')
            return DT_ERR(DT_EFORMAT, "checkpoint %s: metadata 'seed' = '%s' is not a whole number", path, seed);
        out->seed = v;
        out->has_seed = 1;
    }
    if (!name) return DT_OK;
    snprintf(out->name, sizeof out->name, "%s", name);
    if (dt_model_builtin_find(name, &out->kind) != DT_OK) return DT_OK;   /* a user's model */
    const dt_model_builtin *b = dt_model_builtin_of(out->kind);
    out->cfg = dt_model_cfg_default(out->kind);
    for (int k = 0; k < b->n_settings && out->n_fields < DT_ARCH_FIELDS_MAX; k++) {
        const dt_model_setting *s = &b->settings[k];
        const char *v = dt_ckpt_get_meta(c, s->key);
        if (!v) continue;   /* saved before the setting existed: its default */
        if (dt_model_setting_parse(s, &out->cfg, v) != DT_OK) {
            char why[256];
            snprintf(why, sizeof why, "%s", dt_error_message());
            return DT_ERR(DT_EFORMAT, "checkpoint %s: %s", path, why);
        }
        dt_arch_field *f = &out->fields[out->n_fields++];
        f->key = s->key;
        snprintf(f->value, sizeof f->value, "%s", v);
    }
    out->builtin = 1;
    return DT_OK;
}

dt_status dt_checkpoint_read_model(const char *path, dt_ckpt_model *out) {
    memset(out, 0, sizeof *out);
    dt_ckpt *c;
    DT_TRY(dt_ckpt_open(path, &c));
    dt_status s = read_model(c, path, out);
    dt_ckpt_close(c);
    if (s != DT_OK) memset(out, 0, sizeof *out);
    return s;
}
