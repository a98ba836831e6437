/* The trainer with the DDP strategy: tiny GPT-2 on a small text file for a few
 * steps (with and without gradient accumulation); every rank ends with the
 * same parameters, the same reported loss and the same evaluation, and the
 * parameters match one process training on the global batch (N x the per-rank
 * batch: the sampler strides ranks over one permutation, so the N per-rank
 * batches together are exactly the global one). Without the gradient
 * reduction each rank would step on its own batch's gradient only and miss
 * that reference. */
#include "mpi_check.h"
#include "ddp_testutil.h"
#include "dtrain/train.h"
#include "mpi_trainer.h"
#include "tmpdir.h"

static dt_pg *world;
static char dir[128], text_path[256];

static void write_corpus(void) { t_text_corpus("ddp_trainer", "the", 300, dir, text_path); }

/* Trainer options shared by the DDP run (batch per rank) and the reference. */
static void train_opts(dt_train_opts *o, int64_t batch, int accum) {
    dt_train_opts_default(o);
    o->model = dt_model_cfg_default(DT_MODEL_GPT2);
    o->model.n_layer = 1; o->model.n_embd = 16; o->model.n_head = 2; o->model.max_t = 16;
    o->data = DT_DATA_TEXT;
    o->data_path = text_path;
    o->batch = batch; o->seq = 16; o->steps = 4; o->accum = accum; o->quiet = 1;
    o->eval_batches = 2;
    o->clip = 1.0f;
}

/* One process, no strategy, batch N x 2: the parameters after 4 steps and
 * the mean loss of the last step. */
static float *reference_run(int accum, float *last_loss) {
    dt_train_opts o;
    train_opts(&o, 2 * (int64_t)t_size(), accum);
    dt_trainer *t;
    T_OK(dt_trainer_create(&o, NULL, &t));
    double loss = 0;
    for (int i = 0; i < 4; i++) T_OK(dt_trainer_step(t, &loss));
    *last_loss = (float)loss;
    float *p = t_copy(t->model->param_flat.data, t->model->param_flat.numel);
    dt_trainer_free(t);
    return p;
}

static void run_trainer(int accum, int det) {
    dt_train_opts o;
    train_opts(&o, 2, accum);
    dt_ddp_opts d;
    dt_ddp_opts_default(&d);
    d.dp.first_bucket_bytes = 4096;
    d.dp.bucket_bytes = 16384;
    d.dp.deterministic = det;
    dt_strategy s;
    T_OK(dt_ddp_strategy(world, &d, &s));
    T_CHECK(s.world == dt_pg_size(world) && s.rank == dt_pg_rank(world));
    dt_trainer *t;
    T_OK(dt_trainer_create(&o, &s, &t));
    float *init = t_copy(t->model->param_flat.data, t->model->param_flat.numel);
    T_SAME_ON_RANKS(init, t->model->param_flat.numel, "trainer params after setup");
    float lf = 0;
    for (int i = 0; i < 4; i++) {
        double loss = 0;
        T_OK(dt_trainer_step(t, &loss));
        lf = (float)loss;
        T_CHECK(isfinite(lf));
        T_SAME_ON_RANKS(&lf, 1, "reported loss");
    }
    size_t n = t->model->param_flat.numel;
    T_CHECK(t_differs(t->model->param_flat.data, init, n));
    /* the reduction happened: one process on the global batch gets there too */
    float ref_loss;
    float *ref = reference_run(accum, &ref_loss);
    T_CHECK(t_differs(ref, init, n));   /* the reference trained */
    char what[128];
    snprintf(what, sizeof what, "accum %d%s: DDP params vs one process on the global batch", accum,
             det ? " (deterministic)" : "");
    T_NEAR(t->model->param_flat.data, ref, n, 1e-5, what);
    snprintf(what, sizeof what, "accum %d%s: last step's loss vs one process on the global batch", accum,
             det ? " (deterministic)" : "");
    T_NEAR(&lf, &ref_loss, 1, 1e-5, what);
    free(ref);
    T_SAME_ON_RANKS(t->model->param_flat.data, n, "trainer params after steps");
    double el = 0, acc = 0;
    T_OK(dt_trainer_evaluate(t, &el, &acc));
    float ef = (float)el;
    T_SAME_ON_RANKS(&ef, 1, "evaluation loss");
    free(init);
    /* finished, its strategy is gone: a step or an evaluation is refused
     * (they used the freed strategy: a use after free) */
    T_OK(dt_trainer_finish(t));
    T_CHECK(dt_trainer_step(t, NULL) == DT_ESTATE);
    T_CHECK(dt_trainer_evaluate(t, NULL, NULL) == DT_ESTATE);
    dt_trainer_free(t);
}

static void test_trainer(void) {
    t_begin("trainer + dt_ddp_strategy: identical parameters on every rank, as one process on the global batch");
    write_corpus();
    run_trainer(1, 0);
    run_trainer(2, 1);
    MPI_Barrier(MPI_COMM_WORLD);
    if (t_rank() == 0) dt_test_rm_rf(dir);
    t_end();
}

int main(int argc, char **argv) {
    t_init(&argc, &argv);
    T_OK(dt_pg_world(&world));
    test_trainer();
    T_OK(dt_dist_finalize());
    return 0;
}
