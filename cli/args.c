#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "args.h"

static int parse_value(const dt_arg *a, const char *v, char *err, int errlen) {
    char *end = NULL;
    errno = 0;
    /* numbers start with a digit or a sign: strto* would skip leading blanks
     * (" -1" as an unsigned was 2^64 - 1) */
    if (a->type != DT_ARG_STR && a->type != DT_ARG_STRS && a->type != DT_ARG_FLAG && (isspace((unsigned char)*v)))
        goto bad;
    switch (a->type) {
    case DT_ARG_INT: {
        long x = strtol(v, &end, 10);
        if (*v == 0 || *end || errno || x < -2147483647L || x > 2147483647L) break;
        *(int *)a->dst = (int)x;
        return 0;
    }
    case DT_ARG_I64: {
        long long x = strtoll(v, &end, 10);
        if (*v == 0 || *end || errno) break;
        *(int64_t *)a->dst = x;
        return 0;
    }
    case DT_ARG_U64: {
        unsigned long long x = strtoull(v, &end, 10);
        if (*v == 0 || *end || errno || *v == '-') break;
        *(uint64_t *)a->dst = x;
        return 0;
    }
    case DT_ARG_FLOAT: {
        float x = strtof(v, &end);
        if (*v == 0 || *end || errno || !isfinite(x)) break;
        *(float *)a->dst = x;
        return 0;
    }
    case DT_ARG_STR:
        *(const char **)a->dst = v;
        return 0;
    case DT_ARG_LIST: {
        int n = 0;
        const char *p = v;
        while (*p) {
            long x = strtol(p, &end, 10);
            if (end == p || x <= 0 || x > 1 << 20 || isspace((unsigned char)*p)) goto bad;
            if (n >= a->list_cap) {
                snprintf(err, (size_t)errlen, "%s: at most %d values (got more in '%s')", a->name, a->list_cap, v);
                return -1;
            }
            ((int *)a->list)[n++] = (int)x;
            if (*end == ',' && end[1]) end++;   /* (a trailing comma is no list) */
            else if (*end) goto bad;
            p = end;
        }
        if (n == 0) goto bad;
        *(int *)a->dst = n;
        return 0;
    }
    case DT_ARG_STRS: {
        int *n = a->dst;
        if (*n >= a->list_cap) {
            snprintf(err, (size_t)errlen, "%s: at most %d times", a->name, a->list_cap);
            return -1;
        }
        if (!*v) goto bad;
        ((const char **)a->list)[(*n)++] = v;
        return 0;
    }
    case DT_ARG_FLAG:
        return 0;
    }
bad:
    snprintf(err, (size_t)errlen, "%s: invalid value '%s' (expected %s)", a->name, v, a->meta ? a->meta : "a value");
    return -1;
}

/* the table's row for s ("--flag" or "--flag=value"), or NULL */
static const dt_arg *find_arg(const dt_arg *table, int n, const char *s) {
    const char *eq = strchr(s, '=');
    size_t len = eq ? (size_t)(eq - s) : strlen(s);
    for (int k = 0; k < n; k++)
        if (strlen(table[k].name) == len && !strncmp(table[k].name, s, len)) return &table[k];
    return NULL;
}

int dt_args_parse(const dt_arg *table, int n, int argc, char **argv, int from, unsigned char *given, char *err,
                  int errlen) {
    if (given) memset(given, 0, (size_t)n);
    for (int i = from; i < argc; i++) {
        const char *s = argv[i];
        if (!strcmp(s, "--help") || !strcmp(s, "-h")) return 1;
        const char *eq = strchr(s, '=');
        const dt_arg *a = find_arg(table, n, s);
        if (!a) {
            snprintf(err, (size_t)errlen, "unknown option '%s' (see --help)", s);
            return -1;
        }
        if (given) given[a - table] = 1;
        if (a->type == DT_ARG_FLAG) {
            if (eq) { snprintf(err, (size_t)errlen, "%s takes no value", a->name); return -1; }
            *(int *)a->dst = 1;
            continue;
        }
        const char *v = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
        if (!v) { snprintf(err, (size_t)errlen, "%s needs a value (%s)", a->name, a->meta ? a->meta : "value"); return -1; }
        if (!eq && (find_arg(table, n, v) || !strcmp(v, "--help"))) {   /* "--save --quiet": a forgotten value */
            snprintf(err, (size_t)errlen, "%s needs a value (%s), not the flag %s (a value that starts with -- goes as "
                     "%s=VALUE)", a->name, a->meta ? a->meta : "value", v, a->name);
            return -1;
        }
        if (parse_value(a, v, err, errlen)) return -1;
    }
    return 0;
}

static size_t value_size(dt_arg_type t) {
    switch (t) {
    case DT_ARG_I64: return sizeof(int64_t);
    case DT_ARG_U64: return sizeof(uint64_t);
    case DT_ARG_FLOAT: return sizeof(float);
    case DT_ARG_STR: return sizeof(const char *);
    case DT_ARG_INT: case DT_ARG_FLAG: return sizeof(int);
    case DT_ARG_LIST: case DT_ARG_STRS: break;
    }
    return 0;
}

void dt_args_overlay(const dt_arg *table, int n, const unsigned char *given, const void *staged, size_t size, void *out) {
    uintptr_t lo = (uintptr_t)staged;
    for (int k = 0; k < n; k++) {
        uintptr_t at = (uintptr_t)table[k].dst;
        size_t bytes = value_size(table[k].type);
        if (!given[k] || !bytes || at < lo || at - lo > size || bytes > size - (at - lo)) continue;
        memcpy((char *)out + (at - lo), table[k].dst, bytes);
    }
}

void dt_args_help(const dt_arg *table, int n, const char *usage, const char *footer) {
    printf("%s\n\noptions:\n", usage);
    for (int k = 0; k < n; k++) {
        char lhs[64];
        snprintf(lhs, sizeof lhs, "%s%s%s", table[k].name, table[k].meta ? " " : "", table[k].meta ? table[k].meta : "");
        printf("  %-24s %s\n", lhs, table[k].help);
    }
    if (footer) printf("\n%s", footer);
}
