/* 2-D convolution via im2col + one SGEMM per chunk of images.
 *
 *   x[N, C, H, W] * w[OC, C, KH, KW] (+ b[OC]) -> y[N, OC, OH, OW]
 *   OH = (H + 2*pad - KH) / stride + 1, OW likewise, P = OH*OW, K = C*KH*KW.
 *
 * A chunk of nb images is unrolled into col[K, nb*P] (row r = (c*KH + kh)*KW + kw,
 * column i*P + oh*OW + ow for image i of the chunk; zero where the window reads
 * padding). Then
 *   forward:  t[OC, nb*P]   = w[OC, K] . col              (then scattered to y[n, oc, p] + b)
 *   backward: dw[OC, K]    += dyT[OC, nb*P] . col^T
 *             dcol[K, nb*P] = w^T . dyT                    (then col2im += into dx)
 * Chunks are equal-sized with col about DT_CONV_COL_FLOATS floats (at least
 * one image), so arena use does not grow without bound with the batch, while
 * each GEMM stays wide (two-thread OpenBLAS loses a lot on narrow ones: the
 * CNN's 32->64 conv at batch 64 fits in 2 chunks). When the whole batch is
 * one chunk the forward's col is kept for backward (n->saved); otherwise
 * backward recomputes each chunk's col. SGEMM is always called outside
 * OpenMP regions so OpenBLAS can use every thread. */
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include "ops_internal.h"

#ifndef DT_CONV_COL_FLOATS
#define DT_CONV_COL_FLOATS ((int64_t)8 << 20)   /* 32 MiB of im2col per chunk */
#endif

typedef struct conv_geom {
    int64_t N, C, H, W, OC, KH, KW, OH, OW, P, K;
    int64_t stride, pad;
    int64_t nb;       /* images per chunk */
} conv_geom;

/* Smallest o >= 0 with o*s >= a (a may be negative). */
static int64_t ceil_div_pos(int64_t a, int64_t s) {
    return a <= 0 ? 0 : (a + s - 1) / s;
}

/* Output columns ow in [*lo, *hi) read input column iw = ow*s - pad + kw inside [0, W). */
static void valid_range(int64_t kw, int64_t W, int64_t OW, int64_t s, int64_t pad,
                        int64_t *lo, int64_t *hi) {
    int64_t l = ceil_div_pos(pad - kw, s);
    int64_t h = ceil_div_pos(W + pad - kw, s);
    if (l > OW) l = OW;
    if (h > OW) h = OW;
    if (h < l) h = l;
    *lo = l;
    *hi = h;
}

/* col[K, nb*P] <- images n0 .. n0+nb-1 of x. */
static void im2col(const conv_geom *G, const float *x, int64_t n0, int64_t nb, float *col) {
    const int64_t K = G->K, P = G->P, ld = nb * P;
    #pragma omp parallel for schedule(static)
    for (int64_t ri = 0; ri < K * nb; ri++) {
        int64_t r = ri / nb, i = ri % nb;
        int64_t kw = r % G->KW, kh = (r / G->KW) % G->KH, c = r / (G->KW * G->KH);
        int64_t lo, hi;
        valid_range(kw, G->W, G->OW, G->stride, G->pad, &lo, &hi);
        const float *xp = x + ((n0 + i) * G->C + c) * G->H * G->W;
        float *dst = col + r * ld + i * P;
        for (int64_t oh = 0; oh < G->OH; oh++) {
            float *d = dst + oh * G->OW;
            int64_t ih = oh * G->stride - G->pad + kh;
            if (ih < 0 || ih >= G->H) {
                memset(d, 0, (size_t)G->OW * sizeof *d);
                continue;
            }
            const float *xr = xp + ih * G->W;   /* d[ow] = xr[ow*s - pad + kw], in range for ow in [lo, hi) */
            for (int64_t ow = 0; ow < lo; ow++) d[ow] = 0.f;
            if (G->stride == 1)
                memcpy(d + lo, xr + lo - G->pad + kw, (size_t)(hi - lo) * sizeof *d);
            else
                for (int64_t ow = lo; ow < hi; ow++) d[ow] = xr[ow * G->stride - G->pad + kw];
            for (int64_t ow = hi; ow < G->OW; ow++) d[ow] = 0.f;
        }
    }
}

/* dx[n0 .. n0+nb-1] += col2im(dcol[K, nb*P]). Each (image, channel) plane of dx
 * is owned by one iteration, so the scatter-add has no races. */
static void col2im_add(const conv_geom *G, const float *dcol, int64_t n0, int64_t nb, float *dx) {
    const int64_t P = G->P, ld = nb * P;
    #pragma omp parallel for schedule(static)
    for (int64_t ic = 0; ic < nb * G->C; ic++) {
        int64_t i = ic / G->C, c = ic % G->C;
        float *dxp = dx + ((n0 + i) * G->C + c) * G->H * G->W;
        for (int64_t kh = 0; kh < G->KH; kh++)
            for (int64_t kw = 0; kw < G->KW; kw++) {
                int64_t r = (c * G->KH + kh) * G->KW + kw, lo, hi;
                valid_range(kw, G->W, G->OW, G->stride, G->pad, &lo, &hi);
                const float *src = dcol + r * ld + i * P;
                for (int64_t oh = 0; oh < G->OH; oh++) {
                    int64_t ih = oh * G->stride - G->pad + kh;
                    if (ih < 0 || ih >= G->H) continue;
                    float *d = dxp + ih * G->W;
                    const float *s = src + oh * G->OW;
                    for (int64_t ow = lo; ow < hi; ow++) d[ow * G->stride - G->pad + kw] += s[ow];
                }
            }
    }
}

/* Geometry of a recorded conv: shapes from the inputs, stride/pad/nb from n->i. */
static void geom_from_node(const dt_node *n, conv_geom *G) {
    const dt_tensor *x = n->in[0], *w = n->in[1];
    G->N = x->shape[0]; G->C = x->shape[1]; G->H = x->shape[2]; G->W = x->shape[3];
    G->OC = w->shape[0]; G->KH = w->shape[2]; G->KW = w->shape[3];
    G->stride = n->i[0]; G->pad = n->i[1]; G->nb = n->i[2];
    G->OH = (G->H + 2 * G->pad - G->KH) / G->stride + 1;
    G->OW = (G->W + 2 * G->pad - G->KW) / G->stride + 1;
    G->P = G->OH * G->OW;
    G->K = G->C * G->KH * G->KW;
}

void dt_ops_conv2d_bias_grad(float *db, const float *dy, int64_t N, int64_t OC, int64_t P) {
#pragma omp parallel for schedule(static)
    for (int64_t oc = 0; oc < OC; oc++) {
        double s = 0;
        for (int64_t i = 0; i < N; i++) {
            const float *r = dy + (i * OC + oc) * P;
            for (int64_t p = 0; p < P; p++) s += r[p];
        }
        db[oc] += (float)s;
    }
}

static void conv2d_backward(dt_graph *g, dt_node *n) {
    conv_geom G;
    geom_from_node(n, &G);
    dt_tensor *x = n->in[0], *w = n->in[1], *b = n->n_in > 2 ? n->in[2] : NULL;
    float *dx = dt_grad_of(g, x);
    float *dw = dt_grad_of(g, w);
    float *db = dt_grad_of(g, b);
    const float *dy = dt_f32(n->out->grad);
    const int64_t OC = G.OC, P = G.P, K = G.K;

    if (db) dt_ops_conv2d_bias_grad(db, dy, G.N, OC, P);
    if (!dx && !dw) return;

    /* one image per chunk: dy[n0] already is dyT[OC, P] */
    float *dyT = G.nb == 1 ? NULL : dt_graph_scratch(g, (size_t)(OC * G.nb * P) * sizeof(float));
    /* col: the forward's when it covered the whole batch, else recomputed per chunk */
    float *col = !dw ? NULL : n->saved ? n->saved : dt_graph_scratch(g, (size_t)(K * G.nb * P) * sizeof(float));
    float *dcol = dx ? dt_graph_scratch(g, (size_t)(K * G.nb * P) * sizeof(float)) : NULL;
    if ((G.nb > 1 && !dyT) || (dw && !col) || (dx && !dcol)) return;   /* DT_ENOMEM already set */

    for (int64_t n0 = 0; n0 < G.N; n0 += G.nb) {
        int64_t nb = G.N - n0 < G.nb ? G.N - n0 : G.nb, ld = nb * P;
        const float *dyc = dy + n0 * OC * P;
        if (G.nb > 1) {   /* dyT[oc, i*P + p] = dy[n0+i, oc, p] */
            #pragma omp parallel for schedule(static)
            for (int64_t io = 0; io < nb * OC; io++) {
                int64_t i = io / OC, oc = io % OC;
                memcpy(dyT + oc * ld + i * P, dy + ((n0 + i) * OC + oc) * P, (size_t)P * sizeof(float));
            }
            dyc = dyT;
        }
        if (dw) {
            if (!n->saved) im2col(&G, dt_f32(x), n0, nb, col);
            dt_ops_sgemm(0, 1, OC, K, ld, 1.0f, dyc, ld, col, ld, 1.0f, dw, K);
        }
        if (dx) {
            dt_ops_sgemm(1, 0, K, ld, OC, 1.0f, dt_f32(w), K, dyc, ld, 0.0f, dcol, ld);
            col2im_add(&G, dcol, n0, nb, dx);
        }
    }
}

static int bad_f32(const dt_tensor *t) { return t->dtype != DT_F32 || !t->data; }

dt_tensor *dt_op_conv2d(dt_graph *g, dt_tensor *x, dt_tensor *w, dt_tensor *b, int stride, int pad) {
    char sx[64], sw[64], sb[64];
    if (!g || !x || !w) { DT_ERR(DT_EINVAL, "conv2d: graph, x and w are required"); return NULL; }
    dt_shape_str(x, sx, sizeof sx);
    dt_shape_str(w, sw, sizeof sw);
    if (bad_f32(x) || bad_f32(w) || (b && bad_f32(b))) {
        DT_ERR(DT_EINVAL, "conv2d: x, w and b must be F32 tensors with data");
        return NULL;
    }
    if (x->ndim != 4 || w->ndim != 4) {
        DT_ERR(DT_EINVAL, "conv2d: need x[N, C, H, W] and w[OC, C, KH, KW], got x%s w%s", sx, sw);
        return NULL;
    }
    if (w->shape[1] != x->shape[1]) {
        DT_ERR(DT_EINVAL, "conv2d: channel mismatch: x%s has C=%lld but w%s expects %lld",
               sx, (long long)x->shape[1], sw, (long long)w->shape[1]);
        return NULL;
    }
    if (b && (b->ndim != 1 || b->shape[0] != w->shape[0])) {
        DT_ERR(DT_EINVAL, "conv2d: bias %s must be [%lld] for w%s",
               dt_shape_str(b, sb, sizeof sb), (long long)w->shape[0], sw);
        return NULL;
    }
    if (stride < 1 || pad < 0) {
        DT_ERR(DT_EINVAL, "conv2d: stride %d must be >= 1 and pad %d >= 0 (x%s w%s)", stride, pad, sx, sw);
        return NULL;
    }
    dt_tensor *y_dnnl;
    if (dt_conv2d_dnnl(g, x, w, b, stride, pad, &y_dnnl)) return y_dnnl;
    conv_geom G = {
        .N = x->shape[0], .C = x->shape[1], .H = x->shape[2], .W = x->shape[3],
        .OC = w->shape[0], .KH = w->shape[2], .KW = w->shape[3], .stride = stride, .pad = pad,
    };
    if (G.N < 1 || G.C < 1 || G.OC < 1 || G.KH < 1 || G.KW < 1 ||
        G.H + 2 * G.pad < G.KH || G.W + 2 * G.pad < G.KW) {
        DT_ERR(DT_EINVAL, "conv2d: kernel of w%s does not fit x%s with pad %d (or an empty dim)", sw, sx, pad);
        return NULL;
    }
    G.OH = (G.H + 2 * G.pad - G.KH) / G.stride + 1;
    G.OW = (G.W + 2 * G.pad - G.KW) / G.stride + 1;
    G.P = G.OH * G.OW;
    G.K = G.C * G.KH * G.KW;
    /* images per chunk: equal-sized chunks with col[K, nb*P] about DT_CONV_COL_FLOATS (>= one image) */
    int64_t per_img = G.K * G.P;
    int64_t nchunks = (G.N * per_img + DT_CONV_COL_FLOATS - 1) / DT_CONV_COL_FLOATS;
    if (nchunks < 1) nchunks = 1;
    if (nchunks > G.N) nchunks = G.N;
    G.nb = (G.N + nchunks - 1) / nchunks;
    if (G.K > INT_MAX || G.OC > INT_MAX || G.nb * G.P > INT_MAX) {
        DT_ERR(DT_EINVAL, "conv2d: x%s w%s too large for a 32-bit GEMM", sx, sw);
        return NULL;
    }

    int64_t oshape[4] = {G.N, G.OC, G.OH, G.OW};
    dt_tensor *y = dt_graph_tensor(g, 4, oshape);
    float *col = dt_graph_scratch(g, (size_t)(G.K * G.nb * G.P) * sizeof(float));
    float *tmp = G.nb > 1 ? dt_graph_scratch(g, (size_t)(G.OC * G.nb * G.P) * sizeof(float)) : NULL;
    if (!y || !col || (G.nb > 1 && !tmp)) return NULL;

    const float *wd = dt_f32(w), *bd = b ? dt_f32(b) : NULL;
    float *yd = dt_f32(y);
    for (int64_t n0 = 0; n0 < G.N; n0 += G.nb) {
        int64_t nb = G.N - n0 < G.nb ? G.N - n0 : G.nb, ld = nb * G.P;
        im2col(&G, dt_f32(x), n0, nb, col);
        /* one image: GEMM straight into y[n0] (its layout [OC, P] matches) */
        float *t = nb == 1 ? yd + n0 * G.OC * G.P : tmp;
        dt_ops_sgemm(0, 0, G.OC, ld, G.K, 1.0f, wd, G.K, col, ld, 0.0f, t, ld);
        if (nb == 1 && !bd) continue;
        /* y[n0+i, oc, p] = t[oc, i*P + p] + b[oc] */
        #pragma omp parallel for schedule(static)
        for (int64_t io = 0; io < nb * G.OC; io++) {
            int64_t i = io / G.OC, oc = io % G.OC;
            float *dst = yd + ((n0 + i) * G.OC + oc) * G.P;
            const float *src = t + oc * ld + i * G.P;
            float bias = bd ? bd[oc] : 0.f;
            for (int64_t p = 0; p < G.P; p++) dst[p] = src[p] + bias;
        }
    }

    dt_tensor *in[3] = {x, w, b};
    dt_node *n = dt_graph_record(g, "conv2d", conv2d_backward, y, b ? 3 : 2, in);
    if (n) {
        n->i[0] = G.stride;
        n->i[1] = G.pad;
        n->i[2] = G.nb;
        n->saved = G.nb >= G.N ? col : NULL;   /* col of the whole batch, still intact */
    }
    return y;
}
