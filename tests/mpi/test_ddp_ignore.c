/* DDP params_to_ignore. An MLP 20-16-12-5 with "fc2.*" ignored, each rank's
 * model seeded differently (1 + rank), different data per rank.
 *
 * Reference (sound without DDP): N simulated ranks, each its own model copy
 * seeded like the DDP rank, whose non-ignored parameters start as simulated
 * rank 0's (what DDP's broadcast does) while fc2 keeps its own. Each step
 * every simulated rank computes its gradient on its own batch; the
 * non-ignored elements get the rank-ordered average ((g0 + g1) + ...) / N
 * (dist.h's AVG; deterministic at N > 2), fc2 keeps the rank's own
 * gradient; each copy steps its own AdamW. This rank's DDP model must equal
 * simulated rank `rank` bit for bit, everything included.
 * Also: fc2 differs between ranks after training while the rest is equal,
 * and a pattern matching nothing is an error naming it. */
#include "mpi_check.h"
#include "ddp_testutil.h"

static dt_pg *world;
static const char *ignore_fc2[] = {"fc2.*"};

static dt_model_cfg cfg(void) { return dtt_mlp_cfg(20, 16, 12, 5); }

static void net(dtt_net *n, uint64_t seed) {
    dt_model_cfg c = cfg();
    dt_optim_cfg oc = dtt_adamw(1e-2f, 0.01f);
    dtt_net_init(n, &c, seed, &oc);
}

static int is_fc2(const dt_param *p) { return strncmp(p->name, "fc2.", 4) == 0; }

/* fc2's elements of the flat buffer: 1, else 0. */
static unsigned char *fc2_mask(const dt_model *m) {
    unsigned char *mask = calloc(m->param_flat.numel, 1);
    T_CHECK(mask != NULL);
    for (int i = 0; i < m->n_params; i++)
        if (is_fc2(m->params[i])) memset(mask + m->offsets[i], 1, (size_t)m->params[i]->value.numel);
    return mask;
}

static void test_matches_reference(void) {
    t_begin("params_to_ignore: ignored fc2 per rank, the rest averaged: bitwise the simulated ranks");
    int me = dt_pg_rank(world), N = dt_pg_size(world);
    dtt_net n;
    net(&n, 1 + (uint64_t)me);
    dt_ddp_opts o;
    dt_ddp_opts_default(&o);
    o.dp.first_bucket_bytes = o.dp.bucket_bytes = 256;
    o.dp.deterministic = N > 2;
    o.params_to_ignore = ignore_fc2;
    o.n_params_to_ignore = 1;
    dt_ddp *d;
    T_OK(dt_ddp_create(n.m, world, &o, &d));
    for (int i = 0; i < dt_ddp_num_buckets(d); i++)
        for (int k = 0; k < dt_ddp_bucket_at(d, i)->n_params; k++)
            T_CHECK(!is_fc2(n.m->params[dt_ddp_bucket_at(d, i)->params[k]]));

    dtt_net *ref = calloc((size_t)N, sizeof *ref);
    T_CHECK(ref != NULL);
    unsigned char *mask = fc2_mask(n.m);
    size_t ne = n.m->param_flat.numel;
    for (int r = 0; r < N; r++) {
        net(&ref[r], 1 + (uint64_t)r);
        for (size_t e = 0; e < ne; e++)
            if (!mask[e]) ref[r].m->param_flat.data[e] = ref[0].m->param_flat.data[e];
    }
    T_BITWISE(n.m->param_flat.data, ref[me].m->param_flat.data, ne, "after create: rank 0's, fc2 own");
    float *g = malloc((size_t)N * ne * sizeof *g), *avg = malloc(ne * sizeof *avg);
    T_CHECK(g && avg);
    dt_model_cfg c = cfg();
    for (int st = 0; st < 4; st++) {
        dtt_batch *mb = calloc((size_t)N, sizeof *mb);
        for (int r = 0; r < N; r++) dtt_make_batch(&c, dtt_key(st, r, 0), 8, &mb[r]);
        dtt_ddp_step(&n, d, &mb[me], 1);
        for (int r = 0; r < N; r++) {
            dt_model_zero_grad(ref[r].m);
            dtt_fwd_bwd(&ref[r], NULL, 1, &mb[r].b, 1.0f, NULL);
            memcpy(g + (size_t)r * ne, ref[r].m->grad_flat.data, ne * sizeof *g);
        }
        for (size_t e = 0; e < ne; e++) {
            float s = g[e];
            for (int r = 1; r < N; r++) s += g[(size_t)r * ne + e];
            avg[e] = s / (float)N;
        }
        for (int r = 0; r < N; r++) {
            for (size_t e = 0; e < ne; e++)
                if (!mask[e]) ref[r].m->grad_flat.data[e] = avg[e];
            dtt_opt_step(&ref[r]);
        }
        for (int r = 0; r < N; r++) dtt_batch_free(&mb[r]);
        free(mb);
        T_BITWISE(n.m->param_flat.data, ref[me].m->param_flat.data, ne, "DDP vs simulated rank");
    }
    /* fc2 differs between ranks, everything else is the same */
    float *fc2 = malloc(ne * sizeof *fc2), *rest = malloc(ne * sizeof *rest);
    T_CHECK(fc2 && rest);
    size_t n2 = 0, nr = 0;
    for (size_t e = 0; e < ne; e++) {
        if (mask[e]) fc2[n2++] = n.m->param_flat.data[e];
        else rest[nr++] = n.m->param_flat.data[e];
    }
    T_SAME_ON_RANKS(rest, nr, "non-ignored parameters across ranks");
    float *fc2_0 = t_copy(fc2, n2);
    MPI_Bcast(fc2_0, (int)n2, MPI_FLOAT, 0, MPI_COMM_WORLD);
    if (me != 0) T_CHECK(t_differs(fc2, fc2_0, n2));
    free(fc2_0);
    free(fc2);
    free(rest);
    free(g);
    free(avg);
    free(mask);
    for (int r = 0; r < N; r++) dtt_net_free(&ref[r]);
    free(ref);
    dt_ddp_free(d);
    dtt_net_free(&n);
    t_end();
}

static void test_no_match(void) {
    t_begin("params_to_ignore: a pattern matching nothing is an error naming it");
    dtt_net n;
    net(&n, 1);
    const char *pats[] = {"fc1.weight", "nope.*"};
    dt_ddp_opts o;
    dt_ddp_opts_default(&o);
    o.params_to_ignore = pats;
    o.n_params_to_ignore = 2;
    dt_ddp *d = NULL;
    T_EXPECT(dt_ddp_create(n.m, world, &o, &d), DT_EINVAL);
    T_CHECK(d == NULL);
    T_CHECK(strstr(dt_error_message(), "'nope.*'") != NULL);
    o.n_params_to_ignore = 1;   /* the exact name alone is fine */
    T_OK(dt_ddp_create(n.m, world, &o, &d));
    dt_ddp_free(d);
    dtt_net_free(&n);
    t_end();
}

int main(int argc, char **argv) {
    t_init(&argc, &argv);
    T_OK(dt_pg_world(&world));
    test_matches_reference();
    test_no_match();
    T_OK(dt_dist_finalize());
    return 0;
}
