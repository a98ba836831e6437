/* dt_op_linear_gelu is bitwise dt_op_gelu(dt_op_linear(...)): forward values
 * and the gradients of x, w and b compared with memcmp, for shapes with odd
 * and unit sizes, both weight layouts, with and without bias, on the one- and
 * multi-thread paths (both ways of summing db), under plain backward and the
 * split backward deferring w and b, w only or b only (then also equal to
 * plain backward; and B must leave the deferred gradients untouched).
 * Gradients start nonzero, so accumulation (+=) is compared too. Bad
 * arguments are errors naming the op and the culprit. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include "op_test_util.h"

typedef struct lg_case {
    int nd;              /* x's rank: leading dims lead[0..nd-1) then in */
    int64_t lead[2];
    int64_t in, out;
} lg_case;

static const lg_case cases[] = {
    {2, {1}, 1, 1},
    {2, {3}, 5, 7},
    {3, {2, 3}, 17, 33},
    {3, {2, 64}, 16, 48},
    {2, {67}, 19, 515},    /* 34505 outputs: OpenMP, several column blocks: one fused pass */
    {2, {1000}, 8, 50},    /* 50000 outputs in one column block: plain pass + colsum */
    {2, {1}, 300, 129},
};

enum { SPLIT_NONE, SPLIT_ALL, SPLIT_W, SPLIT_B, SPLITS };
static const char *const split_name[SPLITS] = {"plain", "split w+b", "split w", "split b"};

typedef struct run_out { float *y, *dx, *dw, *db; int64_t ny, nx, nw, nb; } run_out;

static void fill(float *v, int64_t n, uint64_t seed, float scale) {
    dt_rng r;
    dt_rng_seed(&r, seed);
    for (int64_t i = 0; i < n; i++) v[i] = scale * dt_rng_normal(&r);
    for (int64_t i = 5; i < n; i += 11) v[i] = i % 2 ? -0.0f : 0.0f;   /* signed zeros */
}

static float *dup(const float *v, int64_t n) {
    float *d = malloc((size_t)(n ? n : 1) * sizeof *d);
    memcpy(d, v, (size_t)n * sizeof *d);
    return d;
}

static int defer_which(const dt_param *p, void *user) {
    const dt_param *const *set = user;
    return p == set[0] || p == set[1];
}

static void run(const lg_case *c, dt_wlayout layout, int bias, int fused, int split, run_out *o) {
    int64_t xs[3] = {c->lead[0], c->lead[1], c->in};
    xs[c->nd - 1] = c->in;
    int64_t N = dt_shape_numel(c->nd - 1, xs);
    int64_t ws[2] = {layout == DT_W_OUT_IN ? c->out : c->in, layout == DT_W_OUT_IN ? c->in : c->out};
    float *xd = malloc((size_t)(N * c->in) * sizeof *xd), *dy = malloc((size_t)(N * c->out) * sizeof *dy);
    fill(xd, N * c->in, 1, 1.5f);
    fill(dy, N * c->out, 2, 1.0f);
    dt_param w, b;
    opt_param(&w, "w", 2, ws, 3, 0.5f);
    opt_param(&b, "b", 1, &c->out, 4, 1.0f);
    fill(dt_f32(&w.grad), w.grad.numel, 5, 0.1f);   /* gradients accumulate onto these */
    fill(dt_f32(&b.grad), b.grad.numel, 6, 0.1f);
    float *w0 = dup(dt_f32(&w.grad), w.grad.numel), *b0 = dup(dt_f32(&b.grad), b.grad.numel);

    dt_graph *g = dt_graph_create();
    dt_param *set[2] = {split == SPLIT_ALL || split == SPLIT_W ? &w : NULL,
                        split == SPLIT_ALL || split == SPLIT_B ? &b : NULL};
    if (split != SPLIT_NONE) dt_graph_defer_weights(g, defer_which, set);
    dt_tensor *x = dt_graph_input(g, c->nd, xs, xd, 1), *bt = bias ? &b.value : NULL;
    dt_tensor *y = fused ? dt_op_linear_gelu(g, x, &w.value, bt, layout)
                         : dt_op_gelu(g, dt_op_linear(g, x, &w.value, bt, layout));
    assert_non_null(y);
    assert_int_equal(y->ndim, c->nd);
    assert_int_equal(y->shape[c->nd - 1], c->out);
    assert_int_equal(dt_graph_backward_from(g, y, dy), DT_OK);
    if (split != SPLIT_NONE) {   /* B computed none of the deferred gradients */
        assert_int_equal(dt_graph_deferred_nodes(g) > 0, split != SPLIT_B || bias);   /* b unused: nothing */
        if (set[0]) assert_memory_equal(dt_f32(&w.grad), w0, (size_t)w.grad.numel * sizeof(float));
        if (set[1]) assert_memory_equal(dt_f32(&b.grad), b0, (size_t)b.grad.numel * sizeof(float));
        assert_int_equal(dt_graph_backward_weights(g), DT_OK);
    }
    o->ny = y->numel;
    o->nx = x->numel;
    o->nw = w.grad.numel;
    o->nb = b.grad.numel;
    o->y = dup(dt_f32(y), y->numel);
    const float *dx = dt_graph_grad(g, x);
    assert_non_null(dx);
    o->dx = dup(dx, x->numel);
    o->dw = dup(dt_f32(&w.grad), w.grad.numel);
    o->db = dup(dt_f32(&b.grad), b.grad.numel);
    if (!bias) assert_memory_equal(o->db, b0, (size_t)o->nb * sizeof(float));
    else assert_memory_not_equal(o->db, b0, (size_t)o->nb * sizeof(float));
    assert_memory_not_equal(o->dw, w0, (size_t)o->nw * sizeof(float));
    dt_graph_free(g);
    dt_param_free(&w);
    dt_param_free(&b);
    free(xd); free(dy); free(w0); free(b0);
}

static void free_out(run_out *o) { free(o->y); free(o->dx); free(o->dw); free(o->db); }

static void expect_same(const run_out *a, const run_out *b, const char *what) {
    if (memcmp(a->y, b->y, (size_t)a->ny * sizeof(float))) fail_msg("%s: y differs", what);
    if (memcmp(a->dx, b->dx, (size_t)a->nx * sizeof(float))) fail_msg("%s: dx differs", what);
    if (memcmp(a->dw, b->dw, (size_t)a->nw * sizeof(float))) fail_msg("%s: dw differs", what);
    if (memcmp(a->db, b->db, (size_t)a->nb * sizeof(float))) fail_msg("%s: db differs", what);
}

static void test_bitwise_unfused(void **state) {
    (void)state;
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
        for (int layout = 0; layout < 2; layout++)
            for (int bias = 0; bias < 2; bias++) {
                run_out plain;
                run(&cases[k], (dt_wlayout)layout, bias, 0, SPLIT_NONE, &plain);
                for (int split = 0; split < SPLITS; split++) {
                    run_out ref, got;
                    run(&cases[k], (dt_wlayout)layout, bias, 0, split, &ref);
                    run(&cases[k], (dt_wlayout)layout, bias, 1, split, &got);
                    char what[160];
                    snprintf(what, sizeof what, "case %zu (in %lld, out %lld) %s %s %s", k,
                             (long long)cases[k].in, (long long)cases[k].out, layout ? "in_out" : "out_in",
                             bias ? "bias" : "no bias", split_name[split]);
                    expect_same(&ref, &got, what);
                    expect_same(&plain, &got, what);   /* the split changes nothing either */
                    free_out(&ref);
                    free_out(&got);
                }
                free_out(&plain);
            }
}

/* With grad off (eval) the values are the chain's too. */
static void test_no_grad_values(void **state) {
    (void)state;
    int64_t xs[2] = {9, 13}, ws[2] = {13, 70};
    dt_param x, w, b;
    opt_param(&x, "x", 2, xs, 7, 2.0f);
    opt_param(&w, "w", 2, ws, 8, 0.5f);
    opt_param(&b, "b", 1, &ws[1], 9, 1.0f);
    dt_graph *g = dt_graph_create();
    dt_graph_set_grad_enabled(g, 0);
    dt_tensor *a = dt_op_linear_gelu(g, &x.value, &w.value, &b.value, DT_W_IN_OUT);
    dt_tensor *r = dt_op_gelu(g, dt_op_linear(g, &x.value, &w.value, &b.value, DT_W_IN_OUT));
    assert_non_null(a);
    assert_non_null(r);
    assert_null(a->grad_fn);
    assert_memory_equal(a->data, r->data, (size_t)a->numel * sizeof(float));
    dt_graph_free(g);
    dt_param_free(&x); dt_param_free(&w); dt_param_free(&b);
}

static void expect_error(const dt_tensor *r, const char *culprit) {
    opt_expect_error(r, "linear_gelu");
    if (!strstr(dt_error_message(), culprit)) fail_msg("message '%s' does not name '%s'", dt_error_message(), culprit);
}

static void test_bad_args(void **state) {
    (void)state;
    int64_t xs[2] = {3, 7}, ws[2] = {7, 5}, b4[1] = {4}, w3[3] = {7, 5, 1};
    dt_param x, w, b, w3d;
    opt_param(&x, "x", 2, xs, 1, 1.0f);
    opt_param(&w, "w", 2, ws, 2, 1.0f);
    opt_param(&b, "b", 1, b4, 3, 1.0f);
    opt_param(&w3d, "w3", 3, w3, 4, 1.0f);
    dt_graph *g = dt_graph_create();
    expect_error(dt_op_linear_gelu(g, &x.value, &w.value, &b.value, DT_W_IN_OUT), "b has shape [4]");
    expect_error(dt_op_linear_gelu(g, &x.value, &w.value, NULL, DT_W_OUT_IN), "x has shape [3, 7]");
    expect_error(dt_op_linear_gelu(g, &x.value, &w3d.value, NULL, DT_W_IN_OUT), "w must be 2-D");
    expect_error(dt_op_linear_gelu(g, NULL, &w.value, NULL, DT_W_IN_OUT), "x is NULL");
    expect_error(dt_op_linear_gelu(g, &x.value, &w.value, NULL, (dt_wlayout)7), "layout");
    expect_error(dt_op_linear_gelu(NULL, &x.value, &w.value, NULL, DT_W_IN_OUT), "graph");
    dt_graph_free(g);
    dt_param_free(&x); dt_param_free(&w); dt_param_free(&b); dt_param_free(&w3d);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bitwise_unfused),
        cmocka_unit_test(test_no_grad_values),
        cmocka_unit_test(test_bad_args),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
