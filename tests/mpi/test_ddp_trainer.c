/* The trainer with the DDP strategy: tiny GPT-2 on a small text file for a few
 * steps (with and without gradient accumulation); every rank ends with the
 * same parameters, the same reported loss and the same evaluation. */
#include "mpi_check.h"
#include "ddp_testutil.h"

static dt_pg *world;
static char text_path[256];

static void write_corpus(void) {
    char dir[128] = "";
    if (t_rank() == 0) {
        strcpy(dir, "/tmp/dt_ddp_trainer_XXXXXX");
        T_CHECK(mkdtemp(dir) != NULL);
        snprintf(text_path, sizeof text_path, "%s/corpus.txt", dir);
        FILE *f = fopen(text_path, "w");
        T_CHECK(f != NULL);
        for (int i = 0; i < 300; i++) fprintf(f, "the quick brown fox %d jumps over the lazy dog.\n", i * 7 % 13);
        fclose(f);
    }
    MPI_Bcast(text_path, sizeof text_path, MPI_CHAR, 0, MPI_COMM_WORLD);
}

static void run_trainer(int accum, int det) {
    dt_train_opts o;
    dt_train_opts_default(&o);
    o.model = dt_model_cfg_default(DT_MODEL_GPT2);
    o.model.n_layer = 1; o.model.n_embd = 16; o.model.n_head = 2; o.model.max_t = 16;
    o.data = DT_DATA_TEXT;
    o.data_path = text_path;
    o.batch = 2; o.seq = 16; o.steps = 4; o.accum = accum; o.quiet = 1;
    o.eval_batches = 2;
    o.clip = 1.0f;
    dt_ddp_opts d;
    dt_ddp_opts_default(&d);
    d.first_bucket_bytes = 4096;
    d.bucket_bytes = 16384;
    d.deterministic = det;
    dt_strategy s;
    T_OK(dt_ddp_strategy(world, &d, &s));
    T_CHECK(s.world == dt_pg_size(world) && s.rank == dt_pg_rank(world));
    dt_trainer *t;
    T_OK(dt_trainer_create(&o, &s, &t));
    float *init = t_copy(t->model->param_flat.data, t->model->param_flat.numel);
    T_SAME_ON_RANKS(init, t->model->param_flat.numel, "trainer params after setup");
    for (int i = 0; i < 4; i++) {
        double loss = 0;
        T_OK(dt_trainer_step(t, &loss));
        float lf = (float)loss;
        T_CHECK(isfinite(lf));
        T_SAME_ON_RANKS(&lf, 1, "reported loss");
    }
    size_t n = t->model->param_flat.numel;
    T_CHECK(t_differs(t->model->param_flat.data, init, n));
    T_SAME_ON_RANKS(t->model->param_flat.data, n, "trainer params after steps");
    double el = 0, acc = 0;
    T_OK(dt_trainer_evaluate(t, &el, &acc));
    float ef = (float)el;
    T_SAME_ON_RANKS(&ef, 1, "evaluation loss");
    free(init);
    dt_trainer_free(t);
}

static void test_trainer(void) {
    t_begin("trainer + dt_ddp_strategy: identical parameters on every rank");
    write_corpus();
    run_trainer(1, 0);
    run_trainer(2, 1);
    if (t_rank() == 0) {
        remove(text_path);
        char *slash = strrchr(text_path, '/');
        *slash = 0;
        rmdir(text_path);
    }
    t_end();
}

int main(int argc, char **argv) {
    t_init(&argc, &argv);
    T_OK(dt_pg_world(&world));
    test_trainer();
    T_OK(dt_dist_finalize());
    return 0;
}
