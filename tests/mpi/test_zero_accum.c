/* ZeRO gradient accumulation: K micro-steps with
 * dt_zero_before_forward(z, g, k == K-1) and backward_scaled(1/K).
 *  - stages 1/2/3 x every step-overlap mode == DDP with the same micro-steps,
 *    bit for bit (N = 2, or deterministic), MLP / CNN / GPT-2, K changing
 *    from step to step, buckets of 256 bytes (many buckets, padding);
 *  - finishing a no_sync micro-step is an error (DT_ESTATE) that leaves the
 *    accumulation intact;
 *  - stages 2/3 keep the full gradient buffers of every touched bucket until
 *    the synchronising micro-step (the high-water mark of full gradient
 *    buffers reaches the whole gradient during accumulation);
 *  - the buckets touched change between micro-steps: a parameter that gets a
 *    gradient only in the first, only in a middle, or only in the
 *    synchronising micro-step still contributes exactly what DDP reduces. */
#include "mpi_check.h"
#include "zero_testutil.h"

static dt_pg *world;

static const dt_zero_overlap overlaps[3] = {DT_ZERO_OVERLAP_OFF, DT_ZERO_OVERLAP_AFTER_BACKWARD,
                                            DT_ZERO_OVERLAP_INTERLEAVED};

/* ZeRO with the accumulation checks; returns registration-order params. */
static float *zero_accum_run(const dtz_spec *s, const dt_zero_opts *o) {
    int me = t_rank();
    dtz_net n;
    dtz_net_init(&n, s, 1 + (uint64_t)me, world, o);
    size_t P = dtz_param_count(n.m);
    for (int st = 0; st < s->steps; st++) {
        int K = dtz_k(s, st);
        dtt_batch mb[8];
        T_CHECK(K <= 8);
        for (int k = 0; k < K; k++) dtt_make_batch(&s->cfg, dtt_key(st, me, k), s->B, &mb[k]);
        dt_zero_set_lr(n.z, dtz_lr(s, st));
        for (int k = 0; k < K; k++) {
            if (s->before_micro) s->before_micro(st, me, k);
            dtz_fwd_bwd(&n, k == K - 1, &mb[k].b, 1.0f / (float)K);
            if (k == K - 1) break;
            /* not the synchronising micro-step: finishing is a usage error, on every rank alike */
            dt_error_clear();
            T_CHECK(dt_zero_finish_backward(n.z) == DT_ESTATE);
            T_CHECK(dt_error_message()[0] != 0);
            if (o->stage >= 2 && !s->before_micro) {
                /* every bucket got gradients and none was reduced: all full buffers alive */
                dt_zero_memory mem = dt_zero_get_memory(n.z);
                T_CHECK(mem.grad_window_peak >= P * sizeof(float));
            }
        }
        T_OK(dt_zero_finish_backward(n.z));
        T_OK(dt_zero_step(n.z, NULL));
        for (int k = 0; k < K; k++) dtt_batch_free(&mb[k]);
    }
    T_CHECK(dt_zero_optim_step(n.z) == s->steps);
    float *lay = dtz_gather_layout(n.z);
    float *p = dtz_params(n.m, lay);
    free(lay);
    dtz_net_free(&n);
    return p;
}

static void check_accum(const char *name, const dtz_spec *s) {
    dt_model *namer;
    T_OK(dt_model_create(&s->cfg, 1, &namer));
    dtz_result want;
    dtz_ddp_run(s, world, &want);
    for (int stage = 1; stage <= 3; stage++)
        for (int oi = 0; oi < 3; oi++) {
            dt_zero_opts o = dtz_opts(s, stage, overlaps[oi]);
            o.dp.first_bucket_bytes = o.dp.bucket_bytes = 256;
            float *got = zero_accum_run(s, &o);
            char what[160];
            snprintf(what, sizeof what, "%s, stage %d, overlap mode %d: accumulated ZeRO vs DDP", name, stage,
                     (int)overlaps[oi]);
            T_SAME_ON_RANKS(got, want.n_params, what);
            dtz_expect_params(namer, got, want.params, 0, what);
            free(got);
        }
    dtz_result_free(&want);
    dt_model_free(namer);
}

static void test_accum(void) {
    t_begin("accumulation (K = 1..4 micro-steps): ZeRO-1/2/3 x overlap modes == DDP bit for bit");
    static const int Ks[4] = {3, 1, 4, 2};
    dtz_spec mlp = dtz_mk_spec(dtt_mlp_cfg(24, 32, 16, 5), 4, 4);
    mlp.Ks = Ks;
    check_accum("mlp 24-[32,16]-5", &mlp);
    dtz_spec gpt = dtz_mk_spec(dtt_gpt2_cfg(), 2, 3);
    gpt.K = 3;
    check_accum("gpt2 tiny", &gpt);
    dtz_spec cnn = dtz_mk_spec(dtt_cnn_cfg(), 2, 2);
    cnn.K = 2;
    check_accum("cnn", &cnn);
    t_end();
}

/* ---- a parameter used in some micro-steps only ---- */


/* fc2.bias (layer 1) gets a gradient only in micro-step use_at[st]
 * (-1: never); K = 3 every step. On odd ranks it is shifted by one
 * micro-step, so ranks touch different buckets in different micro-steps. */
static const int use_at[4] = {0, 2, 1, -1};
static void skip_pattern(int st, int rank, int k) {
    int u = use_at[st];
    if (u >= 0 && rank % 2 == 1) u = (u + 1) % 3;
    dtt_skip_layer = k == u ? -1 : 1;
}
static void skip_always(int st, int rank, int k) { (void)st; (void)rank; (void)k; dtt_skip_layer = 1; }

static void test_touched_buckets_change(void) {
    t_begin("accumulation: parameter used in the first / middle / last micro-step only == DDP");
    dtz_spec s = dtz_mk_spec(dtt_mlp_cfg(20, 16, 12, 5), 4, 4);
    s.K = 3;
    s.find_unused = 1;
    s.forward = dtt_mlp_forward_skip_bias;
    s.before_micro = skip_pattern;
    s.ddp_bucket_bytes = 256;
    dt_model *namer;
    T_OK(dt_model_create(&s.cfg, 1, &namer));
    dtz_result want, never;
    dtz_ddp_run(&s, world, &want);
    /* control: dropping the bias's accumulated micro-step gradients changes the result */
    dtz_spec s2 = s;
    s2.before_micro = skip_always;
    dtz_ddp_run(&s2, world, &never);
    T_CHECK(t_differs(want.params, never.params, want.n_params));
    for (int stage = 1; stage <= 3; stage++)
        for (int oi = 0; oi < 3; oi++) {
            dt_zero_opts o = dtz_opts(&s, stage, overlaps[oi]);
            o.dp.first_bucket_bytes = o.dp.bucket_bytes = 256;   /* the bias's bucket is not the others' */
            float *got = zero_accum_run(&s, &o);
            char what[160];
            snprintf(what, sizeof what, "stage %d, overlap mode %d: partly-used bias, ZeRO vs DDP", stage,
                     (int)overlaps[oi]);
            dtz_expect_params(namer, got, want.params, 0, what);
            free(got);
        }
    dtt_skip_layer = -1;
    dtz_result_free(&want);
    dtz_result_free(&never);
    dt_model_free(namer);
    t_end();
}

int main(int argc, char **argv) {
    t_init(&argc, &argv);
    T_OK(dt_pg_world(&world));
    test_accum();
    test_touched_buckets_change();
    T_OK(dt_dist_finalize());
    return 0;
}
