/* Fused ops are bitwise their unfused chains (tests/common/op_harness.h
 * helpers; their values against double references, gradchecks and bad
 * arguments are table entries in test_ops_layernorm.c / test_ops_linear.c).
 *
 * dt_op_add_layernorm is bitwise dt_op_layernorm(dt_op_add(x, h)): the sum
 * s, the output y and the gradients of x, h, w and b compared with memcmp,
 * for shapes with odd and unit sizes (C = 1, 7, 16, 17, 515, 768; 2-D and
 * 3-D), on the one- and multi-thread paths, with and without b, with x == h,
 * when both s and y reach the loss (GPT-2: s feeds the next residual add),
 * only y, or only s; under plain backward and the split backward deferring
 * w and b or w only (then also equal to plain backward; B must leave the
 * deferred gradients untouched). Gradients of w, b start nonzero (+=).
 *
 * dt_op_linear_gelu is bitwise dt_op_gelu(dt_op_linear(...)): forward values
 * and the gradients of x, w and b compared with memcmp, for shapes with odd
 * and unit sizes, both weight layouts, with and without bias, on the one- and
 * multi-thread paths (both ways of summing db), under plain backward and the
 * split backward deferring w and b, w only or b only (then also equal to
 * plain backward; and B must leave the deferred gradients untouched).
 * Gradients start nonzero, so accumulation (+=) is compared too.
 * With grad off (eval) both are their chains' values too. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include "op_harness.h"

/* ---- add_layernorm ---- */
typedef struct aln_case { int nd; int64_t shape[3]; } aln_case;

static const aln_case aln_cases[] = {
    {2, {1, 1}},
    {2, {3, 7}},
    {3, {2, 3, 17}},
    {2, {5, 16}},
    {2, {1, 768}},
    {3, {2, 20, 768}},   /* 30720 elements: one thread */
    {2, {67, 515}},      /* 34505: OpenMP, per-thread dw/db partials */
    {3, {3, 17, 768}},
};

enum { ALN_USE_BOTH, ALN_USE_Y, ALN_USE_S, ALN_USES };
static const char *const aln_use_name[ALN_USES] = {"s and y used", "y used", "s used"};
enum { ALN_SPLIT_NONE, ALN_SPLIT_ALL, ALN_SPLIT_W, ALN_SPLITS };
static const char *const aln_split_name[ALN_SPLITS] = {"plain", "split w+b", "split w"};

typedef struct aln_variant { int fused, use, split, bias, alias; } aln_variant;
typedef struct aln_out { float *s, *y, *out, *dx, *dh, *dw, *db; int64_t n, C; } aln_out;

static void aln_run(const aln_case *c, const aln_variant *v, aln_out *o) {
    int64_t n = dt_shape_numel(c->nd, c->shape), C = c->shape[c->nd - 1];
    float *xd = malloc((size_t)n * sizeof *xd), *hd = malloc((size_t)n * sizeof *hd);
    float *dy = malloc((size_t)n * sizeof *dy);
    oph_fill(xd, n, 1, 2.0f, 3.0f, 13);   /* a mean far from 0 */
    oph_fill(hd, n, 2, 1.0f, 0.0f, 13);
    oph_fill(dy, n, 3, 1.0f, 0.0f, 13);
    dt_param w, b;
    oph_param(&w, "w", 1, &C, 4, 1.0f);
    oph_param(&b, "b", 1, &C, 5, 1.0f);
    oph_fill(dt_f32(&w.grad), C, 6, 0.1f, 0.0f, 13);
    oph_fill(dt_f32(&b.grad), C, 7, 0.1f, 0.0f, 13);
    float *w0 = oph_dup(dt_f32(&w.grad), C), *b0 = oph_dup(dt_f32(&b.grad), C);

    dt_graph *g = dt_graph_create();
    dt_param *set[2] = {v->split != ALN_SPLIT_NONE ? &w : NULL, v->split == ALN_SPLIT_ALL ? &b : NULL};
    if (v->split != ALN_SPLIT_NONE) dt_graph_defer_weights(g, oph_defer_pair, set);
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
    oph_assert_shape(s, c->nd, c->shape);
    oph_assert_shape(y, c->nd, c->shape);
    dt_tensor *out = v->use == ALN_USE_BOTH ? dt_op_add(g, s, dt_op_gelu(g, y))   /* GPT-2: s -> next residual */
                   : v->use == ALN_USE_Y    ? dt_op_gelu(g, y)
                                        : dt_op_gelu(g, s);
    assert_non_null(out);
    assert_int_equal(dt_graph_backward_from(g, out, dy), DT_OK);
    int reached = v->use != ALN_USE_S;   /* w, b get gradients */
    if (v->split != ALN_SPLIT_NONE) {
        assert_int_equal(dt_graph_deferred_nodes(g), 1);
        assert_memory_equal(dt_f32(&w.grad), w0, (size_t)C * sizeof(float));
        if (v->split == ALN_SPLIT_ALL) assert_memory_equal(dt_f32(&b.grad), b0, (size_t)C * sizeof(float));
        assert_int_equal(dt_graph_backward_weights(g), DT_OK);
    }
    o->n = n;
    o->C = C;
    o->s = oph_dup(dt_f32(s), n);
    o->y = oph_dup(dt_f32(y), n);
    o->out = oph_dup(dt_f32(out), n);
    o->dx = oph_dup(dt_graph_grad(g, x), n);
    o->dh = oph_dup(dt_graph_grad(g, h), n);
    o->dw = oph_dup(dt_f32(&w.grad), C);
    o->db = oph_dup(dt_f32(&b.grad), C);
    if (!reached) assert_memory_equal(o->dw, w0, (size_t)C * sizeof(float));
    else if (C > 1) assert_memory_not_equal(o->dw, w0, (size_t)C * sizeof(float));   /* C = 1: xhat = 0 */
    dt_graph_free(g);
    dt_param_free(&w);
    dt_param_free(&b);
    free(xd); free(hd); free(dy); free(w0); free(b0);
}

static void aln_free_out(aln_out *o) {
    free(o->s); free(o->y); free(o->out); free(o->dx); free(o->dh); free(o->dw); free(o->db);
}

static void aln_expect_same(const aln_out *a, const aln_out *b, const char *what) {
    oph_expect_bits(a->s, b->s, a->n, what, "s");
    oph_expect_bits(a->y, b->y, a->n, what, "y");
    oph_expect_bits(a->out, b->out, a->n, what, "the loss's input");
    oph_expect_bits(a->dx, b->dx, a->n, what, "dx");
    oph_expect_bits(a->dh, b->dh, a->n, what, "dh");
    oph_expect_bits(a->dw, b->dw, a->C, what, "dw");
    oph_expect_bits(a->db, b->db, a->C, what, "db");
}

static void test_add_layernorm_bitwise_unfused(void **state) {
    (void)state;
    for (size_t k = 0; k < sizeof aln_cases / sizeof aln_cases[0]; k++)
        for (int use = 0; use < ALN_USES; use++)
            for (int bias = 0; bias < 2; bias++)
                for (int alias = 0; alias < 2; alias++) {
                    aln_out plain;
                    aln_run(&aln_cases[k], &(aln_variant){0, use, ALN_SPLIT_NONE, bias, alias}, &plain);
                    for (int split = 0; split < ALN_SPLITS; split++) {
                        aln_out ref, got;
                        aln_run(&aln_cases[k], &(aln_variant){0, use, split, bias, alias}, &ref);
                        aln_run(&aln_cases[k], &(aln_variant){1, use, split, bias, alias}, &got);
                        char what[160];
                        snprintf(what, sizeof what, "case %zu (C %lld) %s %s%s %s", k,
                                 (long long)aln_cases[k].shape[aln_cases[k].nd - 1], aln_use_name[use],
                                 bias ? "bias" : "no bias", alias ? " x == h" : "", aln_split_name[split]);
                        aln_expect_same(&ref, &got, what);
                        aln_expect_same(&plain, &got, what);
                        aln_free_out(&ref);
                        aln_free_out(&got);
                    }
                    aln_free_out(&plain);
                }
}

/* With grad off (eval) the values are the chain's too, and nothing is recorded. */
static void test_add_layernorm_no_grad_values(void **state) {
    (void)state;
    int64_t xs[2] = {9, 33};
    dt_param x, h, w, b;
    oph_param(&x, "x", 2, xs, 7, 2.0f);
    oph_param(&h, "h", 2, xs, 8, 2.0f);
    oph_param(&w, "w", 1, &xs[1], 9, 1.0f);
    oph_param(&b, "b", 1, &xs[1], 10, 1.0f);
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

/* ---- linear_gelu ---- */
typedef struct lg_case {
    int nd;              /* x's rank: leading dims lead[0..nd-1) then in */
    int64_t lead[2];
    int64_t in, out;
} lg_case;

static const lg_case lg_cases[] = {
    {2, {1}, 1, 1},
    {2, {3}, 5, 7},
    {3, {2, 3}, 17, 33},
    {3, {2, 64}, 16, 48},
    {2, {67}, 19, 515},    /* 34505 outputs: OpenMP, several column blocks: one fused pass */
    {2, {1000}, 8, 50},    /* 50000 outputs in one column block: plain pass + colsum */
    {2, {1}, 300, 129},
};

enum { LG_SPLIT_NONE, LG_SPLIT_ALL, LG_SPLIT_W, LG_SPLIT_B, LG_SPLITS };
static const char *const lg_split_name[LG_SPLITS] = {"plain", "split w+b", "split w", "split b"};

typedef struct lg_out { float *y, *dx, *dw, *db; int64_t ny, nx, nw, nb; } lg_out;

static void lg_run(const lg_case *c, dt_wlayout layout, int bias, int fused, int split, lg_out *o) {
    int64_t xs[3] = {c->lead[0], c->lead[1], c->in};
    xs[c->nd - 1] = c->in;
    int64_t N = dt_shape_numel(c->nd - 1, xs);
    int64_t ws[2] = {layout == DT_W_OUT_IN ? c->out : c->in, layout == DT_W_OUT_IN ? c->in : c->out};
    float *xd = malloc((size_t)(N * c->in) * sizeof *xd), *dy = malloc((size_t)(N * c->out) * sizeof *dy);
    oph_fill(xd, N * c->in, 1, 1.5f, 0.0f, 11);
    oph_fill(dy, N * c->out, 2, 1.0f, 0.0f, 11);
    dt_param w, b;
    oph_param(&w, "w", 2, ws, 3, 0.5f);
    oph_param(&b, "b", 1, &c->out, 4, 1.0f);
    oph_fill(dt_f32(&w.grad), w.grad.numel, 5, 0.1f, 0.0f, 11);   /* gradients accumulate onto these */
    oph_fill(dt_f32(&b.grad), b.grad.numel, 6, 0.1f, 0.0f, 11);
    float *w0 = oph_dup(dt_f32(&w.grad), w.grad.numel), *b0 = oph_dup(dt_f32(&b.grad), b.grad.numel);

    dt_graph *g = dt_graph_create();
    dt_param *set[2] = {split == LG_SPLIT_ALL || split == LG_SPLIT_W ? &w : NULL,
                        split == LG_SPLIT_ALL || split == LG_SPLIT_B ? &b : NULL};
    if (split != LG_SPLIT_NONE) dt_graph_defer_weights(g, oph_defer_pair, set);
    dt_tensor *x = dt_graph_input(g, c->nd, xs, xd, 1), *bt = bias ? &b.value : NULL;
    dt_tensor *y = fused ? dt_op_linear_gelu(g, x, &w.value, bt, layout)
                         : dt_op_gelu(g, dt_op_linear(g, x, &w.value, bt, layout));
    assert_non_null(y);
    assert_int_equal(y->ndim, c->nd);
    assert_int_equal(y->shape[c->nd - 1], c->out);
    assert_int_equal(dt_graph_backward_from(g, y, dy), DT_OK);
    if (split != LG_SPLIT_NONE) {   /* B computed none of the deferred gradients */
        assert_int_equal(dt_graph_deferred_nodes(g) > 0, split != LG_SPLIT_B || bias);   /* b unused: nothing */
        if (set[0]) assert_memory_equal(dt_f32(&w.grad), w0, (size_t)w.grad.numel * sizeof(float));
        if (set[1]) assert_memory_equal(dt_f32(&b.grad), b0, (size_t)b.grad.numel * sizeof(float));
        assert_int_equal(dt_graph_backward_weights(g), DT_OK);
    }
    o->ny = y->numel;
    o->nx = x->numel;
    o->nw = w.grad.numel;
    o->nb = b.grad.numel;
    o->y = oph_dup(dt_f32(y), y->numel);
    const float *dx = dt_graph_grad(g, x);
    assert_non_null(dx);
    o->dx = oph_dup(dx, x->numel);
    o->dw = oph_dup(dt_f32(&w.grad), w.grad.numel);
    o->db = oph_dup(dt_f32(&b.grad), b.grad.numel);
    if (!bias) assert_memory_equal(o->db, b0, (size_t)o->nb * sizeof(float));
    else assert_memory_not_equal(o->db, b0, (size_t)o->nb * sizeof(float));
    assert_memory_not_equal(o->dw, w0, (size_t)o->nw * sizeof(float));
    dt_graph_free(g);
    dt_param_free(&w);
    dt_param_free(&b);
    free(xd); free(dy); free(w0); free(b0);
}

static void lg_free_out(lg_out *o) { free(o->y); free(o->dx); free(o->dw); free(o->db); }

static void lg_expect_same(const lg_out *a, const lg_out *b, const char *what) {
    oph_expect_bits(a->y, b->y, a->ny, what, "y");
    oph_expect_bits(a->dx, b->dx, a->nx, what, "dx");
    oph_expect_bits(a->dw, b->dw, a->nw, what, "dw");
    oph_expect_bits(a->db, b->db, a->nb, what, "db");
}

static void test_linear_gelu_bitwise_unfused(void **state) {
    (void)state;
    for (size_t k = 0; k < sizeof lg_cases / sizeof lg_cases[0]; k++)
        for (int layout = 0; layout < 2; layout++)
            for (int bias = 0; bias < 2; bias++) {
                lg_out plain;
                lg_run(&lg_cases[k], (dt_wlayout)layout, bias, 0, LG_SPLIT_NONE, &plain);
                for (int split = 0; split < LG_SPLITS; split++) {
                    lg_out ref, got;
                    lg_run(&lg_cases[k], (dt_wlayout)layout, bias, 0, split, &ref);
                    lg_run(&lg_cases[k], (dt_wlayout)layout, bias, 1, split, &got);
                    char what[160];
                    snprintf(what, sizeof what, "case %zu (in %lld, out %lld) %s %s %s", k,
                             (long long)lg_cases[k].in, (long long)lg_cases[k].out, layout ? "in_out" : "out_in",
                             bias ? "bias" : "no bias", lg_split_name[split]);
                    lg_expect_same(&ref, &got, what);
                    lg_expect_same(&plain, &got, what);   /* the split changes nothing either */
                    lg_free_out(&ref);
                    lg_free_out(&got);
                }
                lg_free_out(&plain);
            }
}

/* With grad off (eval) the values are the chain's too. */
static void test_linear_gelu_no_grad_values(void **state) {
    (void)state;
    int64_t xs[2] = {9, 13}, ws[2] = {13, 70};
    dt_param x, w, b;
    oph_param(&x, "x", 2, xs, 7, 2.0f);
    oph_param(&w, "w", 2, ws, 8, 0.5f);
    oph_param(&b, "b", 1, &ws[1], 9, 1.0f);
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

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_add_layernorm_bitwise_unfused),
        cmocka_unit_test(test_add_layernorm_no_grad_values),
        cmocka_unit_test(test_linear_gelu_bitwise_unfused),
        cmocka_unit_test(test_linear_gelu_no_grad_values),
    };
    return cmocka_run_group_tests_name("ops_fused", tests, NULL, NULL);
}
