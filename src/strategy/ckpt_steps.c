/* Checkpoint metadata "optim_steps": each parameter's own optimizer step
 * count where it differs from the optimizer's (strategy.h). Runs of equal
 * counts over consecutive parameters collapse into one "FIRST-LAST:STEPS"
 * entry, so a frozen block of a model costs one entry. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dtrain/strategy.h"

/* Segment of parameter i: *opt and *k, or 0 when no optimizer has one. */
static int find(const dt_model *m, int i, dt_optimizer *const *opts, int n, dt_optimizer **opt, int *k) {
    for (int j = 0; j < n; j++) {
        if (!opts[j]) continue;
        int s = dt_optimizer_find_segment(opts[j], m->offsets[i]);
        if (s >= 0 && opts[j]->segs[s].numel == (size_t)m->params[i]->value.numel) {
            *opt = opts[j];
            *k = s;
            return 1;
        }
    }
    return 0;
}

int64_t dt_checkpoint_param_steps(const dt_model *m, int i, dt_optimizer *const *opts, int n) {
    dt_optimizer *o;
    int k;
    return find(m, i, opts, n, &o, &k) ? dt_optimizer_segment_steps(o, k) : -1;
}

dt_status dt_checkpoint_state_missing(const char *what, const dt_model *m, int i, dt_optimizer *const *opts, int n,
                                      const char *state) {
    int64_t st = dt_checkpoint_param_steps(m, i, opts, n);
    if (st <= 0) return DT_OK;   /* saved frozen and never stepped, or frozen here */
    return DT_ERR(DT_EFORMAT, "%s: no optimizer state '%s' for parameter '%s', which took %lld steps", what, state,
                  m->params[i]->name, (long long)st);
}

/* -1: parameter i took every step; else its own count (0 without a segment:
 * frozen, so that unfreezing it after a resume starts it from step 0). */
static int64_t own_steps(const dt_model *m, int i, dt_optimizer *const *opts, int n) {
    dt_optimizer *o;
    int k;
    if (!find(m, i, opts, n, &o, &k)) return 0;
    int64_t s = dt_optimizer_segment_steps(o, k);
    return s == o->step ? -1 : s;
}

dt_status dt_checkpoint_meta_steps_list(dt_ckpt_meta *mb, const int64_t *own, int n, const char *what) {
    if (mb->n >= DT_CKPT_META_MAX) return DT_ERR(DT_EINVAL, "checkpoint metadata: more than %d keys", DT_CKPT_META_MAX);
    size_t len = 0, cap = sizeof mb->steps;
    mb->steps[0] = 0;
    for (int i = 0; i < n;) {
        int j = i + 1;
        while (j < n && own[j] == own[i]) j++;
        if (own[i] >= 0) {
            int w = snprintf(mb->steps + len, cap - len, "%s%d-%d:%lld", len ? "," : "", i, j - 1, (long long)own[i]);
            if (w < 0 || (size_t)w >= cap - len)
                return DT_ERR(DT_EINVAL, "checkpoint metadata: the per-parameter step counts of %s do not fit in %zu "
                              "bytes (parameters from index %d on)", what, cap, i);
            len += (size_t)w;
        }
        i = j;
    }
    mb->m[mb->n++] = (dt_st_meta){"optim_steps", mb->steps};
    return DT_OK;
}

dt_status dt_checkpoint_meta_steps(dt_ckpt_meta *mb, const dt_model *m, dt_optimizer *const *opts, int n) {
    int64_t *own = malloc((size_t)(m->n_params + 1) * sizeof *own);
    if (!own) return DT_ERR(DT_ENOMEM, "checkpoint metadata: out of memory");
    for (int i = 0; i < m->n_params; i++) own[i] = own_steps(m, i, opts, n);
    char what[160];
    snprintf(what, sizeof what, "model %s", m->name);
    dt_status s = dt_checkpoint_meta_steps_list(mb, own, m->n_params, what);
    free(own);
    return s;
}

/* One "FIRST-LAST:STEPS" entry at *p; advances *p past it and a comma. */
static int parse_run(const char **p, long *first, long *last, long long *steps) {
    char *e;
    errno = 0;
    *first = strtol(*p, &e, 10);
    if (e == *p || *e != '-') return -1;
    const char *q = e + 1;
    *last = strtol(q, &e, 10);
    if (e == q || *e != ':') return -1;
    q = e + 1;
    *steps = strtoll(q, &e, 10);
    if (e == q || errno || (*e && *e != ',')) return -1;
    *p = *e ? e + 1 : e;
    return 0;
}

dt_status dt_checkpoint_apply_steps_of(dt_ckpt_meta_get get, const void *src, const char *what, const dt_model *m,
                                       dt_optimizer *const *opts, int n, const int *local_of, int n_listed) {
    dt_optimizer *o;
    int k;
    for (int i = 0; i < m->n_params; i++)   /* unlisted: stepped every step */
        if (find(m, i, opts, n, &o, &k)) DT_TRY(dt_optimizer_set_segment_steps(o, k, o->step));
    const char *v = get(src, "optim_steps");
    if (!v) return DT_OK;
    for (const char *p = v; *p;) {
        long first, last;
        long long steps;
        if (parse_run(&p, &first, &last, &steps) || first < 0 || last < first || last >= n_listed || steps < 0)
            return DT_ERR(DT_EFORMAT, "%s: metadata 'optim_steps' = '%s' is malformed (expected FIRST-LAST:STEPS runs "
                          "of parameter indices below %d, STEPS >= 0)", what, v, n_listed);
        for (long g = first; g <= last; g++) {
            int i = local_of ? local_of[g] : (int)g;
            if (i < 0 || !find(m, i, opts, n, &o, &k)) continue;
            dt_status s = dt_optimizer_set_segment_steps(o, k, steps);
            if (s != DT_OK)
                return DT_ERR(DT_EFORMAT, "%s: metadata 'optim_steps': parameter '%s' took %lld steps, more than the "
                              "optimizer's %lld", what, m->params[i]->name, steps, (long long)o->step);
        }
    }
    return DT_OK;
}

dt_status dt_checkpoint_apply_steps(dt_ckpt_meta_get get, const void *src, const char *what, const dt_model *m,
                                    dt_optimizer *const *opts, int n) {
    return dt_checkpoint_apply_steps_of(get, src, what, m, opts, n, NULL, m->n_params);
}
