/* dt_op_add_layernorm is bitwise dt_op_layernorm(dt_op_add(x, h)): the sum
 * s, the output y and the gradients of x, h, w and b compared with memcmp,
 * for shapes with odd and unit sizes (C = 1, 7, 16, 17, 515, 768; 2-D and
 * 3-D), on the one- and multi-thread paths, with and without b, with x == h,
 * when both s and y reach the loss (GPT-2: s feeds the next residual add),
 * only y, or only s; under plain backward and the split backward deferring
 * w and b or w only (then also equal to plain backward; B must leave the
 * deferred gradients untouched). Gradients of w, b start nonzero (+=).
 * Bad arguments are errors naming the op and the culprit. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include "op_test_util.h"

typedef struct aln_case { int nd; int64_t shape[3]; } aln_case;

static const aln_case cases[] = {
    {2, {1, 1}},
    {2, {3, 7}},
    {3, {2, 3, 17}},
    {2, {5, 16}},
    {2, {1, 768}},
    {3, {2, 20, 768}},   /* 30720 elements: one thread */
    {2, {67, 515}},      /* 34505: OpenMP, per-thread dw/db partials */
    {3, {3, 17, 768}},
};

enum { USE_BOTH, USE_Y, USE_S, USES };
static const char *const use_name[USES] = {"s and y used", "y used", "s used"};
enum { SPLIT_NONE, SPLIT_ALL, SPLIT_W, SPLITS };
static const char *const split_name[SPLITS] = {"plain", "split w+b", "split w"};

typedef struct variant { int fused, use, split, bias, alias; } variant;
typedef struct run_out { float *s, *y, *out, *dx, *dh, *dw, *db; int64_t n, C; } run_out;

static void fill(float *v, int64_t n, uint64_t seed, float scale, float shift) {
    dt_rng r;
    dt_rng_seed(&r, seed);
    for (int64_t i = 0; i < n; i++) v[i] = shift + scale * dt_rng_normal(&r);
    for (int64_t i = 5; i < n; i += 13) v[i] = i % 2 ? -0.0f : 0.0f;   /* signed zeros */
}

static float *dup(const float *v, int64_t n) {
    float *d = malloc((size_t)n * sizeof *d);
    memcpy(d, v, (size_t)n * sizeof *d);
    return d;
}

static int defer_which(const dt_param *p, void *user) {
    const dt_param *const *set = user;
    return p == set[0] || p == set[1];
}

static void run(const aln_case *c, const variant *v, run_out *o) {
    int64_t n = dt_shape_numel(c->nd, c->shape), C = c->shape[c->nd - 1];
    float *xd = malloc((size_t)n * sizeof *xd), *hd = malloc((size_t)n * sizeof *hd);
    float *dy = malloc((size_t)n * sizeof *dy);
    fill(xd, n, 1, 2.0f, 3.0f);   /* a mean far from 0 */
    fill(hd, n, 2, 1.0f, 0.0f);
    fill(dy, n, 3, 1.0f, 0.0f);
    dt_param w, b;
    opt_param(&w, "w", 1, &C, 4, 1.0f);
    opt_param(&b, "b", 1, &C, 5, 1.0f);
    fill(dt_f32(&w.grad), C, 6, 0.1f, 0.0f);
    fill(dt_f32(&b.grad), C, 7, 0.1f, 0.0f);
    float *w0 = dup(dt_f32(&w.grad), C), *b0 = dup(dt_f32(&b.grad), C);

    dt_graph *g = dt_graph_create();
    dt_param *set[2] = {v->split != SPLIT_NONE ? &w : NULL, v->split == SPLIT_ALL ? &b : NULL};
    if (v->split != SPLIT_NONE) dt_graph_defer_weights(g, defer_which, set);
    dt_tensor *x = dt_graph_input(g, c->nd, c->shape, xd, 1);
    dt_tensor *h = v->alias ? x : dt_graph_input(g, c->nd, c->shape, hd, 1);
    dt_tensor *bt = v->bias ? &b.value : NULL, *s = NULL, *y;
    if (v->fused) {
        y = dt_op_add_layernorm(g, x, h, &w.value, bt, 1e-5f, &s);
    } else {
        s = dt_op_add(g, x, h);
        y = dt_op_layernorm(g, s, &w.value, bt, 1e-5f);
    }
    assert_non_null(y);
    assert_non_null(s);
    opt_assert_shape(s, c->nd, c->shape);
    opt_assert_shape(y, c->nd, c->shape);
    dt_tensor *out = v->use == USE_BOTH ? dt_op_add(g, s, dt_op_gelu(g, y))   /* GPT-2: s -> next residual */
                   : v->use == USE_Y    ? dt_op_gelu(g, y)
                                        : dt_op_gelu(g, s);
    assert_non_null(out);
    assert_int_equal(dt_graph_backward_from(g, out, dy), DT_OK);
    int reached = v->use != USE_S;   /* w, b get gradients */
    if (v->split != SPLIT_NONE) {
        assert_int_equal(dt_graph_deferred_nodes(g), 1);
        assert_memory_equal(dt_f32(&w.grad), w0, (size_t)C * sizeof(float));
        if (v->split == SPLIT_ALL) assert_memory_equal(dt_f32(&b.grad), b0, (size_t)C * sizeof(float));
        assert_int_equal(dt_graph_backward_weights(g), DT_OK);
    }
    o->n = n;
    o->C = C;
    o->s = dup(dt_f32(s), n);
    o->y = dup(dt_f32(y), n);
    o->out = dup(dt_f32(out), n);
    o->dx = dup(dt_graph_grad(g, x), n);
    o->dh = dup(dt_graph_grad(g, h), n);
    o->dw = dup(dt_f32(&w.grad), C);
    o->db = dup(dt_f32(&b.grad), C);
    if (!reached) assert_memory_equal(o->dw, w0, (size_t)C * sizeof(float));
    else if (C > 1) assert_memory_not_equal(o->dw, w0, (size_t)C * sizeof(float));   /* C = 1: xhat = 0 */
    dt_graph_free(g);
    dt_param_free(&w);
    dt_param_free(&b);
    free(xd); free(hd); free(dy); free(w0); free(b0);
}

static void free_out(run_out *o) {
    free(o->s); free(o->y); free(o->out); free(o->dx); free(o->dh); free(o->dw); free(o->db);
}

static void expect_same(const run_out *a, const run_out *b, const char *what) {
    size_t n = (size_t)a->n * sizeof(float), C = (size_t)a->C * sizeof(float);
    if (memcmp(a->s, b->s, n)) fail_msg("%s: s differs", what);
    if (memcmp(a->y, b->y, n)) fail_msg("%s: y differs", what);
    if (memcmp(a->out, b->out, n)) fail_msg("%s: the loss's input differs", what);
    if (memcmp(a->dx, b->dx, n)) fail_msg("%s: dx differs", what);
    if (memcmp(a->dh, b->dh, n)) fail_msg("%s: dh differs", what);
    if (memcmp(a->dw, b->dw, C)) fail_msg("%s: dw differs", what);
    if (memcmp(a->db, b->db, C)) fail_msg("%s: db differs", what);
}

static void test_bitwise_unfused(void **state) {
    (void)state;
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
        for (int use = 0; use < USES; use++)
            for (int bias = 0; bias < 2; bias++)
                for (int alias = 0; alias < 2; alias++) {
                    run_out plain;
                    run(&cases[k], &(variant){0, use, SPLIT_NONE, bias, alias}, &plain);
                    for (int split = 0; split < SPLITS; split++) {
                        run_out ref, got;
                        run(&cases[k], &(variant){0, use, split, bias, alias}, &ref);
                        run(&cases[k], &(variant){1, use, split, bias, alias}, &got);
                        char what[160];
                        snprintf(what, sizeof what, "case %zu (C %lld) %s %s%s %s", k,
                                 (long long)cases[k].shape[cases[k].nd - 1], use_name[use],
                                 bias ? "bias" : "no bias", alias ? " x == h" : "", split_name[split]);
                        expect_same(&ref, &got, what);
                        expect_same(&plain, &got, what);
                        free_out(&ref);
                        free_out(&got);
                    }
                    free_out(&plain);
                }
}

/* With grad off (eval) the values are the chain's too, and nothing is recorded. */
static void test_no_grad_values(void **state) {
    (void)state;
    int64_t xs[2] = {9, 33};
    dt_param x, h, w, b;
    opt_param(&x, "x", 2, xs, 7, 2.0f);
    opt_param(&h, "h", 2, xs, 8, 2.0f);
    opt_param(&w, "w", 1, &xs[1], 9, 1.0f);
    opt_param(&b, "b", 1, &xs[1], 10, 1.0f);
    dt_graph *g = dt_graph_create();
    dt_graph_set_grad_enabled(g, 0);
    dt_tensor *s = NULL, *y = dt_op_add_layernorm(g, &x.value, &h.value, &w.value, &b.value, 1e-5f, &s);
    dt_tensor *rs = dt_op_add(g, &x.value, &h.value), *ry = dt_op_layernorm(g, rs, &w.value, &b.value, 1e-5f);
    assert_non_null(y);
    assert_non_null(ry);
    assert_null(y->grad_fn);
    assert_null(s->grad_fn);
    assert_memory_equal(s->data, rs->data, (size_t)s->numel * sizeof(float));
    assert_memory_equal(y->data, ry->data, (size_t)y->numel * sizeof(float));
    dt_graph_free(g);
    dt_param_free(&x); dt_param_free(&h); dt_param_free(&w); dt_param_free(&b);
}

static void expect_error(const dt_tensor *r, const char *culprit) {
    opt_expect_error(r, "add_layernorm");
    if (!strstr(dt_error_message(), culprit)) fail_msg("message '%s' does not name '%s'", dt_error_message(), culprit);
}

static void test_bad_args(void **state) {
    (void)state;
    int64_t xs[2] = {3, 7}, hs[2] = {3, 6}, c6[1] = {6}, c7[1] = {7};
    dt_param x, h6, w6, w7;
    opt_param(&x, "x", 2, xs, 1, 1.0f);
    opt_param(&h6, "h6", 2, hs, 2, 1.0f);
    opt_param(&w6, "w6", 1, c6, 3, 1.0f);
    opt_param(&w7, "w7", 1, c7, 4, 1.0f);
    dt_graph *g = dt_graph_create();
    dt_tensor *s = &x.value, *X = &x.value;
    expect_error(dt_op_add_layernorm(g, X, &h6.value, &w7.value, NULL, 1e-5f, &s), "h has shape [3, 6]");
    assert_null(s);   /* *sum cleared on error */
    expect_error(dt_op_add_layernorm(g, X, X, &w6.value, NULL, 1e-5f, &s), "w has shape [6]");
    expect_error(dt_op_add_layernorm(g, X, X, &w7.value, &w6.value, 1e-5f, &s), "b has shape [6]");
    expect_error(dt_op_add_layernorm(g, X, X, &w7.value, NULL, -1.0f, &s), "eps");
    expect_error(dt_op_add_layernorm(g, X, X, &w7.value, NULL, 1e-5f, NULL), "sum is NULL");
    expect_error(dt_op_add_layernorm(g, X, NULL, &w7.value, NULL, 1e-5f, &s), "h is NULL");
    expect_error(dt_op_add_layernorm(g, X, X, NULL, NULL, 1e-5f, &s), "w is NULL");
    expect_error(dt_op_add_layernorm(NULL, X, X, &w7.value, NULL, 1e-5f, &s), "graph");
    dt_graph_free(g);
    dt_param_free(&x); dt_param_free(&h6); dt_param_free(&w6); dt_param_free(&w7);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bitwise_unfused),
        cmocka_unit_test(test_no_grad_values),
        cmocka_unit_test(test_bad_args),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
