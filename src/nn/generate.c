/* Generation (generate.h): a KV cache over GPT-2's parameters, the
 * full-prefix reference, token picking and the generation loop.
 *
 * The cache's forward uses the same ops as gpt2.c's blocks (LayerNorm,
 * linear, linear+GELU, residual adds) on a no-grad tape, except attention:
 * the new rows' keys and values are appended to per-layer buffers (keys
 * transposed, k [L][H][hs][maxT], so a row's scores over all positions are
 * one vectorised pass per dimension; values v [L][H][maxT][hs]), and each new
 * row attends to positions 0..its own.
 * Its arithmetic follows dt_op_attention (q pre-scaled by 1/sqrt(hs), fmaf
 * accumulation in position order), so the logits agree with a forward over
 * the whole prefix to rounding (GEMMs over 1 row instead of T). */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dtrain/generate.h"

typedef struct kv_layer {
    dt_tensor *ln1_w, *ln1_b, *attn_w, *attn_b, *aproj_w, *aproj_b;
    dt_tensor *ln2_w, *ln2_b, *fc_w, *fc_b, *mproj_w, *mproj_b;
} kv_layer;

struct dt_kv_cache {
    dt_model *m;
    int L, C, H, hs, V, T, len;
    float *k, *v;                 /* k [L][H][hs][T] (transposed), v [L][H][T][hs] */
    dt_graph *g;                  /* no-grad tape: its arena holds one forward's activations */
    dt_tensor *wte, *wpe, *lnf_w, *lnf_b;
    kv_layer *ly;
};

static dt_status need(dt_model *m, const char *name, int ndim, int64_t d0, int64_t d1, dt_tensor **out) {
    dt_param *p = dt_model_find_param(m, name);
    if (!p)
        return DT_ERR(DT_EINVAL, "kv cache: model '%s' has no parameter '%s' (a GPT-2 holding all its parameters "
                      "is needed)", m->name, name);
    dt_tensor *t = &p->value;
    if (t->ndim != ndim || t->shape[0] != d0 || (ndim > 1 && t->shape[1] != d1) || t->dtype != DT_F32 || !t->data) {
        char sh[64], want[64];
        if (ndim > 1) snprintf(want, sizeof want, "[%lld, %lld]", (long long)d0, (long long)d1);
        else snprintf(want, sizeof want, "[%lld]", (long long)d0);
        return DT_ERR(DT_EINVAL, "kv cache: parameter '%s' has shape %s, GPT-2 with arch.embd %d and arch.vocab %d "
                      "expects %s", name, dt_shape_str(t, sh, sizeof sh), m->cfg.n_embd, m->cfg.vocab, want);
    }
    *out = t;
    return DT_OK;
}

static dt_status bind(dt_kv_cache *c) {
    dt_model *m = c->m;
    int64_t C = c->C;
    char nm[128];
    DT_TRY(need(m, "wte.weight", 2, c->V, C, &c->wte));
    DT_TRY(need(m, "wpe.weight", 2, c->T, C, &c->wpe));
    DT_TRY(need(m, "ln_f.weight", 1, C, 0, &c->lnf_w));
    DT_TRY(need(m, "ln_f.bias", 1, C, 0, &c->lnf_b));
    for (int l = 0; l < c->L; l++) {
        kv_layer *y = &c->ly[l];
        struct { const char *leaf; int ndim; int64_t d0, d1; dt_tensor **dst; } w[] = {
            {"ln_1.weight", 1, C, 0, &y->ln1_w}, {"ln_1.bias", 1, C, 0, &y->ln1_b},
            {"attn.c_attn.weight", 2, C, 3 * C, &y->attn_w}, {"attn.c_attn.bias", 1, 3 * C, 0, &y->attn_b},
            {"attn.c_proj.weight", 2, C, C, &y->aproj_w}, {"attn.c_proj.bias", 1, C, 0, &y->aproj_b},
            {"ln_2.weight", 1, C, 0, &y->ln2_w}, {"ln_2.bias", 1, C, 0, &y->ln2_b},
            {"mlp.c_fc.weight", 2, C, 4 * C, &y->fc_w}, {"mlp.c_fc.bias", 1, 4 * C, 0, &y->fc_b},
            {"mlp.c_proj.weight", 2, 4 * C, C, &y->mproj_w}, {"mlp.c_proj.bias", 1, C, 0, &y->mproj_b},
        };
        for (size_t i = 0; i < sizeof w / sizeof w[0]; i++) {
            snprintf(nm, sizeof nm, "h.%d.%s", l, w[i].leaf);
            DT_TRY(need(m, nm, w[i].ndim, w[i].d0, w[i].d1, w[i].dst));
        }
    }
    return DT_OK;
}

dt_status dt_kv_cache_create(dt_model *m, dt_kv_cache **out) {
    if (!out) return DT_ERR(DT_EINVAL, "dt_kv_cache_create: NULL output");
    *out = NULL;
    if (!m || !m->built) return DT_ERR(DT_EINVAL, "dt_kv_cache_create: no built model");
    if (strcmp(m->name, "gpt2"))
        return DT_ERR(DT_EINVAL, "kv cache: model '%s' is not a GPT-2 (only gpt2 has a KV cache)", m->name);
    const dt_model_cfg *cfg = &m->cfg;
    if (cfg->n_layer <= 0 || cfg->n_head <= 0 || cfg->n_embd % cfg->n_head || cfg->max_t <= 0 || cfg->vocab <= 0)
        return DT_ERR(DT_EINVAL, "kv cache: model gpt2 has an invalid configuration (arch.layers %d, arch.embd %d, "
                      "arch.heads %d)", cfg->n_layer, cfg->n_embd, cfg->n_head);
    if (cfg->tp_size > 1)   /* its split layers need the group's sums: not on one rank */
        return DT_ERR(DT_EINVAL, "kv cache: this gpt2 is tensor-parallel rank %d's part of %d (tp.size); sampling runs "
                      "on one rank and needs the whole model (save, then sample from the checkpoint)",
                      cfg->tp_rank, cfg->tp_size);
    dt_kv_cache *c = calloc(1, sizeof *c);
    if (!c) return DT_ERR(DT_ENOMEM, "kv cache: out of memory");
    c->m = m;
    c->L = cfg->n_layer; c->C = cfg->n_embd; c->H = cfg->n_head; c->hs = c->C / c->H;
    c->V = cfg->vocab; c->T = cfg->max_t;
    size_t n = (size_t)c->L * (size_t)c->T * (size_t)c->C;
    c->ly = calloc((size_t)c->L, sizeof *c->ly);
    c->k = dt_alloc(n * sizeof(float));
    c->v = dt_alloc(n * sizeof(float));
    c->g = dt_graph_create();
    dt_status s = DT_OK;
    if (!c->ly || !c->k || !c->v || !c->g)
        s = DT_ERR(DT_ENOMEM, "kv cache: out of memory (%zu bytes of keys and values)", 2 * n * sizeof(float));
    if (s == DT_OK) s = bind(c);
    if (s != DT_OK) {
        dt_kv_cache_free(c);
        return s;
    }
    dt_graph_set_grad_enabled(c->g, 0);
    dt_graph_set_training(c->g, 0);
    *out = c;
    return DT_OK;
}

void dt_kv_cache_free(dt_kv_cache *c) {
    if (!c) return;
    if (c->g) dt_graph_free(c->g);
    dt_free(c->k);
    dt_free(c->v);
    free(c->ly);
    free(c);
}

void dt_kv_cache_clear(dt_kv_cache *c) { if (c) c->len = 0; }
int dt_kv_cache_len(const dt_kv_cache *c) { return c ? c->len : 0; }
int dt_kv_cache_capacity(const dt_kv_cache *c) { return c ? c->T : 0; }

/* Rows qkv[n, 3C] at positions len..len+n-1: keys and values into layer l's
 * cache, then y[n, C] = causal attention of each row over positions 0..its own. */
static dt_status attend(dt_kv_cache *c, int l, const float *qkv, int n, float *y) {
    const int C = c->C, H = c->H, hs = c->hs, T = c->T, len = c->len;
    const float scale = 1.0f / sqrtf((float)hs);
    float *K = c->k + (size_t)l * H * T * hs, *Vc = c->v + (size_t)l * H * T * hs;
    for (int i = 0; i < n; i++)
        for (int h = 0; h < H; h++) {
            const float *kr = qkv + (size_t)i * 3 * C + C + h * hs;
            for (int d = 0; d < hs; d++) K[((size_t)h * hs + d) * T + len + i] = kr[d];
            memcpy(Vc + ((size_t)h * T + len + i) * hs, qkv + (size_t)i * 3 * C + 2 * C + h * hs,
                   (size_t)hs * sizeof(float));
        }
    int fail = 0;
#pragma omp parallel reduction(| : fail)
    {
        float *s = malloc((size_t)(len + n) * sizeof *s), *q = malloc((size_t)hs * sizeof *q);
        if (!s || !q) fail = 1;
#pragma omp for collapse(2) schedule(static)
        for (int i = 0; i < n; i++)
            for (int h = 0; h < H; h++) {
                if (!s || !q) continue;
                const int p = len + i;   /* this row's position: it sees 0..p */
                const float *qr = qkv + (size_t)i * 3 * C + h * hs;
                const float *Kh = K + (size_t)h * hs * T, *Vh = Vc + (size_t)h * T * hs;
                for (int d = 0; d < hs; d++) q[d] = scale * qr[d];
                /* s[j] = sum over d, in order, of fmaf(q[d], k[j][d], .): independent over j */
                for (int j = 0; j <= p; j++) s[j] = 0.0f;
                for (int d = 0; d < hs; d++) {
                    const float qd = q[d], *kd = Kh + (size_t)d * T;
#pragma omp simd
                    for (int j = 0; j <= p; j++) s[j] = fmaf(qd, kd[j], s[j]);
                }
                float mx = -INFINITY;
                for (int j = 0; j <= p; j++) mx = s[j] > mx ? s[j] : mx;
                float sum = 0.0f;
                for (int j = 0; j <= p; j++) {
                    s[j] = expf(s[j] - mx);
                    sum += s[j];
                }
                float inv = 1.0f / sum;
                for (int j = 0; j <= p; j++) s[j] *= inv;
                float *yr = y + (size_t)i * C + h * hs;
                for (int d = 0; d < hs; d++) yr[d] = 0.0f;
                for (int j = 0; j <= p; j++) {
                    const float *vj = Vh + (size_t)j * hs;
                    for (int d = 0; d < hs; d++) yr[d] = fmaf(s[j], vj[d], yr[d]);
                }
            }
        free(s);
        free(q);
    }
    if (fail) return DT_ERR(DT_ENOMEM, "kv cache: out of memory for attention scores");
    return DT_OK;
}

#define CK(x) do { if (!(x)) return dt_error_code() != DT_OK ? dt_error_code() : DT_ERR(DT_EINVAL, "kv cache: op failed"); } while (0)

static dt_status forward(dt_kv_cache *c, const int32_t *ids, int n, float *logits) {
    dt_graph *g = c->g;
    const int64_t C = c->C;
    dt_graph_reset(g);
    int64_t sh[2] = {n, C};
    dt_tensor *x = dt_graph_tensor(g, 2, sh);
    CK(x);
    const float *wte = dt_f32(c->wte), *wpe = dt_f32(c->wpe);
    for (int i = 0; i < n; i++)
        for (int64_t d = 0; d < C; d++)
            dt_f32(x)[i * C + d] = wte[(int64_t)ids[i] * C + d] + wpe[(int64_t)(c->len + i) * C + d];
    for (int l = 0; l < c->L; l++) {
        const kv_layer *w = &c->ly[l];
        dt_tensor *h, *qkv, *y;
        CK(h = dt_op_layernorm(g, x, w->ln1_w, w->ln1_b, 1e-5f));
        CK(qkv = dt_op_linear(g, h, w->attn_w, w->attn_b, DT_W_IN_OUT));
        CK(y = dt_graph_tensor(g, 2, sh));
        DT_TRY(attend(c, l, dt_f32(qkv), n, dt_f32(y)));
        CK(h = dt_op_linear(g, y, w->aproj_w, w->aproj_b, DT_W_IN_OUT));
        CK(h = dt_op_add_layernorm(g, x, h, w->ln2_w, w->ln2_b, 1e-5f, &x));
        CK(h = dt_op_linear_gelu(g, h, w->fc_w, w->fc_b, DT_W_IN_OUT));
        CK(h = dt_op_linear(g, h, w->mproj_w, w->mproj_b, DT_W_IN_OUT));
        CK(x = dt_op_add(g, x, h));
    }
    dt_tensor last, *h;   /* only the last row's logits are needed */
    int64_t one[2] = {1, C};
    dt_tensor_view(&last, dt_f32(x) + (int64_t)(n - 1) * C, DT_F32, 2, one);
    CK(h = dt_op_layernorm(g, &last, c->lnf_w, c->lnf_b, 1e-5f));
    CK(h = dt_op_linear(g, h, c->wte, NULL, DT_W_OUT_IN));
    memcpy(logits, dt_f32(h), (size_t)c->V * sizeof(float));
    return DT_OK;
}

dt_status dt_kv_cache_forward(dt_kv_cache *c, const int32_t *ids, int n, float *logits) {
    if (!c || !ids || !logits || n < 1) return DT_ERR(DT_EINVAL, "dt_kv_cache_forward: bad arguments (n = %d)", n);
    if (n > c->T - c->len)
        return DT_ERR(DT_EINVAL, "kv cache: %d more tokens after %d exceed the context of %d positions (arch.max_t)",
                      n, c->len, c->T);
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= c->V)
            return DT_ERR(DT_EINVAL, "kv cache: token %d (id %d) is outside the vocabulary of %d (arch.vocab)", i,
                          (int)ids[i], c->V);
    DT_TRY(forward(c, ids, n, logits));
    c->len += n;
    return DT_OK;
}

dt_status dt_model_next_logits(dt_model *m, const int32_t *ids, int n, float *logits) {
    if (!m || !ids || !logits || n < 1) return DT_ERR(DT_EINVAL, "dt_model_next_logits: bad arguments (n = %d)", n);
    dt_graph *g = dt_graph_create();
    if (!g) return DT_ERR(DT_ENOMEM, "dt_model_next_logits: out of memory");
    dt_graph_set_grad_enabled(g, 0);
    dt_graph_set_training(g, 0);
    dt_batch b = {.B = 1, .T = n};
    int64_t shape[2] = {1, n};
    dt_status s = dt_batch_add_input(&b, "ids", DT_I32, 2, shape, ids);
    dt_tensor *y = s == DT_OK ? dt_model_run_blocks(m, g, &b, 0, m->n_blocks, NULL) : NULL;
    if (s == DT_OK && !y) s = dt_error_code() != DT_OK ? dt_error_code() : DT_ERR(DT_EINVAL, "%s: forward failed", m->name);
    int64_t V = s == DT_OK && y->ndim > 0 ? y->shape[y->ndim - 1] : 0;
    if (s == DT_OK && (V != m->classes || y->numel != (int64_t)n * V))
        s = DT_ERR(DT_EINVAL, "%s: the last block gives %lld values, not [%d tokens, %lld classes]", m->name,
                   (long long)y->numel, n, (long long)m->classes);
    if (s == DT_OK) memcpy(logits, dt_f32(y) + (int64_t)(n - 1) * V, (size_t)V * sizeof(float));
    dt_graph_free(g);
    return s;
}

static int desc(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x > y ? -1 : x < y;
}

int32_t dt_gen_pick(const float *logits, int V, float temperature, int top_k, dt_rng *rng, float *scratch) {
    int greedy = temperature == 0 || top_k == 1;
    if (!logits || V < 1 || !(temperature >= 0) || isinf(temperature) || top_k < 0 || (!greedy && !rng)) {
        DT_ERR(DT_EINVAL, "dt_gen_pick: bad arguments (V %d, temperature %g, top_k %d)", V, (double)temperature, top_k);
        return -1;
    }
    for (int i = 0; i < V; i++)
        if (isnan(logits[i])) {
            DT_ERR(DT_EINVAL, "generate: logit %d is NaN (a corrupt or diverged model)", i);
            return -1;
        }
    if (greedy) {
        int best = 0;
        for (int i = 1; i < V; i++)
            if (logits[i] > logits[best]) best = i;
        return best;
    }
    float *own = NULL, *w = scratch;
    if (!w && !(w = own = malloc(2 * (size_t)V * sizeof *w))) {
        DT_ERR(DT_ENOMEM, "dt_gen_pick: out of memory");
        return -1;
    }
    /* the k-th largest logit: keep those above it, and among those equal to
     * it the lowest ids, until k are kept */
    int k = top_k > 0 && top_k < V ? top_k : V;
    float *sorted = w + V;
    memcpy(sorted, logits, (size_t)V * sizeof *sorted);
    float kth = -INFINITY;
    if (k < V) {
        qsort(sorted, (size_t)V, sizeof *sorted, desc);
        kth = sorted[k - 1];
    }
    int above = 0;
    for (int i = 0; i < V; i++) above += logits[i] > kth;
    int equal_left = k - above;
    float mx = -INFINITY;
    for (int i = 0; i < V; i++) mx = logits[i] > mx ? logits[i] : mx;
    double sum = 0;
    for (int i = 0; i < V; i++) {
        int keep = logits[i] > kth || (logits[i] == kth && equal_left-- > 0);
        /* an infinite largest logit (inf - inf is NaN): the kept ids equal to it
         * share the draw evenly (+inf: they outweigh every finite one; all -inf:
         * nothing tells the kept ones apart) */
        float e = isinf(mx) ? (logits[i] == mx ? 1.0f : 0.0f) : expf((logits[i] - mx) / temperature);
        w[i] = keep ? e : 0.0f;
        sum += w[i];
    }
    double u = (double)dt_rng_uniform(rng) * sum, acc = 0;
    int pick = -1, last = 0;
    for (int i = 0; i < V && pick < 0; i++) {
        if (w[i] <= 0) continue;
        last = i;
        acc += w[i];
        if (u < acc) pick = i;
    }
    free(own);
    return pick >= 0 ? pick : last;   /* u rounding up to sum: the last kept id */
}

typedef struct gen_state {
    dt_model *m;
    dt_kv_cache *kv;     /* NULL: no cache */
    int32_t *win;        /* the tokens in context (the cache's positions) */
    int n, cap;
    float *logits;
} gen_state;

/* Appends ids[0..k) to the context and sets the logits of the last one. */
static dt_status push(gen_state *st, const int32_t *ids, int k) {
    memmove(st->win + st->n, ids, (size_t)k * sizeof *ids);
    if (st->kv) DT_TRY(dt_kv_cache_forward(st->kv, st->win + st->n, k, st->logits));
    st->n += k;
    if (!st->kv) DT_TRY(dt_model_next_logits(st->m, st->win, st->n, st->logits));
    return DT_OK;
}

/* The context is full: keep its last cap / 2 tokens, append tok, one prefix forward. */
static dt_status refill(gen_state *st, int32_t tok) {
    int keep = st->cap / 2;
    memmove(st->win, st->win + st->n - keep, (size_t)keep * sizeof *st->win);
    st->win[keep] = tok;
    st->n = 0;
    if (st->kv) dt_kv_cache_clear(st->kv);
    return push(st, st->win, keep + 1);
}

/* The context: a built-in's sequence bound (gpt2: arch.max_t), else T of
 * an "ids" input declared [-T] (at most T tokens); 0 when there is none. */
static int context_of(const dt_model *m) {
    int T = dt_model_cfg_max_seq(&m->cfg, NULL);
    for (int k = 0; T < 1 && k < m->n_inputs; k++) {
        const dt_input_spec *in = &m->inputs[k];
        if (!strcmp(in->name, "ids") && in->dtype == DT_I32 && in->ndim == 1 && in->dims[0] < 0 &&
            in->dims[0] >= -INT_MAX)
            T = (int)-in->dims[0];
    }
    return T;
}

dt_status dt_generate(dt_model *m, const int32_t *prompt, int n_prompt, int n_new, const dt_gen_opts *o,
                      int32_t *out, dt_gen_token_fn fn, void *user) {
    if (!m || !o || (n_new > 0 && !out && !fn) || n_new < 0)
        return DT_ERR(DT_EINVAL, "dt_generate: bad arguments (n_new %d, out %s, fn %s)", n_new, out ? "given" : "NULL",
                      fn ? "given" : "NULL");
    if (!prompt || n_prompt < 1) return DT_ERR(DT_EINVAL, "generate: the prompt is empty (the model needs a first token)");
    if (!(o->temperature >= 0) || !isfinite(o->temperature))
        return DT_ERR(DT_EINVAL, "generate: temperature %g must be 0 (greedy) or positive", (double)o->temperature);
    if (o->top_k < 0) return DT_ERR(DT_EINVAL, "generate: top_k %d must be 0 (all) or positive", o->top_k);
    int V = (int)m->classes, T = context_of(m);
    if (V < 1 || T < 1)
        return DT_ERR(DT_EINVAL, "generate: model '%s' is not a sequence model with a vocabulary and a context bound "
                      "(a built-in's arch.max_t, or an \"ids\" input declared [-T]: at most T tokens)", m->name);
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= V)
            return DT_ERR(DT_EINVAL, "generate: prompt token %d (id %d) is outside the vocabulary of %d (arch.vocab)",
                          i, (int)prompt[i], V);
    if (n_new == 0) return DT_OK;
    gen_state st = {.m = m, .cap = T};
    dt_status s = DT_OK;
    if (!o->no_cache) s = dt_kv_cache_create(m, &st.kv);
    st.win = malloc(((size_t)T + 1) * sizeof *st.win);
    st.logits = malloc(3 * (size_t)V * sizeof *st.logits);   /* logits, then dt_gen_pick's scratch */
    if (s == DT_OK && (!st.win || !st.logits)) s = DT_ERR(DT_ENOMEM, "generate: out of memory");
    dt_rng rng;
    dt_rng_seed(&rng, o->seed);
    if (s == DT_OK) {   /* a prompt longer than the context keeps its last T tokens */
        int skip = n_prompt > T ? n_prompt - T : 0;
        s = push(&st, prompt + skip, n_prompt - skip);
    }
    for (int i = 0; s == DT_OK && i < n_new; i++) {
        int32_t tok = dt_gen_pick(st.logits, V, o->temperature, o->top_k, &rng, st.logits + V);
        if (tok < 0) { s = dt_error_code(); break; }
        if (out) out[i] = tok;
        if ((fn && fn(tok, i, user)) || i == n_new - 1) break;
        s = st.n < st.cap ? push(&st, &tok, 1) : refill(&st, tok);
    }
    dt_kv_cache_free(st.kv);
    free(st.win);
    free(st.logits);
    return s;
}
