/* dropout on the op harness (tests/common/op_harness.h): gradient vs finite
 * differences, the mask against its definition (dt_dropout_hash of (row key,
 * site, element)), identity in eval and at p = 0, bad args; and (not table
 * entries) the mask as a pure function of its keys (same keys, same mask,
 * wherever the row sits; another step / sample / site, another mask), keep
 * rate within binomial bounds, the 1/(1-p) scale, exact backward, thread-count
 * independence. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include "op_harness.h"

enum { MAX_ROWS = 64 };
typedef struct drop_ctx { float p; uint64_t seed; int no_keys, eval; uint64_t site; } drop_ctx;

/* row r's key: (seed, step 0, sample r) */
static const uint64_t *keys_for(uint64_t seed, int64_t rows, uint64_t *buf) {
    for (int64_t r = 0; r < rows && r < MAX_ROWS; r++) buf[r] = dt_dropout_row_key(seed, 0, (uint64_t)r);
    return buf;
}

static dt_tensor *f_drop(dt_graph *g, dt_param **in, void *ctx) {
    const drop_ctx *c = ctx;
    static uint64_t keys[MAX_ROWS];
    if (c->eval) dt_graph_set_training(g, 0);
    dt_tensor *x = OPH_T(in, 0);
    return dt_op_dropout(g, x, c->p, c->no_keys || !x ? NULL : keys_for(c->seed, x->shape[0], keys), c->site);
}
static void r_identity(dt_param **in, void *ctx, double *y) {
    (void)ctx;
    for (int64_t i = 0; i < in[0]->value.numel; i++) y[i] = OPH_V(in, 0)[i];
}
/* The contract (ops.h): element e of row b kept iff
 * dt_dropout_hash(key_b, site, e) >= round(p * 2^32); kept: x / (1 - p). */
static void r_keyed(dt_param **in, void *ctx, double *y) {
    const drop_ctx *c = ctx;
    const dt_tensor *x = &in[0]->value;
    int64_t R = x->shape[0], E = x->numel / R;
    double thr = floor((double)c->p * 4294967296.0 + 0.5);
    for (int64_t b = 0; b < R; b++) {
        uint64_t key = dt_dropout_row_key(c->seed, 0, (uint64_t)b);
        for (int64_t e = 0; e < E; e++) {
            double v = OPH_V(in, 0)[b * E + e];
            y[b * E + e] = (double)dt_dropout_hash(key, c->site, (uint32_t)e) >= thr ? v * (double)(1.0f / (1.0f - c->p)) : 0.0;
        }
    }
}

static drop_ctx d_grad = {0.4f, 42, 0, 0, 3}, d_eval = {0.5f, 1, 0, 1, 0}, d_eval_no_keys = {0.5f, 1, 1, 1, 0};
static drop_ctx d_p0 = {0.0f, 1, 0, 0, 0}, d_keyed = {0.3f, 9, 0, 0, 17};
static drop_ctx d_p1 = {1.0f, 1, 0, 0, 0}, d_neg = {-0.1f, 1, 0, 0, 0}, d_nan = {NAN, 1, 0, 0, 0}, d_no_keys = {0.5f, 1, 1, 0, 0};
static drop_ctx d_p1_eval = {1.0f, 1, 0, 1, 0};

static const oph_entry table[] = {
    {.name = "dropout grad 9x7 p 0.4", .op = "dropout", .fn = f_drop, .ctx = &d_grad, .n_in = 1,
     .in = {{"x", 2, {9, 7}, 41}}, .grad = 1, .gc = {.seed = 43}},   /* linear: exact up to rounding */
    {.name = "dropout 5x3x8 p 0.3: the keyed mask", .op = "dropout", .fn = f_drop, .ctx = &d_keyed, .n_in = 1,
     .in = {{"x", 3, {5, 3, 8}, 5}}, .ref = r_keyed, .exact = 1, .out = OPH_SHAPE(3, 5, 3, 8)},
    {.name = "dropout eval: identity", .op = "dropout", .fn = f_drop, .ctx = &d_eval, .n_in = 1,
     .in = {{"x", 2, {4, 5}, 3}}, .ref = r_identity, .exact = 1, .out = OPH_SHAPE(2, 4, 5), .grad = 1},
    {.name = "dropout eval: no keys needed", .op = "dropout", .fn = f_drop, .ctx = &d_eval_no_keys, .n_in = 1,
     .in = {{"x", 2, {4, 5}, 3}}, .ref = r_identity, .exact = 1, .out = OPH_SHAPE(2, 4, 5)},
    {.name = "dropout p 0: identity", .op = "dropout", .fn = f_drop, .ctx = &d_p0, .n_in = 1,
     .in = {{"x", 2, {4, 5}, 3}}, .ref = r_identity, .exact = 1, .out = OPH_SHAPE(2, 4, 5), .grad = 1},
    {.name = "dropout bad: p 1", .op = "dropout", .fn = f_drop, .ctx = &d_p1, .n_in = 1,
     .in = {{"x", 2, {2, 3}, 1}}, .error = "p = 1"},
    {.name = "dropout bad: p -0.1", .op = "dropout", .fn = f_drop, .ctx = &d_neg, .n_in = 1,
     .in = {{"x", 2, {2, 3}, 1}}, .error = "p = -0.1"},
    {.name = "dropout bad: p NaN", .op = "dropout", .fn = f_drop, .ctx = &d_nan, .n_in = 1,
     .in = {{"x", 2, {2, 3}, 1}}, .error = "[0, 1)"},
    {.name = "dropout bad: row keys NULL in training", .op = "dropout", .fn = f_drop, .ctx = &d_no_keys, .n_in = 1,
     .in = {{"x", 2, {2, 3}, 1}}, .error = "row_keys"},
    {.name = "dropout bad: x NULL", .op = "dropout", .fn = f_drop, .ctx = &d_no_keys, .n_in = 1, .in = {OPH_NULL},
     .error = "required"},
    {.name = "dropout bad: p 1 in eval too", .op = "dropout", .fn = f_drop, .ctx = &d_p1_eval, .n_in = 1,
     .in = {{"x", 2, {2, 3}, 1}}, .error = "[2, 3]"},
};

/* x[i] = 1 + i % 13 (never zero, so y[i] == 0 exactly means "dropped") */
static void fill_nonzero(dt_tensor *t) {
    for (int64_t i = 0; i < t->numel; i++) dt_f32(t)[i] = 1.0f + (float)(i % 13);
}

/* y = dropout(x) with the given row keys and site (a fresh graph) */
static float *run_keys(dt_tensor *x, float p, const uint64_t *keys, uint64_t site) {
    dt_graph *g = dt_graph_create();
    dt_tensor *y = dt_op_dropout(g, x, p, keys, site);
    assert_non_null(y);
    float *out = malloc((size_t)x->numel * sizeof *out);
    memcpy(out, y->data, (size_t)x->numel * sizeof *out);
    dt_graph_free(g);
    return out;
}

/* rows keyed (seed, step 0, sample r) */
static float *run(dt_tensor *x, float p, uint64_t seed) {
    int64_t R = x->shape[0];
    uint64_t *keys = malloc((size_t)R * sizeof *keys);
    for (int64_t r = 0; r < R; r++) keys[r] = dt_dropout_row_key(seed, 0, (uint64_t)r);
    float *y = run_keys(x, p, keys, 0);
    free(keys);
    return y;
}

/* fraction of elements [0, n) whose kept/dropped state differs */
static double mask_diff(const float *a, const float *b, int64_t n) {
    int64_t d = 0;
    for (int64_t i = 0; i < n; i++) d += (a[i] == 0.f) != (b[i] == 0.f);
    return (double)d / (double)n;
}

/* The mask is a pure function of (row key, site, element): the same keys
 * give the same mask in any call and any graph, a row's mask does not depend
 * on the batch it is in nor its place there, and another step, sample or
 * site gives an unrelated mask (two independent masks at p = 0.3 disagree
 * on 2 p (1 - p) = 0.42 of the elements). */
static void test_dropout_mask_is_a_function_of_the_keys(void **state) {
    (void)state;
    enum { R = 6, E = 3 * 1500 };   /* rows of [3, 1500]: past one parallel chunk */
    const float p = 0.3f;
    dt_tensor x;
    assert_int_equal(dt_tensor_alloc(&x, DT_F32, 3, (int64_t[]){R, 3, 1500}), DT_OK);
    fill_nonzero(&x);
    uint64_t k[R], perm[R], other[R];
    for (int r = 0; r < R; r++) k[r] = dt_dropout_row_key(5, 11, (uint64_t)(100 + r));
    float *a = run_keys(&x, p, k, 2), *b = run_keys(&x, p, k, 2);
    assert_memory_equal(a, b, (size_t)x.numel * sizeof *a);
    /* the same rows in another order (another layout of the batch) */
    for (int r = 0; r < R; r++) perm[r] = k[(r + 4) % R];
    float *c = run_keys(&x, p, perm, 2);
    for (int r = 0; r < R; r++)
        for (int64_t e = 0; e < E; e++) {
            float va = a[((r + 4) % R) * E + e], vc = c[r * E + e];
            if ((va == 0.f) != (vc == 0.f)) fail_msg("row %d moved: element %lld differs", r, (long long)e);
        }
    /* two calls in one graph (a recompute's replay): the same mask */
    dt_graph *g = dt_graph_create();
    dt_tensor *y1 = dt_op_dropout(g, &x, p, k, 2), *y2 = dt_op_dropout(g, &x, p, k, 2);
    assert_non_null(y1);
    assert_non_null(y2);
    assert_memory_equal(y1->data, a, (size_t)x.numel * sizeof *a);
    assert_memory_equal(y2->data, a, (size_t)x.numel * sizeof *a);
    dt_graph_free(g);
    struct { const char *what; uint64_t seed, step, sample0, site; } v[] = {
        {"another seed", 6, 11, 100, 2}, {"another step", 5, 12, 100, 2},
        {"other samples", 5, 11, 200, 2}, {"another site", 5, 11, 100, 3}};
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        for (int r = 0; r < R; r++) other[r] = dt_dropout_row_key(v[i].seed, v[i].step, v[i].sample0 + (uint64_t)r);
        float *d = run_keys(&x, p, other, v[i].site);
        double f = mask_diff(a, d, x.numel), want = 2.0 * p * (1.0 - p);
        double sd = sqrt(want * (1 - want) / (double)x.numel);
        if (fabs(f - want) > 6 * sd) fail_msg("%s: masks disagree on %.4f, independent ones on %.4f", v[i].what, f, want);
        free(d);
    }
    /* neighbouring rows of one batch (samples r, r+1) are unrelated too */
    double f = mask_diff(a, a + E, E), want = 2.0 * p * (1.0 - p), sd = sqrt(want * (1 - want) / E);
    if (fabs(f - want) > 6 * sd) fail_msg("rows 0 and 1 disagree on %.4f, independent ones on %.4f", f, want);
    free(a); free(b); free(c);
    dt_tensor_free(&x);
}

static int cmp_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* Within one (row key, site) the element hash is injective: no two of 2^16
 * elements share a 32-bit draw (a bijective mixer over an injective counter). */
static void test_dropout_hash_distinct_within_a_row(void **state) {
    (void)state;
    enum { N = 1 << 16 };
    uint32_t *h = malloc(N * sizeof *h);
    uint64_t key = dt_dropout_row_key(1, 2, 3);
    for (uint32_t e = 0; e < N; e++) h[e] = dt_dropout_hash(key, dt_dropout_site(4, 1), e);
    qsort(h, N, sizeof *h, cmp_u32);
    for (int i = 1; i < N; i++) assert_true(h[i] != h[i - 1]);
    free(h);
}

/* The mask does not depend on the OpenMP thread count. */
static void test_dropout_mask_independent_of_threads(void **state) {
    (void)state;
    dt_tensor x;
    assert_int_equal(dt_tensor_alloc(&x, DT_F32, 2, (int64_t[]){5, 10000}), DT_OK);
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
    uint64_t keys[4] = {1, 2, 3, 4};
    dt_graph_set_training(g, 0);
    dt_tensor *y = dt_op_dropout(g, &x.value, 0.5f, keys, 0);
    assert_true(y == &x.value);
    dt_graph_set_training(g, 1);
    y = dt_op_dropout(g, &x.value, 0.0f, keys, 0);
    assert_true(y == &x.value);
    /* neither needs keys */
    assert_true(dt_op_dropout(g, &x.value, 0.0f, NULL, 0) == &x.value);
    dt_graph_set_training(g, 0);
    assert_true(dt_op_dropout(g, &x.value, 0.5f, NULL, 0) == &x.value);
    dt_graph_free(g);
    dt_param_free(&x);
}

/* Keep rate: over N elements the kept count is Binomial(N, 1 - p), sd
 * sqrt(N p (1 - p)); the kept fraction must be within 5 sd of 1 - p (a
 * correct generator fails this about once in 1.7 million). Kept values are
 * exactly x * (1 / (1 - p)) as a float; the mean is preserved. */
static void test_dropout_keep_rate_and_scale(void **state) {
    (void)state;
    enum { R = 40, E = 5000, N = R * E };
    dt_tensor x;
    assert_int_equal(dt_tensor_alloc(&x, DT_F32, 2, (int64_t[]){R, E}), DT_OK);
    const float ps[] = {0.1f, 0.5f, 0.9f};
    for (size_t k = 0; k < sizeof ps / sizeof ps[0]; k++) {
        const float p = ps[k], scale = 1.0f / (1.0f - p);
        fill_nonzero(&x);
        float *y = run(&x, p, 21 + k);
        int64_t kept = 0;
        for (int64_t i = 0; i < N; i++)
            if (y[i] != 0.f) {
                kept++;
                if (y[i] != dt_f32(&x)[i] * scale) fail_msg("p=%g: kept %g of %g, scale %g", p, y[i], dt_f32(&x)[i], scale);
            }
        double frac = (double)kept / N, sd = sqrt((double)p * (1.0 - p) / N);
        if (fabs(frac - (1.0 - p)) > 5 * sd) fail_msg("p=%g kept %.5f, want %.5f +- %.5f", p, frac, 1.0 - p, 5 * sd);
        free(y);
        for (int64_t i = 0; i < N; i++) dt_f32(&x)[i] = 1.0f;
        y = run(&x, p, 31 + k);
        double sum = 0;
        for (int64_t i = 0; i < N; i++) sum += y[i];
        /* mean of y = scale * kept / N: sd scale * sd(frac) */
        if (fabs(sum / N - 1.0) > 5 * scale * sd) fail_msg("p=%g mean %.5f", p, sum / N);
        free(y);
    }
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
    uint64_t keys[3] = {dt_dropout_row_key(31, 0, 0), dt_dropout_row_key(31, 0, 1), dt_dropout_row_key(31, 0, 2)};
    dt_graph *g = dt_graph_create();
    dt_tensor *y = dt_op_dropout(g, &x.value, p, keys, 0);
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
    /* a second forward/backward with the same keys: the same mask, grad doubles */
    dt_graph_reset(g);
    y = dt_op_dropout(g, &x.value, p, keys, 0);
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
        cmocka_unit_test(test_dropout_mask_is_a_function_of_the_keys),
        cmocka_unit_test(test_dropout_hash_distinct_within_a_row),
        cmocka_unit_test(test_dropout_mask_independent_of_threads),
        cmocka_unit_test(test_dropout_identity_in_eval_and_p0),
        cmocka_unit_test(test_dropout_keep_rate_and_scale),
        cmocka_unit_test(test_dropout_backward_is_mask_times_scale),
    };
    return OPH_RUN("ops_dropout", table, extra);
}
