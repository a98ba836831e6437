/* GPT-2 (pre-LN, GELU-tanh, learned positions, lm-head tied to wte).
 * Names and layouts follow Hugging Face's GPT2Model so checkpoints are
 * interchangeable: wte.weight [V, C], wpe.weight [maxT, C],
 * h.{i}.ln_1.{weight,bias} [C], h.{i}.attn.c_attn.weight [C, 3C] (Conv1D: in, out),
 * h.{i}.attn.c_attn.bias [3C], h.{i}.attn.c_proj.{weight [C, C], bias [C]},
 * h.{i}.ln_2.*, h.{i}.mlp.c_fc.{weight [C, 4C], bias [4C]},
 * h.{i}.mlp.c_proj.{weight [4C, C], bias [C]}, ln_f.{weight,bias}.
 * Modules: wte, wpe, then per block ln_1, attn, ln_2, mlp, then ln_f; wte is
 * entered a second time around the lm-head.
 * Blocks: "embed" (ids -> [B, T, C]), "h.{l}" per layer ([B, T, C] -> same),
 * "head" (ln_f + tied lm-head, -> [B, T, V]; under tensor parallelism [B, T, V/T]).
 * Fused kernels inside a layer block: the attention residual add with ln_2
 * (dt_op_add_layernorm) and c_fc with GELU (dt_op_linear_gelu); bitwise the
 * unfused ops. DTRAIN_NO_FUSE=1 in the environment when the model is built
 * selects the unfused chain (for the tests that compare the two). The other
 * residual adds feed the next block's ln_1 / ln_f across a block boundary
 * (pipeline stages and recompute cut there), so they stay unfused.
 * Tensor parallelism (cfg.tp_size T > 1, this rank cfg.tp_rank; Megatron's
 * layout, src/parallel/tp/ runs it): c_attn is column-parallel by heads --
 * the local weight [C, 3C/T] holds this rank's q, k and v columns of its H/T
 * heads as [q_loc | k_loc | v_loc], so dt_op_attention runs on H/T heads
 * unchanged -- and attn.c_proj row-parallel [C/T, C]; mlp.c_fc column-
 * [C, 4C/T], mlp.c_proj row-parallel [4C/T, C]. A column-parallel linear
 * reads its input through dt_op_tp_copy, a row-parallel one's partial
 * product goes through dt_op_tp_reduce and its bias is added after the sum
 * (once, so the bias stays one replicated tensor). wte [V, C] is split by
 * rows (vocabulary-parallel): rank r holds rows [r n, r n + n), n = ceil(V /
 * T); when T does not divide V the last rank's part ends in zero rows of
 * padding (dt_param_split.pad: never looked up, never counted by the loss,
 * not in checkpoints). The embedding looks up the ids in this rank's rows
 * (others give 0) and tp_reduce sums them; the tied lm-head reads ln_f's
 * output through tp_copy and gives this rank's logits [B, T, n], and the
 * loss head is vocabulary-parallel (dt_model_set_loss_split): no rank holds
 * [B, T, V]. LayerNorms and wpe are whole on every rank.
 * Invariant: every rank of the group computes the same bits outside the
 * split layers (same batch, same replicated parameters, an all-reduce that
 * gives every rank the same sum), so replicated parameters get identical
 * gradients on every rank and need no reduction over the group.
 * Sequence parallelism (cfg.tp_seq; Megatron-LM's): outside the split
 * layers rank r holds positions [r S, r S + S) of every sample, S = T / T_tp
 * ([B, S, C], declared DT_DIM_SEQ_PART): the embedding's partial lookups
 * are reduce-scattered (dt_op_tp_scatter_seq) and wpe looks up this rank's
 * positions; a column-parallel linear (and the lm-head) reads the
 * all-gathered [B, T, C] (dt_op_tp_gather_seq, in place of tp_copy); a
 * row-parallel one's partial product is reduce-scattered (in place of
 * tp_reduce) and its bias added on the shard; LayerNorms, dropout (masks of
 * the global positions: dt_op_dropout_at) and residual adds run on the
 * shard. The replicated parameters (wpe, LayerNorms, row-parallel biases)
 * then get this rank's positions' part of their gradient: the strategy
 * sums them over the group after backward (src/parallel/tp/tp_internal.h).
 * Its registry entry (nn.h section 4b) is at the end. */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "model_internal.h"

enum { MOD_LN1, MOD_ATTN, MOD_LN2, MOD_MLP, MODS_PER_BLOCK };

static dt_module *block_mod(dt_model *m, int layer, int which) {
    return m->modules[2 + layer * MODS_PER_BLOCK + which];
}
static dt_tensor *P(dt_module *mod, int k) { return &mod->params[k]->value; }

static dt_tensor *layernorm_mod(dt_graph *g, dt_module *mod, dt_tensor *x) {
    if (dt_module_enter(g, mod) != DT_OK) return NULL;
    DT_NN_CHECK(x = dt_op_layernorm(g, x, P(mod, 0), P(mod, 1), 1e-5f));
    return dt_module_leave(g, mod) == DT_OK ? x : NULL;
}

static int tp_size(const dt_model *m) { return m->cfg.tp_size > 1 ? m->cfg.tp_size : 1; }
/* Sequence parallelism: between the split layers x is [B, T / tp_size, C],
 * this rank's positions. */
static int seq_par(const dt_model *m) { return tp_size(m) > 1 && m->cfg.tp_seq; }

/* Residual branch output with optional dropout, keyed by the batch's row
 * keys and the site (layer, k): the same mask wherever the sample runs.
 * A sequence-parallel shard [B, S, C] of rank r is elements [r S C, r S C +
 * S C) of each whole row: those elements' masks. */
static dt_tensor *drop(dt_model *m, dt_graph *g, const dt_batch *b, int layer, int k, dt_tensor *x) {
    if (!(m->cfg.dropout > 0)) return x;
    int64_t offset = seq_par(m) ? (int64_t)m->cfg.tp_rank * (x->numel / x->shape[0]) : 0;
    return dt_op_dropout_at(g, x, m->cfg.dropout, b->row_keys, dt_dropout_site(layer, k), offset);
}

/* Before a column-parallel linear: f (tp_copy) under tensor parallelism;
 * under sequence parallelism the all-gather of the shards (backward:
 * reduce-scatter). */
static dt_tensor *col_in(dt_model *m, dt_graph *g, dt_tensor *x) {
    if (tp_size(m) == 1) return x;
    return seq_par(m) ? dt_op_tp_gather_seq(g, x, m->tp) : dt_op_tp_copy(g, x, m->tp);
}

/* A linear layer w, b whose weight is row-parallel under tensor
 * parallelism: the partial product summed over the group (g: tp_reduce;
 * sequence-parallel: reduce-scattered to this rank's positions), then the
 * bias, once. Whole: one dt_op_linear. */
static dt_tensor *row_linear(dt_model *m, dt_graph *g, dt_tensor *x, dt_tensor *w, dt_tensor *b) {
    if (tp_size(m) == 1) return dt_op_linear(g, x, w, b, DT_W_IN_OUT);
    DT_NN_CHECK(x = dt_op_linear(g, x, w, NULL, DT_W_IN_OUT));
    DT_NN_CHECK(x = seq_par(m) ? dt_op_tp_scatter_seq(g, x, m->tp) : dt_op_tp_reduce(g, x, m->tp));
    return dt_op_bias_add(g, x, b);
}

/* fuse: 1 = the fused kernels, 0 = the op chain they replace.
 * Shapes are whole; under tensor parallelism 3C, C (inside attention) and
 * 4C are this rank's 3C/T, C/T and 4C/T, H its H/T heads; under sequence
 * parallelism the [B, T, C] outside attn and mlp are [B, T/T_tp, C]. */
static dt_tensor *block_forward(dt_model *m, dt_graph *g, const dt_batch *b, int l, int fuse, dt_tensor *x) {
    int H = m->cfg.n_head / tp_size(m);
    dt_tensor *h;
    DT_NN_CHECK(h = layernorm_mod(g, block_mod(m, l, MOD_LN1), x));       /* [B, T, C] */
    dt_module *attn = block_mod(m, l, MOD_ATTN);
    if (dt_module_enter(g, attn) != DT_OK) return NULL;
    DT_NN_CHECK(h = col_in(m, g, h));
    DT_NN_CHECK(h = dt_op_linear(g, h, P(attn, 0), P(attn, 1), DT_W_IN_OUT)); /* [B, T, 3C] */
    DT_NN_CHECK(h = dt_op_attention(g, h, H));                              /* [B, T, C] */
    DT_NN_CHECK(h = row_linear(m, g, h, P(attn, 2), P(attn, 3)));           /* [B, T, C] whole */
    if (dt_module_leave(g, attn) != DT_OK) return NULL;
    DT_NN_CHECK(h = drop(m, g, b, l, 0, h));
    dt_module *ln2 = block_mod(m, l, MOD_LN2);
    if (fuse) {   /* x = x + h and h = ln_2(x), one pass; inside ln_2 (its hooks bracket its parameters' use) */
        if (dt_module_enter(g, ln2) != DT_OK) return NULL;
        DT_NN_CHECK(h = dt_op_add_layernorm(g, x, h, P(ln2, 0), P(ln2, 1), 1e-5f, &x));   /* [B, T, C] twice */
        if (dt_module_leave(g, ln2) != DT_OK) return NULL;
    } else {
        DT_NN_CHECK(x = dt_op_add(g, x, h));
        DT_NN_CHECK(h = layernorm_mod(g, ln2, x));
    }
    dt_module *mlp = block_mod(m, l, MOD_MLP);
    if (dt_module_enter(g, mlp) != DT_OK) return NULL;
    DT_NN_CHECK(h = col_in(m, g, h));
    if (fuse) {
        DT_NN_CHECK(h = dt_op_linear_gelu(g, h, P(mlp, 0), P(mlp, 1), DT_W_IN_OUT));   /* [B, T, 4C] */
    } else {
        DT_NN_CHECK(h = dt_op_linear(g, h, P(mlp, 0), P(mlp, 1), DT_W_IN_OUT));
        DT_NN_CHECK(h = dt_op_gelu(g, h));
    }
    DT_NN_CHECK(h = row_linear(m, g, h, P(mlp, 2), P(mlp, 3)));   /* [B, T, C] */
    if (dt_module_leave(g, mlp) != DT_OK) return NULL;
    DT_NN_CHECK(h = drop(m, g, b, l, 1, h));
    return dt_op_add(g, x, h);
}

/* block "embed": ids [B, T] -> wte[ids] + wpe[0..T) (+ dropout) [B, T, C] */
static dt_tensor *embed_block(dt_model *m, dt_graph *g, dt_tensor *x, const dt_batch *b, void *user) {
    (void)x; (void)user;
    const dt_model_cfg *c = &m->cfg;
    const dt_tensor *ids = dt_batch_input(b, "ids", DT_I32, "gpt2");
    if (!ids) return NULL;
    if (b->T <= 0 || b->T > c->max_t || ids->numel != b->B * b->T) {
        DT_ERR(DT_EINVAL, "gpt2: sequence length %lld outside 1..maxT=%d", (long long)b->T, c->max_t);
        return NULL;
    }
    int sp = seq_par(m);
    if (sp && b->T % tp_size(m)) {
        DT_ERR(DT_EINVAL, "gpt2: sequence length %lld is not divisible by the tensor-parallel size %d (sequence "
               "parallelism splits the positions)", (long long)b->T, tp_size(m));
        return NULL;
    }
    int64_t n = b->B * b->T, S = sp ? b->T / tp_size(m) : b->T, p0 = sp ? (int64_t)c->tp_rank * S : 0;
    int32_t *pos = dt_graph_scratch(g, (size_t)(b->B * S) * sizeof *pos);   /* this rank's positions; lives with the tape */
    if (!pos) return NULL;
    for (int64_t i = 0; i < b->B * S; i++) pos[i] = (int32_t)(p0 + i % S);
    int64_t shape[3] = {b->B, b->T, c->n_embd}, part[3] = {b->B, S, c->n_embd};
    dt_module *wte = m->modules[0], *wpe = m->modules[1];
    dt_tensor *tok, *pe;
    if (dt_module_enter(g, wte) != DT_OK) return NULL;
    if (tp_size(m) == 1) {
        DT_NN_CHECK(tok = dt_op_embedding(g, P(wte, 0), ids->data, n, 3, shape));
    } else {   /* this rank's rows [r n, r n + n) of the vocabulary, 0 elsewhere; summed over the group
                * (sequence-parallel: reduce-scattered, this rank's positions of the sum) */
        int64_t start = (int64_t)m->cfg.tp_rank * P(wte, 0)->shape[0];
        DT_NN_CHECK(tok = dt_op_embedding_rows(g, P(wte, 0), start, ids->data, n, 3, shape));
        DT_NN_CHECK(tok = sp ? dt_op_tp_scatter_seq(g, tok, m->tp) : dt_op_tp_reduce(g, tok, m->tp));
    }
    if (dt_module_leave(g, wte) != DT_OK || dt_module_enter(g, wpe) != DT_OK) return NULL;
    DT_NN_CHECK(pe = dt_op_embedding(g, P(wpe, 0), pos, b->B * S, 3, part));
    if (dt_module_leave(g, wpe) != DT_OK) return NULL;
    DT_NN_CHECK(x = dt_op_add(g, tok, pe));
    return drop(m, g, b, -1, 0, x);
}

/* A layer block's user word: 2 * layer + fuse (fuse fixed when the model is built). */
static void *layer_user(int l, int fuse) { return (void *)(intptr_t)(2 * l + fuse); }

/* 0 when DTRAIN_NO_FUSE is set to anything but "" or "0". */
static int fuse_from_env(void) {
    const char *e = getenv("DTRAIN_NO_FUSE");
    return !e || !*e || !strcmp(e, "0");
}

/* block "h.{l}": [B, T, C] -> [B, T, C] */
static dt_tensor *layer_block(dt_model *m, dt_graph *g, dt_tensor *x, const dt_batch *b, void *user) {
    intptr_t u = (intptr_t)user;
    return block_forward(m, g, b, (int)(u / 2), (int)(u % 2), x);
}

/* block "head": ln_f, then the lm-head tied to wte: [B, T, C] -> [B, T, V]
 * (tensor-parallel: this rank's columns [B, T, V/T]; sequence-parallel:
 * ln_f on this rank's positions, all-gathered before the lm-head) */
static dt_tensor *head_block(dt_model *m, dt_graph *g, dt_tensor *x, const dt_batch *b, void *user) {
    (void)b; (void)user;
    dt_module *wte = m->modules[0];
    DT_NN_CHECK(x = layernorm_mod(g, m->modules[m->n_modules - 1], x));
    DT_NN_CHECK(x = col_in(m, g, x));                          /* column-parallel: x's gradient summed */
    if (dt_module_enter(g, wte) != DT_OK) return NULL;        /* x · wte^T */
    DT_NN_CHECK(x = dt_op_linear(g, x, P(wte, 0), NULL, DT_W_OUT_IN));
    return dt_module_leave(g, wte) == DT_OK ? x : NULL;
}

static dt_param *add(dt_model *m, dt_module *mod, const char *leaf, int ndim, int64_t d0, int64_t d1, dt_init in) {
    int64_t s[2] = {d0, d1};
    return dt_model_add_param(m, mod, leaf, ndim, s, in);
}

/* A layer's weight or bias split T ways along dim (groups: c_attn's q, k, v). */
static dt_param *add_split(dt_model *m, dt_module *mod, const char *leaf, int ndim, int64_t d0, int64_t d1, dt_init in,
                           int dim, int groups) {
    int64_t s[2] = {d0, d1};
    dt_param_split sp = {.dim = dim, .groups = groups, .parts = tp_size(m), .index = m->cfg.tp_rank};
    return dt_model_add_param_split(m, mod, leaf, ndim, s, in, sp);
}

static dt_status gpt2_build(dt_model *m) {
    const dt_model_cfg *c = &m->cfg;
    int64_t C = c->n_embd;
    float std = 0.02f, proj_std = 0.02f / sqrtf(2.0f * (float)c->n_layer);
    dt_input_spec in = {.name = "ids", .dtype = DT_I32, .ndim = 1, .dims = {-(int64_t)c->max_t}, .int_limit = c->vocab};
    DT_TRY(dt_model_add_input(m, &in));
    dt_module *wte = dt_model_add_module(m, "wte"), *wpe = dt_model_add_module(m, "wpe");
    int T = tp_size(m);
    int64_t Vp = dt_vocab_part(c->vocab, T) * T;   /* padded to a multiple of T */
    dt_param_split vsplit = {.dim = 0, .groups = 1, .parts = T, .index = c->tp_rank, .pad = (int)(Vp - c->vocab)};
    int64_t wte_shape[2] = {c->vocab, C};
    dt_model_add_param_split(m, wte, "weight", 2, wte_shape, DT_INIT_GAUSS(std), vsplit);
    add(m, wpe, "weight", 2, c->max_t, C, DT_INIT_GAUSS(0.01f));
    int64_t act[2] = {T > 1 && c->tp_seq ? DT_DIM_SEQ_PART : DT_DIM_SEQ, C};
    int64_t logits[2] = {DT_DIM_SEQ, dt_vocab_part(c->vocab, T)};
    DT_TRY(dt_model_add_block(m, "embed", embed_block, NULL, 0, NULL, 2, act));
    int fuse = fuse_from_env();
    for (int l = 0; l < c->n_layer; l++) {
        static const char *names[MODS_PER_BLOCK] = {"ln_1", "attn", "ln_2", "mlp"};
        dt_module *mods[MODS_PER_BLOCK];
        char name[64];
        for (int k = 0; k < MODS_PER_BLOCK; k++) {
            snprintf(name, sizeof name, "h.%d.%s", l, names[k]);
            mods[k] = dt_model_add_module(m, name);
        }
        for (int k = 0; k < MODS_PER_BLOCK; k++) {
            if (k == MOD_LN1 || k == MOD_LN2) {
                add(m, mods[k], "weight", 1, C, 1, DT_INIT_FILL(1.0f));
                add(m, mods[k], "bias", 1, C, 1, DT_INIT_ZERO);
                continue;
            }
            /* whole shapes; under tensor parallelism c_attn / c_fc split their
             * output columns (c_attn's as q, k, v: 3 groups), c_proj its input rows */
            int64_t in1 = C, out1 = k == MOD_ATTN ? 3 * C : 4 * C, in2 = k == MOD_ATTN ? C : 4 * C;
            int groups = k == MOD_ATTN ? 3 : 1;
            add_split(m, mods[k], k == MOD_ATTN ? "c_attn.weight" : "c_fc.weight", 2, in1, out1, DT_INIT_GAUSS(std), 1, groups);
            add_split(m, mods[k], k == MOD_ATTN ? "c_attn.bias" : "c_fc.bias", 1, out1, 1, DT_INIT_ZERO, 0, groups);
            add_split(m, mods[k], "c_proj.weight", 2, in2, C, DT_INIT_GAUSS(proj_std), 0, 1);
            add(m, mods[k], "c_proj.bias", 1, C, 1, DT_INIT_ZERO);   /* whole: added after the sum */
        }
        snprintf(name, sizeof name, "h.%d", l);
        DT_TRY(dt_model_add_block(m, name, layer_block, layer_user(l, fuse), 2, act, 2, act));
    }
    dt_module *lnf = dt_model_add_module(m, "ln_f");
    add(m, lnf, "weight", 1, C, 1, DT_INIT_FILL(1.0f));
    add(m, lnf, "bias", 1, C, 1, DT_INIT_ZERO);
    DT_TRY(dt_model_add_block(m, "head", head_block, NULL, 2, act, 2, logits));
    return dt_model_set_loss_split(m, c->vocab, T);
}

static void gpt2_defaults(dt_model_cfg *c) {
    c->n_layer = 4; c->n_embd = 128; c->n_head = 4; c->vocab = 256; c->max_t = 128; c->dropout = 0.0f;
}

static dt_status gpt2_validate(const dt_model_cfg *c) {
    /* messages name the settings (arch.*), which the CLI shows as flags */
    const struct { const char *key; int v; } pos[] = {{"arch.layers", c->n_layer}, {"arch.embd", c->n_embd},
        {"arch.heads", c->n_head}, {"arch.vocab", c->vocab}, {"arch.max_t", c->max_t}};
    for (size_t i = 0; i < sizeof pos / sizeof pos[0]; i++)
        if (pos[i].v <= 0) return DT_ERR(DT_EINVAL, "gpt2: %s %d must be positive", pos[i].key, pos[i].v);
    if (c->n_embd % c->n_head)
        return DT_ERR(DT_EINVAL, "gpt2: arch.embd %d is not divisible by arch.heads %d", c->n_embd, c->n_head);
    if (c->vocab < 2)   /* a cross-entropy over one class is no loss */
        return DT_ERR(DT_EINVAL, "gpt2: arch.vocab %d: the model predicts one of at least 2 tokens", c->vocab);
    if (c->vocab > 65536)
        return DT_ERR(DT_EINVAL, "gpt2: arch.vocab %d exceeds 65536 (tokens are uint16)", c->vocab);
    if (!(c->dropout >= 0 && c->dropout < 1))
        return DT_ERR(DT_EINVAL, "gpt2: arch.dropout %g outside [0, 1)", c->dropout);
    if (c->tp_size > 1) {   /* tensor parallelism: heads and the MLP's 4C columns split T ways */
        if (c->n_head % c->tp_size)
            return DT_ERR(DT_EINVAL, "gpt2: arch.heads %d is not divisible by the tensor-parallel size tp.size %d "
                          "(attention is split by heads)", c->n_head, c->tp_size);
        if ((4 * (int64_t)c->n_embd) % c->tp_size)
            return DT_ERR(DT_EINVAL, "gpt2: the MLP width 4 x arch.embd = %lld is not divisible by tp.size %d",
                          4 * (long long)c->n_embd, c->tp_size);
        if (c->vocab < c->tp_size)
            return DT_ERR(DT_EINVAL, "gpt2: arch.vocab %d is smaller than tp.size %d (the vocabulary is split by rows)",
                          c->vocab, c->tp_size);
        if (c->tp_rank < 0 || c->tp_rank >= c->tp_size)
            return DT_ERR(DT_EINVAL, "gpt2: tensor-parallel rank %d outside 0..%d", c->tp_rank, c->tp_size - 1);
    } else if (c->tp_seq) {
        return DT_ERR(DT_EINVAL, "gpt2: sequence parallelism needs tensor parallelism (tp.size > 1, got %d)",
                      c->tp_size);
    }
    return DT_OK;
}

/* 6 flops per weight per token (fwd 2 + bwd 4); positional table is a lookup;
 * attention scores and mixing: 12 * L * T * C (PaLM convention). */
static double gpt2_flops(const dt_model *m, int64_t T) {
    const dt_model_cfg *c = &m->cfg;
    double n = (double)m->n_elems - (double)c->max_t * c->n_embd;
    return 6.0 * n + 12.0 * c->n_layer * (double)T * c->n_embd;
}

#define GPT2_INT(k, field, m, h) {.key = k, .type = DT_SETTING_INT, .at = offsetof(dt_model_cfg, field), .meta = m, .help = h}
static const dt_model_setting gpt2_settings[] = {
    GPT2_INT("arch.layers", n_layer, "L", "GPT-2 layers (default 4)"),
    GPT2_INT("arch.embd", n_embd, "C", "GPT-2 embedding width (default 128)"),
    GPT2_INT("arch.heads", n_head, "H", "GPT-2 attention heads (default 4)"),
    GPT2_INT("arch.vocab", vocab, "V", "GPT-2 vocabulary (default 256: bytes)"),
    GPT2_INT("arch.max_t", max_t, "T", "GPT-2 context length (default 128)"),
    {.key = "arch.dropout", .type = DT_SETTING_FLOAT, .at = offsetof(dt_model_cfg, dropout), .meta = "P",
     .help = "GPT-2 dropout (default 0)"},
};

const dt_model_builtin dt_builtin_gpt2 = {
    .name = "gpt2", .data = "text", .max_seq = "arch.max_t",
    .defaults = gpt2_defaults, .validate = gpt2_validate, .build = gpt2_build, .flops = gpt2_flops,
    .settings = gpt2_settings, .n_settings = (int)(sizeof gpt2_settings / sizeof gpt2_settings[0]),
};
