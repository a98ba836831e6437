/* Blocks and the loss head: the forward pass as an ordered list of functions
 * from activation to activation, any contiguous range runnable on its own.
 * Invariants (checked at build): block 0 reads the batch (in_ndim 0), every
 * later block takes what the one before returns, the last returns
 * [.., classes] for the loss head. Each block's output is checked against its
 * declaration when it runs, so a wrong declaration fails at the block. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "model_internal.h"

static dt_status check_dims(const dt_model *m, const char *block, const char *which, int ndim, const int64_t *dims) {
    if (ndim < 0 || ndim > 3 || (ndim == 0 && !strcmp(which, "output")))
        return DT_ERR(DT_EINVAL, "model %s: block %s %s has %d dims (1..3 per sample)", m->name, block, which, ndim);
    if (ndim > 0 && !dims)
        return DT_ERR(DT_EINVAL, "model %s: block %s %s has %d dims but no sizes (NULL)", m->name, block, which, ndim);
    for (int i = 0; i < ndim; i++)
        if (dims[i] <= 0 && dims[i] != DT_DIM_SEQ && dims[i] != DT_DIM_SEQ_PART)
            return DT_ERR(DT_EINVAL, "model %s: block %s %s dim %d is %lld", m->name, block, which, i,
                          (long long)dims[i]);
    return DT_OK;
}

dt_status dt_model_add_block(dt_model *m, const char *name, dt_block_fn fn, void *user, int in_ndim,
                             const int64_t *in_dims, int out_ndim, const int64_t *out_dims) {
    if (!m) return DT_ERR(DT_EINVAL, "cannot add block '%s': the model is NULL", name ? name : "(null)");
    if (m->build_err != DT_OK) return m->build_err;
    dt_status s = DT_OK;
    if (m->built) s = DT_ERR(DT_ESTATE, "model %s: cannot add block %s after dt_model_build", m->name, name ? name : "?");
    else if (!name || !*name || strlen(name) >= sizeof m->blocks[0].name)
        s = DT_ERR(DT_EINVAL, "model %s: block name '%s' must be 1..%zu characters", m->name, name ? name : "(null)",
                   sizeof m->blocks[0].name - 1);
    else if (!fn) s = DT_ERR(DT_EINVAL, "model %s: block %s has no forward function", m->name, name);
    else if (m->n_blocks == DT_MAX_BLOCKS) s = DT_ERR(DT_EINVAL, "model %s: more than %d blocks", m->name, DT_MAX_BLOCKS);
    if (s == DT_OK) s = check_dims(m, name, "input", in_ndim, in_dims);
    if (s == DT_OK) s = check_dims(m, name, "output", out_ndim, out_dims);
    dt_block *nb = s == DT_OK ? dt_nn_grow(m->blocks, m->n_blocks, sizeof *nb) : NULL;
    if (s == DT_OK && !nb) s = DT_ERR(DT_ENOMEM, "out of memory adding block %s", name);
    if (nb) m->blocks = nb;
    if (s != DT_OK) { dt_nn_build_failed(m, s); return s; }
    dt_block *b = &m->blocks[m->n_blocks++];
    memset(b, 0, sizeof *b);
    snprintf(b->name, sizeof b->name, "%s", name);
    b->forward = fn;
    b->user = user;
    b->in_ndim = in_ndim;
    b->out_ndim = out_ndim;
    for (int i = 0; i < in_ndim; i++) b->in_dims[i] = in_dims[i];
    for (int i = 0; i < out_ndim; i++) b->out_dims[i] = out_dims[i];
    return DT_OK;
}

dt_status dt_model_set_loss(dt_model *m, dt_loss_kind kind, int64_t classes) {
    if (!m) return DT_ERR(DT_EINVAL, "dt_model_set_loss: the model is NULL");
    if (m->build_err != DT_OK) return m->build_err;
    if (m->built) {   /* the blocks were checked against the loss the model was built with */
        dt_nn_build_failed(m, DT_ERR(DT_ESTATE, "model %s: cannot set the loss after dt_model_build", m->name));
        return m->build_err;
    }
    dt_status s = DT_OK;
    if (kind != DT_LOSS_CROSS_ENTROPY) s = DT_ERR(DT_EINVAL, "model %s: unknown loss %d", m->name, (int)kind);
    else if (classes < 2) s = DT_ERR(DT_EINVAL, "model %s: cross-entropy over %lld classes (needs >= 2)", m->name,
                                    (long long)classes);
    if (s != DT_OK) { dt_nn_build_failed(m, s); return s; }
    m->loss = kind;
    m->classes = classes;
    m->loss_parts = 1;
    return DT_OK;
}

dt_status dt_model_set_loss_split(dt_model *m, int64_t classes, int parts) {
    if (parts <= 1) return dt_model_set_loss(m, DT_LOSS_CROSS_ENTROPY, classes);
    DT_TRY(dt_model_set_loss(m, DT_LOSS_CROSS_ENTROPY, classes));
    m->loss = DT_LOSS_VOCAB_PARALLEL;
    m->loss_parts = parts;
    return DT_OK;
}

/* The columns of the last block's output: classes, or this rank's part of them. */
static int64_t head_cols(const dt_model *m) {
    return m->loss == DT_LOSS_VOCAB_PARALLEL ? dt_vocab_part(m->classes, m->loss_parts) : m->classes;
}

/* The split loss head's group: m->tp of loss_parts ranks. */
static int split_group_ok(const dt_model *m) {
    if (m->tp && m->tp->size == m->loss_parts) return 1;
    DT_ERR(DT_ESTATE, "model %s: its loss head is split %d ways but the model's tensor-parallel group is %s (size %d)",
           m->name, m->loss_parts, m->tp ? "set" : "not set", m->tp ? m->tp->size : 0);
    return 0;
}

void dt_model_set_recompute(dt_model *m, dt_recompute r) {
    /* not the last block: the loss head keeps its output anyway, so a replay
     * would only hold that output twice (GPT-2's logits: the largest tensor) */
    for (int i = 0; i < m->n_blocks; i++) m->blocks[i].recompute = r == DT_RECOMPUTE_BLOCKS && i + 1 < m->n_blocks;
}

void dt_model_set_saved_dtype(dt_model *m, dt_dtype d) {
    /* not the last block, as for recompute: its output feeds the loss head,
     * so the region would hold it twice while it runs (GPT-2's logits) */
    for (int i = 0; i < m->n_blocks; i++) m->blocks[i].saved_dtype = i + 1 < m->n_blocks ? d : DT_F32;
}

int dt_recompute_parse(const char *s, dt_recompute *out) {
    if (!strcmp(s, "none")) { *out = DT_RECOMPUTE_NONE; return 0; }
    if (!strcmp(s, "blocks")) { *out = DT_RECOMPUTE_BLOCKS; return 0; }
    return -1;
}

static int same_dims(int na, const int64_t *a, int nb, const int64_t *b) {
    if (na != nb) return 0;
    for (int i = 0; i < na; i++)
        if (a[i] != b[i]) return 0;
    return 1;
}

dt_status dt_model_check_blocks(const dt_model *m) {
    if (m->n_inputs == 0) return DT_ERR(DT_EINVAL, "model %s declares no input (dt_model_add_input)", m->name);
    if (m->n_blocks == 0) return DT_ERR(DT_EINVAL, "model %s has no blocks (dt_model_add_block)", m->name);
    if (m->classes == 0) return DT_ERR(DT_EINVAL, "model %s has no loss head (dt_model_set_loss)", m->name);
    if (m->blocks[0].in_ndim != 0)
        return DT_ERR(DT_EINVAL, "model %s: the first block (%s) must read the batch (in_ndim 0)", m->name,
                      m->blocks[0].name);
    for (int i = 1; i < m->n_blocks; i++) {
        const dt_block *p = &m->blocks[i - 1], *b = &m->blocks[i];
        if (!same_dims(p->out_ndim, p->out_dims, b->in_ndim, b->in_dims))
            return DT_ERR(DT_EINVAL, "model %s: block %s takes other dims than block %s returns", m->name, b->name,
                          p->name);
    }
    const dt_block *last = &m->blocks[m->n_blocks - 1];
    for (int j = 0; j < last->out_ndim; j++)
        if (last->out_dims[j] == DT_DIM_SEQ_PART)
            return DT_ERR(DT_EINVAL, "model %s: the last block (%s) returns a sequence-parallel share of the positions "
                          "(DT_DIM_SEQ_PART); the loss head takes every position (DT_DIM_SEQ)", m->name, last->name);
    if (last->out_dims[last->out_ndim - 1] != head_cols(m))
        return DT_ERR(DT_EINVAL, "model %s: the last block (%s) must return [.., %lld] for the loss head", m->name,
                      last->name, (long long)head_cols(m));
    return DT_OK;
}

int dt_model_block_shape(const dt_model *m, int i, int in, const dt_batch *b, int64_t *shape) {
    const dt_block *k = &m->blocks[i];
    int nd = in ? k->in_ndim : k->out_ndim;
    const int64_t *d = in ? k->in_dims : k->out_dims;
    if (nd == 0) return 0;
    shape[0] = b->B;
    int64_t part = m->cfg.tp_seq && m->cfg.tp_size > 1 ? b->T / m->cfg.tp_size : b->T;
    for (int j = 0; j < nd; j++) shape[j + 1] = d[j] == DT_DIM_SEQ ? b->T : d[j] == DT_DIM_SEQ_PART ? part : d[j];
    return nd + 1;
}

static dt_status check_activation(const dt_model *m, int i, int in, const dt_batch *b, const dt_tensor *x) {
    int64_t want[DT_MAX_DIMS];
    int nd = dt_model_block_shape(m, i, in, b, want);
    if (x->dtype == DT_F32 && same_dims(x->ndim, x->shape, nd, want)) return DT_OK;
    char have[64], decl[64];
    dt_tensor w = {0};
    dt_tensor_set_shape(&w, nd, want);
    return DT_ERR(DT_EINVAL, "model %s: block %s %s %s, declared %s", m->name, m->blocks[i].name,
                  in ? "was given" : "returned", dt_shape_str(x, have, sizeof have), dt_shape_str(&w, decl, sizeof decl));
}

/* What a recomputed block needs until backward: the call, with a copy of the
 * batch descriptor (its buffers are the caller's, live until backward). */
typedef struct block_call { dt_model *m; int i; dt_batch b; } block_call;

static dt_tensor *replay_block(dt_graph *g, dt_tensor *x, void *ctx) {
    block_call *c = ctx;
    dt_block *k = &c->m->blocks[c->i];
    return k->forward(c->m, g, x, &c->b, k->user);
}

static dt_tensor *run_block(dt_model *m, dt_graph *g, int i, dt_tensor *x, const dt_batch *b) {
    dt_block *k = &m->blocks[i];
    dt_error_clear();
    dt_tensor *y;
    if (k->recompute && dt_graph_grad_enabled(g)) {   /* keep x; re-run in backward (dropout is keyed by position) */
        block_call *c = dt_graph_scratch(g, sizeof *c);
        if (!c) return NULL;
        *c = (block_call){m, i, *b};
        y = dt_graph_checkpoint(g, replay_block, x, c, NULL);
    } else if (k->saved_dtype != DT_F32 && dt_graph_grad_enabled(g)) {   /* activations in 16 bits until backward */
        block_call *c = dt_graph_scratch(g, sizeof *c);
        if (!c) return NULL;
        *c = (block_call){m, i, *b};
        y = dt_graph_pack16(g, replay_block, x, c, k->saved_dtype);
    } else {
        y = k->forward(m, g, x, b, k->user);
    }
    if (!y) {
        if (dt_error_code() == DT_OK) DT_ERR(DT_EINVAL, "model %s: block %s returned no tensor", m->name, k->name);
        return NULL;
    }
    return check_activation(m, i, 0, b, y) == DT_OK ? y : NULL;
}

dt_tensor *dt_model_run_blocks(dt_model *m, dt_graph *g, const dt_batch *b, int first, int last, dt_tensor *x) {
    if (first < 0 || last > m->n_blocks || first >= last) {
        DT_ERR(DT_EINVAL, "model %s: blocks [%d, %d) outside 0..%d", m->name, first, last, m->n_blocks);
        return NULL;
    }
    if (!b || b->B <= 0) { DT_ERR(DT_EINVAL, "model %s: empty batch", m->name); return NULL; }
    if ((first == 0) != (x == NULL)) {
        DT_ERR(DT_EINVAL, "model %s: block %s %s", m->name, m->blocks[first].name,
               first == 0 ? "reads the batch; x must be NULL" : "needs its input activation x");
        return NULL;
    }
    if (x && check_activation(m, first, 1, b, x) != DT_OK) return NULL;
    for (int i = first; i < last; i++) DT_NN_CHECK(x = run_block(m, g, i, x, b));
    return x;
}

dt_tensor *dt_model_loss(dt_model *m, dt_graph *g, const dt_batch *b, dt_tensor *x, dt_tensor **logits) {
    if (!x || !b || !b->y) { DT_ERR(DT_EINVAL, "model %s: loss needs an activation and targets", m->name); return NULL; }
    int64_t cols = head_cols(m), rows = x->numel / cols;
    if (x->shape[x->ndim - 1] != cols || rows != b->B * b->T) {
        char sx[64];
        DT_ERR(DT_EINVAL, "model %s: loss head takes [.., %lld] with %lld rows (B*T), got %s", m->name,
               (long long)cols, (long long)(b->B * b->T), dt_shape_str(x, sx, sizeof sx));
        return NULL;
    }
    int split = m->loss == DT_LOSS_VOCAB_PARALLEL;
    if (split && !split_group_ok(m)) return NULL;
    /* The logits' values are dead after the loss when a linear layer made
     * them (its backward reads its input, not its output) and the caller does
     * not want them: the loss gradient then overwrites them in place. */
    int consume = !logits && x->grad_fn && x->grad_fn->op && !strcmp(x->grad_fn->op, "linear");
    if (x->ndim != 2) {
        int64_t shape[2] = {rows, cols};
        DT_NN_CHECK(x = dt_op_reshape(g, x, 2, shape));
    }
    if (logits) *logits = x;
    if (split)   /* this rank's columns: max, sum of exp and target logit all-reduced, never [rows, classes] */
        return consume ? dt_op_vocab_parallel_cross_entropy_consume(g, x, b->y, m->classes, m->tp)
                       : dt_op_vocab_parallel_cross_entropy(g, x, b->y, m->classes, m->tp);
    return consume ? dt_op_cross_entropy_consume(g, x, b->y) : dt_op_cross_entropy(g, x, b->y);
}

int64_t dt_model_count_correct(const dt_model *m, const dt_tensor *logits, const int32_t *labels) {
    if (m->loss != DT_LOSS_VOCAB_PARALLEL) return dt_count_correct(logits, labels);
    return split_group_ok(m) ? dt_count_correct_vocab_parallel(logits, labels, m->classes, m->tp) : -1;
}

dt_tensor *dt_model_forward(dt_model *m, dt_graph *g, const dt_batch *b, dt_tensor **logits) {
    if (!b || b->B <= 0 || !b->y) { DT_ERR(DT_EINVAL, "forward: empty batch or missing targets"); return NULL; }
    if (m->forward) return m->forward(m, g, b, logits);
    if (!m->built) { DT_ERR(DT_ESTATE, "model %s: forward before dt_model_build", m->name); return NULL; }
    dt_tensor *x = dt_model_run_blocks(m, g, b, 0, m->n_blocks, NULL);
    return x ? dt_model_loss(m, g, b, x, logits) : NULL;
}
