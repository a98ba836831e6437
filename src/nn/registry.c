/* The model registry: the one place that knows which built-in models exist
 * (nn.h section 4b). Everything else reaches a built-in through its entry. */
#include <ctype.h>
#include <stdio.h>
#include <string.h>
#include "dtrain/nn.h"

/* The built-ins, in --help order. A new one: its file defines
 * `const dt_model_builtin dt_builtin_<name>`; add X(<name>) at the end. The
 * first three keep their kinds (DT_MODEL_MLP, _CNN, _GPT2): do not reorder. */
#define BUILTINS(X) X(mlp) X(cnn) X(gpt2)

#define DECLARE(n) extern const dt_model_builtin dt_builtin_##n;
BUILTINS(DECLARE)
#define ENTRY(n) &dt_builtin_##n,
static const dt_model_builtin *const k_builtins[] = {BUILTINS(ENTRY)};
#define N_BUILTINS ((int)(sizeof k_builtins / sizeof k_builtins[0]))

/* dt_model_register's entries follow the built-ins */
#define MAX_REGISTERED 16
static const dt_model_builtin *g_registered[MAX_REGISTERED];
static int g_n_registered;

int dt_model_builtin_count(void) { return N_BUILTINS + g_n_registered; }

/* entry i has kind i, skipping DT_MODEL_CUSTOM */
static dt_model_kind kind_of(int i) { return (dt_model_kind)(i < DT_MODEL_CUSTOM ? i : i + 1); }

const dt_model_builtin *dt_model_builtin_at(int i, dt_model_kind *kind) {
    if (i < 0 || i >= dt_model_builtin_count()) return NULL;
    if (kind) *kind = kind_of(i);
    return i < N_BUILTINS ? k_builtins[i] : g_registered[i - N_BUILTINS];
}

const dt_model_builtin *dt_model_builtin_of(dt_model_kind kind) {
    int k = (int)kind;
    return k == DT_MODEL_CUSTOM ? NULL : dt_model_builtin_at(k < DT_MODEL_CUSTOM ? k : k - 1, NULL);
}

static int find(const char *name) {
    for (int i = 0; name && i < dt_model_builtin_count(); i++)
        if (!strcmp(dt_model_builtin_at(i, NULL)->name, name)) return i;
    return -1;
}

const char *dt_model_builtin_names(char *buf, size_t n, const char *sep) {
    size_t k = 0;
    if (n) buf[0] = 0;
    for (int i = 0; i < dt_model_builtin_count() && k < n; i++) {
        int w = snprintf(buf + k, n - k, "%s%s", i ? sep : "", dt_model_builtin_at(i, NULL)->name);
        if (w < 0) break;
        k += (size_t)w;
    }
    return buf;
}

dt_status dt_model_builtin_find(const char *name, dt_model_kind *kind) {
    int i = find(name);
    if (i >= 0) {
        if (kind) *kind = kind_of(i);
        return DT_OK;
    }
    char known[256];
    return DT_ERR(DT_EINVAL, "unknown model '%s' (%s)", name ? name : "(none)",
                  dt_model_builtin_names(known, sizeof known, ", "));
}

int dt_model_kind_parse(const char *s, dt_model_kind *out) {
    int i = find(s);
    if (i < 0) return -1;
    *out = kind_of(i);
    return 0;
}

const char *dt_model_kind_name(dt_model_kind k) {
    const dt_model_builtin *b = dt_model_builtin_of(k);
    return b ? b->name : "custom";
}

/* ---- checking an entry ---- */

static size_t setting_bytes(const dt_model_setting *s) {
    return s->type == DT_SETTING_FLOAT ? sizeof(float) : s->type == DT_SETTING_INT ? sizeof(int)
                                                        : (size_t)s->n_max * sizeof(int);
}

/* "arch.<name>", name 1..DT_SETTING_NAME_MAX of a-z, 0-9, _ (so a front end
 * can spell it as it likes: the CLI's --max-t for arch.max_t) */
static int key_ok(const char *key) {
    if (!key || strncmp(key, "arch.", 5)) return 0;
    size_t n = strspn(key + 5, "abcdefghijklmnopqrstuvwxyz0123456789_");
    return n >= 1 && n <= DT_SETTING_NAME_MAX && !key[5 + n];
}

static dt_status check_setting(const dt_model_builtin *b, const dt_model_setting *s) {
    const char *f = s->key ? s->key : "(no key)";
    size_t cfg = sizeof(dt_model_cfg), first = sizeof(dt_model_kind);   /* c->kind is not a setting */
    if (!key_ok(s->key))
        return DT_ERR(DT_EINVAL, "model %s: setting '%s' must be named arch.<name>, name of 1..%d characters a-z, 0-9, _",
                      b->name, f, DT_SETTING_NAME_MAX);
    if ((unsigned)s->type > DT_SETTING_INTS) return DT_ERR(DT_EINVAL, "model %s: %s: unknown type %d", b->name, f, (int)s->type);
    if (s->type == DT_SETTING_INTS &&
        (s->n_min < 0 || s->n_max < 1 || s->n_min > s->n_max || s->n_max > DT_SETTING_INTS_MAX))
        return DT_ERR(DT_EINVAL, "model %s: %s: n_min %d, n_max %d (need 0 <= n_min <= n_max, 1 <= n_max <= %d)", b->name,
                      f, s->n_min, s->n_max, DT_SETTING_INTS_MAX);
    if (s->at < first || s->at > cfg || setting_bytes(s) > cfg - s->at || s->at % sizeof(int))
        return DT_ERR(DT_EINVAL, "model %s: %s: offset %zu is not a field of dt_model_cfg", b->name, f, s->at);
    if (s->type == DT_SETTING_INTS && s->count_at &&
        (s->count_at < first || s->count_at > cfg - sizeof(int) || s->count_at % sizeof(int)))
        return DT_ERR(DT_EINVAL, "model %s: %s: count offset %zu is not a field of dt_model_cfg", b->name, f, s->count_at);
    if (s->meta && !s->help)
        return DT_ERR(DT_EINVAL, "model %s: %s: a setting with a meta (settable) needs a help text", b->name, f);
    return DT_OK;
}

/* a setting another entry also has (one CLI flag) must set the same field */
static dt_status check_shared(const dt_model_builtin *b, const dt_model_setting *s) {
    for (int i = 0; i < dt_model_builtin_count(); i++) {
        const dt_model_builtin *o = dt_model_builtin_at(i, NULL);
        for (int k = 0; o != b && k < o->n_settings; k++) {
            const dt_model_setting *t = &o->settings[k];
            if (strcmp(t->key, s->key)) continue;
            if (t->type != s->type || t->at != s->at || t->count_at != s->count_at || t->n_max != s->n_max ||
                t->n_min != s->n_min || !t->meta != !s->meta)
                return DT_ERR(DT_EINVAL, "model %s: %s is also a setting of model %s, of another field or type",
                              b->name, s->key, o->name);
        }
    }
    return DT_OK;
}

dt_status dt_model_builtin_check(const dt_model_builtin *b) {
    if (!b) return DT_ERR(DT_EINVAL, "model registry: entry is NULL");
    if (!b->name || !*b->name || strlen(b->name) >= sizeof ((dt_model *)0)->name || !strcmp(b->name, "custom"))
        return DT_ERR(DT_EINVAL, "model registry: name '%s' must be 1..%zu characters, not 'custom'",
                      b->name ? b->name : "(null)", sizeof ((dt_model *)0)->name - 1);
    for (const char *c = b->name; *c; c++)   /* it is a --model value and one of a listed set: no separators */
        if (!isalnum((unsigned char)*c) && *c != '_' && *c != '-')
            return DT_ERR(DT_EINVAL, "model registry: name '%s' may hold letters, digits, '_' and '-' only", b->name);
    const char *hole = !b->data ? "data" : !b->defaults ? "defaults" : !b->validate ? "validate" : !b->build ? "build" : NULL;
    if (hole) return DT_ERR(DT_EINVAL, "model %s: the entry has no %s", b->name, hole);
    if (b->n_settings < 0 || b->n_settings > DT_ARCH_FIELDS_MAX || (b->n_settings && !b->settings))
        return DT_ERR(DT_EINVAL, "model %s: %d settings (0..%d, DT_ARCH_FIELDS_MAX)", b->name, b->n_settings,
                      DT_ARCH_FIELDS_MAX);
    int seq = !b->max_seq;
    for (int k = 0; k < b->n_settings; k++) {
        const dt_model_setting *s = &b->settings[k];
        DT_TRY(check_setting(b, s));
        DT_TRY(check_shared(b, s));
        for (int j = 0; j < k; j++)
            if (!strcmp(b->settings[j].key, s->key)) return DT_ERR(DT_EINVAL, "model %s: two settings named %s", b->name, s->key);
        seq |= !strcmp(s->key, b->max_seq ? b->max_seq : "") && s->type == DT_SETTING_INT;
    }
    if (!seq) return DT_ERR(DT_EINVAL, "model %s: max_seq '%s' is not one of its int settings", b->name, b->max_seq);
    dt_model_cfg c;
    memset(&c, 0, sizeof c);
    b->defaults(&c);
    if (b->validate(&c) != DT_OK) {
        char why[384];
        snprintf(why, sizeof why, "%s", dt_error_message());
        return DT_ERR(DT_EINVAL, "model %s: its defaults do not validate: %s", b->name, why);
    }
    return DT_OK;
}

dt_status dt_model_register(const dt_model_builtin *b, dt_model_kind *kind) {
    DT_TRY(dt_model_builtin_check(b));
    if (find(b->name) >= 0) return DT_ERR(DT_EINVAL, "model registry: a model '%s' is already registered", b->name);
    if (g_n_registered == MAX_REGISTERED)
        return DT_ERR(DT_EINVAL, "model registry: model %s is one too many (at most %d registered)", b->name, MAX_REGISTERED);
    g_registered[g_n_registered++] = b;
    if (kind) *kind = kind_of(dt_model_builtin_count() - 1);
    return DT_OK;
}
