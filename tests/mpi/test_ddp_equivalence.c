/* DDP equivalence:
 *  - N-rank DDP == one process accumulating the same N per-rank micro-batches
 *    in rank order, bit for bit, after several AdamW steps (N = 2 always; any
 *    N in deterministic mode), for an MLP, a CNN (BatchNorm) and GPT-2 (tied
 *    embedding);
 *  - N-rank DDP ~ one process on the whole global batch (1e-5 relative);
 *  - bucket caps 64 KiB / 1 MiB / 25 MiB and overlap on/off give bit-identical
 *    results.
 * Each with the buckets in node-shared memory (the default on one machine;
 * rank-ordered, so bitwise at any N even without the deterministic mode) and
 * with MPI collectives (DT_DP_SHM_OFF).
 * ctest also runs it on simulated machines (DTRAIN_TEST_MACHINES, 2 x 2 and
 * 3 + 1): no shared memory then; the hierarchical collectives (dist.h
 * section 10) stay bitwise the reference in deterministic mode. */
#include "mpi_check.h"
#include "ddp_testutil.h"

static dt_pg *world;

static int one_machine(void) {
    dt_pg_topo t;
    dt_pg_topology(world, &t);
    return t.machines == 1;
}

typedef struct spec {
    dt_model_cfg cfg;
    dt_ddp_opts o;
    int steps, K;
    int64_t B;
    dt_optim_cfg oc;
} spec;

static spec mk_spec(dt_model_cfg c, int64_t B, int steps) {
    spec s = {.cfg = c, .steps = steps, .K = 1, .B = B, .oc = dtt_adamw(1e-2f, 0.01f)};
    dt_ddp_opts_default(&s.o);
    return s;
}

/* DDP on every rank; returns rank-local final parameters (and the n_buckets seen). */
static float *ddp_run(const spec *s, int *n_buckets, float *last_loss) {
    int me = dt_pg_rank(world);
    dtt_net n;
    dtt_net_init(&n, &s->cfg, 1 + (uint64_t)me, &s->oc);   /* rank 0's weights must win */
    dt_ddp *d;
    T_OK(dt_ddp_create(n.m, world, &s->o, &d));
    T_CHECK(dt_ddp_uses_shared_memory(d) == (s->o.dp.shm != DT_DP_SHM_OFF && dt_pg_size(world) > 1 && one_machine()));
    if (n_buckets) *n_buckets = dt_ddp_num_buckets(d);
    float loss = 0;
    for (int st = 0; st < s->steps; st++) {
        dtt_batch mb[8];
        for (int k = 0; k < s->K; k++) dtt_make_batch(&s->cfg, dtt_key(st, me, k), s->B, &mb[k]);
        loss = dtt_ddp_step(&n, d, mb, s->K);
        for (int k = 0; k < s->K; k++) dtt_batch_free(&mb[k]);
    }
    if (last_loss) *last_loss = loss;
    float *p = t_copy(n.m->param_flat.data, n.m->param_flat.numel);
    /* the model keeps its (averaged) gradients in private memory after the DDP is gone */
    float *g = t_copy(n.m->grad_flat.data, n.m->grad_flat.numel);
    dt_ddp_free(d);
    T_CHECK(!n.m->grad_flat.borrowed && (const float *)n.m->params[0]->grad.data >= n.m->grad_flat.data &&
              (const float *)n.m->params[0]->grad.data < n.m->grad_flat.data + n.m->grad_flat.numel);
    T_BITWISE(n.m->grad_flat.data, g, n.m->grad_flat.numel, "gradients after dt_ddp_free");
    free(g);
    dtt_net_free(&n);
    return p;
}

/* The single-process oracle on this rank. */
static float *ref_run(const spec *s, int N, float **init) {
    dtt_net r;
    dtt_net_init(&r, &s->cfg, 1, &s->oc);
    if (init) *init = t_copy(r.m->param_flat.data, r.m->param_flat.numel);
    for (int st = 0; st < s->steps; st++) {
        dtt_batch *mb = calloc((size_t)(N * s->K), sizeof *mb);
        for (int q = 0; q < N; q++)
            for (int k = 0; k < s->K; k++) dtt_make_batch(&s->cfg, dtt_key(st, q, k), s->B, &mb[q * s->K + k]);
        dtt_ref_step(&r, mb, N, s->K, NULL);
        for (int i = 0; i < N * s->K; i++) dtt_batch_free(&mb[i]);
        free(mb);
    }
    float *p = t_copy(r.m->param_flat.data, r.m->param_flat.numel);
    dtt_net_free(&r);
    return p;
}

static size_t n_elems(const dt_model_cfg *c) {
    dt_model *m;
    T_OK(dt_model_create(c, 1, &m));
    size_t n = m->param_flat.numel;
    dt_model_free(m);
    return n;
}

static void check_vs_reference(const char *name, spec s, int det, dt_dp_shm shm) {
    int N = dt_pg_size(world);
    s.o.dp.deterministic = det;
    if (shm == DT_DP_SHM_REQUIRE && !one_machine()) shm = DT_DP_SHM_AUTO;   /* none across machines */
    s.o.dp.shm = shm;
    size_t n = n_elems(&s.cfg);
    float loss;
    float *got = ddp_run(&s, NULL, &loss);
    float *init = NULL, *want = ref_run(&s, N, &init);
    char what[160];
    snprintf(what, sizeof what, "%s%s%s: DDP params vs single-process reference", name, det ? " (deterministic)" : "",
             shm == DT_DP_SHM_OFF ? " (MPI)" : " (shared memory)");
    T_CHECK(t_differs(want, init, n));   /* training moved the weights */
    T_SAME_ON_RANKS(got, n, what);
    if (N <= 2 || det || (shm != DT_DP_SHM_OFF && one_machine())) T_BITWISE(got, want, n, what);
    else T_NEAR(got, want, n, 1e-4, what);   /* MPI's summation order, amplified by AdamW */
    /* ranks really saw different data: their last local losses differ */
    float l0 = loss;
    MPI_Bcast(&l0, 1, MPI_FLOAT, 0, MPI_COMM_WORLD);
    if (t_rank() == 1) T_CHECK(l0 != loss);
    free(got); free(want); free(init);
}

static void test_bitwise_vs_reference(void) {
    t_begin("DDP == rank-ordered single-process accumulation (bitwise)");
    spec mlp = mk_spec(dtt_mlp_cfg(20, 16, 12, 5), 8, 4);
    spec cnn = mk_spec(dtt_cnn_cfg(), 3, 3);
    spec gpt = mk_spec(dtt_gpt2_cfg(), 2, 4);
    const dt_dp_shm shm[2] = {DT_DP_SHM_REQUIRE, DT_DP_SHM_OFF};
    for (int si = 0; si < 2; si++)
        for (int det = 0; det < 2; det++) {
            check_vs_reference("mlp 20-[16,12]-5", mlp, det, shm[si]);
            check_vs_reference("cnn", cnn, det, shm[si]);
            check_vs_reference("gpt2 tiny", gpt, det, shm[si]);
        }
    /* gradient accumulation inside each rank (K micro-steps) too */
    mlp.K = 3;
    check_vs_reference("mlp, 3 micro-steps", mlp, 1, DT_DP_SHM_OFF);
    check_vs_reference("mlp, 3 micro-steps", mlp, 0, DT_DP_SHM_AUTO);
    t_end();
}

/* DDP vs one process running the global batch (B*N rows) in one forward. */
static void check_global_batch(const char *name, const dt_model_cfg *c, int64_t B) {
    int me = dt_pg_rank(world), N = dt_pg_size(world);
    dt_optim_cfg oc = dtt_adamw(1e-2f, 0.01f);
    dtt_net n, g;
    dtt_net_init(&n, c, 7, &oc);
    dtt_net_init(&g, c, 7, &oc);
    dt_ddp *d;
    T_OK(dt_ddp_create(n.m, world, NULL, &d));
    size_t ne = n.m->param_flat.numel;
    for (int st = 0; st < 4; st++) {
        dtt_batch *parts = calloc((size_t)N, sizeof *parts), all;
        for (int q = 0; q < N; q++) dtt_make_batch(c, dtt_key(st, q, 0), B, &parts[q]);
        dtt_concat(c, parts, N, &all);
        float l = dtt_fwd_bwd(&n, d, 1, &parts[me].b, 1.0f, NULL);
        T_OK(dt_ddp_finish_backward(d));
        float lg = dtt_fwd_bwd(&g, NULL, 1, &all.b, 1.0f, NULL);
        float lsum = 0;
        MPI_Allreduce(&l, &lsum, 1, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        char what[160];
        snprintf(what, sizeof what, "%s step %d: mean of per-rank losses vs global-batch loss", name, st);
        float lavg = lsum / (float)N;
        T_NEAR(&lavg, &lg, 1, 1e-5, what);
        snprintf(what, sizeof what, "%s step %d: averaged gradient vs global-batch gradient", name, st);
        T_NEAR(n.m->grad_flat.data, g.m->grad_flat.data, ne, 1e-5, what);
        dtt_opt_step(&n);
        dtt_opt_step(&g);
        snprintf(what, sizeof what, "%s step %d: parameters vs global batch", name, st);
        T_NEAR(n.m->param_flat.data, g.m->param_flat.data, ne, 1e-5, what);
        for (int q = 0; q < N; q++) dtt_batch_free(&parts[q]);
        dtt_batch_free(&all);
        free(parts);
    }
    dt_ddp_free(d);
    dtt_net_free(&n);
    dtt_net_free(&g);
}

static void test_global_batch(void) {
    t_begin("DDP ~ one process on the global batch (1e-5 relative)");
    dt_model_cfg mlp = dtt_mlp_cfg(20, 16, 12, 5), gpt = dtt_gpt2_cfg();
    check_global_batch("mlp", &mlp, 8);
    check_global_batch("gpt2", &gpt, 2);
    t_end();
}

/* Buckets are contiguous, in layout order, cover the gradient buffer, and
 * respect the caps (a single larger parameter gets a bucket of its own). */
static void check_buckets(const dt_ddp *d, const dt_model *m, size_t first_cap, size_t cap) {
    int nb = dt_ddp_num_buckets(d);
    size_t pos = 0;
    for (int i = 0; i < nb; i++) {
        const dt_ddp_bucket *b = dt_ddp_bucket_at(d, i);
        T_CHECK(b && b->index == i && b->begin == pos && b->end > b->begin);
        T_CHECK(b->numel == b->end - b->begin && b->grad == m->grad_flat.data + b->begin);
        T_CHECK(b->numel * sizeof(float) <= (i == 0 ? first_cap : cap) || b->n_params == 1);
        pos = b->end;
    }
    T_CHECK(pos == m->grad_flat.numel);
    T_CHECK(dt_ddp_bucket_at(d, nb) == NULL);
}

static void test_bucket_caps(void) {
    t_begin("bucket caps 64 KiB / 1 MiB / 25 MiB x overlap on/off x shared memory/MPI: bit-identical");
    int N = dt_pg_size(world);
    spec s = mk_spec(dtt_mlp_cfg(64, 256, 256, 10), 8, 3);
    s.o.dp.deterministic = N > 2;
    size_t n = n_elems(&s.cfg);
    T_CHECK(n * sizeof(float) > 300 * 1024);
    float *want = ref_run(&s, N, NULL);
    const size_t caps[3] = {64 << 10, 1 << 20, 25 << 20};
    for (int ci = 0; ci < 3; ci++)
        for (int ov = 0; ov < 4; ov++) {   /* overlap on/off x shared memory/MPI */
            spec t = s;
            t.o.dp.first_bucket_bytes = t.o.dp.bucket_bytes = caps[ci];
            t.o.no_overlap = ov & 1;
            t.o.dp.shm = ov & 2 ? DT_DP_SHM_OFF : DT_DP_SHM_AUTO;
            /* bucket layout */
            dtt_net tmp;
            dtt_net_init(&tmp, &t.cfg, 1, &t.oc);
            dt_ddp *d;
            T_OK(dt_ddp_create(tmp.m, world, &t.o, &d));
            check_buckets(d, tmp.m, caps[ci], caps[ci]);
            if (ci == 0) T_CHECK(dt_ddp_num_buckets(d) > 1);
            else T_CHECK(dt_ddp_num_buckets(d) == 1);
            dt_ddp_free(d);
            dtt_net_free(&tmp);
            char what[128];
            snprintf(what, sizeof what, "cap %zu KiB, %s, %s", caps[ci] >> 10, ov & 1 ? "no overlap" : "overlap",
                     ov & 2 ? "MPI" : "shared memory");
            float *got = ddp_run(&t, NULL, NULL);
            T_BITWISE(got, want, n, what);
            free(got);
        }
    /* a small first bucket, then larger ones */
    spec t = s;
    t.o.dp.first_bucket_bytes = 16 << 10;
    t.o.dp.bucket_bytes = 128 << 10;
    dtt_net tmp;
    dtt_net_init(&tmp, &t.cfg, 1, &t.oc);
    dt_ddp *d;
    T_OK(dt_ddp_create(tmp.m, world, &t.o, &d));
    check_buckets(d, tmp.m, t.o.dp.first_bucket_bytes, t.o.dp.bucket_bytes);
    T_CHECK(dt_ddp_num_buckets(d) >= 3);
    dt_ddp_free(d);
    dtt_net_free(&tmp);
    float *got = ddp_run(&t, NULL, NULL);
    T_BITWISE(got, want, n, "first bucket 16 KiB, then 128 KiB");
    free(got);
    free(want);
    t_end();
}

int main(int argc, char **argv) {
    t_init(&argc, &argv);
    T_OK(dt_pg_world(&world));
    test_bitwise_vs_reference();
    test_global_batch();
    test_bucket_caps();
    T_OK(dt_dist_finalize());
    return 0;
}
