/* ZeRO checkpoints (dt_zero_save / dt_zero_load), every rank:
 *  - after a few steps (stage 2; stage 3 stepping during backward), a sharded
 *    set and a consolidated file hold the same tensors; the consolidated file
 *    passes the strict safetensors reader and matches the live parameters and
 *    owned optimizer state;
 *  - either one reloads into a fresh dt_zero at stage 1 and stage 3 (other
 *    bucket sizes), at this world size and at half of it (split group):
 *    owned parameter / state shards bitwise equal, padding 0, optimizer step
 *    and data position restored; one more step then matches the run that was
 *    never interrupted, bit for bit (deterministic reductions);
 *  - a single process (dt_checkpoint_load, world 1) reads both kinds;
 *  - a set whose index comes from another save, a path missing on some
 *    ranks and a save onto a regular file fail on every rank, no hang. */
#include "mpi_check.h"
#include "ddp_testutil.h"
#include "dtrain/train.h"
#include "dtrain/zero.h"
#include "tmpdir.h"

static dt_pg *world;
static int me, N;
static char dir[128];

#define B 4
#define LR 1e-2f

typedef struct model_case {
    const char *name, *tag;
    dt_model_cfg cfg;
    dt_optim_cfg oc;
    int stage;                 /* of the run that saves */
    dt_zero_overlap overlap;
} model_case;

/* ---- a trainer shell: what checkpoint metadata reads and writes ---- */
static dt_trainer *shell(dt_model *m, const dt_optim_cfg *oc, int rank, int w, int owns) {
    dt_trainer *t = calloc(1, sizeof *t);
    T_CHECK(t != NULL);
    dt_train_opts_default(&t->opts);
    t->opts.optim = *oc;
    t->opts.seed = 5;
    t->model = m;
    t->strat = (dt_strategy){.name = owns ? "zero" : "single", .rank = rank, .world = w, .owns_optimizer = owns};
    T_OK(dt_sampler_init(&t->sampler, 960, 5, 1, rank, w, 0));
    t->run = (dt_run){.model = m, .optim = &t->opts.optim, .step = &t->step, .sampler = &t->sampler, .seed = 5,
                      .rank = rank, .world = w};
    return t;
}

static void shell_free(dt_trainer *t) {
    dt_sampler_free(&t->sampler);
    dt_optimizer_free(&t->optim);
    free(t);
}

static dt_zero *make_zero(dt_model *m, dt_pg *pg, const dt_optim_cfg *oc, int stage, size_t first, size_t cap,
                          dt_zero_overlap overlap) {
    dt_zero_opts o;
    dt_zero_opts_default(&o);
    o.overlap_step = overlap;
    o.stage = stage;
    o.dp.first_bucket_bytes = first;
    o.dp.bucket_bytes = cap;
    o.dp.deterministic = 1;
    dt_zero *z;
    T_OK(dt_zero_create(m, pg, oc, &o, &z));
    return z;
}

static void zstep(dt_zero *z, dt_model *m, dt_graph *g, int step, int rank) {
    dtt_batch b;
    dtt_make_batch(&m->cfg, dtt_key(step, rank, 0), B, &b);
    dt_zero_set_lr(z, LR);
    dt_graph_reset(g);
    T_OK(dt_zero_before_forward(z, g, 1));
    dt_tensor *loss = dt_model_forward(m, g, &b.b, NULL);
    T_CHECK(loss != NULL);
    T_OK(dt_graph_backward(g, loss));
    T_OK(dt_zero_finish_backward(z));
    T_OK(dt_zero_step(z, NULL));
    dtt_batch_free(&b);
}

static const char *state_name(const dt_optim_cfg *c, int k) {
    return c->kind == DT_OPTIM_SGD ? "momentum" : k == 0 ? "exp_avg" : "exp_avg_sq";
}

static void tensor_name(char *buf, size_t n, const dt_optim_cfg *c, int k, const char *param) {
    if (k < 0) snprintf(buf, n, "%s", param);
    else snprintf(buf, n, "optim.%s.%s", state_name(c, k), param);
}

static const float *ref_data(const dt_safetensors *ref, const char *name) {
    const dt_st_tensor *x = dt_safetensors_find(ref, name);
    T_CHECK(x != NULL && x->dtype == DT_F32);
    return x->data;
}

/* The owned shards of z (values: k < 0, else state k) equal ref at the
 * same elements; padding is 0. */
static void check_owned(dt_zero *z, const dt_model *m, const dt_safetensors *ref, int k, const char *what) {
    dt_param *const *order = dt_zero_param_order(z);
    const dt_optim_cfg *oc = dt_zero_optim_cfg(z);
    for (int j = 0; j < dt_zero_num_buckets(z); j++) {
        const dt_zero_bucket *b = dt_zero_bucket_at(z, j);
        const float *buf = k < 0 ? dt_zero_shard_params(z, j) : dt_zero_shard_state(z, j, k);
        T_CHECK(buf != NULL);
        unsigned char *covered = calloc(b->shard + 1, 1);
        for (int q = b->first_param; q < b->first_param + b->n_params; q++) {
            const dt_param *p = order[q];
            size_t off = m->offsets[p->index], n = (size_t)p->value.numel;
            size_t lo = off > b->own_begin ? off : b->own_begin;
            size_t hi = off + n < b->own_begin + b->shard ? off + n : b->own_begin + b->shard;
            if (lo >= hi) continue;
            char nm[256];
            tensor_name(nm, sizeof nm, oc, k, p->name);
            T_BITWISE(buf + (lo - b->own_begin), ref_data(ref, nm) + (lo - off), hi - lo, what);
            memset(covered + (lo - b->own_begin), 1, hi - lo);
        }
        for (size_t i = 0; i < b->shard; i++)
            if (!covered[i]) T_CHECK(buf[i] == 0.0f);
        free(covered);
    }
}

/* Whole parameters of a model with a complete flat buffer equal ref. */
static void check_full_params(const dt_model *m, const dt_safetensors *ref, const char *what) {
    for (int i = 0; i < m->n_params; i++)
        T_BITWISE(dt_f32(&m->params[i]->value), ref_data(ref, m->params[i]->name),
                           (size_t)m->params[i]->value.numel, what);
}

static void copy_file(const char *from, const char *to) {
    FILE *f = fopen(from, "rb"), *g = fopen(to, "wb");
    T_CHECK(f && g);
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) T_CHECK(fwrite(buf, 1, n, g) == n);
    fclose(f);
    fclose(g);
}

/* Every tensor of the consolidated file reads back identically from the set. */
static void check_set_equals_file(const char *set, const dt_safetensors *ref) {
    dt_ckpt *c;
    T_OK(dt_ckpt_open(set, &c));
    T_CHECK(dt_ckpt_is_sharded(c));
    for (int i = 0; i < ref->n_tensors; i++) {
        const dt_st_tensor *x = &ref->tensors[i];
        size_t n = x->nbytes / sizeof(float);
        float *got = malloc((n + 1) * sizeof *got);
        T_OK(dt_ckpt_expect(c, x->name, x->ndim, x->shape));
        T_OK(dt_ckpt_read(c, x->name, 0, n, got));
        T_BITWISE(got, x->data, n, x->name);
        free(got);
    }
    const char *keys[] = {"format", "model", "optimizer", "step", "optim_step", "epoch", "cursor", "world"};
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++)
        T_CHECK(!strcmp(dt_ckpt_get_meta(c, keys[i]), dt_safetensors_meta(ref, keys[i])));
    dt_ckpt_close(c);
}

/* Reload into a fresh model + dt_zero on pg; check shards, metadata; then
 * (full group only) one more step equals the source's next step. */
static void reload(const model_case *mc, const char *path, dt_pg *pg, int stage, const dt_safetensors *ref,
                   const dt_safetensors *after, const char *what) {
    int r = dt_pg_rank(pg), w = dt_pg_size(pg);
    dt_model *m;
    T_OK(dt_model_create(&mc->cfg, 99, &m));
    dt_graph *g = dt_graph_create();
    dt_zero *z = make_zero(m, pg, &mc->oc, stage, 2048, 8192, DT_ZERO_OVERLAP_AFTER_BACKWARD);
    dt_trainer *t = shell(m, &mc->oc, r, w, 1);
    T_OK(dt_zero_load(z, &t->run, path));
    T_CHECK(t->step == 3);
    T_CHECK(dt_zero_optim_step(z) == 3);
    T_CHECK(t->sampler.epoch == 1 && t->sampler.cursor == 6 * N / w);
    check_owned(z, m, ref, -1, what);
    for (int k = 0; k < dt_optim_state_per_elem(&mc->oc); k++) check_owned(z, m, ref, k, what);
    if (stage < 3) check_full_params(m, ref, what);
    if (after) {   /* continue: step 4 on the same batches as the source */
        zstep(z, m, g, 3, r);
        T_OK(dt_zero_sync_params(z));
        check_owned(z, m, after, -1, "step after reload");
    }
    shell_free(t);
    dt_zero_free(z);
    dt_graph_free(g);
    dt_model_free(m);
}

/* One process, default layout, its own optimizer: dt_checkpoint_load. */
static void single_process_load(const model_case *mc, const char *path, const dt_safetensors *ref) {
    dt_model *m;
    T_OK(dt_model_create(&mc->cfg, 77, &m));
    dt_trainer *t = shell(m, &mc->oc, 0, 1, 0);
    dt_optim_segment *segs = malloc((size_t)m->n_params * sizeof *segs);
    for (int i = 0; i < m->n_params; i++)
        segs[i] = (dt_optim_segment){m->offsets[i], (size_t)m->params[i]->value.numel, m->params[i]->weight_decay, NULL, NULL, 0};
    T_OK(dt_optimizer_init(&t->optim, &mc->oc, segs, m->n_params, 0, m->param_flat.numel));
    free(segs);
    T_OK(dt_checkpoint_load(t, path));
    T_CHECK(t->step == 3 && t->optim.step == 3);
    T_CHECK(t->sampler.epoch == 1 && t->sampler.cursor == 6 * N);
    check_full_params(m, ref, path);
    for (int k = 0; k < dt_optim_state_per_elem(&mc->oc); k++)
        for (int i = 0; i < m->n_params; i++) {
            char nm[256];
            tensor_name(nm, sizeof nm, &mc->oc, k, m->params[i]->name);
            T_BITWISE(t->optim.state[k] + m->offsets[i], ref_data(ref, nm), (size_t)m->params[i]->value.numel, nm);
        }
    shell_free(t);
    dt_model_free(m);
}

static void expect_all_fail(dt_status s, const char *needle_here) {
    T_CHECK(s != DT_OK);
    if (needle_here && !strstr(dt_error_message(), needle_here)) {
        fprintf(stderr, "rank %d: error lacks '%s': %s\n", me, needle_here, dt_error_message());
        T_CHECK(0);
    }
}

static void run_case(const model_case *mc) {
    t_begin(mc->name);
    char set[256], set2[256], file[256], after_file[256];
    snprintf(set, sizeof set, "%s/%s.set", dir, mc->tag);
    snprintf(set2, sizeof set2, "%s/%s.set2", dir, mc->tag);
    snprintf(file, sizeof file, "%s/%s.safetensors", dir, mc->tag);
    snprintf(after_file, sizeof after_file, "%s/%s.after.safetensors", dir, mc->tag);
    /* source: 3 steps with small buckets (pieces cut parameters) */
    dt_model *m;
    T_OK(dt_model_create(&mc->cfg, 1, &m));
    dt_graph *g = dt_graph_create();
    dt_zero *z = make_zero(m, world, &mc->oc, mc->stage, 1024, 4096, mc->overlap);
    T_CHECK(dt_zero_num_buckets(z) >= 3);
    for (int s = 0; s < 3; s++) zstep(z, m, g, s, me);
    dt_trainer *t = shell(m, &mc->oc, me, N, 1);
    t->step = 3;
    T_OK(dt_sampler_seek(&t->sampler, 1, 6));
    T_OK(dt_zero_save(z, &t->run, set, DT_ZERO_CKPT_SHARDED));
    T_OK(dt_zero_save(z, &t->run, set, DT_ZERO_CKPT_SHARDED));   /* overwrite: a new set replaces the old */
    T_OK(dt_zero_save(z, &t->run, set2, DT_ZERO_CKPT_SHARDED));
    T_OK(dt_zero_save(z, &t->run, file, DT_ZERO_CKPT_CONSOLIDATED));
    dt_safetensors ref;
    T_OK(dt_safetensors_load(file, &ref));   /* the strict reader accepts it */
    if (mc->stage < 3) check_full_params(m, &ref, "consolidated vs live parameters");
    check_owned(z, m, &ref, -1, "consolidated vs live shards");
    for (int k = 0; k < dt_optim_state_per_elem(&mc->oc); k++) check_owned(z, m, &ref, k, "consolidated vs live state");
    check_set_equals_file(set, &ref);
    /* the uninterrupted run's next step, for the continuation checks */
    zstep(z, m, g, 3, me);
    t->step = 4;
    T_OK(dt_zero_save(z, &t->run, after_file, DT_ZERO_CKPT_CONSOLIDATED));
    dt_safetensors after;
    T_OK(dt_safetensors_load(after_file, &after));
    shell_free(t);
    dt_zero_free(z);
    dt_graph_free(g);
    dt_model_free(m);

    reload(mc, set, world, 1, &ref, &after, "sharded -> stage 1");
    reload(mc, set, world, 3, &ref, &after, "sharded -> stage 3");
    reload(mc, file, world, 3, &ref, &after, "consolidated -> stage 3");
    reload(mc, file, world, 2, &ref, NULL, "consolidated -> stage 2");
    dt_pg *half;   /* pairs of ranks (N = 2: single ranks) load the N-rank checkpoints */
    T_OK(dt_pg_split(world, N > 2 ? me / 2 : me, 0, &half));
    reload(mc, set, half, 2, &ref, NULL, "sharded -> half world");
    reload(mc, file, half, 3, &ref, NULL, "consolidated -> half world");
    T_OK(dt_pg_free(half));
    single_process_load(mc, set, &ref);
    single_process_load(mc, file, &ref);
    dt_safetensors_free(&after);
    dt_safetensors_free(&ref);
    t_end();
}

static void test_failures(const model_case *mc) {
    t_begin("failures are collective");
    char set[256], set2[256], file[256], from[300], to[300];
    snprintf(set, sizeof set, "%s/%s.set", dir, mc->tag);
    snprintf(set2, sizeof set2, "%s/%s.set2", dir, mc->tag);
    snprintf(file, sizeof file, "%s/%s.safetensors", dir, mc->tag);
    dt_model *m;
    T_OK(dt_model_create(&mc->cfg, 3, &m));
    dt_zero *z = make_zero(m, world, &mc->oc, 1, 4096, 4096, DT_ZERO_OVERLAP_OFF);
    dt_trainer *t = shell(m, &mc->oc, me, N, 1);
    /* index of another save: its files are not there (or belong to another set) on every rank */
    if (me == 0) {
        snprintf(from, sizeof from, "%s/index.json", set2);
        snprintf(to, sizeof to, "%s/index.json", set);
        copy_file(from, to);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    expect_all_fail(dt_zero_load(z, &t->run, set), "set");
    /* missing on ranks > 0 only: rank 0 reads fine but must fail too */
    char missing[300];
    snprintf(missing, sizeof missing, "%s/nothing-here", dir);
    expect_all_fail(dt_zero_load(z, &t->run, me == 0 ? set2 : missing), me == 0 ? "failed on" : "nothing-here");
    /* sharded save onto a regular file */
    expect_all_fail(dt_zero_save(z, &t->run, file, DT_ZERO_CKPT_SHARDED), me == 0 ? "not a directory" : "failed on rank 0");
    /* consolidated save into a missing directory */
    char bad[300];
    snprintf(bad, sizeof bad, "%s/no/such/dir.safetensors", dir);
    expect_all_fail(dt_zero_save(z, &t->run, bad, DT_ZERO_CKPT_CONSOLIDATED), me == 0 ? "no/such" : "failed on rank 0");
    /* still usable afterwards */
    T_OK(dt_zero_load(z, &t->run, set2));
    shell_free(t);
    dt_zero_free(z);
    dt_model_free(m);
    t_end();
}

int main(int argc, char **argv) {
    t_init(&argc, &argv);
    T_OK(dt_pg_world(&world));
    me = dt_pg_rank(world);
    N = dt_pg_size(world);
    if (me == 0) T_CHECK(dt_test_tmpdir(dir, sizeof dir, "zero_ckpt") == 0);
    MPI_Bcast(dir, sizeof dir, MPI_CHAR, 0, MPI_COMM_WORLD);
    dt_optim_cfg sgd = dt_optim_cfg_default(DT_OPTIM_SGD);
    sgd.lr = LR;
    sgd.momentum = 0.9f;
    model_case cases[] = {
        {"gpt2 adamw, stage 2", "gpt2", dtt_gpt2_cfg(), dtt_adamw(LR, 0.01f), 2, DT_ZERO_OVERLAP_AFTER_BACKWARD},
        {"mlp sgd momentum, stage 3 interleaved", "mlp", dtt_mlp_cfg(12, 40, 24, 5), sgd, 3, DT_ZERO_OVERLAP_INTERLEAVED},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) run_case(&cases[i]);
    test_failures(&cases[0]);
    MPI_Barrier(MPI_COMM_WORLD);
    if (me == 0) dt_test_rm_rf(dir);
    T_OK(dt_pg_free(world));
    T_OK(dt_dist_finalize());
    return 0;
}
