/* dropout on the op harness (tests/common/op_harness.h): gradient vs finite
 * differences through a reseeded rng, identity in eval and at p = 0, bad
 * args; and (not table entries) reproducible masks, keep rate, exact
 * backward (mask * scale), thread-count independence. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <omp.h>
#include <stdlib.h>
#include "op_harness.h"

typedef struct drop_ctx { float p; uint64_t seed; int no_rng, eval; } drop_ctx;

/* a freshly seeded rng on every call: the same mask every time */
static dt_tensor *f_drop(dt_graph *g, dt_param **in, void *ctx) {
    const drop_ctx *c = ctx;
    dt_rng r;
    dt_rng_seed(&r, c->seed);
    if (c->eval) dt_graph_set_training(g, 0);
    return dt_op_dropout(g, OPH_T(in, 0), c->p, c->no_rng ? NULL : &r);
}
static void r_identity(dt_param **in, void *ctx, double *y) {
    (void)ctx;
    for (int64_t i = 0; i < in[0]->value.numel; i++) y[i] = OPH_V(in, 0)[i];
}

static drop_ctx d_grad = {0.4f, 42, 0, 0}, d_eval = {0.5f, 1, 0, 1}, d_eval_no_rng = {0.5f, 1, 1, 1}, d_p0 = {0.0f, 1, 0, 0};
static drop_ctx d_p1 = {1.0f, 1, 0, 0}, d_neg = {-0.1f, 1, 0, 0}, d_nan = {NAN, 1, 0, 0}, d_no_rng = {0.5f, 1, 1, 0};
static drop_ctx d_p1_eval = {1.0f, 1, 0, 1};

static const oph_entry table[] = {
    {.name = "dropout grad 9x7 p 0.4", .op = "dropout", .fn = f_drop, .ctx = &d_grad, .n_in = 1,
     .in = {{"x", 2, {9, 7}, 41}}, .grad = 1, .gc = {.seed = 43}},   /* linear: exact up to rounding */
    {.name = "dropout eval: identity", .op = "dropout", .fn = f_drop, .ctx = &d_eval, .n_in = 1,
     .in = {{"x", 2, {4, 5}, 3}}, .ref = r_identity, .exact = 1, .out = OPH_SHAPE(2, 4, 5), .grad = 1},
    {.name = "dropout eval: no rng needed", .op = "dropout", .fn = f_drop, .ctx = &d_eval_no_rng, .n_in = 1,
     .in = {{"x", 2, {4, 5}, 3}}, .ref = r_identity, .exact = 1, .out = OPH_SHAPE(2, 4, 5)},
    {.name = "dropout p 0: identity", .op = "dropout", .fn = f_drop, .ctx = &d_p0, .n_in = 1,
     .in = {{"x", 2, {4, 5}, 3}}, .ref = r_identity, .exact = 1, .out = OPH_SHAPE(2, 4, 5), .grad = 1},
    {.name = "dropout bad: p 1", .op = "dropout", .fn = f_drop, .ctx = &d_p1, .n_in = 1,
     .in = {{"x", 2, {2, 3}, 1}}, .error = "p = 1"},
    {.name = "dropout bad: p -0.1", .op = "dropout", .fn = f_drop, .ctx = &d_neg, .n_in = 1,
     .in = {{"x", 2, {2, 3}, 1}}, .error = "p = -0.1"},
    {.name = "dropout bad: p NaN", .op = "dropout", .fn = f_drop, .ctx = &d_nan, .n_in = 1,
     .in = {{"x", 2, {2, 3}, 1}}, .error = "[0, 1)"},
    {.name = "dropout bad: rng NULL in training", .op = "dropout", .fn = f_drop, .ctx = &d_no_rng, .n_in = 1,
     .in = {{"x", 2, {2, 3}, 1}}, .error = "rng"},
    {.name = "dropout bad: x NULL", .op = "dropout", .fn = f_drop, .ctx = &d_no_rng, .n_in = 1, .in = {OPH_NULL},
     .error = "required"},
    {.name = "dropout bad: p 1 in eval too", .op = "dropout", .fn = f_drop, .ctx = &d_p1_eval, .n_in = 1,
     .in = {{"x", 2, {2, 3}, 1}}, .error = "[2, 3]"},
};

/* x[i] = 1 + i % 13 (never zero, so y[i] == 0 exactly means "dropped") */
static void fill_nonzero(dt_tensor *t) {
    for (int64_t i = 0; i < t->numel; i++) dt_f32(t)[i] = 1.0f + (float)(i % 13);
}

static float *run(dt_tensor *x, float p, uint64_t seed) {
    dt_graph *g = dt_graph_create();
    dt_rng r;
    dt_rng_seed(&r, seed);
    dt_tensor *y = dt_op_dropout(g, x, p, &r);
    assert_non_null(y);
    float *out = malloc((size_t)x->numel * sizeof *out);
    memcpy(out, y->data, (size_t)x->numel * sizeof *out);
    dt_graph_free(g);
    return out;
}

static void test_dropout_same_seed_same_mask(void **state) {
    (void)state;
    dt_tensor x;
    assert_int_equal(dt_tensor_alloc(&x, DT_F32, 2, (int64_t[]){37, 301}), DT_OK);   /* spans several rng blocks */
    fill_nonzero(&x);
    float *a = run(&x, 0.3f, 7), *b = run(&x, 0.3f, 7), *c = run(&x, 0.3f, 8);
    assert_memory_equal(a, b, (size_t)x.numel * sizeof *a);
    int64_t differ = 0;
    for (int64_t i = 0; i < x.numel; i++) differ += (a[i] == 0.f) != (c[i] == 0.f);
    assert_true(differ > x.numel / 10);   /* another seed, another mask */
    /* the rng advances: a second call with the same generator draws a new mask */
    dt_graph *g = dt_graph_create();
    dt_rng r;
    dt_rng_seed(&r, 7);
    dt_tensor *y1 = dt_op_dropout(g, &x, 0.3f, &r), *y2 = dt_op_dropout(g, &x, 0.3f, &r);
    assert_non_null(y1);
    assert_non_null(y2);
    assert_memory_equal(y1->data, a, (size_t)x.numel * sizeof *a);
    assert_memory_not_equal(y2->data, a, (size_t)x.numel * sizeof *a);
    dt_graph_free(g);
    free(a); free(b); free(c);
    dt_tensor_free(&x);
}

/* The mask depends only on the rng state, not on the OpenMP thread count. */
static void test_dropout_mask_independent_of_threads(void **state) {
    (void)state;
    dt_tensor x;
    assert_int_equal(dt_tensor_alloc(&x, DT_F32, 1, (int64_t[]){50000}), DT_OK);
    fill_nonzero(&x);
    int prev = omp_get_max_threads();
    omp_set_num_threads(1);
    float *a = run(&x, 0.5f, 11);
    omp_set_num_threads(prev > 1 ? prev : 2);
    float *b = run(&x, 0.5f, 11);
    omp_set_num_threads(prev);
    assert_memory_equal(a, b, (size_t)x.numel * sizeof *a);
    free(a); free(b);
    dt_tensor_free(&x);
}

static void test_dropout_identity_in_eval_and_p0(void **state) {
    (void)state;
    dt_param x;
    oph_param(&x, "x", 2, (int64_t[]){4, 5}, 3, 1.0f);
    dt_graph *g = dt_graph_create();
    dt_rng r;
    dt_rng_seed(&r, 1);
    dt_rng before = r;
    dt_graph_set_training(g, 0);
    dt_tensor *y = dt_op_dropout(g, &x.value, 0.5f, &r);
    assert_non_null(y);
    assert_memory_equal(y->data, x.value.data, 20 * sizeof(float));
    dt_graph_set_training(g, 1);
    y = dt_op_dropout(g, &x.value, 0.0f, &r);
    assert_non_null(y);
    assert_memory_equal(y->data, x.value.data, 20 * sizeof(float));
    assert_memory_equal(&r, &before, sizeof r);   /* identity draws nothing */
    /* eval needs no rng at all */
    dt_graph_set_training(g, 0);
    assert_non_null(dt_op_dropout(g, &x.value, 0.5f, NULL));
    dt_graph_free(g);
    dt_param_free(&x);
}

/* p = 0.5 keeps about half (100k draws: sd of the kept fraction is 0.0016, so
 * +-0.01 is > 6 sd), kept values are exactly x * 2; p = 0.9 keeps about 10%
 * and preserves the mean. */
static void test_dropout_keep_rate_and_scale(void **state) {
    (void)state;
    dt_tensor x;
    assert_int_equal(dt_tensor_alloc(&x, DT_F32, 1, (int64_t[]){100000}), DT_OK);
    fill_nonzero(&x);
    float *y = run(&x, 0.5f, 21);
    int64_t kept = 0;
    for (int64_t i = 0; i < x.numel; i++) {
        if (y[i] != 0.f) { kept++; assert_true(y[i] == dt_f32(&x)[i] * 2.0f); }
    }
    double frac = (double)kept / (double)x.numel;
    if (fabs(frac - 0.5) > 0.01) fail_msg("p=0.5 kept %.4f", frac);
    free(y);

    for (int64_t i = 0; i < x.numel; i++) dt_f32(&x)[i] = 1.0f;
    y = run(&x, 0.9f, 22);
    double sum = 0;
    kept = 0;
    for (int64_t i = 0; i < x.numel; i++) { sum += y[i]; kept += y[i] != 0.f; }
    frac = (double)kept / (double)x.numel;
    if (fabs(frac - 0.1) > 0.006) fail_msg("p=0.9 kept %.4f", frac);   /* sd 0.00095 */
    if (fabs(sum / (double)x.numel - 1.0) > 0.06) fail_msg("p=0.9 mean %.4f", sum / (double)x.numel);
    free(y);
    dt_tensor_free(&x);
}

/* dx = dy * mask * scale, bit for bit, with scale = 1/(1-p) as a float. */
static void test_dropout_backward_is_mask_times_scale(void **state) {
    (void)state;
    const float p = 0.3f, scale = 1.0f / (1.0f - p);
    dt_param x;
    assert_int_equal(dt_param_init(&x, "x", 3, (int64_t[]){3, 7, 11}), DT_OK);
    fill_nonzero(&x.value);
    float R[3 * 7 * 11];
    for (int i = 0; i < 3 * 7 * 11; i++) R[i] = (float)sin(0.7 * i + 0.2);
    dt_graph *g = dt_graph_create();
    dt_rng r;
    dt_rng_seed(&r, 31);
    dt_tensor *y = dt_op_dropout(g, &x.value, p, &r);
    assert_non_null(y);
    assert_true(y != &x.value);
    assert_int_equal(dt_graph_backward(g, oph_wsum(g, y, R)), DT_OK);
    int dropped = 0;
    for (int i = 0; i < 3 * 7 * 11; i++) {
        int keep = dt_f32(y)[i] != 0.f;
        dropped += !keep;
        assert_true(dt_f32(&x.grad)[i] == (keep ? R[i] * scale : 0.f));
    }
    assert_true(dropped > 0 && dropped < 3 * 7 * 11);
    /* a second forward/backward with the same mask accumulates: grad doubles */
    dt_graph_reset(g);
    dt_rng_seed(&r, 31);
    y = dt_op_dropout(g, &x.value, p, &r);
    assert_non_null(y);
    assert_int_equal(dt_graph_backward(g, oph_wsum(g, y, R)), DT_OK);
    for (int i = 0; i < 3 * 7 * 11; i++) {
        float once = dt_f32(y)[i] != 0.f ? R[i] * scale : 0.f;
        assert_true(dt_f32(&x.grad)[i] == once + once);
    }
    dt_graph_free(g);
    dt_param_free(&x);
}

int main(void) {
    const struct CMUnitTest extra[] = {
        cmocka_unit_test(test_dropout_same_seed_same_mask),
        cmocka_unit_test(test_dropout_mask_independent_of_threads),
        cmocka_unit_test(test_dropout_identity_in_eval_and_p0),
        cmocka_unit_test(test_dropout_keep_rate_and_scale),
        cmocka_unit_test(test_dropout_backward_is_mask_times_scale),
    };
    return OPH_RUN("ops_dropout", table, extra);
}
