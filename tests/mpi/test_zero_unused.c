/* ZeRO with an unused parameter. An MLP whose forward skips fc2's bias:
 *  - find_unused_params = 0: dt_zero_finish_backward fails on every rank
 *    with DT_EINVAL and a message naming 'fc2.bias' (and no other
 *    parameter), at every stage; nothing hangs and a regular step afterwards
 *    works and leaves every rank with the same parameters;
 *  - find_unused_params = 1: stages 1/2/3 x overlap modes train exactly like
 *    DDP with find_unused_params (bitwise, N = 2 or deterministic) and the
 *    unused parameter stays unchanged (weight decay 0);
 *  - the parameter unused on odd ranks only: still DDP's result, and the
 *    parameter trains (even ranks give it gradients);
 *  - a whole module skipped (so no forward waits its buckets' all-gathers),
 *    on all ranks (every stage) or on odd ranks only (stages 1/2: stage 3
 *    needs the same modules on every rank): still DDP's result;
 *  - dt_zero_finish_backward without a backward, and dt_zero_step without
 *    finish_backward, fail cleanly on every rank. */
#include "mpi_check.h"
#include "zero_testutil.h"

static dt_pg *world;

static dtz_spec spec(int find_unused) {
    dtz_spec s = dtz_mk_spec(dtt_mlp_cfg(20, 16, 12, 5), 8, 4);
    s.oc = dtt_adamw(1e-2f, 0.0f);
    s.forward = dtt_mlp_forward_skip_bias;
    s.find_unused = find_unused;
    s.ddp_bucket_bytes = 256;
    return s;
}

static dt_zero_opts zopts(const dtz_spec *s, int stage, dt_zero_overlap ov) {
    dt_zero_opts o = dtz_opts(s, stage, ov);
    o.dp.first_bucket_bytes = o.dp.bucket_bytes = 256;   /* several buckets: the unused one blocks later ones */
    return o;
}

static void test_unused_is_an_error(void) {
    t_begin("unused parameter without find_unused_params: error naming it on every rank, no hang");
    int me = t_rank();
    dtz_spec s = spec(0);
    static const dt_zero_overlap ovs[3] = {DT_ZERO_OVERLAP_OFF, DT_ZERO_OVERLAP_AFTER_BACKWARD,
                                           DT_ZERO_OVERLAP_INTERLEAVED};
    for (int cfg = 0; cfg < 9; cfg++) {
        int stage = 1 + cfg / 3;
        dt_zero_opts o = zopts(&s, stage, ovs[cfg % 3]);
        dtz_net n;
        dtz_net_init(&n, &s, 11, world, &o);
        T_CHECK(dt_zero_num_buckets(n.z) > 2);
        float *lay0 = dtz_gather_layout(n.z);
        float *before = dtz_params(n.m, lay0);
        free(lay0);
        for (int st = 0; st < 2; st++) {
            dtt_batch b;
            dtt_make_batch(&s.cfg, dtt_key(st, me, 0), 8, &b);
            dtt_skip_layer = 1;
            dt_zero_set_lr(n.z, 1e-2f);
            dtz_fwd_bwd(&n, 1, &b.b, 1.0f);
            dt_error_clear();
            dt_status rc = dt_zero_finish_backward(n.z);
            /* every rank failed the same way */
            int bad = rc != DT_EINVAL, any = 0;
            MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
            T_CHECK(rc == DT_EINVAL && any == 0);
            const char *msg = dt_error_message();
            T_CHECK(strstr(msg, "'fc2.bias'") != NULL);
            T_CHECK(strstr(msg, "find_unused") != NULL);
            T_CHECK(strstr(msg, "fc1.") == NULL && strstr(msg, "fc3.") == NULL);
            dt_error_clear();
            T_CHECK(dt_zero_step(n.z, NULL) == DT_ESTATE);   /* nothing was reduced */
            /* the failed step changed no parameter */
            T_OK(dt_zero_sync_params(n.z));
            float *lay = dtz_gather_layout(n.z);
            float *now = dtz_params(n.m, lay);
            char what[128];
            snprintf(what, sizeof what, "stage %d, overlap mode %d: parameters after a failed step", stage,
                     (int)o.overlap_step);
            dtz_expect_params(n.m, now, before, 0, what);
            free(now);
            free(lay);
            dtt_batch_free(&b);
        }
        free(before);
        MPI_Barrier(MPI_COMM_WORLD);
        /* a regular step still works and moves the (still rank-identical) parameters */
        float *lay = dtz_gather_layout(n.z);
        float *p0 = dtz_params(n.m, lay);
        free(lay);
        dtt_skip_layer = -1;
        dtt_batch b;
        dtt_make_batch(&s.cfg, dtt_key(5, me, 0), 8, &b);
        dtz_step(&n, 1e-2f, &b, 1, NULL);
        T_OK(dt_zero_sync_params(n.z));
        lay = dtz_gather_layout(n.z);
        float *p1 = dtz_params(n.m, lay);
        size_t np = dtz_param_count(n.m);
        T_SAME_ON_RANKS(p1, np, "params after recovery");
        T_CHECK(t_differs(p0, p1, np));
        free(p0);
        free(p1);
        free(lay);
        dtt_batch_free(&b);
        dtz_net_free(&n);
    }
    dtt_skip_layer = 1;
    t_end();
}

static void test_misuse(void) {
    t_begin("finish_backward without backward / step without finish_backward: clean errors, then recovers");
    int me = t_rank();
    dtz_spec s = spec(0);
    dtt_skip_layer = -1;
    for (int stage = 1; stage <= 3; stage++) {
        dt_zero_opts o = zopts(&s, stage, DT_ZERO_OVERLAP_AFTER_BACKWARD);
        dtz_net n;
        dtz_net_init(&n, &s, 13, world, &o);
        dtt_batch b;
        dtt_make_batch(&s.cfg, dtt_key(0, me, 0), 8, &b);
        dt_zero_set_lr(n.z, 1e-2f);
        dt_error_clear();
        T_CHECK(dt_zero_step(n.z, NULL) == DT_ESTATE);
        dt_graph_reset(n.g);
        T_OK(dt_zero_before_forward(n.z, n.g, 1));
        T_CHECK(dt_model_forward(n.m, n.g, &b.b, NULL) != NULL);
        dt_error_clear();
        T_CHECK(dt_zero_finish_backward(n.z) == DT_ESTATE);
        T_CHECK(strstr(dt_error_message(), "backward") != NULL);
        dtz_step(&n, 1e-2f, &b, 1, NULL);
        float *lay = dtz_gather_layout(n.z);
        float *p = dtz_params(n.m, lay);
        T_SAME_ON_RANKS(p, dtz_param_count(n.m), "params after recovery");
        free(p);
        free(lay);
        dtt_batch_free(&b);
        dtz_net_free(&n);
    }
    dtt_skip_layer = 1;
    t_end();
}

static int odd_only;
static void skip_hook(int st, int rank, int k) {
    (void)st; (void)k;
    dtt_skip_layer = odd_only && rank % 2 == 0 ? -1 : 1;
}

static void run_find_unused(int odd) {
    odd_only = odd;
    dtz_spec s = spec(1);
    s.before_micro = skip_hook;
    dt_model *namer;
    T_OK(dt_model_create(&s.cfg, 1, &namer));
    dt_param *pb = dt_model_find_param(namer, "fc2.bias");
    T_CHECK(pb != NULL);
    size_t off = 0;   /* fc2.bias in the registration-order vector */
    for (int i = 0; i < pb->index; i++) off += (size_t)namer->params[i]->value.numel;
    size_t nb = (size_t)pb->value.numel;
    float *init = dtz_init_params(&s.cfg);
    dtz_result want;
    dtz_ddp_run(&s, world, &want);
    T_CHECK(t_differs(want.params, init, want.n_params));
    static const dt_zero_overlap ovs[3] = {DT_ZERO_OVERLAP_OFF, DT_ZERO_OVERLAP_AFTER_BACKWARD,
                                           DT_ZERO_OVERLAP_INTERLEAVED};
    for (int stage = 1; stage <= 3; stage++)
        for (int oi = 0; oi < 3; oi++) {
            dt_zero_opts o = zopts(&s, stage, ovs[oi]);
            dtz_result got;
            dtz_zero_run(&s, world, &o, &got);
            char what[160];
            snprintf(what, sizeof what, "find_unused%s, stage %d, overlap mode %d: ZeRO vs DDP",
                     odd ? " (odd ranks)" : "", stage, (int)ovs[oi]);
            T_SAME_ON_RANKS(got.params, got.n_params, what);
            dtz_expect_params(namer, got.params, want.params, 0, what);
            if (odd) T_CHECK(t_differs(got.params + off, init + off, nb));   /* even ranks trained it */
            else T_BITWISE(got.params + off, init + off, nb, "unused parameter stays unchanged");
            dtz_result_free(&got);
        }
    free(init);
    dtz_result_free(&want);
    dt_model_free(namer);
    dtt_skip_layer = 1;
}

/* A whole module skipped (fc2, 16 -> 16) with find_unused_params: its
 * buckets' parameter all-gathers are never waited by a forward (after-backward
 * queues them; interleaved issues them during backward), on every rank or (not
 * stage 3) on odd ranks only. ZeRO still equals DDP; nothing hangs. */
static int skip_odd_only;
static void skip_module_hook(int st, int rank, int k) {
    (void)st; (void)k;
    dtt_skip_module = skip_odd_only && rank % 2 == 0 ? -1 : 1;
}

static void run_skip_module(int odd) {
    skip_odd_only = odd;
    dtt_skip_layer = -1;
    dtz_spec s = spec(1);
    s.cfg = dtt_mlp_cfg(20, 16, 16, 5);
    s.before_micro = skip_module_hook;
    dtz_result want;
    dtz_ddp_run(&s, world, &want);
    dt_model *namer;
    T_OK(dt_model_create(&s.cfg, 1, &namer));
    static const dt_zero_overlap ovs[3] = {DT_ZERO_OVERLAP_OFF, DT_ZERO_OVERLAP_AFTER_BACKWARD,
                                           DT_ZERO_OVERLAP_INTERLEAVED};
    /* stage 3 gathers per module, so every rank must run the same modules
     * (as in FSDP / DeepSpeed): rank-dependent skipping is stages 1/2 only */
    for (int stage = 1; stage <= (odd ? 2 : 3); stage++)
        for (int oi = 0; oi < 3; oi++) {
            dt_zero_opts o = zopts(&s, stage, ovs[oi]);
            dtz_result got;
            dtz_zero_run(&s, world, &o, &got);
            char what[160];
            snprintf(what, sizeof what, "fc2 skipped%s, stage %d, overlap mode %d: ZeRO vs DDP", odd ? " (odd ranks)" : "",
                     stage, (int)ovs[oi]);
            T_SAME_ON_RANKS(got.params, got.n_params, what);
            dtz_expect_params(namer, got.params, want.params, 0, what);
            dtz_result_free(&got);
        }
    dtz_result_free(&want);
    dt_model_free(namer);
    dtt_skip_module = -1;
    dtt_skip_layer = 1;
}

/* Stage 3 with ranks running different modules: even ranks skip fc2, odd
 * ranks fc3 (equal shapes, one bucket per parameter, so every gather has a
 * partner of the same size and MPI sees nothing wrong). finish_backward fails
 * on every rank with a message saying why, instead of training on gathered
 * parameters of the wrong module. */
static void test_stage3_module_mismatch(void) {
    t_begin("stage 3: ranks running different modules fail with a clear error on every rank");
    int me = t_rank();
    dtz_spec s = spec(1);
    s.cfg = dtt_mlp_cfg(20, 16, 16, 5);
    s.cfg.mlp_n_hidden = 3;
    s.cfg.mlp_hidden[2] = 16;   /* fc1 20->16, fc2 16->16, fc3 16->16, fc4 16->5 */
    for (int oi = 0; oi < 2; oi++) {
        dt_zero_opts o = zopts(&s, 3, oi ? DT_ZERO_OVERLAP_INTERLEAVED : DT_ZERO_OVERLAP_AFTER_BACKWARD);
        o.dp.first_bucket_bytes = o.dp.bucket_bytes = 4;
        dtz_net n;
        dtz_net_init(&n, &s, 3, world, &o);
        dtt_batch b;
        dtt_make_batch(&s.cfg, dtt_key(0, me, 0), 8, &b);
        dtt_skip_layer = -1;
        dtt_skip_module = t_size() > 1 ? 1 + me % 2 : 1;
        dt_zero_set_lr(n.z, 1e-2f);
        dt_graph_reset(n.g);
        T_OK(dt_zero_before_forward(n.z, n.g, 1));
        dt_tensor *loss = dtt_mlp_forward_skip_bias(n.m, n.g, &b.b, NULL);
        T_CHECK(loss != NULL);
        T_OK(dt_graph_backward(n.g, loss));
        dt_error_clear();
        dt_status rc = dt_zero_finish_backward(n.z);
        int bad = rc != DT_EINVAL || !strstr(dt_error_message(), "same modules"), any = 0;
        MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
        T_CHECK(any == 0);
        dtt_skip_module = -1;
        dtt_batch_free(&b);
        dtz_net_free(&n);
    }
    dtt_skip_layer = 1;
    t_end();
}

static void test_find_unused(void) {
    t_begin("find_unused_params: ZeRO-1/2/3 == DDP, unused param unchanged");
    run_find_unused(0);
    t_end();
    t_begin("find_unused_params: parameter unused on odd ranks only == DDP");
    run_find_unused(1);
    t_end();
    t_begin("find_unused_params: a whole module skipped (all ranks, odd ranks) == DDP");
    run_skip_module(0);
    run_skip_module(1);
    t_end();
}

int main(int argc, char **argv) {
    dtt_skip_layer = 1;
    t_init(&argc, &argv);
    T_OK(dt_pg_world(&world));
    test_unused_is_an_error();
    test_misuse();
    test_find_unused();
    test_stage3_module_mismatch();
    T_OK(dt_dist_finalize());
    return 0;
}
