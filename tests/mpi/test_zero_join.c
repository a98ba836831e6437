/* ZeRO stages 1/2 with join (uneven inputs) equal DDP with join.
 *
 * Rank r has r + 2 optimizer steps of data, trains on them, then calls
 * dt_zero_join (resp. dt_ddp_join). The oracle is DDP + join on the same
 * model, data and per-step learning rate (which changes every step, so a
 * joined rank stepping its shard at a stale LR shows): parameters bitwise
 * (N = 2, or deterministic reductions at N = 4), in every overlap mode, with
 * micro-steps, with find_unused_params on (the last rank leaves a bias
 * unused, so in the last step no active rank uses it: the joined rank that
 * owns it must not step it) and off. With BatchNorm (the CNN) the buffers
 * after the run equal DDP's and the last rank's own statistics (it trains
 * longest). Stage 3 and SyncBatchNorm are refused with join. */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "mpi_check.h"
#include "zero_testutil.h"

static dt_pg *world;

typedef struct jcase {
    const char *name;
    dt_model_cfg cfg;
    int stage;
    dt_zero_overlap ov;
    int K;
    int64_t B;
    int find_unused;   /* and the last rank skips layer 1's bias */
    float clip;        /* > 0: compared with a tolerance (the norm is summed in another order) */
} jcase;

static int steps_of(int rank) { return rank + 2; }
static float lr_of(int st) { return 1e-2f * (1.0f - 0.125f * (float)(st % 4)); }

static void set_skip(const jcase *c, int rank) {
    dtt_skip_layer = c->find_unused && rank == t_size() - 1 ? 1 : -1;
}

static void make_micro(const jcase *c, int st, int rank, dtt_batch *mb) {
    for (int k = 0; k < c->K; k++) dtt_make_batch(&c->cfg, dtt_key(st, rank, k), c->B, &mb[k]);
}

/* Oracle: DDP + join; every rank ends with the last joiner's parameters. */
static void ddp_join_run(const jcase *c, dtz_result *out) {
    int me = t_rank(), N = t_size();
    dt_optim_cfg oc = dtt_adamw(1e-2f, 0.01f);
    dtt_net n;
    dtt_net_init(&n, &c->cfg, 1 + (uint64_t)me, &oc);
    if (c->find_unused) n.m->forward = dtt_mlp_forward_skip_bias;
    dt_ddp_opts o;
    dt_ddp_opts_default(&o);
    o.dp.join = 1;
    o.dp.deterministic = N > 2;
    o.dp.find_unused_params = c->find_unused;
    dt_ddp *d;
    T_OK(dt_ddp_create(n.m, world, &o, &d));
    size_t ne = n.m->param_flat.numel;
    for (int st = 0; st < steps_of(me); st++) {
        dtt_batch mb[4];
        make_micro(c, st, me, mb);
        set_skip(c, me);
        for (int k = 0; k < c->K; k++) dtt_fwd_bwd(&n, d, k == c->K - 1, &mb[k].b, 1.0f / (float)c->K, NULL);
        T_OK(dt_ddp_finish_backward(d));
        float scale = c->clip > 0 ? dt_clip_scale(sqrt(dt_sumsq(n.m->grad_flat.data, ne)), c->clip) : 1.0f;
        T_OK(dt_optimizer_step_range(&n.opt, lr_of(st), n.m->param_flat.data, n.m->grad_flat.data, 0, ne, scale));
        dt_optimizer_finish_step(&n.opt);
        dt_model_zero_grad(n.m);
        for (int k = 0; k < c->K; k++) dtt_batch_free(&mb[k]);
    }
    T_OK(dt_ddp_join(d));
    dtt_skip_layer = -1;
    out->params = dtz_params(n.m, NULL);
    out->n_params = dtz_param_count(n.m);
    out->buffers = dtz_buffers(n.m, &out->n_buffers);
    dt_ddp_free(d);
    dtt_net_free(&n);
}

static dt_zero_opts join_opts(const jcase *c) {
    dt_zero_opts o;
    dt_zero_opts_default(&o);
    o.stage = c->stage;
    o.overlap_step = c->ov;
    o.dp.join = 1;
    o.dp.deterministic = t_size() > 2;
    o.dp.find_unused_params = c->find_unused;
    o.clip = c->clip;
    o.dp.first_bucket_bytes = 512;   /* several buckets, so every rank owns shards of each */
    o.dp.bucket_bytes = 2048;
    return o;
}

/* ZeRO + join. own_buffers (may be NULL): on the last rank, the statistics a
 * plain copy of the model computes from the last rank's batches alone (it
 * takes the ZeRO model's parameters and buffers before its first step and
 * the parameters before each later one). */
static void zero_join_run(const jcase *c, dtz_result *out, float **own_buffers) {
    int me = t_rank(), last = t_size() - 1;
    dtz_spec s = dtz_mk_spec(c->cfg, c->B, 1);
    if (c->find_unused) s.forward = dtt_mlp_forward_skip_bias;
    dt_zero_opts o = join_opts(c);
    dtz_net n;
    dtz_net_init(&n, &s, 1 + (uint64_t)me, world, &o);
    T_CHECK(dt_zero_num_buckets(n.z) > 1);
    dtt_net x = {0};
    if (own_buffers) {
        dtt_net_init(&x, &c->cfg, 1, &s.oc);
        for (int i = 0; i < n.m->n_buffers; i++)   /* the common start: rank 0's, broadcast at create */
            memcpy(dt_f32(&x.m->buffers[i]->value), dt_f32(&n.m->buffers[i]->value),
                   (size_t)n.m->buffers[i]->value.numel * sizeof(float));
    }
    for (int st = 0; st < steps_of(me); st++) {
        dtt_batch mb[4];
        make_micro(c, st, me, mb);
        set_skip(c, me);
        if (own_buffers && me == last) {
            T_OK(dt_zero_sync_params(n.z));   /* the parameters of this step's forward */
            for (int i = 0; i < n.m->n_params; i++)
                memcpy(x.m->params[i]->value.data, n.m->params[i]->value.data,
                       (size_t)n.m->params[i]->value.numel * sizeof(float));
            for (int k = 0; k < c->K; k++) dtt_fwd_bwd(&x, NULL, 1, &mb[k].b, 1.0f, NULL);
            dt_model_zero_grad(x.m);
        }
        dtz_step(&n, lr_of(st), mb, c->K, NULL);
        for (int k = 0; k < c->K; k++) dtt_batch_free(&mb[k]);
    }
    T_OK(dt_zero_join(n.z));
    dtt_skip_layer = -1;
    T_CHECK(dt_zero_optim_step(n.z) == steps_of(last));   /* joined ranks stepped their shards too */
    T_OK(dt_zero_sync_params(n.z));
    out->params = dtz_params(n.m, NULL);
    out->n_params = dtz_param_count(n.m);
    out->buffers = dtz_buffers(n.m, &out->n_buffers);
    /* a second join at once: everyone is done already */
    T_OK(dt_zero_join(n.z));
    if (own_buffers) {
        size_t nb;
        *own_buffers = dtz_buffers(x.m, &nb);
        T_CHECK(nb == out->n_buffers);
        dtt_net_free(&x);
    }
    dtz_net_free(&n);
}

static void run_case(const jcase *c, int check_own_buffers) {
    int last = t_size() - 1;
    char what[256];
    dtz_result want, got;
    ddp_join_run(c, &want);
    float *own = NULL;
    zero_join_run(c, &got, check_own_buffers ? &own : NULL);
    T_CHECK(got.n_params == want.n_params && got.n_buffers == want.n_buffers);
    snprintf(what, sizeof what, "%s: parameters across ranks", c->name);
    T_SAME_ON_RANKS(got.params, got.n_params, what);
    snprintf(what, sizeof what, "%s: ZeRO + join vs DDP + join", c->name);
    dt_model *m;
    T_OK(dt_model_create(&c->cfg, 1, &m));
    dtz_expect_params(m, got.params, want.params, c->clip > 0 ? 1e-5 : 0, what);
    dt_model_free(m);
    if (got.n_buffers) {
        snprintf(what, sizeof what, "%s: buffers across ranks", c->name);
        T_SAME_ON_RANKS(got.buffers, got.n_buffers, what);
        snprintf(what, sizeof what, "%s: buffers vs DDP + join", c->name);
        T_BITWISE(got.buffers, want.buffers, got.n_buffers, what);
    }
    if (own) {
        MPI_Bcast(own, (int)got.n_buffers, MPI_FLOAT, last, MPI_COMM_WORLD);
        snprintf(what, sizeof what, "%s: buffers vs the last rank's own statistics", c->name);
        T_BITWISE(got.buffers, own, got.n_buffers, what);
        free(own);
    }
    dtz_result_free(&want);
    dtz_result_free(&got);
}

static void test_join_equals_ddp(void) {
    t_begin("zero join: stages 1/2, uneven steps per rank, equal DDP join");
    dt_model_cfg mlp = dtt_mlp_cfg(20, 16, 12, 5);
    const jcase cases[] = {
        {"stage 1, after-backward", mlp, 1, DT_ZERO_OVERLAP_AFTER_BACKWARD, 1, 8, 0, 0},
        {"stage 2, after-backward, 2 micro-steps", mlp, 2, DT_ZERO_OVERLAP_AFTER_BACKWARD, 2, 4, 0, 0},
        {"stage 1, interleaved, find_unused", mlp, 1, DT_ZERO_OVERLAP_INTERLEAVED, 1, 8, 1, 0},
        {"stage 2, off, find_unused", mlp, 2, DT_ZERO_OVERLAP_OFF, 1, 8, 1, 0},
        {"stage 2, interleaved, 2 micro-steps, find_unused", mlp, 2, DT_ZERO_OVERLAP_INTERLEAVED, 2, 4, 1, 0},
        {"stage 1, after-backward, find_unused, 2 micro-steps", mlp, 1, DT_ZERO_OVERLAP_AFTER_BACKWARD, 2, 4, 1, 0},
        {"stage 2, after-backward, clip", mlp, 2, DT_ZERO_OVERLAP_AFTER_BACKWARD, 1, 8, 0, 0.05f},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(&cases[i], 0);
    t_end();
}

static void test_join_buffers(void) {
    t_begin("zero join: BatchNorm buffers come from the last rank with data");
    dt_model_cfg cnn = dtt_cnn_cfg();
    const jcase cases[] = {
        {"cnn, stage 1, after-backward", cnn, 1, DT_ZERO_OVERLAP_AFTER_BACKWARD, 1, 3, 0, 0},
        {"cnn, stage 2, off", cnn, 2, DT_ZERO_OVERLAP_OFF, 1, 3, 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(&cases[i], 1);
    t_end();
}

static void test_join_misuse(void) {
    t_begin("zero join: needs opts.join; stage 3 and SyncBatchNorm refused");
    dtz_spec s = dtz_mk_spec(dtt_mlp_cfg(20, 16, 0, 5), 4, 1);
    dt_model *m;
    T_OK(dt_model_create(&s.cfg, 1, &m));
    dt_zero_opts o;
    dt_zero_opts_default(&o);
    dt_zero *z;
    T_OK(dt_zero_create(m, world, &s.oc, &o, &z));
    dt_error_clear();
    T_CHECK(dt_zero_join(z) == DT_ESTATE && strstr(dt_error_message(), "join"));
    dt_zero_free(z);
    o.dp.join = 1;
    o.stage = 3;
    static char sentinel;
    z = (dt_zero *)(void *)&sentinel;   /* reset to NULL on failure */
    dt_error_clear();
    T_CHECK(dt_zero_create(m, world, &s.oc, &o, &z) == DT_EINVAL && z == NULL);
    T_CHECK(strstr(dt_error_message(), "join") && strstr(dt_error_message(), "stage"));
    o.stage = 2;
    o.dp.sync_bn = 1;
    dt_error_clear();
    T_CHECK(dt_zero_create(m, world, &s.oc, &o, &z) == DT_EINVAL && z == NULL);
    T_CHECK(strstr(dt_error_message(), "join") && strstr(dt_error_message(), "SyncBatchNorm"));
    dt_model_free(m);
    t_end();
}

int main(int argc, char **argv) {
    t_init(&argc, &argv);
    T_OK(dt_pg_world(&world));
    test_join_equals_ddp();
    test_join_buffers();
    test_join_misuse();
    T_OK(dt_pg_free(world));
    T_OK(dt_dist_finalize());
    return 0;
}
