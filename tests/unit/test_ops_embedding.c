/* embedding on the op harness (tests/common/op_harness.h): gathered rows,
 * output shape, gradient with repeated ids (scatter-add) vs finite
 * differences, rows never looked up get exactly zero, out-of-range ids and
 * shape mismatches are errors. Not table entries: the gradient of an id is
 * the sum of its positions' rows in position order, added once (bitwise,
 * computed here independently), so backward into a zeroed buffer then added
 * to G equals backward straight into G. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdlib.h>
#include "op_harness.h"

typedef struct emb_ctx { int32_t *ids; int64_t n; int ndim; int64_t shape[3]; } emb_ctx;

static dt_tensor *f_emb(dt_graph *g, dt_param **in, void *ctx) {
    const emb_ctx *c = ctx;
    return dt_op_embedding(g, OPH_T(in, 0), c->ids, c->n, c->ndim, c->shape);
}
/* y[i, :] = w[ids[i], :] */
static void r_emb(dt_param **in, void *ctx, double *y) {
    const emb_ctx *c = ctx;
    int64_t C = in[0]->value.shape[1];
    for (int64_t i = 0; i < c->n; i++)
        for (int64_t k = 0; k < C; k++) y[i * C + k] = OPH_V(in, 0)[c->ids[i] * C + k];
}
/* rows 1 and 3 are never looked up: exactly zero gradient */
static void cg_unused_rows_zero(const oph_entry *e, dt_param **in, const dt_tensor *y) {
    (void)e; (void)y;
    for (int k = 0; k < 3; k++) {
        assert_float_equal(dt_f32(&in[0]->grad)[1 * 3 + k], 0.0f, 0.0);
        assert_float_equal(dt_f32(&in[0]->grad)[3 * 3 + k], 0.0f, 0.0);
    }
}
static void p_ids_large(dt_param **in, void *ctx) {   /* many repeats of 17 ids */
    (void)in;
    emb_ctx *c = ctx;
    for (int i = 0; i < 300; i++) c->ids[i] = (int32_t)((i * 7) % 17);
}

static int32_t ids_rep[6] = {4, 0, 4, 2, 4, 0}, ids_large[300], ids_twice[3] = {2, 0, 2};
static int32_t ids_5[2] = {1, 5}, ids_neg[2] = {-1, 0}, ids_ok[2] = {1, 4};
static emb_ctx e_rep = {ids_rep, 6, 3, {2, 3, 3}}, e_large = {ids_large, 300, 2, {300, 200}},
               e_twice = {ids_twice, 3, 2, {3, 3}}, e_5 = {ids_5, 2, 2, {2, 3}}, e_neg = {ids_neg, 2, 2, {2, 3}},
               e_shape = {ids_ok, 2, 2, {2, 4}}, e_null = {NULL, 2, 2, {2, 3}}, e_ok = {ids_ok, 2, 2, {2, 3}};

static const oph_entry table[] = {
    {.name = "embedding 5x3, ids repeated", .op = "embedding", .fn = f_emb, .ctx = &e_rep, .n_in = 1,
     .in = {{"w", 2, {5, 3}, 1}}, .ref = r_emb, .exact = 1, .out = OPH_SHAPE(3, 2, 3, 3), .grad = 1,
     .check_grad = cg_unused_rows_zero},
    {.name = "embedding 17x200, 300 ids (OpenMP scatter)", .op = "embedding", .fn = f_emb, .ctx = &e_large,
     .n_in = 1, .in = {{"w", 2, {17, 200}, 2}}, .prep = p_ids_large, .ref = r_emb, .exact = 1,
     .out = OPH_SHAPE(2, 300, 200), .grad = 1, .gc = {.seed = 3, .max_checks = 80}},
    {.name = "embedding twice", .op = "embedding", .fn = f_emb, .ctx = &e_twice, .n_in = 1,
     .in = {{"w", 2, {4, 3}, 131}}, .twice = 1},
    {.name = "embedding bad: id 5 of 5", .op = "embedding", .fn = f_emb, .ctx = &e_5, .n_in = 1,
     .in = {{"w", 2, {5, 3}, 1}}, .error = "5"},
    {.name = "embedding bad: id -1", .op = "embedding", .fn = f_emb, .ctx = &e_neg, .n_in = 1,
     .in = {{"w", 2, {5, 3}, 1}}, .error = ""},
    {.name = "embedding bad: shape [2, 4] for C 3", .op = "embedding", .fn = f_emb, .ctx = &e_shape, .n_in = 1,
     .in = {{"w", 2, {5, 3}, 1}}, .error = ""},
    {.name = "embedding bad: ids NULL", .op = "embedding", .fn = f_emb, .ctx = &e_null, .n_in = 1,
     .in = {{"w", 2, {5, 3}, 1}}, .error = ""},
    {.name = "embedding bad: w NULL", .op = "embedding", .fn = f_emb, .ctx = &e_ok, .n_in = 1, .in = {OPH_NULL},
     .error = ""},
    {.name = "embedding ok: ids 1, 4", .op = "embedding", .fn = f_emb, .ctx = &e_ok, .n_in = 1,
     .in = {{"w", 2, {5, 3}, 1}}, .ref = r_emb, .exact = 1, .out = OPH_SHAPE(2, 2, 3)},
};

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
    const struct CMUnitTest extra[] = {
        cmocka_unit_test(test_grad_sums_repeats_first),
        cmocka_unit_test(test_grad_zero_buffer_then_add),
    };
    return OPH_RUN("ops_embedding", table, extra);
}
