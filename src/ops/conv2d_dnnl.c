/* 2-D convolution through oneDNN's primitives (the library PyTorch uses for
 * CPU convolutions): forward, backward-data and backward-weights.
 *
 *   x[N, C, H, W] * w[OC, C, KH, KW] (+ b[OC]) -> y[N, OC, OH, OW]   (NCHW / OIHW, as dt_op_conv2d)
 *
 * Tensors stay NCHW at the op's boundary; each primitive is created with
 * "any" memory formats so oneDNN picks its blocked layouts (nChw16c and
 * friends, where its JIT kernels run at GEMM speed), and reorders translate at
 * the boundary. The forward's reordered x is kept for backward-weights.
 *
 * Primitives are created once per geometry (creation costs milliseconds) and
 * cached for the life of the process. Ops run on one thread of the caller
 * (the cache is not locked); oneDNN parallelises inside with OpenMP, sharing
 * libgomp's pool with our loops and OpenBLAS.
 *
 * Backward accumulates (dx +=, dw +=, db +=) like every op: oneDNN writes its
 * results to arena scratch first.
 *
 * 16-bit precision (--precision fp16, and bf16 where the GEMMs compute bf16:
 * gemm_bf16.c): a convolution's products take 16-bit inputs with fp32
 * accumulation, as every matrix product's do (im2col's go through
 * dt_ops_sgemm). Here the fp32 primitives multiply inputs rounded to the
 * 16-bit type and widened back (x and w forward; dy and w for dx; x and dy
 * for dw): a product of two 16-bit values is exact in fp32, so these are
 * the 16-bit numerics, at fp32's speed plus a rounding pass. bf16, as for a
 * GEMM, only from 2^18 multiply-adds (N·OH·OW x OC x C·KH·KW). */
#include <oneapi/dnnl/dnnl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ops_internal.h"

typedef struct conv_key { int64_t N, C, H, W, OC, KH, KW, stride, pad; int bias; } conv_key;

/* One memory argument of a primitive: the layout it wants and, when that
 * differs from the plain one, the reorder that converts (to or from plain). */
typedef struct conv_arg {
    dnnl_memory_desc_t md;        /* the primitive's layout */
    dnnl_primitive_t reorder;     /* plain <-> md; NULL when md is plain */
    dnnl_memory_t mem, plain_mem; /* handles set per call */
} conv_arg;

typedef struct conv_prims {
    conv_key key;
    dnnl_primitive_t fwd, bwd_data, bwd_weights;
    conv_arg f_src, f_w, f_b, f_dst;             /* forward: src/w in, dst out */
    conv_arg d_ddst, d_w, d_dsrc;                /* backward data */
    conv_arg w_src, w_ddst, w_dw, w_db;          /* backward weights */
    dnnl_primitive_t src_to_wsrc;                /* f_src.md -> w_src.md when they differ */
    dnnl_memory_t wsrc_from;                     /* f_src.md handle for that reorder */
} conv_prims;

#define CONV_CACHE 32
static conv_prims g_cache[CONV_CACHE];
static int g_cached;
static dnnl_engine_t g_eng;
static dnnl_stream_t g_stream;
static int g_disabled = -1;   /* 1: im2col (dt_conv_set_backend, or DTRAIN_CONV=im2col); -1: not read yet */

static void backend_default(void) {
    if (g_disabled >= 0) return;
    const char *e = getenv("DTRAIN_CONV");
    g_disabled = e && !strcmp(e, "im2col");
}

dt_status dt_conv_set_backend(const char *name) {
    if (!name || (strcmp(name, "onednn") && strcmp(name, "im2col")))
        return DT_ERR(DT_EINVAL, "conv backend '%s': expected onednn or im2col", name ? name : "(null)");
    g_disabled = !strcmp(name, "im2col");
    return DT_OK;
}

const char *dt_conv_backend(void) {
    backend_default();
    if (g_disabled) return "im2col + GEMM";
    const dnnl_version_t *v = dnnl_version();
    static char name[64];
    snprintf(name, sizeof name, "oneDNN %d.%d.%d", v->major, v->minor, v->patch);
    return name;
}

static int plain_md(dnnl_memory_desc_t *md, int nd, const int64_t *dims, dnnl_format_tag_t tag) {
    dnnl_dims_t d;
    for (int i = 0; i < nd; i++) d[i] = dims[i];
    return dnnl_memory_desc_init_by_tag(md, nd, d, dnnl_f32, tag) != dnnl_success;
}

/* Fills a with pd's `what` layout; to_plain: the reorder goes md -> plain, else plain -> md. */
static int arg_init(conv_arg *a, const_dnnl_primitive_desc_t pd, dnnl_query_t what,
                    const dnnl_memory_desc_t *plain, int to_plain) {
    const dnnl_memory_desc_t *q = dnnl_primitive_desc_query_md(pd, what, 0);
    if (!q) return 1;
    a->md = *q;
    if (dnnl_memory_create(&a->mem, &a->md, g_eng, DNNL_MEMORY_NONE) != dnnl_success) return 1;
    if (dnnl_memory_desc_equal(&a->md, plain)) return 0;
    if (dnnl_memory_create(&a->plain_mem, plain, g_eng, DNNL_MEMORY_NONE) != dnnl_success) return 1;
    dnnl_primitive_desc_t rpd;
    if (dnnl_reorder_primitive_desc_create(&rpd, to_plain ? &a->md : plain, g_eng, to_plain ? plain : &a->md,
                                           g_eng, NULL) != dnnl_success)
        return 1;
    dnnl_status_t s = dnnl_primitive_create(&a->reorder, rpd);
    dnnl_primitive_desc_destroy(rpd);
    return s != dnnl_success;
}

static int prims_create(conv_prims *p) {
    const conv_key *k = &p->key;
    int64_t OH = (k->H + 2 * k->pad - k->KH) / k->stride + 1, OW = (k->W + 2 * k->pad - k->KW) / k->stride + 1;
    int64_t xs[4] = {k->N, k->C, k->H, k->W}, ws[4] = {k->OC, k->C, k->KH, k->KW}, ys[4] = {k->N, k->OC, OH, OW};
    dnnl_memory_desc_t x_p, w_p, y_p, b_p, x_a, w_a, y_a, b_a;
    if (plain_md(&x_p, 4, xs, dnnl_nchw) || plain_md(&w_p, 4, ws, dnnl_oihw) || plain_md(&y_p, 4, ys, dnnl_nchw) ||
        plain_md(&b_p, 1, &k->OC, dnnl_x) || plain_md(&x_a, 4, xs, dnnl_format_tag_any) ||
        plain_md(&w_a, 4, ws, dnnl_format_tag_any) || plain_md(&y_a, 4, ys, dnnl_format_tag_any) ||
        plain_md(&b_a, 1, &k->OC, dnnl_format_tag_any))
        return 1;
    dnnl_dims_t st = {k->stride, k->stride}, pad = {k->pad, k->pad};
    dnnl_convolution_desc_t fd, dd, wd;
    if (dnnl_convolution_forward_desc_init(&fd, dnnl_forward_training, dnnl_convolution_direct, &x_a, &w_a,
                                           k->bias ? &b_a : NULL, &y_a, st, pad, pad) != dnnl_success ||
        dnnl_convolution_backward_data_desc_init(&dd, dnnl_convolution_direct, &x_a, &w_a, &y_a, st, pad, pad) !=
            dnnl_success ||
        dnnl_convolution_backward_weights_desc_init(&wd, dnnl_convolution_direct, &x_a, &w_a, k->bias ? &b_a : NULL,
                                                    &y_a, st, pad, pad) != dnnl_success)
        return 1;
    dnnl_primitive_desc_t fpd = NULL, dpd = NULL, wpd = NULL;
    int bad = dnnl_primitive_desc_create(&fpd, &fd, NULL, g_eng, NULL) != dnnl_success ||
              dnnl_primitive_desc_create(&dpd, &dd, NULL, g_eng, fpd) != dnnl_success ||
              dnnl_primitive_desc_create(&wpd, &wd, NULL, g_eng, fpd) != dnnl_success;
    if (!bad)
        bad = dnnl_primitive_create(&p->fwd, fpd) != dnnl_success ||
              dnnl_primitive_create(&p->bwd_data, dpd) != dnnl_success ||
              dnnl_primitive_create(&p->bwd_weights, wpd) != dnnl_success ||
              arg_init(&p->f_src, fpd, dnnl_query_src_md, &x_p, 0) ||
              arg_init(&p->f_w, fpd, dnnl_query_weights_md, &w_p, 0) ||
              arg_init(&p->f_dst, fpd, dnnl_query_dst_md, &y_p, 1) ||
              arg_init(&p->d_ddst, dpd, dnnl_query_diff_dst_md, &y_p, 0) ||
              arg_init(&p->d_w, dpd, dnnl_query_weights_md, &w_p, 0) ||
              arg_init(&p->d_dsrc, dpd, dnnl_query_diff_src_md, &x_p, 1) ||
              arg_init(&p->w_src, wpd, dnnl_query_src_md, &x_p, 0) ||
              arg_init(&p->w_ddst, wpd, dnnl_query_diff_dst_md, &y_p, 0) ||
              arg_init(&p->w_dw, wpd, dnnl_query_diff_weights_md, &w_p, 1);
    if (!bad && k->bias) {   /* bias: index 1 of the weights queries */
        const dnnl_memory_desc_t *fb = dnnl_primitive_desc_query_md(fpd, dnnl_query_weights_md, 1);
        const dnnl_memory_desc_t *wb = dnnl_primitive_desc_query_md(wpd, dnnl_query_diff_weights_md, 1);
        bad = !fb || !wb || !dnnl_memory_desc_equal(fb, &b_p) || !dnnl_memory_desc_equal(wb, &b_p) ||
              dnnl_memory_create(&p->f_b.mem, fb, g_eng, DNNL_MEMORY_NONE) != dnnl_success ||
              dnnl_memory_create(&p->w_db.mem, wb, g_eng, DNNL_MEMORY_NONE) != dnnl_success;
    }
    if (!bad && !dnnl_memory_desc_equal(&p->f_src.md, &p->w_src.md)) {
        dnnl_primitive_desc_t rpd;
        bad = dnnl_reorder_primitive_desc_create(&rpd, &p->f_src.md, g_eng, &p->w_src.md, g_eng, NULL) != dnnl_success;
        if (!bad) {
            bad = dnnl_primitive_create(&p->src_to_wsrc, rpd) != dnnl_success ||
                  dnnl_memory_create(&p->wsrc_from, &p->f_src.md, g_eng, DNNL_MEMORY_NONE) != dnnl_success;
            dnnl_primitive_desc_destroy(rpd);
        }
    }
    if (fpd) dnnl_primitive_desc_destroy(fpd);
    if (dpd) dnnl_primitive_desc_destroy(dpd);
    if (wpd) dnnl_primitive_desc_destroy(wpd);
    return bad;
}

/* The cached primitives for this geometry; NULL when oneDNN cannot serve it
 * (or is turned off): the caller uses im2col. */
static conv_prims *prims_get(const conv_key *k) {
    backend_default();
    if (g_disabled) return NULL;
    for (int i = 0; i < g_cached; i++)
        if (!memcmp(&g_cache[i].key, k, sizeof *k)) return g_cache[i].fwd ? &g_cache[i] : NULL;
    if (g_cached == CONV_CACHE) return NULL;
    if (!g_eng && (dnnl_engine_create(&g_eng, dnnl_cpu, 0) != dnnl_success ||
                   dnnl_stream_create(&g_stream, g_eng, dnnl_stream_default_flags) != dnnl_success)) {
        g_disabled = 1;
        return NULL;
    }
    conv_prims *p = &g_cache[g_cached++];
    memset(p, 0, sizeof *p);
    p->key = *k;
    if (prims_create(p)) {   /* remembered as unsupported (fwd NULL); objects leak once per geometry */
        p->fwd = NULL;
        return NULL;
    }
    return p;
}

static int run(dnnl_primitive_t prim, int n, const dnnl_exec_arg_t *args) {
    return dnnl_primitive_execute(prim, g_stream, n, args) != dnnl_success ||
           dnnl_stream_wait(g_stream) != dnnl_success;
}

/* a's data for the primitive: `plain` itself, or a reordered copy in the arena. */
static void *to_layout(dt_graph *g, conv_arg *a, const void *plain, int *err) {
    if (!a->reorder) return (void *)plain;
    void *buf = dt_graph_scratch(g, dnnl_memory_desc_get_size(&a->md));
    if (!buf) { *err = 1; return NULL; }
    dnnl_memory_set_data_handle(a->plain_mem, (void *)plain);
    dnnl_memory_set_data_handle(a->mem, buf);
    dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, a->plain_mem}, {DNNL_ARG_TO, a->mem}};
    if (run(a->reorder, 2, args)) *err = 1;
    return buf;
}

/* An output in the primitive's layout: scratch when it differs from plain. */
static void *out_buf(dt_graph *g, conv_arg *a, void *plain, int *err) {
    if (!a->reorder) return plain;
    void *buf = dt_graph_scratch(g, dnnl_memory_desc_get_size(&a->md));
    if (!buf) *err = 1;
    return buf;
}

static void from_layout(conv_arg *a, void *buf, void *plain, int *err) {
    if (!a->reorder || *err) return;
    dnnl_memory_set_data_handle(a->mem, buf);
    dnnl_memory_set_data_handle(a->plain_mem, plain);
    dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, a->mem}, {DNNL_ARG_TO, a->plain_mem}};
    if (run(a->reorder, 2, args)) *err = 1;
}

static void set(dnnl_memory_t m, void *h) { dnnl_memory_set_data_handle(m, h); }

/* OH x OW of one output channel of one image */
static int64_t out_pixels(const conv_key *k) {
    return ((k->H + 2 * k->pad - k->KH) / k->stride + 1) * ((k->W + 2 * k->pad - k->KW) / k->stride + 1);
}

/* the type a convolution's inputs are rounded to (F32: none) */
static dt_dtype rounding(const conv_key *k) {
    if (dt_gemm_precision() == DT_PREC_FP16) return DT_F16;
    return dt_ops_sgemm_bf16_applies(k->N * out_pixels(k), k->OC, k->C * k->KH * k->KW) ? DT_BF16 : DT_F32;
}

/* n floats of src rounded to `to` in arena scratch (src itself for F32) */
static const float *rounded(dt_graph *g, const float *src, size_t n, dt_dtype to, int *err) {
    if (to == DT_F32 || *err) return src;
    float *buf = dt_graph_scratch(g, n * sizeof(float));
    if (!buf) { *err = 1; return NULL; }
    dt_round_to(buf, src, to, n);
    return buf;
}

typedef struct conv_saved { conv_prims *p; void *src; } conv_saved;   /* src in f_src.md */

static void conv_dnnl_backward(dt_graph *g, dt_node *n) {
    conv_saved *sv = n->saved;
    conv_prims *p = sv->p;
    const conv_key *k = &p->key;
    dt_tensor *x = n->in[0], *w = n->in[1], *b = n->n_in > 2 ? n->in[2] : NULL;
    float *dx = dt_grad_of(g, x), *dw = dt_grad_of(g, w), *db = dt_grad_of(g, b);
    if (!dx && !dw && !db) return;
    int err = 0;
    size_t wn = (size_t)(k->OC * k->C * k->KH * k->KW);
    dt_dtype to = rounding(k);   /* (the saved src was rounded in forward) */
    const float *dy32 = dt_f32(n->out->grad), *dy = rounded(g, dy32, (size_t)(k->N * k->OC * out_pixels(k)), to, &err);
    if (dw || db) {
        void *ddst = err ? NULL : to_layout(g, &p->w_ddst, dy, &err);
        void *src = sv->src;
        if (p->src_to_wsrc && !err) {
            src = dt_graph_scratch(g, dnnl_memory_desc_get_size(&p->w_src.md));
            if (!src) err = 1;
            else {
                set(p->wsrc_from, sv->src);
                set(p->w_src.mem, src);
                dnnl_exec_arg_t a[2] = {{DNNL_ARG_FROM, p->wsrc_from}, {DNNL_ARG_TO, p->w_src.mem}};
                err = run(p->src_to_wsrc, 2, a);
            }
        }
        float *dw_plain = dt_graph_scratch(g, wn * sizeof(float));
        float *db_plain = k->bias ? dt_graph_scratch(g, (size_t)k->OC * sizeof(float)) : NULL;
        if (!dw_plain || (k->bias && !db_plain)) err = 1;
        void *dwb = err ? NULL : out_buf(g, &p->w_dw, dw_plain, &err);
        if (!err) {
            set(p->w_src.mem, src);
            set(p->w_ddst.mem, ddst);
            set(p->w_dw.mem, dwb);
            dnnl_exec_arg_t a[4] = {{DNNL_ARG_SRC, p->w_src.mem}, {DNNL_ARG_DIFF_DST, p->w_ddst.mem},
                                    {DNNL_ARG_DIFF_WEIGHTS, p->w_dw.mem}, {DNNL_ARG_DIFF_BIAS, p->w_db.mem}};
            if (k->bias) set(p->w_db.mem, db_plain);
            err = run(p->bwd_weights, k->bias ? 4 : 3, a);
            from_layout(&p->w_dw, dwb, dw_plain, &err);
        }
        if (!err && dw) dt_ops_acc(dw, dw_plain, (int64_t)wn);
        if (!err && db && to == DT_F32) dt_ops_acc(db, db_plain, k->OC);
        else if (!err && db) dt_ops_conv2d_bias_grad(db, dy32, k->N, k->OC, out_pixels(k));   /* a sum: fp32 dy */
    }
    if (dx && !err) {
        size_t xn = (size_t)(k->N * k->C * k->H * k->W);
        void *ddst = to_layout(g, &p->d_ddst, dy, &err);
        const float *wr = rounded(g, dt_f32(w), wn, to, &err);
        void *wl = err ? NULL : to_layout(g, &p->d_w, wr, &err);
        float *dx_plain = err ? NULL : dt_graph_scratch(g, xn * sizeof(float));
        if (!dx_plain) err = 1;
        void *dsrc = err ? NULL : out_buf(g, &p->d_dsrc, dx_plain, &err);
        if (!err) {
            set(p->d_ddst.mem, ddst);
            set(p->d_w.mem, wl);
            set(p->d_dsrc.mem, dsrc);
            dnnl_exec_arg_t a[3] = {{DNNL_ARG_DIFF_DST, p->d_ddst.mem}, {DNNL_ARG_WEIGHTS, p->d_w.mem},
                                    {DNNL_ARG_DIFF_SRC, p->d_dsrc.mem}};
            err = run(p->bwd_data, 3, a);
            from_layout(&p->d_dsrc, dsrc, dx_plain, &err);
        }
        if (!err) dt_ops_acc(dx, dx_plain, (int64_t)xn);
    }
    if (err) DT_ERR(DT_ESTATE, "conv2d: oneDNN backward failed (x%s, w%s)", DT_OPS_SHAPE(x), DT_OPS_SHAPE(w));
}

int dt_conv2d_dnnl(dt_graph *g, dt_tensor *x, dt_tensor *w, dt_tensor *b, int stride, int pad, dt_tensor **out) {
    conv_key k = {x->shape[0], x->shape[1], x->shape[2], x->shape[3], w->shape[0], w->shape[2], w->shape[3],
                  stride, pad, b != NULL};
    conv_prims *p = prims_get(&k);
    if (!p) return 0;
    *out = NULL;
    int64_t OH = (k.H + 2 * k.pad - k.KH) / k.stride + 1, OW = (k.W + 2 * k.pad - k.KW) / k.stride + 1;
    int64_t ys[4] = {k.N, k.OC, OH, OW};
    dt_tensor *y = dt_graph_tensor(g, 4, ys);
    conv_saved *sv = dt_graph_scratch(g, sizeof *sv);
    if (!y || !sv) return 1;
    int err = 0;
    dt_dtype to = rounding(&k);
    const float *xr = rounded(g, dt_f32(x), (size_t)(k.N * k.C * k.H * k.W), to, &err);
    const float *wr = rounded(g, dt_f32(w), (size_t)(k.OC * k.C * k.KH * k.KW), to, &err);
    void *src = err ? NULL : to_layout(g, &p->f_src, xr, &err);
    void *wl = err ? NULL : to_layout(g, &p->f_w, wr, &err);
    void *dst = err ? NULL : out_buf(g, &p->f_dst, dt_f32(y), &err);
    if (!err) {
        set(p->f_src.mem, src);
        set(p->f_w.mem, wl);
        set(p->f_dst.mem, dst);
        dnnl_exec_arg_t a[4] = {{DNNL_ARG_SRC, p->f_src.mem}, {DNNL_ARG_WEIGHTS, p->f_w.mem},
                                {DNNL_ARG_DST, p->f_dst.mem}, {DNNL_ARG_BIAS, p->f_b.mem}};
        if (b) set(p->f_b.mem, dt_f32(b));
        err = run(p->fwd, b ? 4 : 3, a);
        from_layout(&p->f_dst, dst, dt_f32(y), &err);
    }
    if (err) {
        DT_ERR(DT_ESTATE, "conv2d: oneDNN forward failed (x%s, w%s)", DT_OPS_SHAPE(x), DT_OPS_SHAPE(w));
        return 1;
    }
    dt_tensor *in[3] = {x, w, b};
    dt_node *n = dt_graph_record(g, "conv2d", conv_dnnl_backward, y, b ? 3 : 2, in);
    if (n) {
        *sv = (conv_saved){p, src};
        n->saved = sv;
    }
    *out = y;
    return 1;
}
