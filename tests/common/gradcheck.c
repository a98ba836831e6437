#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "gradcheck.h"

void dt_gc_fill(dt_param *p, uint64_t seed, float scale) {
    dt_rng r;
    dt_rng_seed(&r, seed);
    float *x = dt_f32(&p->value);
    for (int64_t i = 0; i < p->value.numel; i++) x[i] = scale * dt_rng_normal(&r);
}

/* L = sum(out * R): differentiable reduction to a scalar, recorded on the tape. */
static void wsum_backward(dt_graph *g, dt_node *n) {
    float *dx = dt_grad_of(g, n->in[0]);
    const float *R = n->saved;
    float dl = dt_f32(n->out->grad)[0];
    if (dx) for (int64_t i = 0; i < n->in[0]->numel; i++) dx[i] += dl * R[i];
}

static dt_tensor *wsum(dt_graph *g, dt_tensor *x, const float *R, double *ld) {
    dt_tensor *out = dt_graph_tensor(g, 0, NULL);
    double s = 0;
    for (int64_t i = 0; i < x->numel; i++) s += (double)dt_f32(x)[i] * R[i];
    dt_f32(out)[0] = (float)s;
    if (ld) *ld = s;
    dt_node *n = dt_graph_record(g, "wsum", wsum_backward, out, 1, &x);
    if (n) n->saved = (void *)R;
    return out;
}

static int eval(dt_gc_fn f, void *ctx, dt_param **in, const float *R, double *L) {
    dt_graph *g = dt_graph_create();
    dt_graph_set_grad_enabled(g, 0);
    dt_tensor *out = f(g, in, ctx);
    if (!out) { fprintf(stderr, "gradcheck: forward failed: %s\n", dt_error_message()); dt_graph_free(g); return 1; }
    wsum(g, out, R, L);
    dt_graph_free(g);
    return 0;
}

int dt_gradcheck(dt_gc_fn f, void *ctx, dt_param **in, int n_in, const dt_gc_opts *o) {
    double eps = o && o->eps > 0 ? o->eps : 1e-2;
    double rtol = o && o->rtol > 0 ? o->rtol : 2e-2;
    double atol = o && o->atol > 0 ? o->atol : 2e-3;
    int max_checks = o ? o->max_checks : 0;
    /* analytic */
    dt_graph *g = dt_graph_create();
    for (int i = 0; i < n_in; i++) memset(in[i]->grad.data, 0, (size_t)in[i]->grad.numel * 4);
    dt_tensor *out = f(g, in, ctx);
    if (!out) { fprintf(stderr, "gradcheck: forward failed: %s\n", dt_error_message()); dt_graph_free(g); return 1; }
    float *R = malloc((size_t)out->numel * sizeof *R);
    dt_rng r;
    dt_rng_seed(&r, o ? o->seed + 17 : 17);
    for (int64_t i = 0; i < out->numel; i++) R[i] = dt_rng_uniform(&r) * 2.f - 1.f;
    dt_tensor *L = wsum(g, out, R, NULL);
    if (dt_graph_backward(g, L) != DT_OK) {
        fprintf(stderr, "gradcheck: backward failed: %s\n", dt_error_message());
        dt_graph_free(g); free(R); return 1;
    }
    dt_graph_free(g);
    int fails = 0;
    for (int k = 0; k < n_in; k++) {
        dt_param *p = in[k];
        if (!p->requires_grad) continue;
        float *x = dt_f32(&p->value), *ga = dt_f32(&p->grad);
        int64_t n = p->value.numel, stride = 1;
        if (max_checks > 0 && n > max_checks) stride = n / max_checks;
        double worst = 0;
        int64_t worst_i = -1;
        double worst_a = 0, worst_n = 0;
        for (int64_t i = 0; i < n; i += stride) {
            float x0 = x[i];
            double lp, lm;
            x[i] = (float)(x0 + eps);
            double ep = (double)x[i] - x0;
            if (eval(f, ctx, in, R, &lp)) { free(R); return 1; }
            x[i] = (float)(x0 - eps);
            double em = x0 - (double)x[i];
            if (eval(f, ctx, in, R, &lm)) { free(R); return 1; }
            x[i] = x0;
            double num = (lp - lm) / (ep + em), ana = ga[i];
            double err = fabs(num - ana) / (atol + rtol * fmax(fabs(num), fabs(ana)));
            if (err > worst) { worst = err; worst_i = i; worst_a = ana; worst_n = num; }
        }
        if (worst > 1.0) {
            fprintf(stderr, "gradcheck: input %d (%s) element %lld: analytic %.6g vs numeric %.6g\n",
                    k, p->name, (long long)worst_i, worst_a, worst_n);
            fails++;
        }
    }
    free(R);
    return fails ? 1 : 0;
}
