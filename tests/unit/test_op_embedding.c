/* dt_op_embedding: gathered rows, output shape, gradient with repeated ids
 * (scatter-add), out-of-range ids and shape mismatches are errors. The
 * gradient of an id is the sum of its positions' rows in position order,
 * added once (bitwise, computed here independently), so backward into a
 * zeroed buffer then added to G equals backward straight into G. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdlib.h>
#include "op_test_util.h"

typedef struct emb_ctx { const int32_t *ids; int64_t n; int ndim; int64_t shape[3]; } emb_ctx;

static dt_tensor *f_emb(dt_graph *g, dt_param **in, void *ctx) {
    emb_ctx *c = ctx;
    return dt_op_embedding(g, &in[0]->value, c->ids, c->n, c->ndim, c->shape);
}

static void test_forward_and_grad(void **state) {
    (void)state;
    int64_t ws[2] = {5, 3};
    dt_param w;
    opt_param(&w, "w", 2, ws, 1, 1.0f);
    int32_t ids[6] = {4, 0, 4, 2, 4, 0};   /* repeats; ids 1 and 3 unused */
    emb_ctx c = {ids, 6, 3, {2, 3, 3}};
    dt_graph *g = dt_graph_create();
    dt_tensor *y = f_emb(g, (dt_param *[]){&w}, &c);
    opt_assert_shape(y, 3, c.shape);
    for (int i = 0; i < 6; i++)
        for (int k = 0; k < 3; k++) assert_float_equal(dt_f32(y)[i * 3 + k], dt_f32(&w.value)[ids[i] * 3 + k], 0.0);
    dt_graph_free(g);
    dt_param *in[1] = {&w};
    assert_int_equal(dt_gradcheck(f_emb, &c, in, 1, NULL), 0);
    /* rows never looked up get exactly zero gradient */
    for (int k = 0; k < 3; k++) {
        assert_float_equal(dt_f32(&w.grad)[1 * 3 + k], 0.0f, 0.0);
        assert_float_equal(dt_f32(&w.grad)[3 * 3 + k], 0.0f, 0.0);
    }
    dt_param_free(&w);
}

/* C spanning several column blocks, many repeated ids: OpenMP scatter path. */
static void test_grad_large(void **state) {
    (void)state;
    int64_t ws[2] = {17, 200};
    dt_param w;
    opt_param(&w, "w", 2, ws, 2, 1.0f);
    int32_t ids[300];
    for (int i = 0; i < 300; i++) ids[i] = (int32_t)((i * 7) % 17);
    emb_ctx c = {ids, 300, 2, {300, 200}};
    dt_param *in[1] = {&w};
    dt_gc_opts o = {.seed = 3, .max_checks = 80};
    assert_int_equal(dt_gradcheck(f_emb, &c, in, 1, &o), 0);
    dt_param_free(&w);
}

static void test_bad_args(void **state) {
    (void)state;
    int64_t ws[2] = {5, 3}, sh[2] = {2, 3}, bad[2] = {2, 4};
    dt_param w;
    opt_param(&w, "w", 2, ws, 1, 1.0f);
    int32_t ids[2] = {1, 5}, neg[2] = {-1, 0}, ok[2] = {1, 4};
    dt_graph *g = dt_graph_create();
    opt_expect_error(dt_op_embedding(g, &w.value, ids, 2, 2, sh), "embedding");
    assert_non_null(strstr(dt_error_message(), "5"));
    opt_expect_error(dt_op_embedding(g, &w.value, neg, 2, 2, sh), "embedding");
    opt_expect_error(dt_op_embedding(g, &w.value, ok, 2, 2, bad), "embedding");
    opt_expect_error(dt_op_embedding(g, &w.value, NULL, 2, 2, sh), "embedding");
    opt_expect_error(dt_op_embedding(g, NULL, ok, 2, 2, sh), "embedding");
    assert_non_null(dt_op_embedding(g, &w.value, ok, 2, 2, sh));
    dt_graph_free(g);
    dt_param_free(&w);
}

static void test_input_used_twice(void **state) {
    (void)state;
    int64_t ws[2] = {4, 3};
    dt_param w;
    opt_param(&w, "w", 2, ws, 131, 1.0f);
    int32_t ids[3] = {2, 0, 2};
    emb_ctx c = {ids, 3, 2, {3, 3}};
    dt_param *in[1] = {&w};
    assert_int_equal(opt_gradcheck_twice(f_emb, &c, in, 1), 0);
    dt_param_free(&w);
}

/* ---- the order of the scatter-add ---- */
typedef struct sum_case { int64_t V, C, n; int distinct; } sum_case;   /* ids drawn from [0, distinct) */
static const sum_case sum_cases[] = {
    {5, 3, 6, 3},          /* one thread */
    {9, 130, 400, 7},      /* three column blocks, threaded, ~57 repeats per id */
    {50304, 16, 300, 40},  /* GPT-2's vocabulary: few rows touched */
};

static uint64_t rng_state = 88172645463325252ull;
static uint64_t next64(void) {   /* xorshift64 */
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}
/* Uniform in [-scale, scale), one value in ten 101 times larger: sums round. */
static float uniform(float scale) {
    double u = (double)(next64() >> 11) / 9007199254740992.0;
    return (float)((2.0 * u - 1.0) * scale * (u > 0.9 ? 101.0 : 1.0));
}

/* w.grad <- G, backward of w's embedding of ids with upstream dy. */
static void backward_into(dt_param *w, const float *G, const int32_t *ids, const sum_case *c, const float *dy) {
    memcpy(w->grad.data, G, (size_t)(c->V * c->C) * sizeof(float));
    dt_graph *g = dt_graph_create();
    dt_tensor *y = dt_op_embedding(g, &w->value, ids, c->n, 2, (int64_t[]){c->n, c->C});
    assert_non_null(y);
    assert_int_equal(dt_graph_backward_from(g, y, dy), DT_OK);
    dt_graph_free(g);
}

typedef struct sum_data { dt_param w; int32_t *ids; float *G, *dy, *zeros, *want; } sum_data;

static void sum_data_init(sum_data *d, const sum_case *c) {
    assert_int_equal(dt_param_init(&d->w, "wte", 2, (int64_t[]){c->V, c->C}), DT_OK);
    d->ids = malloc((size_t)c->n * sizeof *d->ids);
    d->G = malloc((size_t)(c->V * c->C) * sizeof *d->G);
    d->zeros = calloc((size_t)(c->V * c->C), sizeof *d->zeros);
    d->want = malloc((size_t)(c->V * c->C) * sizeof *d->want);
    d->dy = malloc((size_t)(c->n * c->C) * sizeof *d->dy);
    for (int64_t i = 0; i < c->n; i++) d->ids[i] = (int32_t)(next64() % (uint64_t)c->distinct);
    for (int64_t i = 0; i < c->V * c->C; i++) d->G[i] = uniform(10.0f);
    for (int64_t i = 0; i < c->n * c->C; i++) d->dy[i] = uniform(1.0f);
}

static void sum_data_free(sum_data *d) {
    dt_param_free(&d->w);
    free(d->ids); free(d->G); free(d->dy); free(d->zeros); free(d->want);
}

/* dw_after = dw_before + (dy[i0] + dy[i1] + ...) per id, summed left to right. */
static void test_grad_sums_repeats_first(void **state) {
    (void)state;
    for (size_t t = 0; t < sizeof sum_cases / sizeof sum_cases[0]; t++) {
        const sum_case *c = &sum_cases[t];
        sum_data d;
        sum_data_init(&d, c);
        memcpy(d.want, d.G, (size_t)(c->V * c->C) * sizeof(float));
        for (int64_t v = 0; v < c->V; v++)
            for (int64_t k = 0; k < c->C; k++) {
                float s = 0.0f;
                int seen = 0;
                for (int64_t i = 0; i < c->n; i++)
                    if (d.ids[i] == v) {
                        s = seen ? s + d.dy[i * c->C + k] : d.dy[i * c->C + k];
                        seen = 1;
                    }
                if (seen) d.want[v * c->C + k] = d.G[v * c->C + k] + s;
            }
        backward_into(&d.w, d.G, d.ids, c, d.dy);
        assert_memory_equal(d.w.grad.data, d.want, (size_t)(c->V * c->C) * sizeof(float));
        sum_data_free(&d);
    }
}

/* A tied embedding split over pipeline stages: backward into zeros, then
 * G += E, is bitwise backward straight into G. */
static void test_grad_zero_buffer_then_add(void **state) {
    (void)state;
    for (size_t t = 0; t < sizeof sum_cases / sizeof sum_cases[0]; t++) {
        const sum_case *c = &sum_cases[t];
        sum_data d;
        sum_data_init(&d, c);
        backward_into(&d.w, d.zeros, d.ids, c, d.dy);
        for (int64_t i = 0; i < c->V * c->C; i++) d.want[i] = d.G[i] + dt_f32(&d.w.grad)[i];
        backward_into(&d.w, d.G, d.ids, c, d.dy);
        assert_memory_equal(d.w.grad.data, d.want, (size_t)(c->V * c->C) * sizeof(float));
        sum_data_free(&d);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_forward_and_grad),
        cmocka_unit_test(test_grad_large),
        cmocka_unit_test(test_input_used_twice),
        cmocka_unit_test(test_bad_args),
        cmocka_unit_test(test_grad_sums_repeats_first),
        cmocka_unit_test(test_grad_zero_buffer_then_add),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
