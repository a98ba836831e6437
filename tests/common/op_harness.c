/* The op test harness (op_harness.h): runs each table entry as a cmocka test. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include "op_harness.h"

/* ---- helpers ---- */

void oph_param(dt_param *p, const char *name, int ndim, const int64_t *shape, uint64_t seed, float scale) {
    assert_int_equal(dt_param_init(p, name, ndim, shape), DT_OK);
    dt_gc_fill(p, seed, scale);
}

double oph_max_diff(const float *a, const float *b, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        m = isnan(d) ? INFINITY : fmax(m, d);
        if (isinf(m)) break;
    }
    return m;
}

void oph_assert_shape(const dt_tensor *t, int ndim, const int64_t *shape) {
    assert_non_null(t);
    assert_int_equal(t->ndim, ndim);
    for (int i = 0; i < ndim; i++) assert_int_equal(t->shape[i], shape[i]);
}

/* who: what the failure message starts with (the entry's name, or the op) */
static void expect_error(const char *who, const dt_tensor *r, const char *op, const char *needle) {
    if (r) fail_msg("%s: error: the op accepted the input (want DT_EINVAL)", who);
    if (dt_error_code() != DT_EINVAL)
        fail_msg("%s: error: code %d, want DT_EINVAL (message '%s')", who, (int)dt_error_code(), dt_error_message());
    if (!strstr(dt_error_message(), op))
        fail_msg("%s: error: message '%s' does not name '%s'", who, dt_error_message(), op);
    if (needle && !strstr(dt_error_message(), needle))
        fail_msg("%s: error: message '%s' does not contain '%s'", who, dt_error_message(), needle);
    dt_error_clear();
}

void oph_expect_error(const dt_tensor *r, const char *op, const char *needle) { expect_error(op, r, op, needle); }

static void wsum_backward(dt_graph *g, dt_node *n) {
    float *dx = dt_grad_of(g, n->in[0]);
    const float *R = n->saved;
    float dl = dt_f32(n->out->grad)[0];
    if (dx) for (int64_t i = 0; i < n->in[0]->numel; i++) dx[i] += dl * R[i];
}

dt_tensor *oph_wsum(dt_graph *g, dt_tensor *x, const float *R) {
    dt_tensor *out = dt_graph_tensor(g, 0, NULL);
    double s = 0;
    for (int64_t i = 0; i < x->numel; i++) s += (double)dt_f32(x)[i] * R[i];
    dt_f32(out)[0] = (float)s;
    dt_node *n = dt_graph_record(g, "wsum", wsum_backward, out, 1, &x);
    if (n) n->saved = (void *)R;
    return out;
}

void oph_backward_sum(dt_gc_fn f, void *ctx, dt_param **in) {
    dt_graph *g = dt_graph_create();
    dt_tensor *out = f(g, in, ctx);
    assert_non_null(out);
    float *ones = malloc((size_t)out->numel * sizeof *ones);
    for (int64_t i = 0; i < out->numel; i++) ones[i] = 1.0f;
    assert_int_equal(dt_graph_backward(g, oph_wsum(g, out, ones)), DT_OK);
    dt_graph_free(g);
    free(ones);
}

typedef struct twice_ctx { dt_gc_fn f; void *ctx; } twice_ctx;
static dt_tensor *f_twice(dt_graph *g, dt_param **in, void *c) {
    twice_ctx *t = c;
    dt_tensor *a = t->f(g, in, t->ctx), *b = t->f(g, in, t->ctx);
    return a && b ? dt_op_add(g, a, b) : NULL;
}

int oph_gradcheck_twice(dt_gc_fn f, void *ctx, dt_param **in, int n_in) {
    twice_ctx t = {f, ctx};
    dt_gc_opts o = {.seed = 99};
    return dt_gradcheck(f_twice, &t, in, n_in, &o);
}

void oph_fill(float *v, int64_t n, uint64_t seed, float scale, float shift, int zero_every) {
    dt_rng r;
    dt_rng_seed(&r, seed);
    for (int64_t i = 0; i < n; i++) v[i] = shift + scale * dt_rng_normal(&r);
    if (zero_every > 0)
        for (int64_t i = 5; i < n; i += zero_every) v[i] = i % 2 ? -0.0f : 0.0f;   /* signed zeros */
}

float *oph_dup(const float *v, int64_t n) {
    float *d = malloc((size_t)(n ? n : 1) * sizeof *d);
    assert_non_null(d);
    if (n) memcpy(d, v, (size_t)n * sizeof *d);
    return d;
}

int oph_defer_pair(const dt_param *p, void *user) {
    const dt_param *const *set = user;
    return p == set[0] || p == set[1];
}

void oph_expect_bits(const float *a, const float *b, int64_t n, const char *what, const char *which) {
    if (memcmp(a, b, (size_t)n * sizeof(float))) fail_msg("%s: %s differs", what, which);
}

/* ---- running an entry ---- */

static void make_inputs(const oph_entry *e, dt_param *store, dt_param **in) {
    for (int i = 0; i < e->n_in; i++) {
        const oph_input *s = &e->in[i];
        if (s->null) { in[i] = NULL; continue; }
        if (dt_param_init(&store[i], s->name, s->ndim, s->shape) != DT_OK)
            fail_msg("%s: setup: input %d (%s): %s", e->name, i, s->name, dt_error_message());
        dt_gc_fill(&store[i], s->seed, s->scale != 0 ? s->scale : 1.0f);
        if (s->frozen) store[i].requires_grad = store[i].value.requires_grad = 0;
        in[i] = &store[i];
    }
    if (e->prep) e->prep(in, e->ctx);
}

static void free_inputs(const oph_entry *e, dt_param **in) {
    for (int i = 0; i < e->n_in; i++)
        if (in[i]) dt_param_free(in[i]);
}

static void check_error(const oph_entry *e, dt_param **in) {
    dt_graph *g = dt_graph_create();
    dt_error_clear();
    expect_error(e->name, e->fn(g, in, e->ctx), e->op, e->error);
    dt_graph_free(g);
}

static void check_forward(const oph_entry *e, dt_param **in, int grad) {
    const char *mode = grad ? "grad on" : "grad off";
    dt_graph *g = dt_graph_create();
    dt_graph_set_grad_enabled(g, grad);
    dt_tensor *y = e->fn(g, in, e->ctx);
    if (!y) fail_msg("%s: forward (%s): the op failed: %s", e->name, mode, dt_error_message());
    if (e->out.set) {
        int ok = y->ndim == e->out.ndim;
        for (int d = 0; ok && d < y->ndim; d++) ok = y->shape[d] == e->out.dims[d];
        if (!ok) fail_msg("%s: forward (%s): output has %d dims [%lld, %lld, ...], want %d [%lld, %lld, ...]",
                          e->name, mode, y->ndim, (long long)y->shape[0], (long long)y->shape[1], e->out.ndim,
                          (long long)e->out.dims[0], (long long)e->out.dims[1]);
    }
    if (e->ref) {
        if (!e->out.set) fail_msg("%s: the entry has a reference but no .out shape", e->name);
        double *r = malloc((size_t)y->numel * sizeof *r);
        assert_non_null(r);
        e->ref(in, e->ctx, r);
        const float *yv = dt_f32(y);
        for (int64_t i = 0; i < y->numel; i++) {
            double d = fabs((double)yv[i] - r[i]);
            if (e->exact ? !(yv[i] == (float)r[i]) : !(d <= e->atol + e->rtol * fabs(r[i]))) {
                double yi = yv[i], ri = r[i];
                free(r);
                fail_msg("%s: values (%s): y[%lld] = %.9g, reference %.9g (|diff| %.3g; atol %g, rtol %g, exact %d)",
                         e->name, mode, (long long)i, yi, ri, d, e->atol, e->rtol, e->exact);
            }
        }
        free(r);
        if (e->check_values) e->check_values(e, in, y);
    }
    dt_graph_free(g);
}

static void run_entry(void **state) {
    const oph_entry *e = *state;
    dt_param store[OPH_MAX_IN];
    dt_param *in[OPH_MAX_IN] = {0};
    assert_true(e->n_in <= OPH_MAX_IN);
    make_inputs(e, store, in);
    if (e->error) {
        check_error(e, in);
    } else {
        for (int i = 0; i < e->n_in && (e->grad || e->twice); i++)
            if (!in[i]) fail_msg("%s: input %d is OPH_NULL in an entry with .grad or .twice", e->name, i);
        for (int grad = 1; grad >= 0; grad--) check_forward(e, in, grad);
        if (e->grad) {
            if (dt_gradcheck(e->fn, e->ctx, in, e->n_in, &e->gc))
                fail_msg("%s: gradcheck failed (see the element above)", e->name);
            if (e->check_grad) e->check_grad(e, in, NULL);
        }
        if (e->twice && oph_gradcheck_twice(e->fn, e->ctx, in, e->n_in))
            fail_msg("%s: twice (+= accumulation) gradcheck failed (see the element above)", e->name);
    }
    free_inputs(e, in);
}

int oph_run_group(const char *group, const oph_entry *table, size_t n, const struct CMUnitTest *extra,
                  size_t n_extra, CMFixtureFunction setup) {
    struct CMUnitTest *t = calloc(n + n_extra, sizeof *t);
    if (!t) return 1;
    for (size_t i = 0; i < n; i++) {
        t[i].name = table[i].name;
        t[i].test_func = run_entry;
        t[i].initial_state = (void *)(uintptr_t)&table[i];
    }
    for (size_t i = 0; i < n_extra; i++) t[n + i] = extra[i];
    int bad = _cmocka_run_group_tests(group, t, n + n_extra, setup, NULL);
    free(t);
    return bad;
}
