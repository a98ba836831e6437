/* Max pooling, square window k, stride s, no padding.
 *
 *   x[N, C, H, W] -> y[N, C, OH, OW], OH = (H - k) / s + 1 (floor: trailing
 *   rows/cols a window does not reach are ignored), OW likewise.
 *
 * Forward saves, per output element, the flat index (ih*W + iw) of the winning
 * input inside its (n, c) plane (int32). On ties the first in row-major window
 * order wins. Backward scatters dy to those indices; windows may overlap when
 * s < k, so each (n, c) plane is handled by one thread. */
#include <stdint.h>
#include "dtrain/ops.h"

static void maxpool2d_backward(dt_graph *g, dt_node *n) {
    float *dx = dt_grad_of(g, n->in[0]);
    if (!dx) return;
    const dt_tensor *x = n->in[0], *y = n->out;
    const int64_t planes = x->shape[0] * x->shape[1];
    const int64_t HW = x->shape[2] * x->shape[3], OP = y->shape[2] * y->shape[3];
    const float *dy = dt_f32(y->grad);
    const int32_t *arg = n->saved;
    #pragma omp parallel for schedule(static)
    for (int64_t pl = 0; pl < planes; pl++) {
        float *d = dx + pl * HW;
        const float *gy = dy + pl * OP;
        const int32_t *a = arg + pl * OP;
        for (int64_t o = 0; o < OP; o++) d[a[o]] += gy[o];
    }
}

dt_tensor *dt_op_maxpool2d(dt_graph *g, dt_tensor *x, int k, int s) {
    char sx[64];
    if (!g || !x) { DT_ERR(DT_EINVAL, "maxpool2d: graph and x are required"); return NULL; }
    dt_shape_str(x, sx, sizeof sx);
    if (x->dtype != DT_F32 || !x->data) {
        DT_ERR(DT_EINVAL, "maxpool2d: x%s must be an F32 tensor with data", sx);
        return NULL;
    }
    if (x->ndim != 4) { DT_ERR(DT_EINVAL, "maxpool2d: need x[N, C, H, W], got %s", sx); return NULL; }
    if (k < 1 || s < 1) { DT_ERR(DT_EINVAL, "maxpool2d: window %d and stride %d must be >= 1 (x%s)", k, s, sx); return NULL; }
    const int64_t N = x->shape[0], C = x->shape[1], H = x->shape[2], W = x->shape[3];
    if (H < k || W < k) {
        DT_ERR(DT_EINVAL, "maxpool2d: window %d larger than the %lldx%lld input x%s", k, (long long)H, (long long)W, sx);
        return NULL;
    }
    if (H * W > INT32_MAX) { DT_ERR(DT_EINVAL, "maxpool2d: plane of x%s too large", sx); return NULL; }
    const int64_t OH = (H - k) / s + 1, OW = (W - k) / s + 1, OP = OH * OW, planes = N * C;

    int64_t oshape[4] = {N, C, OH, OW};
    dt_tensor *y = dt_graph_tensor(g, 4, oshape);
    if (!y) return NULL;
    /* argmax is only needed for backward, but whether a node gets recorded is
     * known only after the output exists; allocate it when grad could flow. */
    int32_t *arg = NULL;
    if (dt_graph_grad_enabled(g) && x->requires_grad) {
        arg = dt_graph_scratch(g, (size_t)(planes * OP) * sizeof *arg);
        if (!arg) return NULL;
    }
    const float *xd = dt_f32(x);
    float *yd = dt_f32(y);
    #pragma omp parallel for schedule(static)
    for (int64_t pl = 0; pl < planes; pl++) {
        const float *xp = xd + pl * H * W;
        float *yp = yd + pl * OP;
        int32_t *ap = arg ? arg + pl * OP : NULL;
        for (int64_t oh = 0; oh < OH; oh++)
            for (int64_t ow = 0; ow < OW; ow++) {
                int64_t best = oh * s * W + ow * s;
                float m = xp[best];
                for (int64_t i = 0; i < k; i++) {
                    const float *row = xp + (oh * s + i) * W + ow * s;
                    for (int64_t j = 0; j < k; j++)
                        if (row[j] > m) { m = row[j]; best = (oh * s + i) * W + ow * s + j; }
                }
                yp[oh * OW + ow] = m;
                if (ap) ap[oh * OW + ow] = (int32_t)best;
            }
    }
    dt_node *n = dt_graph_record(g, "maxpool2d", maxpool2d_backward, y, 1, &x);
    if (n) n->saved = arg;
    return y;
}
