/* Finite-difference gradient checks for ops.
 *
 * The op under test is wrapped in a function building out = f(inputs). The
 * check forms L = sum(out * R) for a fixed random R, back-propagates, and
 * compares every input gradient with the central difference
 * (L(x+eps) - L(x-eps)) / 2eps, where L is summed in double from the forward
 * output. Inputs are dt_params so their gradients outlive the graph. */
#ifndef DT_TEST_GRADCHECK_H
#define DT_TEST_GRADCHECK_H
#include "dtrain/autograd.h"

typedef dt_tensor *(*dt_gc_fn)(dt_graph *g, dt_param **in, void *ctx);

typedef struct dt_gc_opts {
    double eps;      /* perturbation, default 1e-2 */
    double rtol;     /* default 2e-2 */
    double atol;     /* default 2e-3 */
    uint64_t seed;   /* for R */
    int max_checks;  /* per input, 0 = every element (else a strided subset) */
} dt_gc_opts;

/* Returns 0 on success; on failure prints the worst element and returns 1. */
int dt_gradcheck(dt_gc_fn f, void *ctx, dt_param **in, int n_in, const dt_gc_opts *opts);
/* Fill a param's value with N(0, scale) (seeded). */
void dt_gc_fill(dt_param *p, uint64_t seed, float scale);
#endif
