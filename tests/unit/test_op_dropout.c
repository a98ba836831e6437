/* dt_op_dropout: reproducible masks, identity in eval / p == 0, keep rate,
 * exact backward (mask * scale), thread-count independence, bad args. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include "dtrain/ops.h"
#include "gradcheck.h"

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
    assert_int_equal(dt_param_init(&x, "x", 2, (int64_t[]){4, 5}), DT_OK);
    dt_gc_fill(&x, 3, 1.0f);
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

/* L = sum(y * R). */
static void wsum_bw(dt_graph *g, dt_node *n) {
    float *dx = dt_grad_of(g, n->in[0]);
    const float *R = n->saved;
    float d = dt_f32(n->out->grad)[0];
    if (dx) for (int64_t i = 0; i < n->in[0]->numel; i++) dx[i] += d * R[i];
}
static dt_tensor *wsum(dt_graph *g, dt_tensor *x, const float *R) {
    dt_tensor *out = dt_graph_tensor(g, 0, NULL);
    dt_f32(out)[0] = 0;
    dt_node *n = dt_graph_record(g, "wsum", wsum_bw, out, 1, &x);
    if (n) n->saved = (void *)R;
    return out;
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
    assert_int_equal(dt_graph_backward(g, wsum(g, y, R)), DT_OK);
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
    assert_int_equal(dt_graph_backward(g, wsum(g, y, R)), DT_OK);
    for (int i = 0; i < 3 * 7 * 11; i++) {
        float once = dt_f32(y)[i] != 0.f ? R[i] * scale : 0.f;
        assert_true(dt_f32(&x.grad)[i] == once + once);
    }
    dt_graph_free(g);
    dt_param_free(&x);
}

/* Finite differences through a reseeded rng (same mask on every call). */
static dt_tensor *drop_fn(dt_graph *g, dt_param **in, void *ctx) {
    dt_rng r;
    dt_rng_seed(&r, *(const uint64_t *)ctx);
    return dt_op_dropout(g, &in[0]->value, 0.4f, &r);
}

static void test_dropout_gradcheck(void **state) {
    (void)state;
    dt_param x;
    assert_int_equal(dt_param_init(&x, "x", 2, (int64_t[]){9, 7}), DT_OK);
    dt_gc_fill(&x, 41, 1.0f);
    uint64_t seed = 42;
    dt_param *in[1] = {&x};
    dt_gc_opts o = {.seed = 43};
    assert_int_equal(dt_gradcheck(drop_fn, &seed, in, 1, &o), 0);   /* linear: exact up to rounding */
    dt_param_free(&x);
}

static void expect_error(dt_tensor *y, const char *needle) {
    assert_null(y);
    assert_int_equal(dt_error_code(), DT_EINVAL);
    if (!strstr(dt_error_message(), "dropout") || !strstr(dt_error_message(), needle))
        fail_msg("unexpected message: %s", dt_error_message());
    dt_error_clear();
}

static void test_dropout_bad_args(void **state) {
    (void)state;
    dt_tensor x;
    assert_int_equal(dt_tensor_alloc(&x, DT_F32, 2, (int64_t[]){2, 3}), DT_OK);
    dt_graph *g = dt_graph_create();
    dt_rng r;
    dt_rng_seed(&r, 1);
    expect_error(dt_op_dropout(g, &x, 1.0f, &r), "p = 1");
    expect_error(dt_op_dropout(g, &x, -0.1f, &r), "p = -0.1");
    expect_error(dt_op_dropout(g, &x, NAN, &r), "[0, 1)");
    expect_error(dt_op_dropout(g, &x, 0.5f, NULL), "rng");
    expect_error(dt_op_dropout(g, NULL, 0.5f, &r), "required");
    dt_graph_set_training(g, 0);
    expect_error(dt_op_dropout(g, &x, 1.0f, &r), "[2, 3]");   /* p is checked in eval too */
    dt_graph_free(g);
    dt_tensor_free(&x);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dropout_same_seed_same_mask),
        cmocka_unit_test(test_dropout_mask_independent_of_threads),
        cmocka_unit_test(test_dropout_identity_in_eval_and_p0),
        cmocka_unit_test(test_dropout_keep_rate_and_scale),
        cmocka_unit_test(test_dropout_backward_is_mask_times_scale),
        cmocka_unit_test(test_dropout_gradcheck),
        cmocka_unit_test(test_dropout_bad_args),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
