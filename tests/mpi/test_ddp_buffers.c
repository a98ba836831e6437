/* Buffers (BatchNorm running statistics) under DDP:
 *  - broadcast_buffers: identical on every rank after each step although the
 *    ranks see different data (and they do differ without it);
 *  - SyncBatchNorm: N ranks match one process on the concatenated batch
 *    (BN forward output / logits, loss, gradients, running stats, params). */
#include "mpi_check.h"
#include "ddp_testutil.h"

static dt_pg *world;

/* 1 if any rank's buffers differ from rank 0's. */
static int buffers_differ_somewhere(const dt_model *m) {
    int bad = 0, any = 0;
    for (int i = 0; i < m->n_buffers; i++) {
        const dt_tensor *t = &m->buffers[i]->value;
        float *r0 = t_copy(dt_f32(t), (size_t)t->numel);
        MPI_Bcast(r0, (int)t->numel, MPI_FLOAT, 0, MPI_COMM_WORLD);
        bad |= t_differs(r0, dt_f32(t), (size_t)t->numel);
        free(r0);
    }
    MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_LOR, MPI_COMM_WORLD);
    return any;
}

static void expect_buffers_same(const dt_model *m, const char *when) {
    for (int i = 0; i < m->n_buffers; i++) {
        char what[256];
        snprintf(what, sizeof what, "%s: %s", when, m->buffers[i]->name);
        T_SAME_ON_RANKS(dt_f32(&m->buffers[i]->value), (size_t)m->buffers[i]->value.numel, what);
    }
}

static void test_broadcast_buffers(void) {
    t_begin("broadcast_buffers: BatchNorm running stats identical across ranks");
    int me = dt_pg_rank(world);
    dt_model_cfg c = dtt_cnn_cfg();
    dt_optim_cfg oc = dtt_adamw(1e-2f, 0.01f);
    for (int bc = 1; bc >= 0; bc--) {
        dtt_net n;
        dtt_net_init(&n, &c, 51, &oc);
        T_CHECK(n.m->n_buffers == 4);
        dt_ddp_opts o;
        dt_ddp_opts_default(&o);
        o.dp.broadcast_buffers = bc;
        o.dp.deterministic = dt_pg_size(world) > 2;
        dt_ddp *d;
        T_OK(dt_ddp_create(n.m, world, &o, &d));
        expect_buffers_same(n.m, "after create");
        for (int st = 0; st < 3; st++) {
            dtt_batch mb[2];
            for (int k = 0; k < 2; k++) dtt_make_batch(&c, dtt_key(st, me, k), 3, &mb[k]);
            dtt_ddp_step(&n, d, mb, st == 1 ? 2 : 1);   /* step 1 has a no_sync micro-step */
            if (bc) expect_buffers_same(n.m, "after a step");
            else T_CHECK(buffers_differ_somewhere(n.m));   /* the data really differ */
            T_SAME_ON_RANKS(n.m->param_flat.data, n.m->param_flat.numel, "params");
            for (int k = 0; k < 2; k++) dtt_batch_free(&mb[k]);
        }
        dt_ddp_free(d);
        dtt_net_free(&n);
    }
    t_end();
}

static void run_sync_bn(int det, int bcast) {
    int me = dt_pg_rank(world), N = dt_pg_size(world);
    const int64_t B = 3;
    dt_model_cfg c = dtt_cnn_cfg();
    dt_optim_cfg oc = dt_optim_cfg_default(DT_OPTIM_SGD);   /* no AdamW sign amplification */
    oc.lr = 0.05f;
    oc.momentum = 0.9f;
    dtt_net s, l, g;
    dtt_net_init(&s, &c, 61, &oc);   /* SyncBN */
    dtt_net_init(&l, &c, 61, &oc);   /* local BN: must NOT match */
    dtt_net_init(&g, &c, 61, &oc);   /* one process, global batch */
    dt_ddp_opts o;
    dt_ddp_opts_default(&o);
    o.dp.sync_bn = 1;
    o.dp.broadcast_buffers = bcast;
    o.dp.deterministic = det;
    dt_ddp *ds, *dl;
    T_OK(dt_ddp_create(s.m, world, &o, &ds));
    o.dp.sync_bn = 0;
    T_OK(dt_ddp_create(l.m, world, &o, &dl));
    size_t ne = s.m->param_flat.numel, nl = (size_t)B * (size_t)c.cnn_classes;
    for (int st = 0; st < 3; st++) {
        dtt_batch *parts = calloc((size_t)N, sizeof *parts), all;
        for (int q = 0; q < N; q++) dtt_make_batch(&c, dtt_key(st, q, 0), B, &parts[q]);
        dtt_concat(&c, parts, N, &all);
        const float *ls, *ll, *lg;
        float loss_s = dtt_fwd_bwd(&s, ds, 1, &parts[me].b, 1.0f, &ls);
        T_OK(dt_ddp_finish_backward(ds));
        dtt_fwd_bwd(&l, dl, 1, &parts[me].b, 1.0f, &ll);
        T_OK(dt_ddp_finish_backward(dl));
        float loss_g = dtt_fwd_bwd(&g, NULL, 1, &all.b, 1.0f, &lg);
        char what[200];   /* a buffer name is < 128 */
        snprintf(what, sizeof what, "step %d: SyncBN logits vs global-batch rows", st);
        T_NEAR(ls, lg + (size_t)me * nl, nl, 1e-5, what);
        if (N > 1 && st == 0) T_CHECK(t_rel_diff(ll, lg + (size_t)me * nl, nl) > 1e-3);   /* local BN differs */
        float lsum = 0, lavg;
        MPI_Allreduce(&loss_s, &lsum, 1, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        lavg = lsum / (float)N;
        snprintf(what, sizeof what, "step %d: SyncBN mean loss vs global-batch loss", st);
        T_NEAR(&lavg, &loss_g, 1, 1e-5, what);
        snprintf(what, sizeof what, "step %d: SyncBN gradient vs global-batch gradient", st);
        T_NEAR(s.m->grad_flat.data, g.m->grad_flat.data, ne, 1e-5, what);
        for (int i = 0; i < s.m->n_buffers; i++) {
            const dt_tensor *a = &s.m->buffers[i]->value, *b = &g.m->buffers[i]->value;
            snprintf(what, sizeof what, "step %d: SyncBN %s vs global batch", st, s.m->buffers[i]->name);
            T_NEAR(dt_f32(a), dt_f32(b), (size_t)a->numel, 1e-5, what);
        }
        expect_buffers_same(s.m, "SyncBN running stats");   /* without any broadcast */
        dtt_opt_step(&s);
        dtt_opt_step(&l);
        dtt_opt_step(&g);
        snprintf(what, sizeof what, "step %d: SyncBN params vs global batch", st);
        T_NEAR(s.m->param_flat.data, g.m->param_flat.data, ne, 1e-5, what);
        T_SAME_ON_RANKS(s.m->param_flat.data, ne, "SyncBN params across ranks");
        for (int q = 0; q < N; q++) dtt_batch_free(&parts[q]);
        dtt_batch_free(&all);
        free(parts);
    }
    dt_ddp_free(ds);
    dt_ddp_free(dl);
    T_CHECK(s.m->bn_sync.fn == NULL);   /* free uninstalls SyncBN */
    dtt_net_free(&s);
    dtt_net_free(&l);
    dtt_net_free(&g);
}

static void test_sync_bn(void) {
    t_begin("SyncBatchNorm: N ranks == one process on the concatenated batch");
    run_sync_bn(0, 0);
    run_sync_bn(1, 1);
    t_end();
}

int main(int argc, char **argv) {
    t_init(&argc, &argv);
    T_OK(dt_pg_world(&world));
    test_broadcast_buffers();
    test_sync_bn();
    T_OK(dt_dist_finalize());
    return 0;
}
