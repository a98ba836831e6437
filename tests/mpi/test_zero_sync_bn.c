/* SyncBatchNorm under ZeRO stages 1/2/3 equals DDP with sync_bn, bitwise
 * (N = 2, or deterministic reductions at N = 4): parameters and BatchNorm
 * buffers of the CNN after a few steps on different data per rank, with one
 * and with two micro-steps. A sanity check first: DDP with sync_bn differs
 * from DDP without it (the ranks' batch statistics differ), so the equality
 * says something. DDP's 16-bit wire carries gradients only: the statistics
 * stay float32 (run on simulated machines too, where that wire is the
 * hierarchical one between machines). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "mpi_check.h"
#include "zero_testutil.h"

static dt_pg *world;

enum { STEPS = 3 };

static float lr_of(int st) { return 1e-2f * (1.0f - 0.125f * (float)(st % 4)); }

static void make_micro(const dt_model_cfg *c, int st, int K, int64_t B, dtt_batch *mb) {
    /* rank-dependent rows: the local statistics differ between ranks */
    for (int k = 0; k < K; k++) dtt_make_batch(c, dtt_key(st, t_rank(), k), B + t_rank() % 2, &mb[k]);
}

static void ddp_run_wire(const dt_model_cfg *c, int K, int sync_bn, dt_dtype wire, int steps, int det, dtz_result *out) {
    dt_optim_cfg oc = dtt_adamw(1e-2f, 0.01f);
    dtt_net n;
    dtt_net_init(&n, c, 1 + (uint64_t)t_rank(), &oc);
    dt_ddp_opts o;
    dt_ddp_opts_default(&o);
    o.dp.sync_bn = sync_bn;
    o.dp.deterministic = det;
    o.dp.wire = wire;
    dt_ddp *d;
    T_OK(dt_ddp_create(n.m, world, &o, &d));
    for (int st = 0; st < steps; st++) {
        dtt_batch mb[2];
        make_micro(c, st, K, 3, mb);
        n.lr = lr_of(st);
        dtt_ddp_step(&n, d, mb, K);
        for (int k = 0; k < K; k++) dtt_batch_free(&mb[k]);
    }
    out->params = dtz_params(n.m, NULL);
    out->n_params = dtz_param_count(n.m);
    out->buffers = dtz_buffers(n.m, &out->n_buffers);
    dt_ddp_free(d);
    dtt_net_free(&n);
}

static void ddp_run(const dt_model_cfg *c, int K, int sync_bn, dtz_result *out) {
    ddp_run_wire(c, K, sync_bn, DT_F32, STEPS, t_size() > 2, out);
}

static void zero_run(const dt_model_cfg *c, int K, int stage, dtz_result *out) {
    dtz_spec s = dtz_mk_spec(*c, 3, STEPS);
    dt_zero_opts o = dtz_opts(&s, stage, DT_ZERO_OVERLAP_AFTER_BACKWARD);
    o.dp.sync_bn = 1;
    o.dp.first_bucket_bytes = 512;
    o.dp.bucket_bytes = 2048;
    dtz_net n;
    dtz_net_init(&n, &s, 1 + (uint64_t)t_rank(), world, &o);
    for (int st = 0; st < STEPS; st++) {
        dtt_batch mb[2];
        make_micro(c, st, K, 3, mb);
        dtz_step(&n, lr_of(st), mb, K, NULL);
        for (int k = 0; k < K; k++) dtt_batch_free(&mb[k]);
    }
    T_OK(dt_zero_sync_params(n.z));
    float *lay = dtz_gather_layout(n.z);
    out->params = dtz_params(n.m, lay);
    out->n_params = dtz_param_count(n.m);
    free(lay);
    out->buffers = dtz_buffers(n.m, &out->n_buffers);
    dtz_net_free(&n);
}

static void test_sync_bn(void) {
    t_begin("zero sync_bn: stages 1/2/3 equal DDP sync_bn bitwise");
    dt_model_cfg c = dtt_cnn_cfg();
    dt_model *m;
    T_OK(dt_model_create(&c, 1, &m));
    T_CHECK(m->n_buffers > 0);
    char what[160];
    for (int K = 1; K <= 2; K++) {
        dtz_result want, plain;
        ddp_run(&c, K, 1, &want);
        ddp_run(&c, K, 0, &plain);
        T_CHECK(memcmp(want.params, plain.params, want.n_params * sizeof(float)) != 0);
        T_SAME_ON_RANKS(want.buffers, want.n_buffers, "DDP sync_bn: buffers across ranks");
        for (int stage = 1; stage <= 3; stage++) {
            dtz_result got;
            zero_run(&c, K, stage, &got);
            T_CHECK(got.n_params == want.n_params && got.n_buffers == want.n_buffers);
            snprintf(what, sizeof what, "stage %d, %d micro-step(s): parameters vs DDP sync_bn", stage, K);
            dtz_expect_params(m, got.params, want.params, 0, what);
            snprintf(what, sizeof what, "stage %d, %d micro-step(s): buffers vs DDP sync_bn", stage, K);
            T_BITWISE(got.buffers, want.buffers, got.n_buffers, what);
            dtz_result_free(&got);
        }
        dtz_result_free(&want);
        dtz_result_free(&plain);
    }
    dt_model_free(m);
    t_end();
}

/* After one step the BatchNorm buffers come from the initial parameters and
 * the batch alone: a 16-bit gradient wire must leave them bitwise as with
 * float32 (rounding the count and the sums of x and x^2 lost the variance) */
static void test_sync_bn_wire(void) {
    dt_pg_topo topo;
    dt_pg_topology(world, &topo);
    t_begin(topo.hierarchical ? "DDP sync_bn: float32 statistics under a 16-bit wire between machines"
                              : "DDP sync_bn: float32 statistics under a 16-bit wire");
    dt_model_cfg c = dtt_cnn_cfg();
    dtz_result want;   /* (plain sums, as a 16-bit wire allows: a fixed order for one layout) */
    ddp_run_wire(&c, 1, 1, DT_F32, 1, 0, &want);
    const dt_dtype wires[] = {DT_BF16, DT_F16};
    for (int i = 0; i < 2; i++) {
        dtz_result got;
        ddp_run_wire(&c, 1, 1, wires[i], 1, 0, &got);
        T_CHECK(got.n_buffers == want.n_buffers);
        T_BITWISE(got.buffers, want.buffers, got.n_buffers, i ? "fp16 wire: BatchNorm buffers" : "bf16 wire: BatchNorm buffers");
        dtz_result_free(&got);
    }
    dtz_result_free(&want);
    t_end();
}

int main(int argc, char **argv) {
    t_init(&argc, &argv);
    T_OK(dt_pg_world(&world));
    test_sync_bn();
    test_sync_bn_wire();
    T_OK(dt_pg_free(world));
    T_OK(dt_dist_finalize());
    return 0;
}
