/* no_sync / gradient accumulation: K micro-steps with
 * dt_ddp_before_forward(d, g, k == K-1) and backward_scaled(1/K)
 *  - equal one step on the K-times batch (1e-5 relative),
 *  - equal the rank-ordered single-process reference bit for bit (N = 2, or
 *    deterministic),
 *  - communicate only on the last micro-step (bytes_reduced grows once per
 *    step, by the whole gradient). */
#include "mpi_check.h"
#include "ddp_testutil.h"

static dt_pg *world;

static size_t grad_bytes(const dt_ddp *d) {
    size_t n = 0;
    for (int i = 0; i < dt_ddp_num_buckets(d); i++) n += dt_ddp_bucket_at(d, i)->numel * sizeof(float);
    return n;
}

static void run_accum(int det, int overlap) {
    int me = dt_pg_rank(world), N = dt_pg_size(world);
    const int K = 3, steps = 3;
    const int64_t B = 4;
    dt_model_cfg c = dtt_mlp_cfg(64, 256, 256, 10);
    /* SGD: AdamW's first steps are ~lr*sign(g), which turns 1e-7 gradient
     * differences on near-zero elements into lr-sized parameter differences */
    dt_optim_cfg oc = dt_optim_cfg_default(DT_OPTIM_SGD);
    oc.lr = 0.05f;
    oc.momentum = 0.9f;
    dt_ddp_opts o;
    dt_ddp_opts_default(&o);
    o.dp.first_bucket_bytes = o.dp.bucket_bytes = 64 << 10;   /* several buckets */
    o.dp.deterministic = det;
    o.no_overlap = !overlap;
    dtt_net acc, big, ref;
    dtt_net_init(&acc, &c, 3, &oc);
    dtt_net_init(&big, &c, 3, &oc);
    dtt_net_init(&ref, &c, 3, &oc);
    dt_ddp *da, *db;
    T_OK(dt_ddp_create(acc.m, world, &o, &da));
    T_OK(dt_ddp_create(big.m, world, &o, &db));
    T_CHECK(dt_ddp_num_buckets(da) > 1);
    size_t n = acc.m->param_flat.numel, all = grad_bytes(da);
    T_CHECK(all == n * sizeof(float));
    for (int st = 0; st < steps; st++) {
        dtt_batch *mb = calloc((size_t)(N * K), sizeof *mb), mine;
        for (int q = 0; q < N; q++)
            for (int k = 0; k < K; k++) dtt_make_batch(&c, dtt_key(st, q, k), B, &mb[q * K + k]);
        /* K micro-steps, communication only on the last */
        dt_ddp_stats s0 = dt_ddp_get_stats(da);
        for (int k = 0; k < K; k++) {
            dtt_fwd_bwd(&acc, da, k == K - 1, &mb[me * K + k].b, 1.0f / (float)K, NULL);
            dt_ddp_stats s1 = dt_ddp_get_stats(da);
            if (k < K - 1) {
                T_CHECK(s1.bytes_reduced == s0.bytes_reduced);
                T_CHECK(s1.steps == s0.steps);
                /* finishing a no_sync micro-step is a usage error, on every rank alike */
                T_CHECK(dt_ddp_finish_backward(da) == DT_ESTATE);
            } else if (!overlap) {
                T_CHECK(s1.bytes_reduced == s0.bytes_reduced);   /* launched only in finish */
            }
        }
        T_OK(dt_ddp_finish_backward(da));
        dt_ddp_stats s2 = dt_ddp_get_stats(da);
        T_CHECK(s2.bytes_reduced == s0.bytes_reduced + all);
        T_CHECK(s2.steps == s0.steps + 1);
        T_CHECK(s2.wait_us >= 0 && s2.backward_us >= 0);
        /* one step on the K-times batch */
        dtt_concat(&c, &mb[me * K], K, &mine);
        dtt_fwd_bwd(&big, db, 1, &mine.b, 1.0f, NULL);
        T_OK(dt_ddp_finish_backward(db));
        char what[128];
        snprintf(what, sizeof what, "step %d: gradient of %d micro-steps vs one %dx batch", st, K, K);
        T_NEAR(acc.m->grad_flat.data, big.m->grad_flat.data, n, 1e-5, what);
        dtt_opt_step(&acc);
        dtt_opt_step(&big);
        dtt_ref_step(&ref, mb, N, K, NULL);
        snprintf(what, sizeof what, "step %d: %d micro-steps vs one %dx batch", st, K, K);
        T_NEAR(acc.m->param_flat.data, big.m->param_flat.data, n, 1e-5, what);
        snprintf(what, sizeof what, "step %d: %d micro-steps vs rank-ordered reference", st, K);
        if (N <= 2 || det) T_BITWISE(acc.m->param_flat.data, ref.m->param_flat.data, n, what);
        else T_NEAR(acc.m->param_flat.data, ref.m->param_flat.data, n, 1e-5, what);
        T_SAME_ON_RANKS(acc.m->param_flat.data, n, "accumulated params across ranks");
        for (int i = 0; i < N * K; i++) dtt_batch_free(&mb[i]);
        dtt_batch_free(&mine);
        free(mb);
    }
    T_CHECK(dt_ddp_get_stats(da).steps == steps);
    dt_ddp_free(da);
    dt_ddp_free(db);
    dtt_net_free(&acc);
    dtt_net_free(&big);
    dtt_net_free(&ref);
}

static void test_no_sync(void) {
    t_begin("no_sync accumulation == K-times batch; reduces once per step");
    for (int ov = 0; ov < 2; ov++) {
        run_accum(0, ov);
        run_accum(1, ov);
    }
    t_end();
}

/* The same through the trainer's micro-step loop shape: the grads left after
 * finish_backward are the average of the ranks' accumulated grads. */
static void test_accum_grads(void) {
    t_begin("accumulated gradient after finish_backward == rank average");
    int me = dt_pg_rank(world), N = dt_pg_size(world);
    dt_model_cfg c = dtt_gpt2_cfg();
    dt_optim_cfg oc = dtt_adamw(1e-2f, 0.0f);
    dt_ddp_opts o;
    dt_ddp_opts_default(&o);
    o.dp.deterministic = 1;
    o.dp.first_bucket_bytes = 1024;
    o.dp.bucket_bytes = 4096;
    dtt_net a, r;
    dtt_net_init(&a, &c, 5, &oc);
    dtt_net_init(&r, &c, 5, &oc);
    dt_ddp *d;
    T_OK(dt_ddp_create(a.m, world, &o, &d));
    const int K = 2;
    size_t n = a.m->grad_flat.numel;
    dtt_batch *mb = calloc((size_t)(N * K), sizeof *mb);
    for (int q = 0; q < N; q++)
        for (int k = 0; k < K; k++) dtt_make_batch(&c, dtt_key(9, q, k), 2, &mb[q * K + k]);
    for (int k = 0; k < K; k++) dtt_fwd_bwd(&a, d, k == K - 1, &mb[me * K + k].b, 0.5f, NULL);
    T_OK(dt_ddp_finish_backward(d));
    /* the oracle: per-rank accumulated grads, summed in rank order, / N */
    float *sum = calloc(n, sizeof *sum);
    for (int q = 0; q < N; q++) {
        dt_model_zero_grad(r.m);
        for (int k = 0; k < K; k++) dtt_fwd_bwd(&r, NULL, 1, &mb[q * K + k].b, 0.5f, NULL);
        for (size_t i = 0; i < n; i++) sum[i] = q == 0 ? r.m->grad_flat.data[i] : sum[i] + r.m->grad_flat.data[i];
    }
    for (size_t i = 0; i < n; i++) sum[i] = sum[i] / (float)N;
    T_BITWISE(a.m->grad_flat.data, sum, n, "averaged accumulated gradient");
    free(sum);
    for (int i = 0; i < N * K; i++) dtt_batch_free(&mb[i]);
    free(mb);
    dt_ddp_free(d);
    dtt_net_free(&a);
    dtt_net_free(&r);
    t_end();
}

int main(int argc, char **argv) {
    t_init(&argc, &argv);
    T_OK(dt_pg_world(&world));
    test_no_sync();
    test_accum_grads();
    T_OK(dt_dist_finalize());
    return 0;
}
