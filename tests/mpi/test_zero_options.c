/* ZeRO options:
 *  - dt_zero_opts_default gives the documented defaults; NULL options mean
 *    the defaults;
 *  - contradictory or out-of-range options are rejected by dt_zero_create
 *    with DT_EINVAL and a message naming the problem, identically on every
 *    rank, leaving *out NULL and the model untouched: stage 0 / 4 / -1,
 *    clip > 0 with INTERLEAVED, negative or NaN clip, an unknown overlap
 *    mode, negative prefetch;
 *  - after all those rejections the same model trains under ZeRO exactly
 *    like DDP (a rejected create changed nothing). */
#include "mpi_check.h"
#include "zero_testutil.h"

static dt_pg *world;

static void test_defaults(void) {
    t_begin("dt_zero_opts_default: documented defaults; NULL options = defaults");
    dt_zero_opts o;
    memset(&o, 0x5a, sizeof o);
    dt_zero_opts_default(&o);
    T_CHECK(o.stage == 1);
    T_CHECK(o.dp.first_bucket_bytes == (size_t)1 << 20 && o.dp.bucket_bytes == (size_t)4 << 20);
    T_CHECK(o.overlap_step == DT_ZERO_OVERLAP_AFTER_BACKWARD);
    T_CHECK(o.dp.find_unused_params == 0 && o.dp.broadcast_buffers == 1 && o.dp.deterministic == 0);
    T_CHECK(o.clip == 0.0f && o.prefetch == 2);
    dt_model_cfg c = dtt_mlp_cfg(20, 16, 12, 5);
    dt_model *m;
    T_OK(dt_model_create(&c, 1, &m));
    dt_optim_cfg oc = dtt_adamw(1e-2f, 0.01f);
    dt_zero *z = NULL;
    T_OK(dt_zero_create(m, world, &oc, NULL, &z));
    T_CHECK(z != NULL && dt_zero_stage(z) == 1 && dt_zero_num_buckets(z) == 1);
    T_CHECK(dt_zero_pg(z) == world && dt_zero_optim_step(z) == 0);
    const dt_optim_cfg *got = dt_zero_optim_cfg(z);
    T_CHECK(got && got->kind == DT_OPTIM_ADAMW && got->lr == oc.lr && got->weight_decay == oc.weight_decay);
    dt_zero_free(z);
    dt_model_free(m);
    t_end();
}

typedef struct bad_case {
    const char *name;
    void (*set)(dt_zero_opts *o);
    const char *words[2];   /* must appear in the message */
} bad_case;

static void set_stage0(dt_zero_opts *o) { o->stage = 0; }
static void set_stage4(dt_zero_opts *o) { o->stage = 4; }
static void set_stage_neg(dt_zero_opts *o) { o->stage = -1; }
static void set_clip_interleaved(dt_zero_opts *o) { o->clip = 1.0f; o->overlap_step = DT_ZERO_OVERLAP_INTERLEAVED; }
static void set_clip_neg(dt_zero_opts *o) { o->clip = -1.0f; }
static void set_clip_nan(dt_zero_opts *o) { o->clip = NAN; }
static void set_overlap_bad(dt_zero_opts *o) { o->overlap_step = (dt_zero_overlap)7; }
static void set_prefetch_neg(dt_zero_opts *o) { o->stage = 3; o->prefetch = -1; }

static void test_rejected(void) {
    t_begin("contradictory options: DT_EINVAL with a clear message on every rank, model untouched");
    static const bad_case cases[] = {
        {"stage 0", set_stage0, {"stage", "0"}},
        {"stage 4", set_stage4, {"stage", "4"}},
        {"stage -1", set_stage_neg, {"stage", "-1"}},
        {"clip with interleaved", set_clip_interleaved, {"clip", "nterleav"}},
        {"negative clip", set_clip_neg, {"clip", NULL}},
        {"NaN clip", set_clip_nan, {"clip", NULL}},
        {"unknown overlap mode", set_overlap_bad, {"overlap", "7"}},
        {"negative prefetch", set_prefetch_neg, {"prefetch", NULL}},
    };
    dtz_spec s = dtz_mk_spec(dtt_mlp_cfg(20, 16, 12, 5), 8, 3);
    dt_model *m;
    T_OK(dt_model_create(&s.cfg, 1 + (uint64_t)t_rank(), &m));
    float *before = dtz_params(m, NULL);
    size_t np = dtz_param_count(m), flat = m->param_flat.numel;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        dt_zero_opts o = dtz_opts(&s, 1, DT_ZERO_OVERLAP_AFTER_BACKWARD);
        cases[i].set(&o);
        dt_zero *z = (dt_zero *)m;   /* garbage that must become NULL */
        dt_error_clear();
        dt_status rc = dt_zero_create(m, world, &s.oc, &o, &z);
        int bad = rc != DT_EINVAL, any = 0;
        MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
        if (any) fprintf(stderr, "rank %d: case '%s': status %s\n", t_rank(), cases[i].name, dt_status_name(rc));
        T_CHECK(any == 0);
        T_CHECK(z == NULL);
        const char *msg = dt_error_message();
        for (int w = 0; w < 2; w++)
            if (cases[i].words[w] && !strstr(msg, cases[i].words[w])) {
                fprintf(stderr, "rank %d: case '%s': message \"%s\" lacks \"%s\"\n", t_rank(), cases[i].name, msg,
                        cases[i].words[w]);
                t_fail(__FILE__, __LINE__, cases[i].name);
            }
        /* nothing changed: same layout, same (rank-local) parameters */
        T_CHECK(m->param_flat.numel == flat && m->grad_flat.data != NULL);
        float *now = dtz_params(m, NULL);
        T_BITWISE(now, before, np, "parameters after a rejected create");
        free(now);
        for (int k = 0; k < m->n_params; k++)
            T_CHECK(m->params[k]->on_grad_ready == NULL && m->params[k]->value.data != NULL);
    }
    free(before);
    dt_model_free(m);
    t_end();
}

/* A model that went through rejected creates still trains like DDP. */
static void test_usable_after_rejection(void) {
    t_begin("after rejected creates the model trains under ZeRO exactly like DDP");
    dtz_spec s = dtz_mk_spec(dtt_mlp_cfg(20, 16, 12, 5), 8, 3);
    int me = t_rank();
    dtz_result want;
    dtz_ddp_run(&s, world, &want);
    for (int stage = 1; stage <= 3; stage++) {
        dt_model *m;
        T_OK(dt_model_create(&s.cfg, 1 + (uint64_t)me, &m));
        dt_graph *g = dt_graph_create();
        dt_zero *z = NULL;
        dt_zero_opts o = dtz_opts(&s, 4, DT_ZERO_OVERLAP_AFTER_BACKWARD);
        T_CHECK(dt_zero_create(m, world, &s.oc, &o, &z) == DT_EINVAL);
        o = dtz_opts(&s, stage, DT_ZERO_OVERLAP_INTERLEAVED);
        o.clip = 2.0f;
        T_CHECK(dt_zero_create(m, world, &s.oc, &o, &z) == DT_EINVAL);
        o.clip = 0;
        dtz_net n = {m, g, NULL};
        T_OK(dt_zero_create(m, world, &s.oc, &o, &n.z));
        for (int st = 0; st < s.steps; st++) {
            dtt_batch b;
            dtt_make_batch(&s.cfg, dtt_key(st, me, 0), s.B, &b);
            dtz_step(&n, dtz_lr(&s, st), &b, 1, NULL);
            dtt_batch_free(&b);
        }
        float *lay = dtz_gather_layout(n.z);
        float *p = dtz_params(m, lay);
        char what[96];
        snprintf(what, sizeof what, "stage %d after rejected creates: ZeRO vs DDP", stage);
        dtz_expect_params(m, p, want.params, 0, what);
        free(p);
        free(lay);
        dtz_net_free(&n);
    }
    dtz_result_free(&want);
    t_end();
}

int main(int argc, char **argv) {
    t_init(&argc, &argv);
    T_OK(dt_pg_world(&world));
    test_defaults();
    test_rejected();
    test_usable_after_rejection();
    T_OK(dt_dist_finalize());
    return 0;
}
