/* refresh_trainable for DDP and ZeRO 1/2/3. An MLP 20-16-12-5 trains K0 = 3
 * steps with fc1 frozen; then fc1 is unfrozen and training goes on for 3
 * more steps.
 *
 * Reference ("a run that had fc1 trainable from step K0 with the same
 * optimizer state"), built without any refresh: DDP (deterministic) over a
 * whole-model AdamW that steps a parameter only while it has a gradient
 * (dt_optimizer_init_model): K0 steps under a DDP created with fc1 frozen,
 * then that DDP freed and a fresh one created with fc1 trainable, the same
 * optimizer going on. fc1 thus starts at zero state and its own step 0,
 * fc2/fc3 keep their moments and step counts. ZeRO's results equal DDP's
 * bitwise with rank-ordered sums (zero.h), so:
 *  - DDP + dt_ddp_refresh_trainable equals the reference bitwise;
 *  - ZeRO stage 1/2/3 + dt_zero_refresh_trainable equals it bitwise;
 *  - ZeRO optimizer bytes per rank shrink when a layer is frozen through a
 *    refresh, to what a ZeRO created with it frozen reports, and come back
 *    when it is unfrozen again;
 *  - frozen parameters take no gradient memory: DDP's gradient buffer and
 *    buckets hold only the trainable parameters (node-shared or not), ZeRO's
 *    gradient bytes per rank shrink as the optimizer's do;
 *  - ranks that disagree on the trainable set fail on every rank, naming a
 *    parameter and the rank. */
#include "mpi_check.h"
#include "zero_testutil.h"

enum { K0 = 3, K1 = 3, B = 8 };
static dt_pg *world;

static dt_model_cfg cfg(void) { return dtt_mlp_cfg(20, 16, 12, 5); }
static dt_optim_cfg ocfg(void) { return dtt_adamw(1e-2f, 0.01f); }

static void set_fc1(dt_model *m, int trainable) {
    for (int i = 0; i < m->n_params; i++)
        if (strncmp(m->params[i]->name, "fc1.", 4) == 0) m->params[i]->requires_grad = trainable;
}

static dt_ddp_opts ddp_opts(void) {
    dt_ddp_opts o;
    dt_ddp_opts_default(&o);
    o.dp.first_bucket_bytes = o.dp.bucket_bytes = 512;
    o.dp.deterministic = 1;
    return o;
}

static void batch(int st, dtt_batch *b) {
    dt_model_cfg c = cfg();
    dtt_make_batch(&c, dtt_key(st, dt_pg_rank(world), 0), B, b);
}

static void ddp_steps(dtt_net *n, dt_ddp *d, int from, int to) {
    for (int st = from; st < to; st++) {
        dtt_batch b;
        batch(st, &b);
        dtt_ddp_step(n, d, &b, 1);
        dtt_batch_free(&b);
    }
}

/* The reference: registration-order parameters after K0 + K1 steps. */
static float *reference(void) {
    dt_model_cfg c = cfg();
    dt_optim_cfg oc = ocfg();
    dtt_net n;
    dtt_net_init(&n, &c, 1 + (uint64_t)dt_pg_rank(world), &oc);
    set_fc1(n.m, 0);
    dt_ddp_opts o = ddp_opts();
    dt_ddp *d;
    T_OK(dt_ddp_create(n.m, world, &o, &d));
    ddp_steps(&n, d, 0, K0);
    dt_ddp_free(d);
    set_fc1(n.m, 1);
    T_OK(dt_ddp_create(n.m, world, &o, &d));
    ddp_steps(&n, d, K0, K0 + K1);
    float *p = dtz_params(n.m, NULL);
    dt_ddp_free(d);
    dtt_net_free(&n);
    return p;
}

static void expect_fc1_moved(const dt_model *m, const float *got, const float *init) {
    size_t at = 0;
    for (int i = 0; i < m->n_params; i++) {
        size_t n = (size_t)m->params[i]->value.numel;
        if (strncmp(m->params[i]->name, "fc1.", 4) == 0) T_CHECK(t_differs(got + at, init + at, n));
        at += n;
    }
}

/* DDP holds gradients for the trainable parameters only: fc2 + fc3 of the
 * 20-16-12-5 MLP are 16*12 + 12 + 12*5 + 5 = 269 floats, fc1 20*16 + 16 = 336. */
static void expect_ddp_grads(const dt_ddp *d, const dt_model *m, size_t want) {
    T_CHECK(m->grad_flat.numel == want);
    size_t in_buckets = 0;
    for (int i = 0; i < dt_ddp_num_buckets(d); i++) in_buckets += dt_ddp_bucket_at(d, i)->numel;
    T_CHECK(in_buckets == want);   /* no bucket spans a frozen parameter */
    for (int i = 0; i < m->n_params; i++)
        T_CHECK((m->params[i]->grad.data != NULL) == (m->params[i]->requires_grad != 0));
}

static void test_ddp(const float *want) {
    t_begin("ddp refresh_trainable: unfreezing fc1 at step 3 equals a fresh DDP from step 3");
    dt_model_cfg c = cfg();
    dt_optim_cfg oc = ocfg();
    dtt_net n;
    dtt_net_init(&n, &c, 1 + (uint64_t)dt_pg_rank(world), &oc);
    set_fc1(n.m, 0);
    dt_ddp_opts o = ddp_opts();
    dt_ddp *d;
    T_OK(dt_ddp_create(n.m, world, &o, &d));
    expect_ddp_grads(d, n.m, 269);
    ddp_steps(&n, d, 0, K0);
    float *mid = dtz_params(n.m, NULL);
    set_fc1(n.m, 1);
    T_OK(dt_ddp_refresh_trainable(d));
    expect_ddp_grads(d, n.m, 269 + 336);
    ddp_steps(&n, d, K0, K0 + K1);
    float *got = dtz_params(n.m, NULL);
    dtz_expect_params(n.m, got, want, 0, "ddp refresh vs reference");
    expect_fc1_moved(n.m, got, mid);
    free(mid);
    free(got);
    dt_ddp_free(d);
    dtt_net_free(&n);
    t_end();
}

static void prepare_frozen(dt_model *m) { set_fc1(m, 0); }

static dtz_spec spec(void) {
    dtz_spec s = dtz_mk_spec(cfg(), B, K0 + K1);
    s.oc = ocfg();
    s.det = 1;
    s.prepare = prepare_frozen;
    return s;
}

static float *zero_params(dtz_net *n) {
    if (dt_zero_stage(n->z) < 3) {
        T_OK(dt_zero_sync_params(n->z));
        return dtz_params(n->m, NULL);
    }
    float *lay = dtz_gather_layout(n->z);
    float *p = dtz_params(n->m, lay);
    free(lay);
    return p;
}

static void zero_steps(dtz_net *n, float lr, int from, int to) {
    for (int st = from; st < to; st++) {
        dtt_batch b;
        batch(st, &b);
        dtz_step(n, lr, &b, 1, NULL);
        dtt_batch_free(&b);
    }
}

static void test_zero(int stage, const float *want) {
    char name[96];
    snprintf(name, sizeof name, "zero-%d refresh_trainable: unfreezing fc1 at step 3 equals the reference", stage);
    t_begin(name);
    dtz_spec s = spec();
    dt_zero_opts o = dtz_opts(&s, stage, DT_ZERO_OVERLAP_AFTER_BACKWARD);
    o.dp.first_bucket_bytes = o.dp.bucket_bytes = 512;
    dtz_net n;
    dtz_net_init(&n, &s, 1 + (uint64_t)dt_pg_rank(world), world, &o);
    zero_steps(&n, s.oc.lr, 0, K0);
    float *mid = zero_params(&n);
    set_fc1(n.m, 1);
    T_OK(dt_zero_refresh_trainable(n.z));
    dtz_check_geometry(n.z, n.m);
    T_CHECK(dt_zero_optim_step(n.z) == K0);
    zero_steps(&n, s.oc.lr, K0, K0 + K1);
    float *got = zero_params(&n);
    dtz_expect_params(n.m, got, want, 0, "zero refresh vs reference");
    expect_fc1_moved(n.m, got, mid);
    free(mid);
    free(got);
    dtz_net_free(&n);
    t_end();
}

static void test_zero_memory(void) {
    t_begin("zero refresh_trainable: optimizer and gradient bytes per rank shrink when fc1 is frozen, and come back");
    dtz_spec s = spec();
    s.prepare = NULL;
    for (int stage = 1; stage <= 3; stage++) {
        dt_zero_opts o = dtz_opts(&s, stage, DT_ZERO_OVERLAP_AFTER_BACKWARD);
        o.dp.first_bucket_bytes = o.dp.bucket_bytes = 512;
        dtz_net n, f;
        dtz_net_init(&n, &s, 1, world, &o);
        size_t all = dt_zero_get_memory(n.z).optim_bytes, gall = dt_zero_get_memory(n.z).grad_bytes;
        zero_steps(&n, s.oc.lr, 0, 1);
        size_t rs_all = dt_zero_get_stats(n.z).bytes_reduced;
        set_fc1(n.m, 0);
        T_OK(dt_zero_refresh_trainable(n.z));
        size_t frozen = dt_zero_get_memory(n.z).optim_bytes, gfrozen = dt_zero_get_memory(n.z).grad_bytes;
        /* gradients: fc1's 336 floats are gone (stage 1: the whole of them; 2/3: this rank's
         * shard of them), less at most one bucket's padding (16 floats per rank) */
        size_t P = (size_t)dt_pg_size(world), gone = stage == 1 ? 4 * 336 : 4 * 336 / P;
        T_CHECK(gfrozen + gone <= gall + 4 * 16 * P);
        /* a frozen bucket is not reduce-scattered: one step reduces fewer bytes, by at least
         * fc1's weight (20 x 16 floats, in buckets of 512 bytes) */
        size_t rs0 = dt_zero_get_stats(n.z).bytes_reduced, ag0 = dt_zero_get_stats(n.z).bytes_gathered;
        zero_steps(&n, s.oc.lr, 1, 2);
        size_t rs_frozen = dt_zero_get_stats(n.z).bytes_reduced - rs0, ag_frozen = dt_zero_get_stats(n.z).bytes_gathered - ag0;
        T_CHECK(rs_frozen + 4 * 20 * 16 <= rs_all);
        /* stages 1/2 gather what they stepped: the trainable buckets only (a frozen one
         * gathered too would add its 1408 bytes here) */
        if (stage < 3) T_CHECK(ag_frozen <= rs_frozen);
        T_CHECK(frozen < all);
        /* fc1 is 20x16 + 16 floats, 2 AdamW states: at least its share per rank is gone */
        T_CHECK(all - frozen >= (size_t)(2 * 4 * (20 * 16 + 16) / dt_pg_size(world)) - 2 * 4 * 16 * (size_t)dt_pg_size(world));
        dtz_spec sf = s;
        sf.prepare = prepare_frozen;
        dtz_net_init(&f, &sf, 1, world, &o);
        T_CHECK(dt_zero_get_memory(f.z).optim_bytes == frozen);   /* as if created frozen */
        T_CHECK(dt_zero_get_memory(f.z).grad_bytes == gfrozen);
        dtz_net_free(&f);
        set_fc1(n.m, 1);
        T_OK(dt_zero_refresh_trainable(n.z));
        T_CHECK(dt_zero_get_memory(n.z).optim_bytes == all);
        T_CHECK(dt_zero_get_memory(n.z).grad_bytes == gall);
        zero_steps(&n, s.oc.lr, 2, 3);
        dtz_net_free(&n);
    }
    t_end();
}

static void test_disagreement(void) {
    t_begin("refresh_trainable: ranks with different trainable sets fail on every rank, naming it");
    int me = dt_pg_rank(world), N = dt_pg_size(world);
    if (N < 2) { t_end(); return; }
    char want[64];
    snprintf(want, sizeof want, "rank %d has", N - 1);
    dt_model_cfg c = cfg();
    dt_optim_cfg oc = ocfg();
    dtt_net n;
    dtt_net_init(&n, &c, 1, &oc);
    set_fc1(n.m, 0);
    dt_ddp_opts o = ddp_opts();
    dt_ddp *d;
    T_OK(dt_ddp_create(n.m, world, &o, &d));
    ddp_steps(&n, d, 0, 1);
    set_fc1(n.m, me == N - 1);
    T_EXPECT(dt_ddp_refresh_trainable(d), DT_EINVAL);
    T_CHECK(strstr(dt_error_message(), "'fc1.") != NULL && strstr(dt_error_message(), want) != NULL);
    set_fc1(n.m, 0);
    T_OK(dt_ddp_refresh_trainable(d));   /* agreeing again works */
    ddp_steps(&n, d, 1, 2);
    dt_ddp_free(d);
    dtt_net_free(&n);

    dtz_spec s = spec();
    dt_zero_opts zo = dtz_opts(&s, 2, DT_ZERO_OVERLAP_AFTER_BACKWARD);
    dtz_net z;
    dtz_net_init(&z, &s, 1, world, &zo);
    zero_steps(&z, s.oc.lr, 0, 1);
    set_fc1(z.m, me == N - 1);
    T_EXPECT(dt_zero_refresh_trainable(z.z), DT_EINVAL);
    T_CHECK(strstr(dt_error_message(), "'fc1.") != NULL && strstr(dt_error_message(), want) != NULL);
    set_fc1(z.m, 0);
    zero_steps(&z, s.oc.lr, 1, 2);   /* nothing was re-partitioned */
    dtz_net_free(&z);
    t_end();
}

int main(int argc, char **argv) {
    t_init(&argc, &argv);
    T_OK(dt_pg_world(&world));
    float *want = reference();
    test_ddp(want);
    for (int stage = 1; stage <= 3; stage++) test_zero(stage, want);
    test_zero_memory();
    test_disagreement();
    free(want);
    T_OK(dt_dist_finalize());
    return 0;
}
