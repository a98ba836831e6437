/* Configurations of the built-in models, through their registry entries
 * (nn.h section 4b): defaults, validation, sizing from the data, creation,
 * FLOPs. */
#include <string.h>
#include "model_internal.h"

dt_model_cfg dt_model_cfg_default(dt_model_kind kind) {
    dt_model_cfg c;
    memset(&c, 0, sizeof c);
    /* every built-in's fields, then the kind's own again (a field two share) */
    for (int i = 0; i < dt_model_builtin_count(); i++) dt_model_builtin_at(i, NULL)->defaults(&c);
    const dt_model_builtin *b = dt_model_builtin_of(kind);
    if (b) b->defaults(&c);
    c.kind = kind;
    return c;
}

dt_status dt_model_cfg_validate(const dt_model_cfg *c) {
    const dt_model_builtin *b = dt_model_builtin_of(c->kind);
    if (b) return b->validate(c);
    char known[256];
    return DT_ERR(DT_EINVAL, "unknown model kind %d (the built-ins are %s)", (int)c->kind,
                  dt_model_builtin_names(known, sizeof known, ", "));
}

dt_status dt_model_cfg_fit(dt_model_cfg *c, const dt_sample_shape *s) {
    const dt_model_builtin *b = dt_model_builtin_of(c->kind);
    if (b && b->fit) b->fit(c, s);
    return dt_model_cfg_validate(c);
}

int dt_model_cfg_max_seq(const dt_model_cfg *c, const char **key) {
    const dt_model_builtin *b = dt_model_builtin_of(c->kind);
    for (int k = 0; b && b->max_seq && k < b->n_settings; k++) {
        const dt_model_setting *s = &b->settings[k];
        if (s->type != DT_SETTING_INT || strcmp(s->key, b->max_seq)) continue;
        if (key) *key = s->key;
        int v;
        memcpy(&v, (const char *)c + s->at, sizeof v);
        return v;
    }
    return 0;
}

dt_status dt_model_create(const dt_model_cfg *cfg, uint64_t seed, dt_model **out) {
    if (!cfg || !out) return DT_ERR(DT_EINVAL, "dt_model_create: %s is NULL", !cfg ? "cfg" : "out");
    *out = NULL;
    DT_TRY(dt_model_cfg_validate(cfg));
    const dt_model_builtin *b = dt_model_builtin_of(cfg->kind);
    dt_model *m;
    DT_TRY(dt_model_new(b->name, seed, &m));
    m->cfg = *cfg;
    dt_status s = b->build(m);
    if (s == DT_OK) s = dt_model_build(m);
    if (s != DT_OK) { dt_model_free(m); return s; }
    *out = m;
    return DT_OK;
}

double dt_model_flops_per_item(const dt_model *m, int64_t T) {
    const dt_model_builtin *b = dt_model_builtin_of(m->cfg.kind);
    return b && b->flops ? b->flops(m, T) : 6.0 * (double)m->n_elems;
}
