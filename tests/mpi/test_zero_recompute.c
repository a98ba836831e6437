/* Activation recompute (dt_graph_checkpoint) under DDP and ZeRO 1/2/3.
 *
 * The model is a 6-layer MLP run by a forward of our own (m->forward):
 * linear + relu + dropout per hidden layer, each layer its module; the
 * checkpointed variant wraps layers [0, 3) and [3, 5) in checkpoints, the
 * head (layer 5) stays plain. Two micro-steps per step, AdamW, dropout.
 *  - DDP: checkpointed == plain bit for bit, and the grad-ready hooks still
 *    fire during backward (in the replay), so every bucket is launched
 *    before backward returns (overlap kept).
 *  - ZeRO stages 1/2/3 (stage 3 with prefetch 0/1/2, overlap AFTER_BACKWARD
 *    and INTERLEAVED): checkpointed == plain == DDP bit for bit (N = 2 or
 *    deterministic). Stage 3 with one bucket per parameter: no bucket is
 *    all-gathered twice in one backward (backward_regathers == 0): a
 *    replayed block's modules are gathered once for recompute and backward.
 *    Stage 3's module-order check passes (it runs in finish_backward). */
#include "mpi_check.h"
#include "zero_testutil.h"

static dt_pg *world;

#define P_DROP 0.2f
enum { N_LAYERS = 6, N_SPANS = 3 };
static const int cuts[N_SPANS + 1] = {0, 3, 5, 6};   /* spans of layers; the first two checkpointed */

typedef struct span { dt_model *m; int first, end; const uint64_t *keys; } span;
static span spans[N_SPANS];   /* a checkpoint keeps &spans[k] until backward */

static dt_tensor *layers(dt_graph *g, dt_tensor *x, void *ctx) {
    const span *s = ctx;
    dt_model *m = s->m;
    for (int i = s->first; i < s->end && x; i++) {
        dt_module *mod = m->modules[i];
        if (dt_module_enter(g, mod) != DT_OK) return NULL;
        x = dt_op_linear(g, x, &mod->params[0]->value, &mod->params[1]->value, DT_W_OUT_IN);
        if (x && i + 1 < m->n_modules) x = dt_op_dropout(g, dt_op_relu(g, x), P_DROP, s->keys, (uint64_t)i);
        if (dt_module_leave(g, mod) != DT_OK) return NULL;
    }
    return x;
}

static dt_tensor *forward(dt_model *m, dt_graph *g, const dt_batch *b, dt_tensor **logits, int ckpt) {
    const dt_tensor *img = dt_batch_input(b, "image", DT_F32, "test_zero_recompute");
    dt_tensor *x = img ? dt_graph_input(g, 2, (int64_t[]){b->B, m->cfg.mlp_in}, img->data, 0) : NULL;
    /* dropout keys per row from the sample itself (its first pixel and its
     * target; the batches are the same in every run compared), kept with
     * the tape until backward's replay */
    uint64_t *keys = x ? dt_graph_scratch(g, (size_t)b->B * sizeof *keys) : NULL;
    for (int64_t r = 0; keys && r < b->B; r++) {
        uint32_t bits;
        memcpy(&bits, (const float *)img->data + r * m->cfg.mlp_in, sizeof bits);
        keys[r] = dt_dropout_row_key(m->dropout_seed, (uint64_t)b->y[r], bits);
    }
    if (!keys) x = NULL;
    for (int k = 0; k < N_SPANS && x; k++) {
        spans[k] = (span){m, cuts[k], cuts[k + 1], keys};
        x = ckpt && k < N_SPANS - 1 ? dt_graph_checkpoint(g, layers, x, &spans[k], NULL)
                                    : layers(g, x, &spans[k]);
    }
    if (!x) return NULL;
    if (logits) *logits = x;
    return dt_op_cross_entropy(g, x, b->y);
}
static dt_tensor *fwd_plain(dt_model *m, dt_graph *g, const dt_batch *b, dt_tensor **lg) { return forward(m, g, b, lg, 0); }
static dt_tensor *fwd_ckpt(dt_model *m, dt_graph *g, const dt_batch *b, dt_tensor **lg) { return forward(m, g, b, lg, 1); }

static dtz_spec spec(int ckpt) {
    dt_model_cfg c = dtt_mlp_cfg(12, 16, 16, 5);
    c.mlp_n_hidden = N_LAYERS - 1;
    for (int i = 0; i < c.mlp_n_hidden; i++) c.mlp_hidden[i] = 16;
    dtz_spec s = dtz_mk_spec(c, 6, 3);
    s.K = 2;
    s.forward = ckpt ? fwd_ckpt : fwd_plain;
    return s;
}

static void make_micro(const dtz_spec *s, int st, dtt_batch *mb) {
    for (int k = 0; k < s->K; k++) dtt_make_batch(&s->cfg, dtt_key(st, t_rank(), k), s->B, &mb[k]);
}

/* DDP as dtz_ddp_run trains (same LR per step), small buckets. Returns the
 * parameters (registration order); *in_bwd / *total: bytes handed to the
 * group before backward returned / in the whole step, summed over steps. */
static float *ddp_train(const dtz_spec *s, size_t *in_bwd, size_t *total) {
    dtt_net n;
    dtt_net_init(&n, &s->cfg, 1 + (uint64_t)t_rank(), &s->oc);
    n.m->forward = s->forward;
    dt_ddp_opts o;
    dt_ddp_opts_default(&o);
    o.dp.deterministic = s->det;
    o.dp.first_bucket_bytes = o.dp.bucket_bytes = 512;   /* several buckets */
    dt_ddp *d;
    T_OK(dt_ddp_create(n.m, world, &o, &d));
    T_CHECK(dt_ddp_num_buckets(d) > 2);
    *in_bwd = *total = 0;
    for (int st = 0; st < s->steps; st++) {
        dtt_batch mb[2];
        make_micro(s, st, mb);
        size_t b0 = dt_ddp_get_stats(d).bytes_reduced;
        for (int k = 0; k < s->K; k++) dtt_fwd_bwd(&n, d, k == s->K - 1, &mb[k].b, 1.0f / (float)s->K, NULL);
        size_t b1 = dt_ddp_get_stats(d).bytes_reduced;
        T_OK(dt_ddp_finish_backward(d));
        *in_bwd += b1 - b0;
        *total += dt_ddp_get_stats(d).bytes_reduced - b0;
        T_OK(dt_optimizer_step_range(&n.opt, dtz_lr(s, st), n.m->param_flat.data, n.m->grad_flat.data, 0,
                                     n.m->param_flat.numel, 1.0f));
        dt_optimizer_finish_step(&n.opt);
        dt_model_zero_grad(n.m);
        for (int k = 0; k < s->K; k++) dtt_batch_free(&mb[k]);
    }
    float *p = dtz_params(n.m, NULL);
    dt_ddp_free(d);
    dtt_net_free(&n);
    return p;
}

/* ZeRO as dtz_zero_run trains; parameters assembled from the owned shards. */
static float *zero_train(const dtz_spec *s, const dt_zero_opts *o, dt_zero_stats *stats) {
    dtz_net n;
    dtz_net_init(&n, s, 1 + (uint64_t)t_rank(), world, o);
    for (int st = 0; st < s->steps; st++) {
        dtt_batch mb[2];
        make_micro(s, st, mb);
        dtz_step(&n, dtz_lr(s, st), mb, s->K, NULL);
        for (int k = 0; k < s->K; k++) dtt_batch_free(&mb[k]);
    }
    *stats = dt_zero_get_stats(n.z);
    T_OK(dt_zero_sync_params(n.z));
    float *lay = dtz_gather_layout(n.z);
    float *p = dtz_params(n.m, lay);
    free(lay);
    dtz_net_free(&n);
    return p;
}

static dt_model *names;   /* parameter names and sizes for the comparisons */
static float *ddp_plain;

static void test_ddp(void) {
    t_begin("DDP: checkpointed blocks == plain bit for bit; every bucket launched during backward");
    dtz_spec sp = spec(0), sc = spec(1);
    size_t in_bwd[2], total[2];
    ddp_plain = ddp_train(&sp, &in_bwd[0], &total[0]);
    float *ck = ddp_train(&sc, &in_bwd[1], &total[1]);
    dtz_expect_params(names, ck, ddp_plain, 0, "DDP checkpointed vs plain");
    for (int v = 0; v < 2; v++) T_CHECK(total[v] > 0 && in_bwd[v] == total[v]);
    free(ck);
    t_end();
}

static void test_zero(void) {
    t_begin("ZeRO 1/2/3: checkpointed blocks == plain == DDP bit for bit; stage 3 gathers a bucket once per backward");
    typedef struct zcase { int stage, prefetch; dt_zero_overlap ov; } zcase;
    const zcase cases[] = {
        {1, 2, DT_ZERO_OVERLAP_AFTER_BACKWARD}, {2, 2, DT_ZERO_OVERLAP_AFTER_BACKWARD},
        {2, 2, DT_ZERO_OVERLAP_INTERLEAVED},    {3, 0, DT_ZERO_OVERLAP_AFTER_BACKWARD},
        {3, 1, DT_ZERO_OVERLAP_AFTER_BACKWARD}, {3, 2, DT_ZERO_OVERLAP_AFTER_BACKWARD},
        {3, 2, DT_ZERO_OVERLAP_INTERLEAVED},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        float *got[2];
        dt_zero_stats st[2];
        for (int ck = 0; ck < 2; ck++) {
            dtz_spec s = spec(ck);
            dt_zero_opts o = dtz_opts(&s, cases[c].stage, cases[c].ov);
            o.prefetch = cases[c].prefetch;
            o.dp.first_bucket_bytes = o.dp.bucket_bytes = 4;   /* one bucket per parameter */
            got[ck] = zero_train(&s, &o, &st[ck]);
        }
        char what[128];
        snprintf(what, sizeof what, "stage %d prefetch %d overlap %d: checkpointed vs plain", cases[c].stage,
                 cases[c].prefetch, (int)cases[c].ov);
        dtz_expect_params(names, got[1], got[0], 0, what);
        snprintf(what, sizeof what, "stage %d prefetch %d overlap %d: checkpointed vs DDP", cases[c].stage,
                 cases[c].prefetch, (int)cases[c].ov);
        dtz_expect_params(names, got[1], ddp_plain, 0, what);
        if (cases[c].stage == 3) {
            if (getenv("DTT_VERBOSE") && t_rank() == 0)
                printf("  prefetch %d: backward gathers plain %lld (again %lld), checkpointed %lld (again %lld)\n",
                       cases[c].prefetch, (long long)st[0].backward_gathers, (long long)st[0].backward_regathers,
                       (long long)st[1].backward_gathers, (long long)st[1].backward_regathers);
            for (int ck = 0; ck < 2; ck++) T_CHECK(st[ck].backward_gathers > 0 && st[ck].backward_regathers == 0);
        } else {
            for (int ck = 0; ck < 2; ck++) T_CHECK(st[ck].backward_gathers == 0);
        }
        free(got[0]);
        free(got[1]);
    }
    t_end();
}

int main(int argc, char **argv) {
    t_init(&argc, &argv);
    T_OK(dt_pg_world(&world));
    dtz_spec s = spec(0);
    T_OK(dt_model_create(&s.cfg, 1, &names));
    T_CHECK(names->n_modules == N_LAYERS);
    test_ddp();
    test_zero();
    free(ddp_plain);
    dt_model_free(names);
    T_OK(dt_dist_finalize());
    return 0;
}
