/* GPT-2 (pre-LN, GELU-tanh, learned positions, lm-head tied to wte).
 * Names and layouts follow Hugging Face's GPT2Model so checkpoints are
 * interchangeable: wte.weight [V, C], wpe.weight [maxT, C],
 * h.{i}.ln_1.{weight,bias} [C], h.{i}.attn.c_attn.weight [C, 3C] (Conv1D: in, out),
 * h.{i}.attn.c_attn.bias [3C], h.{i}.attn.c_proj.{weight [C, C], bias [C]},
 * h.{i}.ln_2.*, h.{i}.mlp.c_fc.{weight [C, 4C], bias [4C]},
 * h.{i}.mlp.c_proj.{weight [4C, C], bias [C]}, ln_f.{weight,bias}.
 * Modules: wte, wpe, then per block ln_1, attn, ln_2, mlp, then ln_f; wte is
 * entered a second time around the lm-head. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "model_internal.h"

enum { MOD_LN1, MOD_ATTN, MOD_LN2, MOD_MLP, MODS_PER_BLOCK };

typedef struct gpt2_impl { int32_t *pos; int64_t pos_len; } gpt2_impl;

static dt_module *block_mod(dt_model *m, int layer, int which) {
    return m->modules[2 + layer * MODS_PER_BLOCK + which];
}
static dt_tensor *P(dt_module *mod, int k) { return &mod->params[k]->value; }

static dt_tensor *layernorm_mod(dt_graph *g, dt_module *mod, dt_tensor *x) {
    if (dt_module_enter(g, mod) != DT_OK) return NULL;
    DT_NN_CHECK(x = dt_op_layernorm(g, x, P(mod, 0), P(mod, 1), 1e-5f));
    return dt_module_leave(g, mod) == DT_OK ? x : NULL;
}

/* Residual branch output with optional dropout. */
static dt_tensor *drop(dt_model *m, dt_graph *g, dt_tensor *x) {
    return m->cfg.dropout > 0 ? dt_op_dropout(g, x, m->cfg.dropout, &m->dropout_rng) : x;
}

static dt_tensor *block_forward(dt_model *m, dt_graph *g, int l, dt_tensor *x) {
    int H = m->cfg.n_head;
    dt_tensor *h;
    DT_NN_CHECK(h = layernorm_mod(g, block_mod(m, l, MOD_LN1), x));       /* [B, T, C] */
    dt_module *attn = block_mod(m, l, MOD_ATTN);
    if (dt_module_enter(g, attn) != DT_OK) return NULL;
    DT_NN_CHECK(h = dt_op_linear(g, h, P(attn, 0), P(attn, 1), DT_W_IN_OUT)); /* [B, T, 3C] */
    DT_NN_CHECK(h = dt_op_attention(g, h, H));                              /* [B, T, C] */
    DT_NN_CHECK(h = dt_op_linear(g, h, P(attn, 2), P(attn, 3), DT_W_IN_OUT));
    if (dt_module_leave(g, attn) != DT_OK) return NULL;
    DT_NN_CHECK(h = drop(m, g, h));
    DT_NN_CHECK(x = dt_op_add(g, x, h));
    DT_NN_CHECK(h = layernorm_mod(g, block_mod(m, l, MOD_LN2), x));
    dt_module *mlp = block_mod(m, l, MOD_MLP);
    if (dt_module_enter(g, mlp) != DT_OK) return NULL;
    DT_NN_CHECK(h = dt_op_linear(g, h, P(mlp, 0), P(mlp, 1), DT_W_IN_OUT));   /* [B, T, 4C] */
    DT_NN_CHECK(h = dt_op_gelu(g, h));
    DT_NN_CHECK(h = dt_op_linear(g, h, P(mlp, 2), P(mlp, 3), DT_W_IN_OUT));   /* [B, T, C] */
    if (dt_module_leave(g, mlp) != DT_OK) return NULL;
    DT_NN_CHECK(h = drop(m, g, h));
    return dt_op_add(g, x, h);
}

static dt_tensor *gpt2_forward(dt_model *m, dt_graph *g, const dt_batch *b, dt_tensor **logits) {
    const dt_model_cfg *c = &m->cfg;
    gpt2_impl *im = m->impl;
    if (!b->x_ids) { DT_ERR(DT_EINVAL, "gpt2: batch has no token ids"); return NULL; }
    if (b->T <= 0 || b->T > c->max_t) {
        DT_ERR(DT_EINVAL, "gpt2: sequence length %lld outside 1..maxT=%d", (long long)b->T, c->max_t);
        return NULL;
    }
    int64_t n = b->B * b->T;
    if (im->pos_len < n) {   /* position ids 0..T-1 repeated per row */
        int32_t *pos = realloc(im->pos, (size_t)n * sizeof *pos);
        if (!pos) { DT_ERR(DT_ENOMEM, "out of memory"); return NULL; }
        im->pos = pos;
        im->pos_len = n;
    }
    for (int64_t i = 0; i < n; i++) im->pos[i] = (int32_t)(i % b->T);
    int64_t shape[3] = {b->B, b->T, c->n_embd};
    dt_module *wte = m->modules[0], *wpe = m->modules[1];
    dt_tensor *tok, *pos, *x;
    if (dt_module_enter(g, wte) != DT_OK) return NULL;
    DT_NN_CHECK(tok = dt_op_embedding(g, P(wte, 0), b->x_ids, n, 3, shape));
    if (dt_module_leave(g, wte) != DT_OK || dt_module_enter(g, wpe) != DT_OK) return NULL;
    DT_NN_CHECK(pos = dt_op_embedding(g, P(wpe, 0), im->pos, n, 3, shape));
    if (dt_module_leave(g, wpe) != DT_OK) return NULL;
    DT_NN_CHECK(x = dt_op_add(g, tok, pos));
    DT_NN_CHECK(x = drop(m, g, x));
    for (int l = 0; l < c->n_layer; l++) DT_NN_CHECK(x = block_forward(m, g, l, x));
    DT_NN_CHECK(x = layernorm_mod(g, m->modules[m->n_modules - 1], x));
    if (dt_module_enter(g, wte) != DT_OK) return NULL;        /* tied lm-head: x · wte^T */
    DT_NN_CHECK(x = dt_op_linear(g, x, P(wte, 0), NULL, DT_W_OUT_IN));   /* [B, T, V] */
    if (dt_module_leave(g, wte) != DT_OK) return NULL;
    int64_t lshape[2] = {n, c->vocab};
    DT_NN_CHECK(x = dt_op_reshape(g, x, 2, lshape));
    if (logits) *logits = x;
    return dt_op_cross_entropy(g, x, b->y);
}

static void gpt2_destroy(dt_model *m) {
    gpt2_impl *im = m->impl;
    if (im) free(im->pos);
    free(im);
    m->impl = NULL;
}

static dt_param *add(dt_model *m, dt_module *mod, const char *leaf, int ndim, int64_t d0, int64_t d1) {
    int64_t s[2] = {d0, d1};
    return dt_model_add_param(m, mod, leaf, ndim, s);
}

dt_status dt_gpt2_build(dt_model *m, dt_rng *r) {
    const dt_model_cfg *c = &m->cfg;
    int64_t C = c->n_embd;
    float std = 0.02f, proj_std = 0.02f / sqrtf(2.0f * (float)c->n_layer);
    gpt2_impl *im = calloc(1, sizeof *im);
    if (!im) return DT_ERR(DT_ENOMEM, "out of memory");
    m->impl = im;
    m->destroy = gpt2_destroy;
    dt_module *wte = dt_model_add_module(m, "wte"), *wpe = dt_model_add_module(m, "wpe");
    if (!wte || !wpe) return DT_ENOMEM;
    dt_param *p;
    if (!(p = add(m, wte, "weight", 2, c->vocab, C))) return DT_ENOMEM;
    dt_init_normal(p, r, std);
    if (!(p = add(m, wpe, "weight", 2, c->max_t, C))) return DT_ENOMEM;
    dt_init_normal(p, r, 0.01f);
    for (int l = 0; l < c->n_layer; l++) {
        static const char *names[MODS_PER_BLOCK] = {"ln_1", "attn", "ln_2", "mlp"};
        dt_module *mods[MODS_PER_BLOCK];
        for (int k = 0; k < MODS_PER_BLOCK; k++) {
            char name[64];
            snprintf(name, sizeof name, "h.%d.%s", l, names[k]);
            if (!(mods[k] = dt_model_add_module(m, name))) return DT_ENOMEM;
        }
        for (int k = 0; k < MODS_PER_BLOCK; k++) {
            if (k == MOD_LN1 || k == MOD_LN2) {
                if (!(p = add(m, mods[k], "weight", 1, C, 1))) return DT_ENOMEM;
                dt_init_const(p, 1.0f);
                if (!(p = add(m, mods[k], "bias", 1, C, 1))) return DT_ENOMEM;
                continue;
            }
            int64_t in1 = C, out1 = k == MOD_ATTN ? 3 * C : 4 * C, in2 = k == MOD_ATTN ? C : 4 * C;
            const char *w1 = k == MOD_ATTN ? "c_attn.weight" : "c_fc.weight";
            const char *b1 = k == MOD_ATTN ? "c_attn.bias" : "c_fc.bias";
            if (!(p = add(m, mods[k], w1, 2, in1, out1))) return DT_ENOMEM;
            dt_init_normal(p, r, std);
            if (!(p = add(m, mods[k], b1, 1, out1, 1))) return DT_ENOMEM;
            if (!(p = add(m, mods[k], "c_proj.weight", 2, in2, C))) return DT_ENOMEM;
            dt_init_normal(p, r, proj_std);
            if (!(p = add(m, mods[k], "c_proj.bias", 1, C, 1))) return DT_ENOMEM;
        }
    }
    dt_module *lnf = dt_model_add_module(m, "ln_f");
    if (!lnf) return DT_ENOMEM;
    if (!(p = add(m, lnf, "weight", 1, C, 1))) return DT_ENOMEM;
    dt_init_const(p, 1.0f);
    if (!(p = add(m, lnf, "bias", 1, C, 1))) return DT_ENOMEM;
    m->forward = gpt2_forward;
    return DT_OK;
}
