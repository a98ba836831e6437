/* A built-in's settings as text (nn.h section 4b): what checkpoints record
 * ("arch.layers" = "3"; messages name the setting by that key) and what the
 * ranks of a run compare. Formats are fixed: checkpoints written before
 * compare these strings byte for byte. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "model_internal.h"

static int get_int(const dt_model_cfg *c, size_t at) {
    int v;
    memcpy(&v, (const char *)c + at, sizeof v);
    return v;
}

static void format(const dt_model_setting *s, const dt_model_cfg *c, char *buf, size_t n) {
    if (s->type == DT_SETTING_INT) {
        snprintf(buf, n, "%d", get_int(c, s->at));
        return;
    }
    if (s->type == DT_SETTING_FLOAT) {
        float v;
        memcpy(&v, (const char *)c + s->at, sizeof v);
        snprintf(buf, n, "%.9g", (double)v);
        return;
    }
    int count = s->count_at ? get_int(c, s->count_at) : s->n_max;
    if (count > s->n_max) count = s->n_max;
    snprintf(buf, n, "%s", count > 0 || !s->none ? "" : s->none);
    size_t k = 0;
    for (int i = 0; i < count && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, "%s%d", i ? "," : "", get_int(c, s->at + (size_t)i * sizeof(int)));
}

/* the settings checkpoints record (arch), or all */
static int texts(const dt_model_cfg *c, dt_arch_field *out, int arch) {
    const dt_model_builtin *b = dt_model_builtin_of(c->kind);
    int n = 0;
    for (int k = 0; b && k < b->n_settings && n < DT_ARCH_FIELDS_MAX; k++) {
        const dt_model_setting *s = &b->settings[k];
        if (arch && s->unrecorded) continue;
        dt_arch_field *f = &out[n++];
        f->key = s->key;
        format(s, c, f->value, sizeof f->value);
    }
    return n;
}

int dt_model_arch_fields(const dt_model_cfg *c, dt_arch_field *out) { return texts(c, out, 1); }
int dt_model_settings(const dt_model_cfg *c, dt_arch_field *out) { return texts(c, out, 0); }

dt_status dt_model_setting_set_ints(const dt_model_setting *s, dt_model_cfg *c, const int *v, int n) {
    if (s->type != DT_SETTING_INTS) return DT_ERR(DT_EINVAL, "%s takes one value, not a list", s->key);
    if (n < s->n_min || n > s->n_max) {
        const char *meta = s->meta ? s->meta : "values";
        if (s->n_min == s->n_max) return DT_ERR(DT_EINVAL, "%s needs %d values (%s)", s->key, s->n_min, meta);
        return DT_ERR(DT_EINVAL, "%s takes %d to %d values (%s), got %d", s->key, s->n_min, s->n_max, meta, n);
    }
    if (s->count_at) memcpy((char *)c + s->count_at, &n, sizeof n);
    for (int i = 0; i < n; i++) memcpy((char *)c + s->at + (size_t)i * sizeof(int), &v[i], sizeof(int));
    return DT_OK;
}

/* one int of text at *p (advanced past it): 0, or -1 */
static int parse_int(const char **p, int *out) {
    char *end;
    errno = 0;
    long v = strtol(*p, &end, 10);
    if (end == *p || errno || v < INT_MIN || v > INT_MAX) return -1;
    *out = (int)v;
    *p = end;
    return 0;
}

dt_status dt_model_setting_parse(const dt_model_setting *s, dt_model_cfg *c, const char *text) {
    const char *p = text;
    if (s->type == DT_SETTING_INT) {
        int v;
        if (parse_int(&p, &v) || *p) return DT_ERR(DT_EINVAL, "%s: '%s' is not an integer", s->key, text);
        memcpy((char *)c + s->at, &v, sizeof v);
        return DT_OK;
    }
    if (s->type == DT_SETTING_FLOAT) {
        char *end;
        errno = 0;
        float v = strtof(text, &end);
        if (end == text || *end || errno || !isfinite(v)) return DT_ERR(DT_EINVAL, "%s: '%s' is not a number", s->key, text);
        memcpy((char *)c + s->at, &v, sizeof v);
        return DT_OK;
    }
    int v[DT_SETTING_INTS_MAX], n = 0;
    if (*text && !(s->none && !strcmp(text, s->none)))   /* "": no values (a list without `none`) */
        for (;;) {
            if (n == DT_SETTING_INTS_MAX || parse_int(&p, &v[n]))
                return DT_ERR(DT_EINVAL, "%s: '%s' is not a list of integers (N,N,..)", s->key, text);
            n++;
            if (!*p) break;
            if (*p++ != ',') return DT_ERR(DT_EINVAL, "%s: '%s' is not a list of integers (N,N,..)", s->key, text);
        }
    return dt_model_setting_set_ints(s, c, v, n);
}
