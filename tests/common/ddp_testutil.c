/* Helpers for the multi-rank DDP tests; see ddp_testutil.h. */
#include "ddp_testutil.h"
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- models ---- */
dt_model_cfg dtt_mlp_cfg(int in, int h1, int h2, int out) {
    dt_model_cfg c = dt_model_cfg_default(DT_MODEL_MLP);
    c.mlp_in = in;
    c.mlp_out = out;
    c.mlp_n_hidden = h2 > 0 ? 2 : 1;
    c.mlp_hidden[0] = h1;
    c.mlp_hidden[1] = h2;
    return c;
}

dt_model_cfg dtt_cnn_cfg(void) {
    dt_model_cfg c = dt_model_cfg_default(DT_MODEL_CNN);
    c.cnn_c1 = 4; c.cnn_c2 = 8; c.cnn_fc = 16; c.cnn_classes = 10;
    return c;
}

dt_model_cfg dtt_gpt2_cfg(void) {
    dt_model_cfg c = dt_model_cfg_default(DT_MODEL_GPT2);
    c.n_layer = 1; c.n_embd = 16; c.n_head = 2; c.vocab = 32; c.max_t = 8;
    c.dropout = 0;
    return c;
}

/* ---- batches ---- */
uint64_t dtt_key(int step, int rank, int micro) {
    return 0x9e3779b97f4a7c15ull ^ ((uint64_t)step << 32) ^ ((uint64_t)rank << 16) ^ (uint64_t)micro;
}

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    T_CHECK(p != NULL);
    return p;
}

/* Label of one input row: argmax of a fixed random linear map (the teacher). */
static int32_t teacher(const float *x, int64_t in, int classes) {
    dt_rng r;
    dt_rng_seed(&r, 4242);
    int32_t best = 0;
    float bv = -INFINITY;
    for (int c = 0; c < classes; c++) {
        float s = 0;
        for (int64_t j = 0; j < in; j++) s += dt_rng_normal(&r) * x[j];
        if (s > bv) { bv = s; best = c; }
    }
    return best;
}

void dtt_make_batch(const dt_model_cfg *c, uint64_t key, int64_t B, dtt_batch *o) {
    memset(o, 0, sizeof *o);
    dt_rng r;
    dt_rng_seed(&r, key);
    o->b.B = B;
    if (c->kind == DT_MODEL_GPT2) {
        int64_t T = c->max_t, n = B * T;
        o->ids = xmalloc((size_t)n * sizeof *o->ids);
        o->y = xmalloc((size_t)n * sizeof *o->y);
        for (int64_t i = 0; i < n; i++) {
            o->ids[i] = (int32_t)dt_rng_below(&r, (uint64_t)c->vocab);
            o->y[i] = (3 * o->ids[i] + 1) % c->vocab;
        }
        o->b.T = T;
        dt_batch_add_input(&o->b, "ids", DT_I32, 2, (int64_t[]){B, T}, o->ids);
    } else {
        int64_t in = c->kind == DT_MODEL_MLP ? c->mlp_in : 784;
        int classes = c->kind == DT_MODEL_MLP ? c->mlp_out : c->cnn_classes;
        o->x = xmalloc((size_t)(B * in) * sizeof *o->x);
        o->y = xmalloc((size_t)B * sizeof *o->y);
        for (int64_t i = 0; i < B * in; i++) o->x[i] = dt_rng_normal(&r);
        for (int64_t i = 0; i < B; i++) o->y[i] = teacher(o->x + i * in, in, classes);
        o->b.T = 1;
        if (c->kind == DT_MODEL_MLP) dt_batch_add_input(&o->b, "image", DT_F32, 2, (int64_t[]){B, in}, o->x);
        else dt_batch_add_input(&o->b, "image", DT_F32, 4, (int64_t[]){B, 1, 28, 28}, o->x);
    }
    o->b.y = o->y;
}

void dtt_concat(const dt_model_cfg *c, const dtt_batch *parts, int n, dtt_batch *o) {
    memset(o, 0, sizeof *o);
    int64_t B = 0;
    for (int i = 0; i < n; i++) B += parts[i].b.B;
    int64_t T = parts[0].b.T;
    int64_t in = c->kind == DT_MODEL_MLP ? c->mlp_in : 784;
    o->b.B = B;
    o->b.T = T;
    o->y = xmalloc((size_t)(B * T) * sizeof *o->y);
    if (c->kind == DT_MODEL_GPT2) o->ids = xmalloc((size_t)(B * T) * sizeof *o->ids);
    else o->x = xmalloc((size_t)(B * in) * sizeof *o->x);
    int64_t row = 0;
    for (int i = 0; i < n; i++) {
        int64_t b = parts[i].b.B;
        memcpy(o->y + row * T, parts[i].y, (size_t)(b * T) * sizeof *o->y);
        if (o->ids) memcpy(o->ids + row * T, parts[i].ids, (size_t)(b * T) * sizeof *o->ids);
        else memcpy(o->x + row * in, parts[i].x, (size_t)(b * in) * sizeof *o->x);
        row += b;
    }
    if (o->ids) dt_batch_add_input(&o->b, "ids", DT_I32, 2, (int64_t[]){B, T}, o->ids);
    else if (c->kind == DT_MODEL_MLP) dt_batch_add_input(&o->b, "image", DT_F32, 2, (int64_t[]){B, in}, o->x);
    else dt_batch_add_input(&o->b, "image", DT_F32, 4, (int64_t[]){B, 1, 28, 28}, o->x);
    o->b.y = o->y;
}

void dtt_batch_free(dtt_batch *b) {
    free(b->x);
    free(b->ids);
    free(b->y);
    memset(b, 0, sizeof *b);
}

/* ---- nets ---- */
dt_optim_cfg dtt_adamw(float lr, float wd) {
    dt_optim_cfg oc = dt_optim_cfg_default(DT_OPTIM_ADAMW);
    oc.lr = lr;
    oc.weight_decay = wd;
    return oc;
}

void dtt_net_init(dtt_net *n, const dt_model_cfg *c, uint64_t seed, const dt_optim_cfg *oc) {
    memset(n, 0, sizeof *n);
    T_OK(dt_model_create(c, seed, &n->m));
    n->g = dt_graph_create();
    T_CHECK(n->g != NULL);
    dt_model *m = n->m;
    /* steps a parameter only while it has a gradient, as the strategies' optimizers */
    T_OK(dt_optimizer_init_model(&n->opt, oc, m));
    n->lr = oc->lr;
}

void dtt_net_free(dtt_net *n) {
    dt_optimizer_free(&n->opt);
    dt_graph_free(n->g);
    dt_model_free(n->m);
    memset(n, 0, sizeof *n);
}

float dtt_fwd_bwd(dtt_net *n, dt_ddp *d, int sync, const dt_batch *b, float scale, const float **logits) {
    dt_graph_reset(n->g);
    if (d) T_OK(dt_ddp_before_forward(d, n->g, sync));
    dt_tensor *lg = NULL;
    dt_tensor *loss = dt_model_forward(n->m, n->g, b, &lg);
    T_CHECK(loss != NULL);
    if (logits) *logits = dt_f32(lg);
    float l = dt_f32(loss)[0];
    T_OK(dt_graph_backward_scaled(n->g, loss, scale));
    return l;
}

void dtt_opt_step(dtt_net *n) {
    dt_model *m = n->m;
    T_OK(dt_optimizer_step_range(&n->opt, n->lr, m->param_flat.data, m->grad_flat.data, 0, m->param_flat.numel, 1.0f));
    dt_optimizer_finish_step(&n->opt);
    dt_model_zero_grad(m);
}

float dtt_ddp_step(dtt_net *n, dt_ddp *d, const dtt_batch *micro, int K) {
    float sum = 0;
    for (int k = 0; k < K; k++) sum += dtt_fwd_bwd(n, d, k == K - 1, &micro[k].b, 1.0f / (float)K, NULL);
    T_OK(dt_ddp_finish_backward(d));
    dtt_opt_step(n);
    return sum / (float)K;
}

void (*dtt_ref_rank_hook)(int r) = NULL;

void dtt_ref_step(dtt_net *ref, const dtt_batch *per_rank, int N, int K, const int *active) {
    dtt_ref_grads(ref, per_rank, N, K, active);
    dtt_opt_step(ref);
}

void dtt_ref_grads(dtt_net *ref, const dtt_batch *per_rank, int N, int K, const int *active) {
    dt_model *m = ref->m;
    size_t n = m->grad_flat.numel;
    float *sum = xmalloc(n * sizeof *sum), *zero = calloc(n ? n : 1, sizeof *zero);
    unsigned char *used = calloc((size_t)m->n_params + 1, 1);   /* has_grad on any simulated rank */
    T_CHECK(zero != NULL && used != NULL);
    for (int r = 0; r < N; r++) {
        const float *g = zero;
        if (!active || active[r]) {
            if (dtt_ref_rank_hook) dtt_ref_rank_hook(r);
            dt_model_zero_grad(m);
            for (int k = 0; k < K; k++) dtt_fwd_bwd(ref, NULL, 1, &per_rank[r * K + k].b, 1.0f / (float)K, NULL);
            g = m->grad_flat.data;
            for (int i = 0; i < m->n_params; i++) used[i] |= (unsigned char)(m->params[i]->has_grad != 0);
        }
        if (r == 0) memcpy(sum, g, n * sizeof *sum);
        else for (size_t i = 0; i < n; i++) sum[i] += g[i];
    }
    for (int i = 0; i < m->n_params; i++) m->params[i]->has_grad = used[i];
    free(used);
    const float div = (float)N;
    for (size_t i = 0; i < n; i++) m->grad_flat.data[i] = sum[i] / div;
    free(sum);
    free(zero);
}

int dtt_skip_layer = -1, dtt_skip_module = -1;

dt_tensor *dtt_mlp_forward_skip_bias(dt_model *m, dt_graph *g, const dt_batch *b, dt_tensor **logits) {
    const dt_model_cfg *c = &m->cfg;
    int64_t shape[2] = {b->B, c->mlp_in};
    dt_tensor *x = dt_graph_tensor(g, 2, shape);
    if (!x) return NULL;
    const dt_tensor *img = dt_batch_input(b, "image", DT_F32, "dtt_mlp_forward_skip_bias");
    if (!img) return NULL;
    x->data = img->data;
    int n_layers = c->mlp_n_hidden + 1;
    for (int i = 0; i < n_layers; i++) {
        dt_module *mod = m->modules[i];
        if (i == dtt_skip_module) continue;
        if (dt_module_enter(g, mod) != DT_OK) return NULL;
        dt_tensor *bias = i == dtt_skip_layer ? NULL : &mod->params[1]->value;
        if (!(x = dt_op_linear(g, x, &mod->params[0]->value, bias, DT_W_OUT_IN))) return NULL;
        if (i + 1 < n_layers && !(x = dt_op_relu(g, x))) return NULL;
        if (dt_module_leave(g, mod) != DT_OK) return NULL;
    }
    if (logits) *logits = x;
    return dt_op_cross_entropy(g, x, b->y);
}
