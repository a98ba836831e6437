/* The model a checkpoint records (train.h, dt_checkpoint_read_model): its
 * built-in's name and arch.* settings, read from the metadata of a file or a
 * sharded set's index, so a caller can build it again without describing it. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dtrain/train.h"

static dt_status read_model(const dt_ckpt *c, const char *path, dt_ckpt_model *out) {
    const char *name = dt_ckpt_get_meta(c, "model"), *opt = dt_ckpt_get_meta(c, "optimizer");
    if (opt) snprintf(out->optimizer, sizeof out->optimizer, "%s", opt);
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
