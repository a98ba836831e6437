/* Uneven inputs with join: rank r has r + 2 batches, trains on them, then
 * calls dt_ddp_join. Every rank finishes (no hang) and ends with identical
 * parameters (and buffers), equal to the single-process reference in which
 * ranks that ran out contribute zero gradients (bitwise at N = 2, or in
 * deterministic mode). Also with micro-steps, BatchNorm buffers, bf16
 * compression and a custom hook. The buffers come from the highest rank
 * still active, so they end as the last rank's own statistics. */
#include "mpi_check.h"
#include "ddp_testutil.h"

static dt_pg *world;

/* Custom hook: blocking SUM, / N in finish. */
static dt_status sum_launch(void *st, dt_pg *pg, dt_ddp_bucket *b, dt_work **w) {
    (void)st;
    *w = NULL;
    return dt_allreduce(pg, b->grad, b->grad, (int64_t)b->numel, DT_F32, DT_RED_SUM | DT_RED_DETERMINISTIC, NULL);
}
static dt_status sum_finish(void *st, dt_pg *pg, dt_ddp_bucket *b) {
    (void)st;
    const float n = (float)dt_pg_size(pg);
    for (size_t i = 0; i < b->numel; i++) b->grad[i] = b->grad[i] / n;
    return DT_OK;
}
static const dt_ddp_comm_hook sum_hook = {sum_launch, sum_finish, NULL};

typedef struct jspec {
    const char *name;
    dt_model_cfg cfg;
    int K;
    int64_t B;
    dt_dtype wire;       /* DDP's dp.wire */
    const dt_ddp_comm_hook *hook;
    int exact;   /* compare with the reference bitwise */
} jspec;

static void run_join(const jspec *js) {
    int me = dt_pg_rank(world), N = dt_pg_size(world);
    int mine = me + 2, steps = N + 1, K = js->K;
    dt_optim_cfg oc = dtt_adamw(1e-2f, 0.01f);
    dt_ddp_opts o;
    dt_ddp_opts_default(&o);
    o.dp.join = 1;
    o.dp.first_bucket_bytes = 512;
    o.dp.bucket_bytes = 2048;
    o.dp.wire = js->wire;
    o.hook = js->hook;
    o.dp.deterministic = N > 2 && !js->hook && js->wire == DT_F32;
    dtt_net n, r;
    dtt_net_init(&n, &js->cfg, 21, &oc);
    dtt_net_init(&r, &js->cfg, 21, &oc);
    dt_ddp *d;
    T_OK(dt_ddp_create(n.m, world, &o, &d));
    T_CHECK(dt_ddp_num_buckets(d) > 1);
    for (int st = 0; st < mine; st++) {
        dtt_batch mb[4];
        for (int k = 0; k < K; k++) dtt_make_batch(&js->cfg, dtt_key(st, me, k), js->B, &mb[k]);
        dtt_ddp_step(&n, d, mb, K);
        for (int k = 0; k < K; k++) dtt_batch_free(&mb[k]);
    }
    T_OK(dt_ddp_join(d));
    size_t ne = n.m->param_flat.numel;
    char what[320];
    snprintf(what, sizeof what, "%s: params across ranks after join", js->name);
    T_SAME_ON_RANKS(n.m->param_flat.data, ne, what);
    for (int i = 0; i < n.m->n_buffers; i++) {
        snprintf(what, sizeof what, "%s: buffer %s across ranks after join", js->name, n.m->buffers[i]->name);
        T_SAME_ON_RANKS(dt_f32(&n.m->buffers[i]->value), (size_t)n.m->buffers[i]->value.numel, what);
    }
    if (js->exact) {
        int *active = calloc((size_t)N, sizeof *active);
        for (int st = 0; st < steps; st++) {
            dtt_batch *mb = calloc((size_t)(N * K), sizeof *mb);
            for (int q = 0; q < N; q++) {
                active[q] = st < q + 2;
                for (int k = 0; k < K && active[q]; k++) dtt_make_batch(&js->cfg, dtt_key(st, q, k), js->B, &mb[q * K + k]);
            }
            dtt_ref_step(&r, mb, N, K, active);
            for (int i = 0; i < N * K; i++) dtt_batch_free(&mb[i]);
            free(mb);
        }
        free(active);
        snprintf(what, sizeof what, "%s: params after join vs reference", js->name);
        T_BITWISE(n.m->param_flat.data, r.m->param_flat.data, ne, what);
    }
    /* a second join right away: everyone is already done */
    T_OK(dt_ddp_join(d));
    dt_ddp_free(d);
    dtt_net_free(&n);
    dtt_net_free(&r);
}

static void test_join(void) {
    t_begin("join: uneven inputs finish with identical parameters");
    jspec specs[] = {
        {"mlp", dtt_mlp_cfg(20, 16, 12, 5), 1, 8, DT_F32, NULL, 1},
        {"mlp, 2 micro-steps", dtt_mlp_cfg(20, 16, 12, 5), 2, 4, DT_F32, NULL, 1},
        {"cnn (BatchNorm buffers broadcast)", dtt_cnn_cfg(), 1, 3, DT_F32, NULL, 1},
        {"mlp, bf16 compression", dtt_mlp_cfg(20, 16, 12, 5), 1, 8, DT_BF16, NULL, 0},
        {"mlp, custom hook", dtt_mlp_cfg(20, 16, 12, 5), 2, 4, DT_F32, &sum_hook, 1},
    };
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) run_join(&specs[i]);
    t_end();
}

/* Packed model buffers (registration order). */
static float *pack_buffers(const dt_model *m, size_t *n) {
    size_t k = 0;
    for (int i = 0; i < m->n_buffers; i++) k += (size_t)m->buffers[i]->value.numel;
    float *out = malloc((k + 1) * sizeof *out);
    T_CHECK(out != NULL);
    size_t at = 0;
    for (int i = 0; i < m->n_buffers; i++) {
        memcpy(out + at, dt_f32(&m->buffers[i]->value), (size_t)m->buffers[i]->value.numel * sizeof *out);
        at += (size_t)m->buffers[i]->value.numel;
    }
    *n = k;
    return out;
}

/* Buffers under join come from the highest rank still active (PyTorch's
 * common rank), never from a rank that ran out of data. Rank r has r + 2
 * batches, so the last rank trains longest; its BatchNorm statistics, updated
 * only by its own forwards, are what every rank must end with. The
 * expectation: on the last rank a plain copy of the model (no DDP) takes the
 * DDP model's parameters before each step and runs the same forward on the
 * same batch; its buffers are sent to every rank. */
static void test_join_buffers(void) {
    t_begin("join: BatchNorm buffers come from the highest rank still active");
    int me = dt_pg_rank(world), N = dt_pg_size(world), last = N - 1;
    dt_model_cfg cfg = dtt_cnn_cfg();
    dt_optim_cfg oc = dtt_adamw(1e-2f, 0.01f);
    dt_ddp_opts o;
    dt_ddp_opts_default(&o);
    o.dp.join = 1;
    o.dp.first_bucket_bytes = 512;
    o.dp.bucket_bytes = 2048;
    o.dp.deterministic = N > 2;
    dtt_net n, x;
    dtt_net_init(&n, &cfg, 21, &oc);
    dtt_net_init(&x, &cfg, 21, &oc);
    T_CHECK(n.m->n_buffers > 0);
    dt_ddp *d;
    T_OK(dt_ddp_create(n.m, world, &o, &d));
    for (int i = 0; i < n.m->n_buffers; i++)   /* the common start: rank 0's, broadcast at create */
        memcpy(dt_f32(&x.m->buffers[i]->value), dt_f32(&n.m->buffers[i]->value),
               (size_t)n.m->buffers[i]->value.numel * sizeof(float));
    size_t ne = n.m->param_flat.numel;
    for (int st = 0; st < me + 2; st++) {
        dtt_batch b;
        dtt_make_batch(&cfg, dtt_key(st, me, 0), 3, &b);
        if (me == last) {
            memcpy(x.m->param_flat.data, n.m->param_flat.data, ne * sizeof(float));
            dtt_fwd_bwd(&x, NULL, 1, &b.b, 1.0f, NULL);
            dt_model_zero_grad(x.m);
        }
        dtt_ddp_step(&n, d, &b, 1);
        dtt_batch_free(&b);
    }
    T_OK(dt_ddp_join(d));
    size_t nb, nb2;
    float *got = pack_buffers(n.m, &nb), *want = pack_buffers(x.m, &nb2);
    T_CHECK(nb == nb2);
    MPI_Bcast(want, (int)nb, MPI_FLOAT, last, MPI_COMM_WORLD);
    T_BITWISE(got, want, nb, "buffers after join vs the last rank's own statistics");
    free(got);
    free(want);
    dt_ddp_free(d);
    dtt_net_free(&n);
    dtt_net_free(&x);
    t_end();
}

static void test_join_misuse(void) {
    t_begin("join: needs opts.join; SyncBatchNorm + join rejected");
    dt_model_cfg c = dtt_mlp_cfg(20, 16, 0, 5);
    dt_optim_cfg oc = dtt_adamw(1e-2f, 0.0f);
    dtt_net n;
    dtt_net_init(&n, &c, 1, &oc);
    dt_ddp *d;
    T_OK(dt_ddp_create(n.m, world, NULL, &d));
    dt_error_clear();
    T_CHECK(dt_ddp_join(d) == DT_ESTATE);
    T_CHECK(strstr(dt_error_message(), "join") != NULL);
    dt_ddp_free(d);
    dt_ddp_opts o;
    dt_ddp_opts_default(&o);
    o.dp.join = 1;
    o.dp.sync_bn = 1;
    static char sentinel;
    d = (dt_ddp *)(void *)&sentinel;   /* must be reset to NULL on failure */
    dt_error_clear();
    T_CHECK(dt_ddp_create(n.m, world, &o, &d) == DT_EINVAL && d == NULL);
    T_CHECK(strstr(dt_error_message(), "join") && strstr(dt_error_message(), "SyncBatchNorm"));
    /* all ranks with equal data: join returns at once */
    o.dp.sync_bn = 0;
    T_OK(dt_ddp_create(n.m, world, &o, &d));
    dtt_batch b;
    dtt_make_batch(&c, dtt_key(0, dt_pg_rank(world), 0), 4, &b);
    dtt_ddp_step(&n, d, &b, 1);
    T_OK(dt_ddp_join(d));
    T_SAME_ON_RANKS(n.m->param_flat.data, n.m->param_flat.numel, "params after an even join");
    dtt_batch_free(&b);
    dt_ddp_free(d);
    dtt_net_free(&n);
    t_end();
}

int main(int argc, char **argv) {
    t_init(&argc, &argv);
    T_OK(dt_pg_world(&world));
    test_join();
    test_join_buffers();
    test_join_misuse();
    T_OK(dt_dist_finalize());
    return 0;
}
