/* Frozen and unused parameters are not stepped (PyTorch skips a parameter
 * whose grad is None), with weight decay 0.1 and momentum (SGD momentum 0.9,
 * AdamW). An MLP 20 -> 16 -> 16 -> 5 whose fc1.weight is frozen
 * (dt_model_freeze) and whose whole fc2 layer (16 -> 16) is skipped by the
 * forward:
 *  - fc2 unused in every step: fc1.weight and fc2 keep their initial values
 *    bit for bit;
 *  - fc2 unused in some steps on every rank (1, 4) and used by the last rank
 *    only in others (2, 5): the run equals an oracle with one optimizer per
 *    parameter that steps a parameter only in the steps where some rank used
 *    it (so each parameter has its own step count, as PyTorch's
 *    per-parameter state), and fc2's optimizer state does not move in the
 *    steps nobody used it;
 * in one process (the model's optimizer, dt_optimizer_init_model), DDP with
 * find_unused_params, and ZeRO 1/2/3 in every step overlap mode. Bitwise:
 * N = 2 or deterministic reductions. */
#include "mpi_check.h"
#include "zero_testutil.h"

static dt_pg *world;

enum { STEPS = 6, ROWS = 8, FC2 = 1 };
static int g_mixed;     /* 0: fc2 never used; 1: used in some steps / on some ranks */
static int g_uniform;   /* mixed, but the same on every rank (ZeRO-3 gathers per module, so
                           every rank must run the same modules) */

/* Whether rank r uses fc2 in step st. */
static int fc2_used(int st, int r) {
    if (!g_mixed) return 0;
    return st % 3 == 0 || (st % 3 == 2 && (g_uniform || r == t_size() - 1));
}
static int is_fc2(const dt_param *p) { return strncmp(p->name, "fc2.", 4) == 0; }
static void freeze(dt_model *m) { T_CHECK(dt_model_freeze(m, "fc1.weight") == 1); }
static void skip_for(int st, int r) { dtt_skip_module = fc2_used(st, r) ? -1 : FC2; }
static void zero_hook(int st, int rank, int k) { (void)k; skip_for(st, rank); }

static dtz_spec spec(const dt_optim_cfg *oc) {
    dtz_spec s = dtz_mk_spec(dtt_mlp_cfg(20, 16, 16, 5), ROWS, STEPS);
    s.oc = *oc;
    s.forward = dtt_mlp_forward_skip_bias;
    s.find_unused = 1;
    s.before_micro = zero_hook;
    s.prepare = freeze;
    return s;
}

/* ---- the oracle: one process, one optimizer per parameter ---- */
typedef struct oracle {
    dtt_net r;
    dt_optimizer *po;   /* po[i]: parameter i alone, state [0, numel) */
} oracle;

static int g_step;
static const int *g_ranks;
static void ref_hook(int q) { skip_for(g_step, g_ranks[q]); }

/* The gradient of ranks[0..nr) averaged (dtt_ref_grads); parameter i is
 * stepped by its own optimizer when it is trainable and some of those ranks
 * used it. */
static void oracle_run(const dtz_spec *s, const int *ranks, int nr, oracle *o) {
    dtt_net_init(&o->r, &s->cfg, 1, &s->oc);
    dt_model *m = o->r.m;
    m->forward = dtt_mlp_forward_skip_bias;
    freeze(m);
    o->po = calloc((size_t)m->n_params, sizeof *o->po);
    T_CHECK(o->po != NULL);
    for (int i = 0; i < m->n_params; i++) {
        size_t n = (size_t)m->params[i]->value.numel;
        dt_optim_segment seg = {0, n, m->params[i]->weight_decay, NULL, NULL, 0};
        T_OK(dt_optimizer_init(&o->po[i], &s->oc, &seg, 1, 0, n));
    }
    for (int st = 0; st < STEPS; st++) {
        dtt_batch mb[8];
        T_CHECK(nr <= 8);
        int any = 0;
        for (int q = 0; q < nr; q++) {
            dtt_make_batch(&s->cfg, dtt_key(st, ranks[q], 0), s->B, &mb[q]);
            any |= fc2_used(st, ranks[q]);
        }
        g_step = st;
        g_ranks = ranks;
        dtt_ref_rank_hook = ref_hook;
        dtt_ref_grads(&o->r, mb, nr, 1, NULL);
        dtt_ref_rank_hook = NULL;
        for (int i = 0; i < m->n_params; i++) {
            dt_param *p = m->params[i];
            if (!p->requires_grad || (is_fc2(p) && !any)) continue;
            T_OK(dt_optimizer_step_range(&o->po[i], dtz_lr(s, st), dt_f32(&p->value), m->grad_flat.data + m->offsets[i],
                                         0, (size_t)p->value.numel, 1.0f));
            dt_optimizer_finish_step(&o->po[i]);
        }
        dt_model_zero_grad(m);
        for (int q = 0; q < nr; q++) dtt_batch_free(&mb[q]);
    }
    dtt_skip_module = -1;
}

static void oracle_free(oracle *o) {
    for (int i = 0; i < o->r.m->n_params; i++) dt_optimizer_free(&o->po[i]);
    free(o->po);
    dtt_net_free(&o->r);
}

/* ---- checks shared by the runs ---- */

/* fc1.weight always, fc2 when never used: bitwise their initial values. */
static void expect_kept(const dt_model *m, const float *init, const char *what) {
    char msg[200];
    size_t off = 0;
    for (int i = 0; i < m->n_params; i++) {
        const dt_param *p = m->params[i];
        size_t n = (size_t)p->value.numel;
        if (!p->requires_grad || (is_fc2(p) && !g_mixed)) {
            snprintf(msg, sizeof msg, "%s: %s keeps its initial value", what, p->name);
            T_BITWISE(dt_f32(&p->value), init + off, n, msg);
        }
        off += n;
    }
}

/* A whole-model optimizer's state equals the oracle's, parameter by
 * parameter; a frozen parameter has none (compact state). */
static void expect_state(const dt_optimizer *opt, const dt_model *m, const oracle *o, const char *what) {
    char msg[200];
    for (int k = 0; k < dt_optim_state_per_elem(&opt->cfg); k++)
        for (int i = 0; i < m->n_params; i++) {
            const float *st = dt_optimizer_state_of(opt, k, m->offsets[i]);
            if (!m->params[i]->requires_grad) {
                T_CHECK(st == NULL);
                continue;
            }
            T_CHECK(st != NULL);
            snprintf(msg, sizeof msg, "%s: optimizer state %d of %s vs oracle", what, k, m->params[i]->name);
            T_BITWISE(st, o->po[i].state[k], (size_t)m->params[i]->value.numel, msg);
        }
}

/* fc2's slice of each state array, to see it unchanged over a skipped step. */
static float *fc2_state(const dt_optimizer *opt, const dt_model *m, size_t *len) {
    int k2 = dt_optim_state_per_elem(&opt->cfg);
    size_t n = 0;
    for (int i = 0; i < m->n_params; i++)
        if (is_fc2(m->params[i])) n += (size_t)m->params[i]->value.numel;
    float *out = malloc((n * (size_t)k2 + 1) * sizeof *out), *w = out;
    T_CHECK(out != NULL);
    for (int k = 0; k < k2; k++)
        for (int i = 0; i < m->n_params; i++)
            if (is_fc2(m->params[i])) {
                memcpy(w, dt_optimizer_state_of(opt, k, m->offsets[i]), (size_t)m->params[i]->value.numel * sizeof *w);
                w += m->params[i]->value.numel;
            }
    *len = n * (size_t)k2;
    return out;
}

/* One process or DDP (d != NULL): the model's own optimizer. */
static void run_local(const dtz_spec *s, int use_ddp, const char *name) {
    int me = t_rank(), N = t_size();
    int all[8], mine[1] = {me};
    for (int r = 0; r < N && r < 8; r++) all[r] = r;
    oracle o;
    oracle_run(s, use_ddp ? all : mine, use_ddp ? N : 1, &o);
    dtt_net n;
    dtt_net_init(&n, &s->cfg, use_ddp ? 1 + (uint64_t)me : 1, &s->oc);
    n.m->forward = dtt_mlp_forward_skip_bias;
    freeze(n.m);
    dt_optimizer_free(&n.opt);
    T_OK(dt_optimizer_init_model(&n.opt, &s->oc, n.m));
    dt_ddp *d = NULL;
    if (use_ddp) {
        dt_ddp_opts dopts;
        dt_ddp_opts_default(&dopts);
        dopts.dp.first_bucket_bytes = dopts.dp.bucket_bytes = 256;
        dopts.dp.find_unused_params = 1;
        dopts.dp.deterministic = N > 2;
        T_OK(dt_ddp_create(n.m, world, &dopts, &d));
    }
    float *init = dtz_params(n.m, NULL);
    char what[200];
    for (int st = 0; st < STEPS; st++) {
        dtt_batch b;
        dtt_make_batch(&s->cfg, dtt_key(st, me, 0), s->B, &b);
        skip_for(st, me);
        n.lr = dtz_lr(s, st);
        size_t len;
        float *before = fc2_state(&n.opt, n.m, &len);
        if (d) dtt_ddp_step(&n, d, &b, 1);
        else {
            dtt_fwd_bwd(&n, NULL, 1, &b.b, 1.0f, NULL);
            dtt_opt_step(&n);
        }
        int any = 0;
        for (int r = 0; r < (use_ddp ? N : 1); r++) any |= fc2_used(st, use_ddp ? r : me);
        if (!any) {
            float *after = fc2_state(&n.opt, n.m, &len);
            snprintf(what, sizeof what, "%s: fc2's optimizer state over step %d, which no rank used it in", name, st);
            T_BITWISE(after, before, len, what);
            free(after);
        }
        free(before);
        dtt_batch_free(&b);
    }
    dtt_skip_module = -1;
    float *got = dtz_params(n.m, NULL), *want = dtz_params(o.r.m, NULL);
    snprintf(what, sizeof what, "%s vs the per-parameter oracle", name);
    dtz_expect_params(n.m, got, want, 0, what);
    expect_kept(n.m, init, name);
    expect_state(&n.opt, n.m, &o, name);
    free(got);
    free(want);
    free(init);
    dt_ddp_free(d);
    dtt_net_free(&n);
    oracle_free(&o);
}

static void run_zero(const dtz_spec *s) {
    int N = t_size(), all[8];
    for (int r = 0; r < N && r < 8; r++) all[r] = r;
    float *init = dtz_init_params(&s->cfg);
    static const dt_zero_overlap ovs[3] = {DT_ZERO_OVERLAP_OFF, DT_ZERO_OVERLAP_AFTER_BACKWARD,
                                           DT_ZERO_OVERLAP_INTERLEAVED};
    for (int stage = 1; stage <= 3; stage++) {
        g_uniform = stage == 3;
        oracle o;
        oracle_run(s, all, N, &o);
        float *want = dtz_params(o.r.m, NULL);
        for (int oi = 0; oi < 3; oi++) {
            dt_zero_opts zo = dtz_opts(s, stage, ovs[oi]);
            zo.dp.first_bucket_bytes = zo.dp.bucket_bytes = 256;   /* several buckets, fc2 alone in some */
            dtz_result got;
            dtz_zero_run(s, world, &zo, &got);
            char what[200];
            snprintf(what, sizeof what, "%s, %s, ZeRO-%d overlap mode %d vs the per-parameter oracle",
                     s->oc.kind == DT_OPTIM_SGD ? "sgd" : "adamw", g_mixed ? "mixed" : "never used", stage, (int)ovs[oi]);
            dtz_expect_params(o.r.m, got.params, want, 0, what);
            size_t off = 0;   /* registration order: the kept ones bitwise their initial values */
            for (int i = 0; i < o.r.m->n_params; i++) {
                const dt_param *p = o.r.m->params[i];
                size_t n = (size_t)p->value.numel;
                if (!p->requires_grad || (is_fc2(p) && !g_mixed)) {
                    char msg[512];
                    snprintf(msg, sizeof msg, "%s: %s keeps its initial value", what, p->name);
                    T_BITWISE(got.params + off, init + off, n, msg);
                }
                off += n;
            }
            dtz_result_free(&got);
        }
        free(want);
        oracle_free(&o);
    }
    g_uniform = 0;
    dtt_skip_module = -1;
    free(init);
}

static dt_optim_cfg sgd_momentum(void) {
    dt_optim_cfg c = dt_optim_cfg_default(DT_OPTIM_SGD);
    c.lr = 0.05f;
    c.momentum = 0.9f;
    c.weight_decay = 0.1f;
    return c;
}

static void for_each_case(const char *title, void (*run)(const dtz_spec *s, const char *label)) {
    dt_optim_cfg ocs[2] = {sgd_momentum(), dtt_adamw(1e-2f, 0.1f)};
    for (int mixed = 0; mixed < 2; mixed++)
        for (int k = 0; k < 2; k++) {
            char name[160];
            snprintf(name, sizeof name, "%s, %s, fc2 %s", title, k ? "adamw wd 0.1" : "sgd momentum 0.9 wd 0.1",
                     mixed ? "used in some steps / on some ranks" : "never used");
            t_begin(name);
            g_mixed = mixed;
            dtz_spec s = spec(&ocs[k]);
            run(&s, name);
            t_end();
        }
    g_mixed = 0;
}

static void one_process(const dtz_spec *s, const char *label) { run_local(s, 0, label); }
static void ddp(const dtz_spec *s, const char *label) { run_local(s, 1, label); }
static void zero_case(const dtz_spec *s, const char *label) { (void)label; run_zero(s); }

int main(int argc, char **argv) {
    t_init(&argc, &argv);
    T_OK(dt_pg_world(&world));
    dtt_skip_layer = -1;
    for_each_case("one process", one_process);
    for_each_case("DDP find_unused", ddp);
    for_each_case("ZeRO-1/2/3 find_unused", zero_case);
    T_OK(dt_dist_finalize());
    return 0;
}
