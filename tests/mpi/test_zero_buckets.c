/* ZeRO bucket layout and memory:
 *  - geometry: buckets contiguous in reverse registration order, each padded
 *    to a multiple of N, rank r owns [begin + r*S, begin + (r+1)*S), every
 *    parameter in exactly one bucket; with 256-byte buckets there are many
 *    buckets, padding exists and parameters straddle shard boundaries;
 *  - bucket-size independence: 256 B, 256 B first + 4 KiB, the defaults and
 *    one 64 MiB bucket give the same parameters as DDP bit for bit (N = 2 or
 *    deterministic), at every stage, GPT-2 and MLP;
 *  - memory (dt_zero_get_memory) against sizes computed from the model
 *    (P parameters, N ranks, s optimizer states per element; DDP keeps
 *    4P bytes of parameters, 4P of gradients and 4sP of optimizer state):
 *      optimizer state ~ 4sP/N at every stage, gradients ~ 4P/N from
 *      stage 2, parameters ~ 4P/N at stage 3 (each within 1% + padding),
 *      full-size windows bounded by the layout; stage 3 on a deep MLP holds
 *      only a window of modules gathered at a time, and at stages 2/3 a
 *      bucket's full gradient is released once its reduction finished. */
#include "mpi_check.h"
#include "zero_testutil.h"

static dt_pg *world;

/* A parameter whose elements lie in two ranks' shards. */
static int straddles(dt_zero *z, const dt_model *m) {
    int N = t_size();
    dt_param *const *ord = dt_zero_param_order(z);
    for (int i = 0; i < dt_zero_num_buckets(z); i++) {
        const dt_zero_bucket *b = dt_zero_bucket_at(z, i);
        for (int k = 0; k < b->n_params; k++) {
            const dt_param *p = ord[b->first_param + k];
            size_t lo = m->offsets[p->index], hi = lo + (size_t)p->value.numel;
            for (int r = 1; r < N; r++) {
                size_t cut = b->begin + (size_t)r * b->shard;
                if (lo < cut && cut < hi) return 1;
            }
        }
    }
    return 0;
}

static void test_geometry(void) {
    t_begin("tiny buckets: geometry, padding, parameters straddling shard boundaries");
    const dt_model_cfg cfgs[2] = {dtt_gpt2_cfg(), dtt_mlp_cfg(20, 16, 12, 5)};
    for (int c = 0; c < 2; c++)
        for (int stage = 1; stage <= 3; stage++) {
            dtz_spec s = dtz_mk_spec(cfgs[c], 2, 1);
            dt_zero_opts o = dtz_opts(&s, stage, DT_ZERO_OVERLAP_AFTER_BACKWARD);
            o.dp.first_bucket_bytes = o.dp.bucket_bytes = 256;
            dtz_net n;
            dtz_net_init(&n, &s, 1, world, &o);
            dtz_check_geometry(n.z, n.m);
            int nb = dt_zero_num_buckets(n.z), padded = 0;
            T_CHECK(nb >= 4);
            for (int i = 0; i < nb; i++) {
                const dt_zero_bucket *b = dt_zero_bucket_at(n.z, i);
                if (b->used < b->numel) padded = 1;
                /* a bucket is over the cap only when it holds a single parameter */
                T_CHECK(b->used * sizeof(float) <= 256 || b->n_params == 1);
            }
            T_CHECK(padded);
            T_CHECK(straddles(n.z, n.m));
            /* the layout covers every parameter element once: P <= layout */
            T_CHECK(dtz_layout_len(n.z) >= dtz_param_count(n.m));
            /* default caps: everything of these tiny models in one bucket */
            dtz_net_free(&n);
            o.dp.first_bucket_bytes = (size_t)1 << 20;
            o.dp.bucket_bytes = (size_t)4 << 20;
            dtz_net_init(&n, &s, 1, world, &o);
            dtz_check_geometry(n.z, n.m);
            T_CHECK(dt_zero_num_buckets(n.z) == 1);
            dtz_net_free(&n);
        }
    t_end();
}

static void test_bucket_independence(void) {
    t_begin("bucket sizes 256 B / 256 B+4 KiB / default / 64 MiB: same parameters as DDP, bit for bit");
    const size_t caps[4][2] = {{256, 256}, {256, 4096}, {1 << 20, 4 << 20}, {64 << 20, 64 << 20}};
    dtz_spec specs[2] = {dtz_mk_spec(dtt_gpt2_cfg(), 2, 3), dtz_mk_spec(dtt_mlp_cfg(20, 32, 16, 5), 8, 3)};
    for (int si = 0; si < 2; si++) {
        const dtz_spec *s = &specs[si];
        dt_model *namer;
        T_OK(dt_model_create(&s->cfg, 1, &namer));
        dtz_result want;
        dtz_ddp_run(s, world, &want);
        for (int stage = 1; stage <= 3; stage++)
            for (int ci = 0; ci < 4; ci++) {
                /* interleaved stepping with the smallest buckets: many shards stepped during backward */
                dt_zero_opts o = dtz_opts(s, stage, ci == 0 ? DT_ZERO_OVERLAP_INTERLEAVED : DT_ZERO_OVERLAP_AFTER_BACKWARD);
                o.dp.first_bucket_bytes = caps[ci][0];
                o.dp.bucket_bytes = caps[ci][1];
                dtz_result got;
                dtz_zero_run(s, world, &o, &got);
                char what[160];
                snprintf(what, sizeof what, "%s, stage %d, buckets %zu/%zu B", si ? "mlp" : "gpt2", stage, caps[ci][0],
                         caps[ci][1]);
                dtz_expect_params(namer, got.params, want.params, 0, what);
                dtz_result_free(&got);
            }
        dtz_result_free(&want);
        dt_model_free(namer);
    }
    t_end();
}

/* lo <= x <= hi with hi = want * 1.01 + slack */
static void expect_about(size_t x, double want, double slack, const char *what) {
    if ((double)x >= want && (double)x <= want * 1.01 + slack) return;
    fprintf(stderr, "rank %d: %s: %zu bytes, expected %.0f .. %.0f\n", t_rank(), what, x, want,
            want * 1.01 + slack);
    t_fail(__FILE__, __LINE__, what);
}

static void check_memory(const dt_model_cfg *c, const dt_optim_cfg *oc) {
    int me = t_rank(), N = t_size();
    dtz_spec s = dtz_mk_spec(*c, 4, 2);
    s.oc = *oc;
    const double states = (double)dt_optim_state_per_elem(oc);
    for (int stage = 1; stage <= 3; stage++) {
        dt_zero_opts o = dtz_opts(&s, stage, DT_ZERO_OVERLAP_AFTER_BACKWARD);
        dtz_net n;
        dtz_net_init(&n, &s, 1, world, &o);
        const double P = (double)dtz_param_count(n.m);
        /* padding: less than N elements per bucket for the split, plus alignment; bounded by 64 per rank per bucket */
        const double slack = 4.0 * 64.0 * (double)dt_zero_num_buckets(n.z) * (states + 1);
        const double full = 4.0 * P, part = 4.0 * P / N;
        for (int st = 0; st < 2; st++) {
            dt_zero_memory mem = dt_zero_get_memory(n.z);
            char what[128];
            snprintf(what, sizeof what, "stage %d (%s) after %d steps: optimizer state", stage,
                     oc->kind == DT_OPTIM_ADAMW ? "AdamW" : "SGD", st);
            expect_about(mem.optim_bytes, states * part, slack, what);
            snprintf(what, sizeof what, "stage %d after %d steps: gradients", stage, st);
            expect_about(mem.grad_bytes, stage >= 2 ? part : full, stage >= 2 ? slack : N * slack, what);
            snprintf(what, sizeof what, "stage %d after %d steps: parameters", stage, st);
            expect_about(mem.param_bytes, stage >= 3 ? part : full, stage >= 3 ? slack : N * slack, what);
            size_t layout_bytes = dtz_layout_len(n.z) * sizeof(float);
            T_CHECK(mem.grad_window_peak <= layout_bytes && mem.param_window_peak <= layout_bytes);
            if (st > 0 && stage >= 2) T_CHECK(mem.grad_window_peak > 0);     /* full buckets existed in backward */
            if (st > 0 && stage == 3) T_CHECK(mem.param_window_peak > 0);    /* and gathered parameters */
            if (stage < 3) T_CHECK(mem.param_window_peak == 0);
            dtt_batch b;
            dtt_make_batch(c, dtt_key(st, me, 0), 4, &b);
            dtz_step(&n, 1e-2f, &b, 1, NULL);
            dtt_batch_free(&b);
        }
        dtz_net_free(&n);
    }
}

static void test_memory(void) {
    t_begin("memory: optimizer state 1/N (stage >= 1), gradients 1/N (>= 2), parameters 1/N (3)");
    dt_model_cfg mlp = dtt_mlp_cfg(64, 256, 256, 10);
    dt_optim_cfg adam = dtt_adamw(1e-2f, 0.01f);
    dt_optim_cfg sgd = dt_optim_cfg_default(DT_OPTIM_SGD);
    sgd.momentum = 0.9f;
    check_memory(&mlp, &adam);
    check_memory(&mlp, &sgd);
    dt_model_cfg gpt = dtt_gpt2_cfg();
    gpt.n_embd = 64;
    gpt.n_head = 4;
    gpt.vocab = 128;
    check_memory(&gpt, &adam);
    t_end();
}

/* 32 -> 8 x 128 -> 10: nine layers, one 128x128-float bucket cap each */
static dt_model_cfg deep_mlp_cfg(void) {
    dt_model_cfg c = dtt_mlp_cfg(32, 128, 128, 10);
    c.mlp_n_hidden = 8;
    for (int i = 0; i < 8; i++) c.mlp_hidden[i] = 128;
    return c;
}

/* Two steps of the deep MLP with a bucket per layer on group pg; the memory
 * figures afterwards and the layout length in bytes. */
static dt_zero_memory deep_mlp_two_steps(const dtz_spec *s, dt_pg *pg, dt_zero_opts o, size_t *layout_bytes) {
    o.dp.first_bucket_bytes = o.dp.bucket_bytes = 128 * 128 * sizeof(float);
    dtz_net n;
    dtz_net_init(&n, s, 1, pg, &o);
    T_CHECK(dt_zero_num_buckets(n.z) >= 8);
    for (int st = 0; st < 2; st++) {
        dtt_batch b;
        dtt_make_batch(&s->cfg, dtt_key(st, t_rank(), 0), 4, &b);
        dtz_step(&n, 1e-2f, &b, 1, NULL);
        dtt_batch_free(&b);
    }
    dt_zero_memory mem = dt_zero_get_memory(n.z);
    *layout_bytes = dtz_layout_len(n.z) * sizeof(float);
    dtz_net_free(&n);
    return mem;
}

/* Stage 3 on a deep MLP with a bucket per layer: at no time are more than a
 * few modules' parameters gathered. */
static void test_stage3_window(void) {
    t_begin("stage 3: gathered parameters stay a window of modules (deep MLP)");
    int me = t_rank();
    dtz_spec s = dtz_mk_spec(deep_mlp_cfg(), 4, 2);
    for (int pf = 0; pf <= 1; pf++) {
        dt_zero_opts o = dtz_opts(&s, 3, DT_ZERO_OVERLAP_AFTER_BACKWARD);
        o.prefetch = pf;
        size_t layout_bytes;
        dt_zero_memory mem = deep_mlp_two_steps(&s, world, o, &layout_bytes);
        if (getenv("DTT_VERBOSE") && me == 0)
            printf("  prefetch %d: param window peak %zu of %zu bytes\n", pf, mem.param_window_peak, layout_bytes);
        T_CHECK(mem.param_window_peak >= 128 * 128 * sizeof(float));   /* one hidden layer at least */
        T_CHECK(mem.param_window_peak * 10 <= layout_bytes * 6);         /* 9 modules: never most of them */
    }
    t_end();
}

/* Stages 2/3: a bucket's full-size gradient lives only until its
 * reduce-scatter has finished, in every overlap mode. Each rank runs alone in
 * its own one-rank group, where a reduce-scatter completes at once: the
 * buffers are released as backward proceeds, so at most a few buckets (a
 * layer's weight and bias) are alive together, never most of the model. */
static void test_grad_window(void) {
    t_begin("stages 2/3: full gradient buckets released as their reductions finish (deep MLP)");
    int me = t_rank();
    dt_pg *solo;
    T_OK(dt_pg_split(world, me, 0, &solo));
    dtz_spec s = dtz_mk_spec(deep_mlp_cfg(), 4, 2);
    for (int stage = 2; stage <= 3; stage++)
        for (int ov = 0; ov <= 2; ov++) {
            size_t layout_bytes;
            dt_zero_memory mem = deep_mlp_two_steps(&s, solo, dtz_opts(&s, stage, (dt_zero_overlap)ov), &layout_bytes);
            if (getenv("DTT_VERBOSE") && me == 0)
                printf("  stage %d overlap %d: grad window peak %zu of %zu bytes\n", stage, ov, mem.grad_window_peak,
                       layout_bytes);
            T_CHECK(mem.grad_window_peak >= 128 * 128 * sizeof(float));   /* one hidden layer at least */
            T_CHECK(mem.grad_window_peak * 10 <= layout_bytes * 4);        /* 9 layers: never most of them */
        }
    dt_pg_free(solo);
    t_end();
}

/* AFTER_BACKWARD: the parameter all-gathers of a step are not all issued by
 * dt_zero_step; most start during the next forward (a few at a time, in the
 * order its modules need them). OFF and INTERLEAVED issue them at once. */
static void test_gather_queue(void) {
    t_begin("after-backward: parameter all-gathers queued and issued during the next forward");
    dt_model_cfg c = deep_mlp_cfg();
    int me = t_rank();
    dtz_spec s = dtz_mk_spec(c, 4, 2);
    for (int stage = 1; stage <= 2; stage++)
        for (int ov = 0; ov <= 2; ov++) {
            dt_zero_opts o = dtz_opts(&s, stage, (dt_zero_overlap)ov);
            o.dp.first_bucket_bytes = o.dp.bucket_bytes = 128 * 128 * sizeof(float);
            dtz_net n;
            dtz_net_init(&n, &s, 1, world, &o);
            int nb = dt_zero_num_buckets(n.z);
            T_CHECK(nb >= 8);
            dtt_batch b;
            dtt_make_batch(&c, dtt_key(0, me, 0), 4, &b);
            dtz_step(&n, 1e-2f, &b, 1, NULL);
            dt_zero_stats after_step = dt_zero_get_stats(n.z);
            dtz_fwd_bwd(&n, 1, &b.b, 1.0f);   /* the next forward waits every bucket */
            T_OK(dt_zero_finish_backward(n.z));
            T_OK(dt_zero_step(n.z, NULL));
            T_OK(dt_zero_sync_params(n.z));
            dtt_batch_free(&b);
            dt_zero_stats st = dt_zero_get_stats(n.z);
            if (ov == DT_ZERO_OVERLAP_AFTER_BACKWARD) {
                T_CHECK(after_step.deferred_gathers == 0);   /* none issued after the first step yet */
                T_CHECK(st.deferred_gathers >= 2 * (nb - 2)); /* all but a window, both steps */
            } else {
                T_CHECK(st.deferred_gathers == 0);
            }
            dtz_net_free(&n);
        }
    t_end();
}

int main(int argc, char **argv) {
    t_init(&argc, &argv);
    T_OK(dt_pg_world(&world));
    test_geometry();
    test_bucket_independence();
    test_memory();
    test_stage3_window();
    test_grad_window();
    test_gather_queue();
    T_OK(dt_dist_finalize());
    return 0;
}
