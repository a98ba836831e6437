/* The op test harness: one table entry per case, modelled on ggml's
 * test-backend-ops. Include after <cmocka.h>.
 *
 * HOW TO TEST AN OP
 *
 * 1. Write a builder: out = op(inputs). The harness hands it the entry's
 *    inputs as dt_params (OPH_T(in, i) is input i's tensor, or NULL for an
 *    input declared OPH_NULL or past .n_in) and the entry's ctx for
 *    everything else (layouts, strides, ids, targets, eps, a NULL graph for
 *    the bad-input entries ...). One builder serves the valid and the bad
 *    entries of an op:
 *
 *        static dt_tensor *f_add(dt_graph *g, dt_param **in, void *ctx) {
 *            (void)ctx;
 *            return dt_op_add(g, OPH_T(in, 0), OPH_T(in, 1));
 *        }
 *
 * 2. Write a reference in double, from the definition of the op, never from
 *    the code under test. It reads the same inputs (values as float) and the
 *    same ctx and writes every output element:
 *
 *        static void r_add(dt_param **in, void *ctx, double *y) {
 *            (void)ctx;
 *            for (int64_t i = 0; i < in[0]->value.numel; i++)
 *                y[i] = (double)OPH_V(in, 0)[i] + OPH_V(in, 1)[i];
 *        }
 *
 * 3. Add entries to the table. Each entry is its own cmocka test, named by
 *    .name (ctest prints "[  FAILED  ] add 2x3x5"; the failure message says
 *    which check: "add 2x3x5: values: ..."):
 *
 *        static const oph_entry table[] = {
 *            {.name = "add 2x3x5", .op = "add", .fn = f_add, .n_in = 2,
 *             .in = {{"a", 3, {2, 3, 5}, 1}, {"b", 3, {2, 3, 5}, 2}},
 *             .ref = r_add, .exact = 1, .out = OPH_SHAPE(3, 2, 3, 5), .grad = 1},
 *            {.name = "add twice", .op = "add", .fn = f_add, .n_in = 2,
 *             .in = {{"a", 2, {3, 4}, 71}, {"b", 2, {3, 4}, 72}}, .twice = 1},
 *            {.name = "add bad: [2, 3] + [3, 2]", .op = "add", .fn = f_add, .n_in = 2,
 *             .in = {{"a", 2, {2, 3}, 1}, {"b", 2, {3, 2}, 1}}, .error = ""},
 *        };
 *        int main(void) { return oph_run_group("ops_add", table, OPH_LEN(table), NULL, 0, NULL); }
 *
 * WHAT AN ENTRY CHECKS, in this order (each check that applies):
 *   error   (.error != NULL) the builder returns NULL, dt_error_code() is
 *           DT_EINVAL and the message names .op and contains .error ("" for
 *           no extra needle). Nothing else runs for an error entry.
 *   forward the builder returns a tensor, under grad on and grad off; its
 *           shape is .out when .out is set.
 *   values  (.ref) every output element y within |y - ref| <= atol +
 *           rtol * |ref| of the reference, under grad on and grad off; with
 *           .exact, y equals the reference rounded to float (for ops that
 *           round once or not at all: add, max, gathers). NaN never passes.
 *           Then .check_values, if set, for extra properties of this output
 *           (row sums, views, endpoints).
 *   grad    (.grad) dt_gradcheck (tests/common/gradcheck.h) over every input
 *           with the options .gc (zero fields: gradcheck's defaults). Inputs
 *           declared .frozen are skipped by it; an entry with an OPH_NULL
 *           input cannot have .grad or .twice. Then .check_grad, if set,
 *           reads the analytic gradients gradcheck left in the params.
 *   twice   (.twice) gradcheck of fn(inputs) + fn(inputs): every input is
 *           used twice, so a backward that overwrites instead of
 *           accumulating (+=) fails (gradcheck seed 99, default tolerances).
 *
 * INPUTS: oph_input {name, ndim, {shape}, seed, scale}, e.g. {"x", 2, {3, 7},
 * 4, 2.0f}: a [3, 7] input with values N(0, 2^2) from seed 4 (scale left
 * out or 0 means 1). .prep, if set, edits the values afterwards
 * (a large-mean row, keeping relu's inputs away from the kink, distinct
 * values for max-pooling, gamma around 1). .frozen: requires_grad = 0.
 * .null: the builder gets NULL for this input (bad-input entries).
 *
 * Cases that are not "one op call against a reference" (statistics,
 * running buffers, bitwise equality with another path, accumulation over
 * steps) are ordinary cmocka tests in the same file, built from the helpers
 * at the end of this header, and passed to OPH_RUN as its extra tests. */
#ifndef DT_TEST_OP_HARNESS_H
#define DT_TEST_OP_HARNESS_H
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include "dtrain/ops.h"
#include "gradcheck.h"

#define OPH_MAX_IN 6
#define OPH_MAX_DIM 4

typedef struct oph_input {
    const char *name;
    int ndim;
    int64_t shape[OPH_MAX_DIM];
    uint64_t seed;   /* values N(0, scale) from this seed */
    float scale;     /* 0 means 1 */
    int frozen;      /* requires_grad = 0: no gradient, gradcheck skips it */
    int null;        /* the builder gets NULL (bad-input entries) */
} oph_input;

#define OPH_NULL {.name = "null", .null = 1}

typedef struct oph_shape { int set, ndim; int64_t dims[OPH_MAX_DIM]; } oph_shape;
/* OPH_SHAPE(ndim, dims...): the expected output shape; OPH_SCALAR for ndim 0. */
#define OPH_SHAPE(nd, ...) {.set = 1, .ndim = nd, .dims = {__VA_ARGS__}}
#define OPH_SCALAR {.set = 1, .ndim = 0}

typedef struct oph_entry oph_entry;
typedef void (*oph_ref_fn)(dt_param **in, void *ctx, double *y);
typedef void (*oph_prep_fn)(dt_param **in, void *ctx);
typedef void (*oph_check_fn)(const oph_entry *e, dt_param **in, const dt_tensor *y);

struct oph_entry {
    const char *name;      /* unique; what ctest prints for this test */
    const char *op;        /* the op's name as its error messages spell it */
    dt_gc_fn fn;           /* the builder: out = op(inputs) */
    void *ctx;             /* handed to fn, ref, prep */
    int n_in;
    oph_input in[OPH_MAX_IN];
    oph_prep_fn prep;      /* optional: edit input values after the fill */
    oph_shape out;         /* expected output shape (unset: not checked) */
    /* values */
    oph_ref_fn ref;        /* double-precision reference, or NULL */
    double atol, rtol;     /* |y - ref| <= atol + rtol * |ref| */
    int exact;             /* instead: y == (float)ref (one rounding: add, max, copies) */
    oph_check_fn check_values;   /* optional, after values (y: the output) */
    /* gradients */
    int grad;              /* run dt_gradcheck with .gc */
    dt_gc_opts gc;
    oph_check_fn check_grad;     /* optional, after gradcheck (y: NULL) */
    int twice;             /* gradcheck of fn + fn: accumulation */
    /* bad input */
    const char *error;     /* non-NULL: expect DT_EINVAL naming .op and this */
};

/* Input i's tensor (NULL for an OPH_NULL input or i >= n) and its values. */
#define OPH_T(in, i) ((in)[i] ? &(in)[i]->value : NULL)
#define OPH_V(in, i) ((const float *)(in)[i]->value.data)

/* Run a table (and extra ordinary cmocka tests, may be NULL/0) as one group;
 * setup (may be NULL) runs once before the group. Returns the failure count. */
int oph_run_group(const char *group, const oph_entry *table, size_t n, const struct CMUnitTest *extra,
                  size_t n_extra, CMFixtureFunction setup);
#define OPH_LEN(a) (sizeof(a) / sizeof((a)[0]))
/* A table and an array of extra tests (use oph_run_group for none). */
#define OPH_RUN(group, table, extra) oph_run_group(group, table, OPH_LEN(table), extra, OPH_LEN(extra), NULL)

/* ---- helpers for the tests that are not table entries ---- */

/* dt_param with N(0, scale) values. */
void oph_param(dt_param *p, const char *name, int ndim, const int64_t *shape, uint64_t seed, float scale);
/* Max |a[i] - b[i]| over n (NaN counts as infinite). */
double oph_max_diff(const float *a, const float *b, int64_t n);
void oph_assert_shape(const dt_tensor *t, int ndim, const int64_t *shape);
/* r is NULL, dt_error_code() is DT_EINVAL and the message names op and
 * contains needle (NULL or "": none); clears the error. */
void oph_expect_error(const dt_tensor *r, const char *op, const char *needle);
/* L = sum(x * R) recorded on g (R must outlive the backward). */
dt_tensor *oph_wsum(dt_graph *g, dt_tensor *x, const float *R);
/* Run f under a grad-enabled graph, backward from sum(out), leaving
 * gradients in the params (not zeroed first). */
void oph_backward_sum(dt_gc_fn f, void *ctx, dt_param **in);
/* dt_gradcheck of f(in) + f(in) (seed 99): gradients must accumulate. */
int oph_gradcheck_twice(dt_gc_fn f, void *ctx, dt_param **in, int n_in);
/* v[i] = shift + scale * N(0, 1) from seed, with a signed zero every
 * zero_every elements from index 5 (0: none). */
void oph_fill(float *v, int64_t n, uint64_t seed, float scale, float shift, int zero_every);
/* A malloc'd copy of n floats (n may be 0). */
float *oph_dup(const float *v, int64_t n);
/* A dt_graph_defer_weights predicate: p is set[0] or set[1] (user = set). */
int oph_defer_pair(const dt_param *p, void *user);
/* fail_msg unless a and b hold the same n floats bit for bit. */
void oph_expect_bits(const float *a, const float *b, int64_t n, const char *what, const char *which);
#endif
