/* DDP static_graph. The model: an MLP 16-16-16-16 (fc1, fc2, fc3 all 16x16)
 * whose forward runs the layers in reverse registration order, fc3 -> fc2 ->
 * fc1. The layout is reverse registration (fc3 first), so bucket 0 (fc3,
 * one layer per bucket under the caps below) gets its gradients last in
 * backward, and every bucket waits for it. Expected from the forward alone:
 * backward produces fc1's gradients first, then fc2's, then fc3's.
 *  - after iteration 1 with static_graph, bucket 0 holds fc1, bucket 1 fc2,
 *    bucket 2 fc3; without it bucket 0 holds fc3 for good;
 *  - launches (a logging comm hook) against module hooks: from iteration 2
 *    the first bucket launches before backward reaches fc3 (its
 *    PRE_BACKWARD), which without static_graph it never can;
 *  - parameters bitwise equal to the same training without static_graph
 *    (deterministic reductions at N > 2), with node-shared memory and without;
 *  - a rank running another layer order in iteration 1: finish_backward fails
 *    on every rank naming that rank. */
#include "mpi_check.h"
#include "ddp_testutil.h"
#include "parallel/common/common_internal.h"

static dt_pg *world;
static int forward_in_order;   /* 1: fc1 -> fc2 -> fc3 (registration order) */

static dt_model_cfg cfg(void) { return dtt_mlp_cfg(16, 16, 16, 16); }

static dt_tensor *reverse_forward(dt_model *m, dt_graph *g, const dt_batch *b, dt_tensor **logits) {
    int64_t shape[2] = {b->B, 16};
    dt_tensor *x = dt_graph_tensor(g, 2, shape);
    const dt_tensor *img = dt_batch_input(b, "image", DT_F32, "reverse_forward");
    if (!x || !img) return NULL;
    x->data = img->data;
    for (int j = 0; j < 3; j++) {
        dt_module *mod = m->modules[forward_in_order ? j : 2 - j];
        if (dt_module_enter(g, mod) != DT_OK) return NULL;
        if (!(x = dt_op_linear(g, x, &mod->params[0]->value, &mod->params[1]->value, DT_W_OUT_IN))) return NULL;
        if (j < 2 && !(x = dt_op_relu(g, x))) return NULL;
        if (dt_module_leave(g, mod) != DT_OK) return NULL;
    }
    if (logits) *logits = x;
    return dt_op_cross_entropy(g, x, b->y);
}

static void net(dtt_net *n, uint64_t seed) {
    dt_model_cfg c = cfg();
    dt_optim_cfg oc = dtt_adamw(1e-2f, 0.01f);
    dtt_net_init(n, &c, seed, &oc);
    n->m->forward = reverse_forward;
}

static dt_ddp_opts opts(int static_graph, dt_dp_shm shm) {
    dt_ddp_opts o;
    dt_ddp_opts_default(&o);
    o.dp.first_bucket_bytes = o.dp.bucket_bytes = 1100;   /* one layer (1024 + 64 B) per bucket */
    o.static_graph = static_graph;
    o.dp.deterministic = dt_pg_size(world) > 2;
    o.dp.shm = shm;
    return o;
}

/* The layer ("fc1".."fc3") every parameter of bucket i belongs to, or NULL if mixed. */
static const char *bucket_layer(const dt_ddp *d, const dt_model *m, int i) {
    const dt_ddp_bucket *b = dt_ddp_bucket_at(d, i);
    static char layer[8];
    if (!b || b->n_params < 1) return NULL;
    snprintf(layer, sizeof layer, "%.3s", m->params[b->params[0]]->name);
    for (int k = 1; k < b->n_params; k++)
        if (strncmp(m->params[b->params[k]]->name, layer, 3) != 0) return NULL;
    return layer;
}

static void train(dtt_net *n, dt_ddp *d, int steps) {
    dt_model_cfg c = cfg();
    for (int st = 0; st < steps; st++) {
        dtt_batch b;
        dtt_make_batch(&c, dtt_key(st, dt_pg_rank(world), 0), 8, &b);
        dtt_ddp_step(n, d, &b, 1);
        dtt_batch_free(&b);
    }
}

static void test_bucket_order(void) {
    t_begin("static_graph: buckets cut again in backward order after iteration 1");
    for (int sg = 0; sg < 2; sg++) {
        dtt_net n;
        net(&n, 3);
        dt_ddp_opts o = opts(sg, DT_DP_SHM_AUTO);
        dt_ddp *d;
        T_OK(dt_ddp_create(n.m, world, &o, &d));
        T_CHECK(dt_ddp_num_buckets(d) == 3);
        T_CHECK(strcmp(bucket_layer(d, n.m, 0), "fc3") == 0);   /* layout order before any backward */
        train(&n, d, 1);
        T_CHECK(dt_ddp_num_buckets(d) == 3);
        T_CHECK(dt_ddp_buckets_rebuilt(d) == sg);
        const char *want[2][3] = {{"fc3", "fc2", "fc1"}, {"fc1", "fc2", "fc3"}};
        for (int i = 0; i < 3; i++) {
            const char *l = bucket_layer(d, n.m, i);
            T_CHECK(l != NULL && strcmp(l, want[sg][i]) == 0);
            T_CHECK(dt_ddp_bucket_at(d, i)->staged == sg);
        }
        train(&n, d, 2);   /* stays cut so */
        T_CHECK(strcmp(bucket_layer(d, n.m, 0), want[sg][0]) == 0);
        dt_ddp_free(d);
        dtt_net_free(&n);
    }
    t_end();
}

/* ---- launch order against backward progress ---- */
enum { EV_LAUNCH = 100 };
static int events[256], n_events;
static void log_event(int e) { if (n_events < 256) events[n_events++] = e; }

static dt_status log_launch(void *state, dt_pg *pg, dt_ddp_bucket *b, dt_work **w) {
    (void)state;
    log_event(EV_LAUNCH + b->index);
    return dt_allreduce(pg, b->grad, b->grad, (int64_t)b->numel, DT_F32, DT_RED_AVG, w);
}

static dt_status module_log(dt_module *mod, dt_module_hook_kind kind, void *user) {
    (void)user;
    if (kind == DT_HOOK_PRE_BACKWARD) log_event(mod->name[2] - '0');   /* 1..3: backward reached fcN */
    return DT_OK;
}

/* Position of the first launch and of fc3's PRE_BACKWARD in the log. */
static void first_launch_vs_fc3(int *launch, int *fc3) {
    *launch = *fc3 = -1;
    for (int i = 0; i < n_events; i++) {
        if (*launch < 0 && events[i] >= EV_LAUNCH) *launch = i;
        if (*fc3 < 0 && events[i] == 3) *fc3 = i;
    }
}

static void test_launch_order(void) {
    t_begin("static_graph: from iteration 2 the first bucket launches before backward reaches fc3");
    dt_ddp_comm_hook hook = {log_launch, NULL, NULL};
    for (int sg = 0; sg < 2; sg++) {
        dtt_net n;
        net(&n, 4);
        for (int i = 0; i < n.m->n_modules; i++) { n.m->modules[i]->hook = module_log; n.m->modules[i]->hook_user = NULL; }
        dt_ddp_opts o = opts(sg, DT_DP_SHM_OFF);
        o.dp.deterministic = 0;
        o.hook = &hook;
        dt_ddp *d;
        T_OK(dt_ddp_create(n.m, world, &o, &d));
        for (int st = 0; st < 3; st++) {
            n_events = 0;
            train(&n, d, 1);
            int launch, fc3;
            first_launch_vs_fc3(&launch, &fc3);
            T_CHECK(launch >= 0 && fc3 >= 0);
            if (sg && st > 0) T_CHECK(launch < fc3);   /* overlaps fc2's and fc3's backward */
            else T_CHECK(launch > fc3);                /* waits for fc3's gradients */
        }
        for (int i = 0; i < n.m->n_modules; i++) n.m->modules[i]->hook = NULL;
        dt_ddp_free(d);
        dtt_net_free(&n);
    }
    t_end();
}

static void test_bitwise(dt_dp_shm shm, const char *name) {
    t_begin(name);
    dtt_net a, b;
    net(&a, 5 + (uint64_t)dt_pg_rank(world));
    net(&b, 5 + (uint64_t)dt_pg_rank(world));
    dt_ddp_opts oa = opts(1, shm), ob = opts(0, shm);
    dt_ddp *da, *db;
    T_OK(dt_ddp_create(a.m, world, &oa, &da));
    T_OK(dt_ddp_create(b.m, world, &ob, &db));
    size_t ne = a.m->param_flat.numel;
    float *init = t_copy(a.m->param_flat.data, ne);
    dt_model_cfg c = cfg();
    for (int st = 0; st < 5; st++) {
        dtt_batch x;
        dtt_make_batch(&c, dtt_key(st, dt_pg_rank(world), 0), 8, &x);
        dtt_ddp_step(&a, da, &x, 1);
        dtt_ddp_step(&b, db, &x, 1);
        dtt_batch_free(&x);
        T_BITWISE(a.m->param_flat.data, b.m->param_flat.data, ne, "static_graph vs not, after a step");
    }
    T_CHECK(dt_ddp_buckets_rebuilt(da) == 1);
    T_CHECK(t_differs(a.m->param_flat.data, init, ne));
    T_SAME_ON_RANKS(a.m->param_flat.data, ne, "params across ranks");
    free(init);
    dt_ddp_free(da);
    dt_ddp_free(db);
    dtt_net_free(&a);
    dtt_net_free(&b);
    t_end();
}

static void test_mismatch(void) {
    t_begin("static_graph: another order on one rank fails on every rank, naming it");
    int me = dt_pg_rank(world), N = dt_pg_size(world);
    if (N < 2) { t_end(); return; }
    dtt_net n;
    net(&n, 6);
    dt_ddp_opts o = opts(1, DT_DP_SHM_AUTO);
    dt_ddp *d;
    T_OK(dt_ddp_create(n.m, world, &o, &d));
    dt_model_cfg c = cfg();
    dtt_batch b;
    dtt_make_batch(&c, dtt_key(0, me, 0), 8, &b);
    forward_in_order = me == N - 1;
    dtt_fwd_bwd(&n, d, 1, &b.b, 1.0f, NULL);
    forward_in_order = 0;
    dt_error_clear();
    T_CHECK(dt_ddp_finish_backward(d) == DT_EINVAL);
    char want[64];
    snprintf(want, sizeof want, "on rank %d than on rank 0", N - 1);
    T_CHECK(strstr(dt_error_message(), want) != NULL);
    T_CHECK(strstr(dt_error_message(), "static_graph") != NULL);
    T_CHECK(dt_ddp_buckets_rebuilt(d) == 0);
    dtt_batch_free(&b);
    dt_ddp_free(d);
    dtt_net_free(&n);
    t_end();
}

/* The strategies' configuration agreement covers static_graph and
 * params_to_ignore: a rank that differs is named before any collective. */
static void test_agreement(void) {
    t_begin("static_graph, params_to_ignore: in the configuration agreement");
    int me = dt_pg_rank(world), N = dt_pg_size(world);
    static const char *pats[2] = {"fc2.*", "fc3.*"};
    for (int which = 0; which < 2; which++) {
        dt_ddp_opts o;
        dt_ddp_opts_default(&o);
        int odd = me == N - 1;
        if (which == 0) o.static_graph = odd;
        else { o.params_to_ignore = pats + odd; o.n_params_to_ignore = 1; }
        dt_agree a;
        dt_agree_init(&a);
        dt_par_describe_ddp(&o, &a);
        T_EXPECT(dt_pg_agree(world, &a), DT_EINVAL);
        T_CHECK(strstr(dt_error_message(), which == 0 ? "ddp.static_graph" : "ddp.params_to_ignore[0]") != NULL);
        dt_agree_free(&a);
    }
    t_end();
}

int main(int argc, char **argv) {
    t_init(&argc, &argv);
    T_OK(dt_pg_world(&world));
    test_bucket_order();
    test_launch_order();
    test_bitwise(DT_DP_SHM_AUTO, "static_graph: bitwise as without (node-shared memory where available)");
    test_bitwise(DT_DP_SHM_OFF, "static_graph: bitwise as without (MPI collectives)");
    test_mismatch();
    test_agreement();
    T_OK(dt_dist_finalize());
    return 0;
}
