/* Small helpers shared by the tests/unit/test_op_*.c files (header-only).
 * Include after <cmocka.h>. */
#ifndef DT_TEST_OP_TEST_UTIL_H
#define DT_TEST_OP_TEST_UTIL_H
#include <math.h>
#include <string.h>
#include "dtrain/ops.h"
#include "gradcheck.h"

/* dt_param with N(0, scale) values. */
static inline void opt_param(dt_param *p, const char *name, int ndim, const int64_t *shape,
                             uint64_t seed, float scale) {
    assert_int_equal(dt_param_init(p, name, ndim, shape), DT_OK);
    dt_gc_fill(p, seed, scale);
}

/* Max |a[i] - ref[i]| over n. */
static inline double opt_max_diff(const float *a, const double *ref, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) m = fmax(m, fabs((double)a[i] - ref[i]));
    return m;
}

/* The op returned NULL with DT_EINVAL and a message naming it. */
static inline void opt_expect_error(const dt_tensor *r, const char *op) {
    assert_null(r);
    assert_int_equal(dt_error_code(), DT_EINVAL);
    if (!strstr(dt_error_message(), op)) fail_msg("message '%s' does not name '%s'", dt_error_message(), op);
}

static inline void opt_assert_shape(const dt_tensor *t, int ndim, const int64_t *shape) {
    assert_non_null(t);
    assert_int_equal(t->ndim, ndim);
    for (int i = 0; i < ndim; i++) assert_int_equal(t->shape[i], shape[i]);
}

/* Run f under a grad-enabled graph, backward from sum(out * R) with R = 1
 * everywhere, leaving gradients in the params (not zeroed first). */
static inline void opt_backward_sum(dt_tensor *(*f)(dt_graph *, dt_param **, void *), void *ctx,
                                    dt_param **in) {
    dt_graph *g = dt_graph_create();
    dt_tensor *out = f(g, in, ctx);
    assert_non_null(out);
    dt_tensor *flat = dt_op_reshape(g, out, 1, (int64_t[]){out->numel});
    assert_non_null(flat);
    /* sum via linear with a ones vector [1, numel] (out_in layout) */
    int64_t os[2] = {1, out->numel};
    dt_tensor *ones = dt_graph_tensor(g, 2, os);
    for (int64_t i = 0; i < out->numel; i++) dt_f32(ones)[i] = 1.0f;
    dt_tensor *s = dt_op_linear(g, flat, ones, NULL, DT_W_OUT_IN);
    assert_non_null(s);
    dt_tensor *loss = dt_op_reshape(g, s, 0, NULL);
    assert_non_null(loss);
    assert_int_equal(dt_graph_backward(g, loss), DT_OK);
    dt_graph_free(g);
}

/* f(inputs) + f(inputs): every input is used twice, so gradients must
 * accumulate (+=) rather than overwrite. Use with dt_gradcheck. */
typedef struct opt_twice { dt_gc_fn f; void *ctx; } opt_twice;
static inline dt_tensor *opt_f_twice(dt_graph *g, dt_param **in, void *c) {
    opt_twice *t = c;
    dt_tensor *a = t->f(g, in, t->ctx), *b = t->f(g, in, t->ctx);
    return a && b ? dt_op_add(g, a, b) : NULL;
}
static inline int opt_gradcheck_twice(dt_gc_fn f, void *ctx, dt_param **in, int n_in) {
    opt_twice t = {f, ctx};
    dt_gc_opts o = {.seed = 99};
    return dt_gradcheck(opt_f_twice, &t, in, n_in, &o);
}

#endif
