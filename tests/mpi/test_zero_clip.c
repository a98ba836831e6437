/* ZeRO gradient clipping (dt_zero_opts.clip) against DDP followed by
 * norm = sqrt(dt_sumsq(grad)) and dt_clip_scale(norm, clip):
 *  - the global gradient norm dt_zero_step reports equals DDP's within 1e-6
 *    relative at every step (stages 1/2/3, overlap OFF and AFTER_BACKWARD,
 *    with and without gradient accumulation);
 *  - parameters within 1e-6 relative of DDP's, with SGD + momentum (the
 *    update is proportional to the clip scale, so a wrong scale shows) and
 *    with AdamW; the clip is active at every step (checked) and the clipped
 *    run differs from the unclipped one;
 *  - a clip that never triggers gives exactly the unclipped DDP result;
 *  - clip > 0 with the INTERLEAVED overlap is rejected at creation. */
#include "mpi_check.h"
#include "zero_testutil.h"

static dt_pg *world;

static void check_clip(const char *name, const dtz_spec *s) {
    dt_model *namer;
    T_OK(dt_model_create(&s->cfg, 1, &namer));
    dtz_result want, unclipped;
    dtz_ddp_run(s, world, &want);
    for (int st = 0; st < s->steps; st++) T_CHECK(want.norms[st] > s->clip * 1.5);   /* clipping active */
    dtz_spec u = *s;
    u.clip = 0;
    dtz_ddp_run(&u, world, &unclipped);
    T_CHECK(t_rel_diff(want.params, unclipped.params, want.n_params) > 1e-5);
    static const dt_zero_overlap ovs[2] = {DT_ZERO_OVERLAP_OFF, DT_ZERO_OVERLAP_AFTER_BACKWARD};
    for (int stage = 1; stage <= 3; stage++)
        for (int oi = 0; oi < 2; oi++) {
            dt_zero_opts o = dtz_opts(s, stage, ovs[oi]);
            o.dp.first_bucket_bytes = 512;
            o.dp.bucket_bytes = 2048;
            T_CHECK(o.clip == s->clip);
            dtz_result got;
            dtz_zero_run(s, world, &o, &got);
            char what[160];
            for (int st = 0; st < s->steps; st++) {
                snprintf(what, sizeof what, "%s, stage %d, overlap mode %d, step %d: grad norm vs DDP's", name, stage,
                         (int)ovs[oi], st);
                float gn = (float)got.norms[st], wn = (float)want.norms[st];
                T_NEAR(&gn, &wn, 1, 1e-6, what);
            }
            snprintf(what, sizeof what, "%s, stage %d, overlap mode %d: clipped ZeRO vs DDP + dt_clip_scale", name,
                     stage, (int)ovs[oi]);
            T_SAME_ON_RANKS(got.params, got.n_params, what);
            dtz_expect_params(namer, got.params, want.params, 1e-6, what);
            dtz_result_free(&got);
        }
    dtz_result_free(&want);
    dtz_result_free(&unclipped);
    dt_model_free(namer);
}

static void test_clip_active(void) {
    t_begin("clip: ZeRO-1/2/3 norm and parameters == DDP + dt_clip_scale (1e-6)");
    dtz_spec sgd = dtz_mk_spec(dtt_mlp_cfg(20, 32, 16, 5), 8, 4);
    sgd.oc = dt_optim_cfg_default(DT_OPTIM_SGD);
    sgd.oc.lr = 0.1f;
    sgd.oc.momentum = 0.9f;
    sgd.oc.weight_decay = 0.01f;
    sgd.clip = 0.05f;
    check_clip("mlp, SGD momentum", &sgd);
    dtz_spec adam = dtz_mk_spec(dtt_gpt2_cfg(), 2, 3);
    adam.clip = 0.1f;
    check_clip("gpt2, AdamW", &adam);
    dtz_spec acc = sgd;
    acc.K = 3;
    check_clip("mlp, SGD momentum, 3 micro-steps", &acc);
    t_end();
}

static void test_clip_inactive(void) {
    t_begin("clip that never triggers: exactly the unclipped DDP result, norm reported");
    dtz_spec s = dtz_mk_spec(dtt_mlp_cfg(20, 32, 16, 5), 8, 3);
    dt_model *namer;
    T_OK(dt_model_create(&s.cfg, 1, &namer));
    dtz_result want, normed;
    dtz_ddp_run(&s, world, &want);
    dtz_spec c = s;
    c.clip = 1e6f;
    dtz_ddp_run(&c, world, &normed);   /* DDP's norms; parameters as unclipped */
    dtz_expect_params(namer, normed.params, want.params, 0, "DDP with an inactive clip vs without");
    for (int stage = 1; stage <= 3; stage++) {
        dt_zero_opts o = dtz_opts(&c, stage, DT_ZERO_OVERLAP_AFTER_BACKWARD);
        dtz_result got;
        dtz_zero_run(&c, world, &o, &got);
        char what[128];
        snprintf(what, sizeof what, "stage %d, inactive clip: ZeRO vs unclipped DDP", stage);
        dtz_expect_params(namer, got.params, want.params, 0, what);
        for (int st = 0; st < s.steps; st++) {
            T_CHECK(got.norms[st] > 0 && isfinite(got.norms[st]));
            float gn = (float)got.norms[st], wn = (float)normed.norms[st];
            T_NEAR(&gn, &wn, 1, 1e-6, "grad norm of an inactive clip");
        }
        dtz_result_free(&got);
    }
    dtz_result_free(&want);
    dtz_result_free(&normed);
    dt_model_free(namer);
    t_end();
}

static void test_clip_interleaved_rejected(void) {
    t_begin("clip > 0 with INTERLEAVED overlap: rejected at creation on every rank");
    dtz_spec s = dtz_mk_spec(dtt_mlp_cfg(20, 16, 12, 5), 8, 1);
    for (int stage = 1; stage <= 3; stage++) {
        dt_model *m;
        T_OK(dt_model_create(&s.cfg, 1, &m));
        dt_zero_opts o = dtz_opts(&s, stage, DT_ZERO_OVERLAP_INTERLEAVED);
        o.clip = 1.0f;
        dt_zero *z = (dt_zero *)&o;   /* must be reset to NULL */
        dt_error_clear();
        T_CHECK(dt_zero_create(m, world, &s.oc, &o, &z) == DT_EINVAL);
        T_CHECK(z == NULL);
        const char *msg = dt_error_message();
        T_CHECK(strstr(msg, "clip") != NULL && strstr(msg, "nterleav") != NULL);
        /* the same with clip 0 is fine */
        o.clip = 0;
        T_OK(dt_zero_create(m, world, &s.oc, &o, &z));
        dt_zero_free(z);
        dt_model_free(m);
    }
    t_end();
}

int main(int argc, char **argv) {
    t_init(&argc, &argv);
    T_OK(dt_pg_world(&world));
    test_clip_active();
    test_clip_inactive();
    test_clip_interleaved_rejected();
    T_OK(dt_dist_finalize());
    return 0;
}
