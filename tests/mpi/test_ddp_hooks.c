/* Communication hooks and option validation:
 *  - bf16 / fp16 compression: training converges, parameters stay identical
 *    across ranks, gradients really travelled as 16-bit values (and at N = 2
 *    equal the 16-bit oracle bit for bit);
 *  - a custom hook (SUM in launch, / N in finish, blocking or asynchronous) is
 *    called once per bucket per step and equals the default path bitwise;
 *  - contradictory options fail at dt_ddp_create with a clear message. */
#include "mpi_check.h"
#include "ddp_testutil.h"

static dt_pg *world;

/* ---- custom hook ---- */
typedef struct hook_state { int launches, finishes, async; } hook_state;

static dt_status count_launch(void *st, dt_pg *pg, dt_ddp_bucket *b, dt_work **w) {
    hook_state *h = st;
    h->launches++;
    T_CHECK(b->numel == b->end - b->begin && b->launched);
    if (!h->async) *w = NULL;
    return dt_allreduce(pg, b->grad, b->grad, (int64_t)b->numel, DT_F32, DT_RED_SUM | DT_RED_DETERMINISTIC,
                        h->async ? w : NULL);
}

static dt_status count_finish(void *st, dt_pg *pg, dt_ddp_bucket *b) {
    hook_state *h = st;
    h->finishes++;
    const float n = (float)dt_pg_size(pg);
    for (size_t i = 0; i < b->numel; i++) b->grad[i] = b->grad[i] / n;
    return DT_OK;
}

static dt_ddp_opts small_buckets(void) {
    dt_ddp_opts o;
    dt_ddp_opts_default(&o);
    o.dp.first_bucket_bytes = 1024;
    o.dp.bucket_bytes = 4096;
    return o;
}

static void test_custom_hook(void) {
    t_begin("custom comm hook: once per bucket per step, equals the default path");
    int me = dt_pg_rank(world), N = dt_pg_size(world);
    dt_model_cfg c = dtt_gpt2_cfg();
    dt_optim_cfg oc = dtt_adamw(1e-2f, 0.01f);
    for (int async = 0; async < 2; async++)
        for (int ov = 0; ov < 2; ov++) {
            hook_state hs = {0, 0, async};
            dt_ddp_comm_hook hook = {count_launch, count_finish, &hs};
            dt_ddp_opts oh = small_buckets(), od = small_buckets();
            oh.hook = &hook;
            oh.no_overlap = od.no_overlap = ov;
            od.dp.deterministic = N > 2;   /* the hook sums in rank order too */
            dtt_net a, b;
            dtt_net_init(&a, &c, 31, &oc);
            dtt_net_init(&b, &c, 31, &oc);
            dt_ddp *da, *db;
            T_OK(dt_ddp_create(a.m, world, &oh, &da));
            T_OK(dt_ddp_create(b.m, world, &od, &db));
            int nb = dt_ddp_num_buckets(da);
            T_CHECK(nb > 2 && nb == dt_ddp_num_buckets(db));
            for (int st = 0; st < 3; st++) {
                dtt_batch mb;
                dtt_make_batch(&c, dtt_key(st, me, 0), 2, &mb);
                dtt_ddp_step(&a, da, &mb, 1);
                dtt_ddp_step(&b, db, &mb, 1);
                T_CHECK(hs.launches == (st + 1) * nb);
                T_CHECK(hs.finishes == (st + 1) * nb);
                dtt_batch_free(&mb);
            }
            T_BITWISE(a.m->param_flat.data, b.m->param_flat.data, a.m->param_flat.numel,
                               "custom hook vs default reduction");
            T_SAME_ON_RANKS(a.m->param_flat.data, a.m->param_flat.numel, "custom hook params across ranks");
            dt_ddp_free(da);
            dt_ddp_free(db);
            dtt_net_free(&a);
            dtt_net_free(&b);
        }
    t_end();
}

/* ---- compression ---- */
static int representable(const float *g, size_t n, dt_dtype t) {
    for (size_t i = 0; i < n; i++) {
        float r = t == DT_BF16 ? dt_bf16_to_f32(dt_f32_to_bf16(g[i])) : dt_f16_to_f32(dt_f32_to_f16(g[i]));
        if (memcmp(&r, &g[i], sizeof r)) return 0;
    }
    return 1;
}

static float round16(float x, dt_dtype t) {
    return t == DT_BF16 ? dt_bf16_to_f32(dt_f32_to_bf16(x)) : dt_f16_to_f32(dt_f32_to_f16(x));
}

static void run_compress(dt_dtype comp) {
    int me = dt_pg_rank(world), N = dt_pg_size(world);
    dt_dtype wire = comp == DT_BF16 ? DT_BF16 : DT_F16;
    const char *name = comp == DT_BF16 ? "bf16" : "fp16";
    dt_model_cfg c = dtt_mlp_cfg(20, 32, 0, 5);
    dt_optim_cfg oc = dtt_adamw(1e-2f, 0.0f);
    dt_ddp_opts o = small_buckets(), o32 = small_buckets();
    o.dp.wire = comp;
    dtt_net n, f, r;
    dtt_net_init(&n, &c, 41, &oc);
    dtt_net_init(&f, &c, 41, &oc);   /* the same run without compression */
    dtt_net_init(&r, &c, 41, &oc);   /* 16-bit oracle (N = 2) */
    dt_ddp *d, *df;
    T_OK(dt_ddp_create(n.m, world, &o, &d));
    T_OK(dt_ddp_create(f.m, world, &o32, &df));
    T_CHECK(dt_ddp_num_buckets(d) > 1);
    size_t ne = n.m->param_flat.numel;
    float *sum = calloc(ne, sizeof *sum);
    double first = 0, last = 0;
    const int steps = 30;
    for (int st = 0; st < steps; st++) {
        dtt_batch *mb = calloc((size_t)N, sizeof *mb);
        for (int q = 0; q < N; q++) dtt_make_batch(&c, dtt_key(st, q, 0), 16, &mb[q]);
        size_t bytes0 = dt_ddp_get_stats(d).bytes_reduced;
        float l = dtt_fwd_bwd(&n, d, 1, &mb[me].b, 1.0f, NULL);
        T_OK(dt_ddp_finish_backward(d));
        T_CHECK(dt_ddp_get_stats(d).bytes_reduced - bytes0 == ne * 2);   /* 16-bit payload */
        T_CHECK(representable(n.m->grad_flat.data, ne, wire));
        if (N == 2 && st < 5) {
            /* oracle (dist.h): each rank's gradient rounded to 16 bits; their sum
             * in float rounded to 16 bits; / N in float, rounded again */
            for (int q = 0; q < N; q++) {
                dt_model_zero_grad(r.m);
                dtt_fwd_bwd(&r, NULL, 1, &mb[q].b, 1.0f, NULL);
                for (size_t i = 0; i < ne; i++) {
                    float g = round16(r.m->grad_flat.data[i], wire);
                    sum[i] = q == 0 ? g : round16(sum[i] + g, wire);
                }
            }
            for (size_t i = 0; i < ne; i++) r.m->grad_flat.data[i] = round16(sum[i] / (float)N, wire);
            T_BITWISE(n.m->grad_flat.data, r.m->grad_flat.data, ne, "compressed gradient vs 16-bit oracle");
            dtt_opt_step(&r);
        }
        dtt_opt_step(&n);
        dtt_ddp_step(&f, df, &mb[me], 1);
        float lsum = 0;
        MPI_Allreduce(&l, &lsum, 1, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        if (st == 0) first = lsum / N;
        if (st >= steps - 3) last += lsum / N / 3;
        for (int q = 0; q < N; q++) dtt_batch_free(&mb[q]);
        free(mb);
    }
    char what[128];
    snprintf(what, sizeof what, "%s: params across ranks", name);
    T_SAME_ON_RANKS(n.m->param_flat.data, ne, what);
    if (me == 0) printf("  %s: loss %.4f -> %.4f (rel diff to f32 run %.3g)\n", name, first, last,
                        t_rel_diff(n.m->param_flat.data, f.m->param_flat.data, ne));
    T_CHECK(last < 0.6 * first);
    T_CHECK(t_differs(n.m->param_flat.data, f.m->param_flat.data, ne));   /* compression was in effect */
    T_NEAR(n.m->param_flat.data, f.m->param_flat.data, ne, 0.1, "compressed vs f32 training");
    free(sum);
    dt_ddp_free(d);
    dt_ddp_free(df);
    dtt_net_free(&n);
    dtt_net_free(&f);
    dtt_net_free(&r);
}

static void test_compression(void) {
    t_begin("bf16 / fp16 compression: converges, ranks identical");
    run_compress(DT_BF16);
    run_compress(DT_F16);
    t_end();
}

/* ---- option validation ---- */
static void expect_rejected(dt_model *m, const dt_ddp_opts *o, const char *k1, const char *k2) {
    static char sentinel;
    dt_ddp *d = (dt_ddp *)(void *)&sentinel;
    dt_error_clear();
    dt_status s = dt_ddp_create(m, world, o, &d);
    if (s != DT_EINVAL || d != NULL || !strstr(dt_error_message(), k1) || (k2 && !strstr(dt_error_message(), k2))) {
        fprintf(stderr, "rank %d: expected rejection mentioning '%s'/'%s', got %s: %s\n", t_rank(), k1,
                k2 ? k2 : "", dt_status_name(s), dt_error_message());
        T_CHECK(!"option contradiction accepted");
    }
}

static void test_validation(void) {
    t_begin("contradictory options fail at dt_ddp_create with a clear message");
    dt_model_cfg c = dtt_mlp_cfg(20, 16, 0, 5);
    dt_model *m;
    T_OK(dt_model_create(&c, 1, &m));
    hook_state hs = {0, 0, 0};
    dt_ddp_comm_hook hook = {count_launch, count_finish, &hs}, nolaunch = {NULL, count_finish, &hs};
    dt_ddp_opts o;
    dt_ddp_opts_default(&o);
    o.hook = &hook;
    o.dp.wire = DT_BF16;
    expect_rejected(m, &o, "hook", "compression");
    dt_ddp_opts_default(&o);
    o.dp.deterministic = 1;
    o.dp.wire = DT_BF16;
    expect_rejected(m, &o, "deterministic", "bf16");
    o.dp.wire = DT_F16;
    expect_rejected(m, &o, "deterministic", "fp16");
    o.dp.wire = DT_F32;
    o.hook = &hook;
    expect_rejected(m, &o, "deterministic", "hook");
    dt_ddp_opts_default(&o);
    o.hook = &nolaunch;
    expect_rejected(m, &o, "launch", NULL);
    dt_ddp_opts_default(&o);
    o.dp.wire = (dt_dtype)7;
    expect_rejected(m, &o, "dp.wire", "7");
    o.dp.sync_bn = 1;   /* must not skip the other checks */
    o.dp.broadcast_buffers = 0;
    expect_rejected(m, &o, "dp.wire", "7");
    dt_ddp_opts_default(&o);
    o.dp.shm = DT_DP_SHM_REQUIRE;
    o.dp.wire = DT_F16;
    expect_rejected(m, &o, "node-shared", "compression");
    o.dp.wire = DT_F32;
    o.hook = &hook;
    expect_rejected(m, &o, "node-shared", "hook");
    o.hook = NULL;
    o.dp.shm = (dt_dp_shm)5;
    expect_rejected(m, &o, "shm mode", "5");
    dt_ddp_opts_default(&o);
    o.dp.bucket_bytes = 0;
    expect_rejected(m, &o, "bucket", NULL);
    /* validation issues no collective: one rank alone may fail without hanging */
    if (t_rank() == 0) {
        dt_ddp_opts_default(&o);
        o.dp.first_bucket_bytes = 2;
        expect_rejected(m, &o, "bucket", NULL);
    }
    /* hook state untouched by failed creations; no grad-ready hook left behind */
    T_CHECK(hs.launches == 0);
    for (int i = 0; i < m->n_params; i++) T_CHECK(m->params[i]->on_grad_ready == NULL);
    dt_model_free(m);
    t_end();
}

int main(int argc, char **argv) {
    t_init(&argc, &argv);
    T_OK(dt_pg_world(&world));
    test_validation();
    test_custom_hook();
    test_compression();
    T_OK(dt_dist_finalize());
    return 0;
}
