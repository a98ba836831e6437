/* ZeRO parameter handling, mostly stage 3 (parameters sharded between uses):
 *  - step by step in lockstep with DDP: after every step the owned shards of
 *    all ranks (assembled with plain MPI) equal DDP's parameters bit for bit
 *    (N = 2 or deterministic), MLP / CNN / GPT-2 (the tied embedding is used
 *    by the first and the last module), prefetch 0 / 1 / 2, overlap
 *    AFTER_BACKWARD and INTERLEAVED;
 *  - evaluation between steps in no-grad mode (dt_graph_set_grad_enabled(g,
 *    0), training off) right after dt_zero_step, twice in a row (without,
 *    then with dt_zero_sync_params first, as the trainer does): logits and
 *    loss equal DDP's model on the same batch bit for bit, at every stage,
 *    and training continues exactly like DDP afterwards;
 *  - dt_zero_free gathers the model back: full parameters equal DDP's and the
 *    model works without ZeRO (a plain forward/backward gives DDP's model's
 *    loss and gradients, bit for bit). */
#include "mpi_check.h"
#include "zero_testutil.h"

static dt_pg *world;

/* Eval forward (no grad, eval mode) of one batch; returns a copy of the logits. */
static float *eval_logits(dt_model *m, dt_graph *g, const dt_batch *b, size_t *n, float *loss) {
    dt_graph_reset(g);
    int was = dt_graph_set_grad_enabled(g, 0);
    T_CHECK(was == 1);
    dt_graph_set_training(g, 0);
    dt_tensor *lg = NULL;
    dt_tensor *l = dt_model_forward(m, g, b, &lg);
    T_CHECK(l != NULL && lg != NULL);
    *loss = dt_f32(l)[0];
    *n = (size_t)lg->numel;
    float *out = t_copy(dt_f32(lg), *n);
    dt_graph_set_training(g, 1);
    T_CHECK(dt_graph_set_grad_enabled(g, 1) == 0);
    dt_graph_reset(g);
    return out;
}

typedef struct cfg3 {
    const char *name;
    dtz_spec s;
} cfg3;

static void run_lockstep(const char *name, const dtz_spec *s, const dt_zero_opts *o, int with_eval) {
    int me = t_rank();
    dt_model *namer;
    T_OK(dt_model_create(&s->cfg, 1, &namer));
    /* DDP side */
    dtt_net d;
    dtt_net_init(&d, &s->cfg, 1 + (uint64_t)me, &s->oc);
    dt_ddp_opts dop;
    dt_ddp_opts_default(&dop);
    dop.dp.deterministic = s->det;
    dt_ddp *ddp;
    T_OK(dt_ddp_create(d.m, world, &dop, &ddp));
    /* ZeRO side */
    dtz_net z;
    dtz_net_init(&z, s, 1 + (uint64_t)me, world, o);
    char what[192];
    for (int st = 0; st < s->steps; st++) {
        dtt_batch b;
        dtt_make_batch(&s->cfg, dtt_key(st, me, 0), s->B, &b);
        d.lr = dtz_lr(s, st);
        float ld = dtt_ddp_step(&d, ddp, &b, 1);
        float lz = dtz_step(&z, dtz_lr(s, st), &b, 1, NULL);
        T_CHECK(ld == lz);   /* the forward saw the same parameters */
        dtt_batch_free(&b);
        if (with_eval) {
            /* straight after the step: stage 1/2 all-gathers may still be in flight */
            dtt_batch e;
            dtt_make_batch(&s->cfg, dtt_key(100 + st, me, 0), s->B, &e);
            for (int rep = 0; rep < 2; rep++) {
                size_t nd, nz;
                float eld, elz;
                dt_graph_set_tick(d.g, NULL, NULL);
                if (rep == 1) T_OK(dt_zero_sync_params(z.z));   /* what the trainer does before evaluating */
                float *ldg = eval_logits(d.m, d.g, &e.b, &nd, &eld);
                float *lzg = eval_logits(z.m, z.g, &e.b, &nz, &elz);
                snprintf(what, sizeof what, "%s, step %d, eval %d: no-grad logits vs DDP's model", name, st, rep);
                T_CHECK(nd == nz);
                T_BITWISE(lzg, ldg, nd, what);
                T_CHECK(eld == elz);
                free(ldg);
                free(lzg);
            }
            dtt_batch_free(&e);
        }
        float *lay = dtz_gather_layout(z.z);
        float *pz = dtz_params(z.m, lay);
        float *pd = dtz_params(d.m, NULL);
        snprintf(what, sizeof what, "%s, stage %d, prefetch %d, overlap mode %d, step %d: shards vs DDP", name,
                 o->stage, o->prefetch, (int)o->overlap_step, st);
        dtz_expect_params(namer, pz, pd, 0, what);
        free(lay);
        free(pz);
        free(pd);
    }
    T_OK(dt_zero_sync_params(z.z));
    /* ZeRO off: the model is whole again */
    dt_zero_free(z.z);
    z.z = NULL;
    dt_ddp_free(ddp);
    dt_graph_set_tick(d.g, NULL, NULL);
    dt_graph_set_tick(z.g, NULL, NULL);
    float *pz = dtz_params(z.m, NULL), *pd = dtz_params(d.m, NULL);
    snprintf(what, sizeof what, "%s, stage %d: model after dt_zero_free vs DDP", name, o->stage);
    dtz_expect_params(namer, pz, pd, 0, what);
    free(pz);
    free(pd);
    dtt_batch b;
    dtt_make_batch(&s->cfg, dtt_key(77, me, 0), s->B, &b);
    dt_model_zero_grad(d.m);
    dt_model_zero_grad(z.m);
    float ld = dtt_fwd_bwd(&d, NULL, 1, &b.b, 1.0f, NULL);
    float lz = dtt_fwd_bwd(&(dtt_net){.m = z.m, .g = z.g}, NULL, 1, &b.b, 1.0f, NULL);
    T_CHECK(ld == lz);
    size_t P = dtz_param_count(d.m), pos = 0;
    float *gd = calloc(P, sizeof *gd), *gz = calloc(P, sizeof *gz);
    T_CHECK(gd && gz);
    for (int i = 0; i < d.m->n_params; i++) {
        size_t k = (size_t)d.m->params[i]->value.numel;
        T_CHECK(z.m->params[i]->grad.data != NULL);
        memcpy(gd + pos, d.m->params[i]->grad.data, k * sizeof(float));
        memcpy(gz + pos, z.m->params[i]->grad.data, k * sizeof(float));
        pos += k;
    }
    snprintf(what, sizeof what, "%s, stage %d: plain backward after dt_zero_free vs DDP's model", name, o->stage);
    int nonzero = 0;
    for (size_t i = 0; i < P; i++) nonzero |= gd[i] != 0.0f;
    T_CHECK(nonzero);
    dtz_expect_params(namer, gz, gd, 0, what);
    free(gd);
    free(gz);
    dtt_batch_free(&b);
    dt_graph_free(z.g);
    dt_model_free(z.m);
    dtt_net_free(&d);
    dt_model_free(namer);
}

static void test_lockstep_stage3(void) {
    t_begin("stage 3 step by step == DDP (prefetch 0/1/2, after-backward / interleaved), then freed whole");
    cfg3 cs[3] = {{"mlp", dtz_mk_spec(dtt_mlp_cfg(20, 32, 16, 5), 8, 3)},
                  {"cnn", dtz_mk_spec(dtt_cnn_cfg(), 2, 2)},
                  {"gpt2", dtz_mk_spec(dtt_gpt2_cfg(), 2, 3)}};
    for (int c = 0; c < 3; c++)
        for (int pf = 0; pf <= 2; pf++)
            for (int ov = 0; ov < 2; ov++) {
                dt_zero_opts o = dtz_opts(&cs[c].s, 3, ov ? DT_ZERO_OVERLAP_INTERLEAVED : DT_ZERO_OVERLAP_AFTER_BACKWARD);
                o.prefetch = pf;
                o.dp.first_bucket_bytes = 512;
                o.dp.bucket_bytes = 1024;
                run_lockstep(cs[c].name, &cs[c].s, &o, 0);
            }
    t_end();
}

static void test_eval(void) {
    t_begin("no-grad eval right after each step == DDP's model (stages 1/2/3, every overlap mode)");
    cfg3 cs[3] = {{"mlp", dtz_mk_spec(dtt_mlp_cfg(20, 32, 16, 5), 8, 3)},
                  {"cnn (eval-mode BatchNorm)", dtz_mk_spec(dtt_cnn_cfg(), 2, 2)},
                  {"gpt2", dtz_mk_spec(dtt_gpt2_cfg(), 2, 3)}};
    static const dt_zero_overlap ovs[3] = {DT_ZERO_OVERLAP_OFF, DT_ZERO_OVERLAP_AFTER_BACKWARD,
                                           DT_ZERO_OVERLAP_INTERLEAVED};
    for (int c = 0; c < 3; c++)
        for (int stage = 1; stage <= 3; stage++)
            for (int oi = 0; oi < 3; oi++) {
                dt_zero_opts o = dtz_opts(&cs[c].s, stage, ovs[oi]);
                o.dp.first_bucket_bytes = 512;
                o.dp.bucket_bytes = 1024;
                run_lockstep(cs[c].name, &cs[c].s, &o, 1);
            }
    t_end();
}

int main(int argc, char **argv) {
    t_init(&argc, &argv);
    T_OK(dt_pg_world(&world));
    test_lockstep_stage3();
    test_eval();
    T_OK(dt_dist_finalize());
    return 0;
}
