/* ZeRO with node-shared parameters (zero.h node_params; dist.h section 10):
 * one parameter copy per machine, each shard gathered into every other
 * machine once. On the real machine and on simulated ones
 * (DTRAIN_TEST_MACHINES, cmake/tests.cmake):
 *  - it is in effect, and stage 3 keeps whole parameters (stage 2);
 *  - parameters, buffers and the last loss are bit for bit those of the same
 *    run with private parameters, for stages 1/2/3 x every step overlap, the
 *    MLP, the CNN (buffers) and GPT-2 (tied embedding), with gradient
 *    accumulation, in deterministic mode (which those runs match DDP in:
 *    test_zero_equivalence), so node_params changes where parameters live,
 *    never what they are;
 *  - the memory report counts each rank's share of its machine's copy;
 *  - a 16-bit wire and join are refused, naming node_params. */
#include "mpi_check.h"
#include "zero_testutil.h"

static dt_pg *world;

static const dt_zero_overlap overlaps[3] = {DT_ZERO_OVERLAP_OFF, DT_ZERO_OVERLAP_AFTER_BACKWARD,
                                            DT_ZERO_OVERLAP_INTERLEAVED};

static void check_model(const char *name, dtz_spec *s) {
    dt_model *namer;
    T_OK(dt_model_create(&s->cfg, 1, &namer));
    for (int stage = 1; stage <= 3; stage++)
        for (int oi = 0; oi < 3; oi++) {
            dt_zero_opts o = dtz_opts(s, stage, overlaps[oi]);
            dtz_result want, got;
            dtz_zero_run(s, world, &o, &want);
            o.node_params = 1;
            dtz_zero_run(s, world, &o, &got);
            char what[160];
            snprintf(what, sizeof what, "%s, stage %d, overlap %d: node-shared vs private parameters", name, stage, oi);
            T_CHECK(got.n_params == want.n_params && got.n_buffers == want.n_buffers);
            dtz_expect_params(namer, got.params, want.params, 0, what);
            T_SAME_ON_RANKS(got.params, got.n_params, what);
            if (got.n_buffers) T_BITWISE(got.buffers, want.buffers, got.n_buffers, what);
            T_CHECK(got.last_loss == want.last_loss);
            dtz_result_free(&want);
            dtz_result_free(&got);
        }
    dt_model_free(namer);
}

static void test_same_as_private(void) {
    t_begin("node-shared parameters == private parameters, bit for bit (stages x overlaps x models)");
    dtz_spec mlp = dtz_mk_spec(dtt_mlp_cfg(20, 16, 12, 5), 8, 3);
    dtz_spec cnn = dtz_mk_spec(dtt_cnn_cfg(), 3, 2);
    dtz_spec gpt = dtz_mk_spec(dtt_gpt2_cfg(), 2, 3);
    mlp.det = cnn.det = gpt.det = 1;
    mlp.K = 2;   /* accumulation: parameters are read by micro-steps that do not reduce */
    check_model("mlp", &mlp);
    check_model("cnn", &cnn);
    check_model("gpt2 tiny", &gpt);
    t_end();
}

static void test_in_effect(void) {
    t_begin("node-shared parameters: in effect, stage 3 as stage 2, memory is each rank's share");
    dt_pg_topo t;
    dt_pg_topology(world, &t);
    dtz_spec s = dtz_mk_spec(dtt_gpt2_cfg(), 2, 1);
    for (int stage = 1; stage <= 3; stage++) {
        dt_zero_opts o = dtz_opts(&s, stage, DT_ZERO_OVERLAP_AFTER_BACKWARD);
        o.node_params = 1;
        dtz_net n;
        dtz_net_init(&n, &s, 1, world, &o);
        const char *why = NULL;
        T_CHECK(dt_zero_node_params(n.z, &why) == 1);
        T_CHECK(why && !*why);
        T_CHECK(dt_zero_stage(n.z) == (stage == 3 ? 2 : stage));
        size_t full = dtz_layout_len(n.z) * sizeof(float);
        T_CHECK(dt_zero_get_memory(n.z).param_bytes == full / (size_t)t.local_size);
        dtz_net_free(&n);
    }
    t_end();
}

static void test_refused(void) {
    t_begin("node-shared parameters: 16-bit wire and join refused");
    dtz_spec s = dtz_mk_spec(dtt_mlp_cfg(8, 6, 0, 3), 4, 1);
    dt_model *m;
    T_OK(dt_model_create(&s.cfg, 1, &m));
    dt_zero_opts o = dtz_opts(&s, 2, DT_ZERO_OVERLAP_AFTER_BACKWARD);
    o.node_params = 1;
    o.dp.wire = DT_BF16;
    dt_zero *z = NULL;
    T_CHECK(dt_zero_create(m, world, &s.oc, &o, &z) == DT_EINVAL && !z);
    T_CHECK(strstr(dt_error_message(), "node_params") != NULL);
    o.dp.wire = DT_F32;
    o.dp.join = 1;
    T_CHECK(dt_zero_create(m, world, &s.oc, &o, &z) == DT_EINVAL && !z);
    T_CHECK(strstr(dt_error_message(), "node_params") != NULL);
    dt_error_clear();
    dt_model_free(m);
    t_end();
}

int main(int argc, char **argv) {
    t_init(&argc, &argv);
    T_OK(dt_pg_world(&world));
    test_in_effect();
    test_same_as_private();
    test_refused();
    T_OK(dt_dist_finalize());
    return 0;
}
