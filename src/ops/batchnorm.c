/* Batch normalisation over x[N, C, S...] (ndim 2, 3 or 4; S = product of the
 * trailing dims, 1 for ndim 2). Statistics are per channel c over the M = N*S
 * values x[n, c, s].
 *
 *   batch-stat mode (training, or no running buffers given):
 *     mean = sum/M, var = sumsq/M - mean^2 (biased, used to normalise)
 *     training also updates running_mean/var (PyTorch semantics; not again
 *     when a recompute replays the forward):
 *       running_mean = (1-m)*running_mean + m*mean
 *       running_var  = (1-m)*running_var  + m*var*M/(M-1)   (unbiased)
 *   eval mode (not training, running buffers given): mean/var = running stats,
 *     nothing is updated and the backward is the plain per-channel affine map.
 *   y = gamma * (x - mean) * invstd + beta,  invstd = 1/sqrt(var + eps)
 *   (gamma / beta may be NULL: 1 / 0).
 *
 * SyncBatchNorm (sync && sync->fn, batch-stat mode only). Exactly two
 * exchanges per step, both float arrays of 2C values laid out as two halves:
 *   forward:  buf[c] = sum_c x,   buf[C + c] = sum_c x^2     (local sums)
 *             *count = local M on input; the fn replaces buf by its sum over
 *             ranks and *count by the global M.
 *   backward: buf[c] = sum_c dy,  buf[C + c] = sum_c dy*xhat (local sums)
 *             (*count = local M on input; the output is not used: the global M
 *             saved by the forward is.) Only done when x needs a gradient,
 *             which is the same on every rank running the same model.
 * The local sums are accumulated in double and rounded to float whether or not
 * a sync fn is given, so one rank with an identity sync fn gives bit-identical
 * results to the plain path. gamma/beta gradients use the LOCAL sums
 * (sum dy*xhat, sum dy): data parallelism reduces parameter gradients itself.
 * The dx formula uses the global sums and global M:
 *   dx = gamma*invstd * (dy - sum_dy/M - xhat * sum_dy_xhat/M).
 * The sync struct is copied; its `user` must stay valid until backward. */
#include <math.h>
#include <stdio.h>
#include "dtrain/ops.h"

typedef struct bn_saved {
    float *mean, *invstd;   /* [C]: statistics actually used to normalise */
    double count;           /* global M (batch-stat mode) */
    int batch_stats;        /* 1: batch statistics (full backward); 0: running stats (affine backward) */
    int64_t N, C, S;
    dt_bn_sync sync;        /* fn == NULL: no sync */
} bn_saved;

static dt_status bn_run_sync(const dt_bn_sync *sync, float *buf, int64_t n, double *count, const char *what) {
    dt_status st = sync->fn(buf, n, count, sync->user);
    if (st == DT_OK) return DT_OK;
    char prev[512];
    snprintf(prev, sizeof prev, "%s", dt_error_message());
    return DT_ERR(st, "batchnorm: SyncBatchNorm all-reduce of %s failed: %s", what,
                  prev[0] ? prev : dt_status_name(st));
}

/* Shape checks for an optional per-channel vector. */
static int bn_bad_vec(const dt_tensor *t, int64_t C) {
    return t && (t->dtype != DT_F32 || !t->data || t->ndim != 1 || t->shape[0] != C);
}

static void batchnorm_backward(dt_graph *g, dt_node *n) {
    const bn_saved *sv = n->saved;
    dt_tensor *x = n->in[0], *gamma = n->in[1], *beta = n->in[2];
    float *dx = dt_grad_of(g, x);
    float *dgamma = dt_grad_of(g, gamma);
    float *dbeta = dt_grad_of(g, beta);
    const int64_t N = sv->N, C = sv->C, S = sv->S;
    const float *xd = dt_f32(x), *dy = dt_f32(n->out->grad);
    const float *gd = gamma ? dt_f32(gamma) : NULL;

    /* buf[c] = sum dy, buf[C + c] = sum dy*xhat over the local N*S values of channel c */
    float *buf = dt_graph_scratch(g, (size_t)(2 * C) * sizeof(float));
    if (!buf) return;
    #pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < C; c++) {
        const double mu = sv->mean[c], is = sv->invstd[c];
        double sdy = 0, sdyx = 0;
        for (int64_t i = 0; i < N; i++) {
            const float *xr = xd + (i * C + c) * S, *gr = dy + (i * C + c) * S;
            /* vector lanes of double partial sums: a fixed order for a given S, so deterministic */
            #pragma omp simd reduction(+ : sdy, sdyx)
            for (int64_t s = 0; s < S; s++) {
                sdy += gr[s];
                sdyx += gr[s] * ((xr[s] - mu) * is);
            }
        }
        buf[c] = (float)sdy;
        buf[C + c] = (float)sdyx;
    }
    if (dgamma) for (int64_t c = 0; c < C; c++) dgamma[c] += buf[C + c];
    if (dbeta) for (int64_t c = 0; c < C; c++) dbeta[c] += buf[c];
    if (!dx) return;

    if (!sv->batch_stats) {   /* eval: y = gamma*invstd*x + const */
        #pragma omp parallel for schedule(static)
        for (int64_t r = 0; r < N * C; r++) {
            int64_t c = r % C;
            const float a = (gd ? gd[c] : 1.f) * sv->invstd[c];
            const float *gr = dy + r * S;
            float *d = dx + r * S;
            for (int64_t s = 0; s < S; s++) d[s] += a * gr[s];
        }
        return;
    }
    if (sv->sync.fn) {
        double cnt = (double)(N * S);
        if (bn_run_sync(&sv->sync, buf, 2 * C, &cnt, "[sum dy, sum dy*xhat]") != DT_OK) return;
    }
    const double M = sv->count;
    #pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < N * C; r++) {
        int64_t c = r % C;
        const float mu = sv->mean[c], is = sv->invstd[c];
        const float a = (gd ? gd[c] : 1.f) * is;
        const float mdy = (float)(buf[c] / M), mdyx = (float)(buf[C + c] / M);
        const float *xr = xd + r * S, *gr = dy + r * S;
        float *d = dx + r * S;
        for (int64_t s = 0; s < S; s++) {
            float xhat = (xr[s] - mu) * is;
            d[s] += a * (gr[s] - mdy - xhat * mdyx);
        }
    }
}

dt_tensor *dt_op_batchnorm(dt_graph *g, dt_tensor *x, dt_tensor *gamma, dt_tensor *beta,
                           dt_tensor *running_mean, dt_tensor *running_var,
                           float momentum, float eps, const dt_bn_sync *sync) {
    char sx[64];
    if (!g || !x) { DT_ERR(DT_EINVAL, "batchnorm: graph and x are required"); return NULL; }
    dt_shape_str(x, sx, sizeof sx);
    if (x->dtype != DT_F32 || !x->data) { DT_ERR(DT_EINVAL, "batchnorm: x%s must be an F32 tensor with data", sx); return NULL; }
    if (x->ndim < 2 || x->ndim > 4) { DT_ERR(DT_EINVAL, "batchnorm: need x[N, C, S...] with 2..4 dims, got %s", sx); return NULL; }
    const int64_t N = x->shape[0], C = x->shape[1], S = x->ndim > 2 && N > 0 && C > 0 ? x->numel / (N * C) : 1;
    if (x->numel == 0) { DT_ERR(DT_EINVAL, "batchnorm: empty input x%s", sx); return NULL; }
    const char *bad = bn_bad_vec(gamma, C) ? "gamma" : bn_bad_vec(beta, C) ? "beta"
                    : bn_bad_vec(running_mean, C) ? "running_mean" : bn_bad_vec(running_var, C) ? "running_var" : NULL;
    if (bad) { DT_ERR(DT_EINVAL, "batchnorm: %s must be an F32 [%lld] tensor for x%s", bad, (long long)C, sx); return NULL; }
    if (!running_mean != !running_var) {
        DT_ERR(DT_EINVAL, "batchnorm: give both running_mean and running_var or neither (x%s)", sx);
        return NULL;
    }
    if (!(momentum >= 0.f && momentum <= 1.f) || !(eps >= 0.f) || !isfinite(eps)) {
        DT_ERR(DT_EINVAL, "batchnorm: momentum %g must be in [0, 1] and eps %g >= 0 (x%s)", momentum, eps, sx);
        return NULL;
    }
    const int training = dt_graph_training(g);
    const int batch_stats = training || !running_mean;
    const int use_sync = batch_stats && sync && sync->fn;

    int64_t shape[DT_MAX_DIMS];
    for (int i = 0; i < x->ndim; i++) shape[i] = x->shape[i];
    dt_tensor *y = dt_graph_tensor(g, x->ndim, shape);
    bn_saved *sv = dt_graph_scratch(g, sizeof *sv);
    float *mean = dt_graph_scratch(g, (size_t)C * sizeof(float));
    float *invstd = dt_graph_scratch(g, (size_t)C * sizeof(float));
    float *buf = dt_graph_scratch(g, (size_t)(2 * C) * sizeof(float));
    if (!y || !sv || !mean || !invstd || !buf) return NULL;
    const float *xd = dt_f32(x);

    double count = (double)(N * S);
    if (batch_stats) {
        /* buf[c] = sum x, buf[C + c] = sum x^2 over the local values of channel c */
        #pragma omp parallel for schedule(static)
        for (int64_t c = 0; c < C; c++) {
            double s1 = 0, s2 = 0;
            for (int64_t i = 0; i < N; i++) {
                const float *xr = xd + (i * C + c) * S;
                #pragma omp simd reduction(+ : s1, s2)   /* double lanes, fixed order: deterministic */
                for (int64_t s = 0; s < S; s++) { double v = xr[s]; s1 += v; s2 += v * v; }
            }
            buf[c] = (float)s1;
            buf[C + c] = (float)s2;
        }
        if (use_sync) {
            if (bn_run_sync(sync, buf, 2 * C, &count, "[sum x, sum x^2]") != DT_OK) return NULL;
            if (!(count >= 1.0) || !isfinite(count)) {
                DT_ERR(DT_ECOMM, "batchnorm: SyncBatchNorm returned a bad global count %g (x%s)", count, sx);
                return NULL;
            }
        }
        if (training && count < 2.0) {
            DT_ERR(DT_EINVAL, "batchnorm: training needs more than one value per channel, x%s has %g", sx, count);
            return NULL;
        }
        /* a recompute replay (dt_graph_checkpoint) re-runs a forward that
         * already updated them: update once */
        int update = running_mean && training && !dt_graph_recomputing(g);
        float *rm = update ? dt_f32(running_mean) : NULL;
        float *rv = update ? dt_f32(running_var) : NULL;
        for (int64_t c = 0; c < C; c++) {
            double mu = buf[c] / count;
            double var = buf[C + c] / count - mu * mu;
            if (var < 0) var = 0;   /* rounding in sumsq/M - mean^2 */
            mean[c] = (float)mu;
            invstd[c] = (float)(1.0 / sqrt(var + (double)eps));
            if (rm) {
                rm[c] = (float)((1.0 - momentum) * rm[c] + (double)momentum * mu);
                rv[c] = (float)((1.0 - momentum) * rv[c] + (double)momentum * var * count / (count - 1.0));
            }
        }
    } else {
        const float *rm = dt_f32(running_mean), *rv = dt_f32(running_var);
        for (int64_t c = 0; c < C; c++) {
            mean[c] = rm[c];
            invstd[c] = (float)(1.0 / sqrt((double)rv[c] + (double)eps));
        }
    }

    /* y = gamma_c * xhat + beta_c, xhat = (x - mean_c)*invstd_c (same float expression as backward) */
    const float *gd = gamma ? dt_f32(gamma) : NULL, *bd = beta ? dt_f32(beta) : NULL;
    float *yd = dt_f32(y);
    #pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < N * C; r++) {
        int64_t c = r % C;
        const float mu = mean[c], is = invstd[c];
        const float ga = gd ? gd[c] : 1.f, be = bd ? bd[c] : 0.f;
        const float *xr = xd + r * S;
        float *yr = yd + r * S;
        for (int64_t s = 0; s < S; s++) yr[s] = ga * ((xr[s] - mu) * is) + be;
    }

    dt_tensor *in[3] = {x, gamma, beta};
    dt_node *n = dt_graph_record(g, "batchnorm", batchnorm_backward, y, 3, in);
    if (n) {
        *sv = (bn_saved){.mean = mean, .invstd = invstd, .count = count, .batch_stats = batch_stats,
                         .N = N, .C = C, .S = S};
        if (use_sync) sv->sync = *sync;
        n->saved = sv;
    }
    return y;
}
