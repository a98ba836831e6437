/* Batch normalisation over x[N, C, S...] (ndim 2, 3 or 4; S = product of the
 * trailing dims, 1 for ndim 2). Statistics are per channel c over the M = N*S
 * values x[n, c, s].
 *
 *   batch-stat mode (training, or no running buffers given):
 *     mean = sum/M, var = sum (x - mean)^2 / M (biased, used to normalise;
 *     two passes: sumsq/M - mean^2 cancels when |mean| >> std)
 *     training also updates running_mean/var (PyTorch semantics; not again
 *     when a recompute replays the forward):
 *       running_mean = (1-m)*running_mean + m*mean
 *       running_var  = (1-m)*running_var  + m*var*M/(M-1)   (unbiased)
 *   eval mode (not training, running buffers given): mean/var = running stats,
 *     nothing is updated and the backward is the plain per-channel affine map.
 *   y = gamma * (x - mean) * invstd + beta,  invstd = 1/sqrt(var + eps)
 *   (gamma / beta may be NULL: 1 / 0).
 *
 * SyncBatchNorm (sync && sync->fn, batch-stat mode only). Exactly three
 * exchanges per step:
 *   forward:  C values sum_c x (local sums), *count = local M on input; the
 *             fn replaces them by their sums over ranks and *count by the
 *             global M; then C values sum_c (x - mean_c)^2 around the global
 *             mean (*count 0: not used).
 *   backward: 2C values in two halves (below).
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
    /* backward re-normalises x with the exact statistics (batch or running):
     * under dt_graph_pack16 a bf16 x is off by up to 2^-9 |x|, which dwarfs
     * x - mean when a channel's mean dwarfs its spread */
    dt_graph_saved_keep_exact(g, xd, x->numel);

    double count = (double)(N * S);
    if (batch_stats) {
        /* Two passes (sync: two exchanges): buf[c] = sum x -> the mean, then
         * buf[C + c] = sum (x - mean)^2. One pass of sum x^2 - M mean^2
         * cancels when the mean is large against the spread (mean 5000,
         * std 1: a variance of 0 and outputs 330 times too large). */
        #pragma omp parallel for schedule(static)
        for (int64_t c = 0; c < C; c++) {
            double s1 = 0;
            for (int64_t i = 0; i < N; i++) {
                const float *xr = xd + (i * C + c) * S;
                #pragma omp simd reduction(+ : s1)   /* double lanes, fixed order: deterministic */
                for (int64_t s = 0; s < S; s++) s1 += xr[s];
            }
            buf[c] = (float)s1;
        }
        if (use_sync && bn_run_sync(sync, buf, C, &count, "[sum x]") != DT_OK) return NULL;
        if (use_sync && (!(count >= 1.0) || !isfinite(count))) {
            DT_ERR(DT_ECOMM, "batchnorm: SyncBatchNorm returned a bad global count %g (x%s)", count, sx);
            return NULL;
        }
        for (int64_t c = 0; c < C; c++) mean[c] = (float)(buf[c] / count);   /* (the same on every rank) */
        #pragma omp parallel for schedule(static)
        for (int64_t c = 0; c < C; c++) {
            double s2 = 0;
            const double mu = mean[c];
            for (int64_t i = 0; i < N; i++) {
                const float *xr = xd + (i * C + c) * S;
                #pragma omp simd reduction(+ : s2)
                for (int64_t s = 0; s < S; s++) { double d = (double)xr[s] - mu; s2 += d * d; }
            }
            buf[C + c] = (float)s2;
        }
        double again = 0;   /* (the count is known: the exchange sums this one) */
        if (use_sync && bn_run_sync(sync, buf + C, C, &again, "[sum (x - mean)^2]") != DT_OK) return NULL;
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
            double mu = mean[c];
            double var = buf[C + c] / count;   /* (>= 0: a sum of squares) */
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
