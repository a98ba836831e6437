/* Unused parameters. An MLP whose forward skips fc2's bias:
 *  - find_unused_params = 0: dt_ddp_finish_backward fails on every rank with a
 *    message naming 'fc2.bias'; nothing hangs and the next step still works;
 *  - find_unused_params = 1: training matches the single-process reference
 *    bit for bit and the unused parameter stays unchanged (weight decay 0);
 *  - the parameter unused on some ranks only: still the reference;
 *  - finish_backward without a backward fails cleanly on every rank. */
#include "mpi_check.h"
#include "ddp_testutil.h"

static dt_pg *world;

static dt_model_cfg cfg(void) { return dtt_mlp_cfg(20, 16, 12, 5); }

static void net(dtt_net *n, uint64_t seed) {
    dt_model_cfg c = cfg();
    dt_optim_cfg oc = dtt_adamw(1e-2f, 0.0f);
    dtt_net_init(n, &c, seed, &oc);
    n->m->forward = dtt_mlp_forward_skip_bias;
}

static dt_ddp_opts opts(int find_unused) {
    dt_ddp_opts o;
    dt_ddp_opts_default(&o);
    o.dp.first_bucket_bytes = o.dp.bucket_bytes = 256;   /* several buckets: the unused one blocks later ones */
    o.dp.find_unused_params = find_unused;
    o.dp.deterministic = dt_pg_size(world) > 2;
    return o;
}

static void test_unused_is_an_error(void) {
    t_begin("unused parameter without find_unused_params: error naming it, no hang");
    int me = dt_pg_rank(world);
    dtt_net n;
    net(&n, 11);
    dt_ddp_opts o = opts(0);
    dt_ddp *d;
    T_OK(dt_ddp_create(n.m, world, &o, &d));
    T_CHECK(dt_ddp_num_buckets(d) > 2);
    dt_model_cfg c = cfg();
    for (int st = 0; st < 2; st++) {
        dtt_batch b;
        dtt_make_batch(&c, dtt_key(st, me, 0), 8, &b);
        dtt_skip_layer = 1;
        dtt_fwd_bwd(&n, d, 1, &b.b, 1.0f, NULL);
        dt_error_clear();
        T_CHECK(dt_ddp_finish_backward(d) == DT_EINVAL);
        T_CHECK(strstr(dt_error_message(), "'fc2.bias'") != NULL);
        T_CHECK(strstr(dt_error_message(), "find_unused") != NULL);
        T_CHECK(strstr(dt_error_message(), "fc1.") == NULL && strstr(dt_error_message(), "fc3.") == NULL);
        dt_model_zero_grad(n.m);
        dtt_batch_free(&b);
    }
    /* every rank got here; a regular step afterwards still works */
    MPI_Barrier(MPI_COMM_WORLD);
    dtt_skip_layer = -1;
    dtt_batch b;
    dtt_make_batch(&c, dtt_key(5, me, 0), 8, &b);
    dtt_ddp_step(&n, d, &b, 1);
    T_SAME_ON_RANKS(n.m->param_flat.data, n.m->param_flat.numel, "params after recovery");
    dtt_batch_free(&b);
    dt_ddp_free(d);
    dtt_net_free(&n);
    dtt_skip_layer = 1;
    t_end();
}

static void test_finish_without_backward(void) {
    t_begin("finish_backward without backward: error on every rank, then recovers");
    int me = dt_pg_rank(world);
    dtt_net n;
    net(&n, 13);
    dt_ddp_opts o = opts(0);
    dt_ddp *d;
    T_OK(dt_ddp_create(n.m, world, &o, &d));
    dt_model_cfg c = cfg();
    dtt_batch b;
    dtt_make_batch(&c, dtt_key(0, me, 0), 8, &b);
    dtt_skip_layer = -1;
    dt_graph_reset(n.g);
    T_OK(dt_ddp_before_forward(d, n.g, 1));
    T_CHECK(dt_model_forward(n.m, n.g, &b.b, NULL) != NULL);
    dt_error_clear();
    T_CHECK(dt_ddp_finish_backward(d) == DT_ESTATE);
    T_CHECK(strstr(dt_error_message(), "backward") != NULL);
    dtt_ddp_step(&n, d, &b, 1);
    T_SAME_ON_RANKS(n.m->param_flat.data, n.m->param_flat.numel, "params after recovery");
    dtt_skip_layer = 1;
    dtt_batch_free(&b);
    dt_ddp_free(d);
    dtt_net_free(&n);
    t_end();
}

static int skip_on_odd_ranks;
static void ref_rank_hook(int r) { dtt_skip_layer = skip_on_odd_ranks && r % 2 == 0 ? -1 : 1; }

static void run_find_unused(int odd_only) {
    int me = dt_pg_rank(world), N = dt_pg_size(world);
    skip_on_odd_ranks = odd_only;
    dtt_net n, r;
    net(&n, 12 + (uint64_t)me);
    net(&r, 12);
    dt_ddp_opts o = opts(1);
    dt_ddp *d;
    T_OK(dt_ddp_create(n.m, world, &o, &d));
    dt_param *pb = dt_model_find_param(n.m, "fc2.bias");
    T_CHECK(pb != NULL);
    size_t nb = (size_t)pb->value.numel, ne = n.m->param_flat.numel;
    float *b0 = t_copy(dt_f32(&pb->value), nb), *init = t_copy(n.m->param_flat.data, ne);
    dt_model_cfg c = cfg();
    dtt_ref_rank_hook = ref_rank_hook;
    for (int st = 0; st < 4; st++) {
        dtt_batch *mb = calloc((size_t)N, sizeof *mb);
        for (int q = 0; q < N; q++) dtt_make_batch(&c, dtt_key(st, q, 0), 8, &mb[q]);
        ref_rank_hook(me);
        dtt_ddp_step(&n, d, &mb[me], 1);
        dtt_ref_step(&r, mb, N, 1, NULL);
        for (int q = 0; q < N; q++) dtt_batch_free(&mb[q]);
        free(mb);
    }
    dtt_ref_rank_hook = NULL;
    dtt_skip_layer = 1;
    T_CHECK(t_differs(n.m->param_flat.data, init, ne));
    T_SAME_ON_RANKS(n.m->param_flat.data, ne, "params across ranks");
    T_BITWISE(n.m->param_flat.data, r.m->param_flat.data, ne, "find_unused_params: DDP vs reference");
    if (odd_only) T_CHECK(t_differs(dt_f32(&pb->value), b0, nb));   /* even ranks trained it */
    else T_BITWISE(dt_f32(&pb->value), b0, nb, "unused parameter stays unchanged");
    free(b0);
    free(init);
    dt_ddp_free(d);
    dtt_net_free(&n);
    dtt_net_free(&r);
}

static void test_find_unused(void) {
    t_begin("find_unused_params: trains, matches the reference, unused param unchanged");
    run_find_unused(0);
    t_end();
    if (dt_pg_size(world) < 2) return;
    t_begin("find_unused_params: parameter unused on odd ranks only");
    run_find_unused(1);
    t_end();
}

int main(int argc, char **argv) {
    dtt_skip_layer = 1;
    t_init(&argc, &argv);
    T_OK(dt_pg_world(&world));
    test_unused_is_an_error();
    test_finish_without_backward();
    test_find_unused();
    T_OK(dt_dist_finalize());
    return 0;
}
