/* A user's model split with the public builder's tensor-parallel layers
 * (nn.h dt_nn_add_linear_col / _row) trains under the tp strategy as the
 * whole model does in one process: a token MLP on text,
 *   ids -> embedding [256, C] (whole) -> fc1 column-parallel C -> 4C/T,
 *   GELU -> fc2 row-parallel 4C/T -> C -> head linear C -> 256 (whole)
 * built by train.build_model for world rank r at tp W (W = the world, 2 or
 * 4), 3 AdamW steps with clipping and an evaluation through the trainer:
 *   - each rank's parameters at start are the slices of the whole model's
 *   - every loss within 1e-6 relative of the one-process run, the same on
 *     every rank; after training fc1.weight is still the slice of the
 *     whole-trained one within 1e-5
 *   - a model built whole is refused by the strategy, naming the builder
 *     functions. */
#include <math.h>
#include <string.h>
#include "mpi_check.h"
#include "dtrain/parallel.h"
#include "dtrain/train.h"
#include "mpi_trainer.h"
#include "tmpdir.h"

enum { C = 16, SEQ = 8, VOCAB = 256 };
static dt_pg *world;
static char dir[128], text_path[256];

typedef struct mlp { int parts, rank; dt_module *emb, *fc1, *fc2, *head; } mlp;

static dt_tensor *embed(dt_model *m, dt_graph *g, dt_tensor *x, const dt_batch *b, void *user) {
    (void)x;
    mlp *u = user;
    const dt_tensor *ids = dt_batch_input(b, "ids", DT_I32, "tok_mlp");
    if (!ids) return NULL;
    int64_t shape[3] = {b->B, b->T, C};
    (void)m;
    if (dt_module_enter(g, u->emb) != DT_OK) return NULL;
    dt_tensor *y = dt_op_embedding(g, &u->emb->params[0]->value, ids->data, ids->numel, 3, shape);
    return y && dt_module_leave(g, u->emb) == DT_OK ? y : NULL;
}

static dt_tensor *mlp_block(dt_model *m, dt_graph *g, dt_tensor *x, const dt_batch *b, void *user) {
    (void)b;
    mlp *u = user;
    dt_tensor *h = dt_nn_linear_col(g, u->fc1, x, m->tp);   /* [B, T, 4C/T] */
    if (h) h = dt_op_gelu(g, h);
    if (h) h = dt_nn_linear_row(g, u->fc2, h, m->tp);        /* [B, T, C], whole */
    return h ? dt_op_add(g, x, h) : NULL;
}

static dt_tensor *head(dt_model *m, dt_graph *g, dt_tensor *x, const dt_batch *b, void *user) {
    (void)m; (void)b;
    return dt_nn_linear(g, ((mlp *)user)->head, x);
}

static dt_status build(void *user, uint64_t seed, dt_model **out) {
    mlp *u = user;
    dt_model *m;
    DT_TRY(dt_model_new("tok_mlp", seed, &m));
    dt_input_spec in = {.name = "ids", .dtype = DT_I32, .ndim = 1, .dims = {-SEQ}, .int_limit = VOCAB};
    dt_model_add_input(m, &in);
    u->emb = dt_model_add_module(m, "emb");
    dt_model_add_param(m, u->emb, "weight", 2, (int64_t[]){VOCAB, C}, DT_INIT_GAUSS(0.02f));
    u->fc1 = dt_nn_add_linear_col(m, "fc1", C, 4 * C, u->parts, u->rank);
    u->fc2 = dt_nn_add_linear_row(m, "fc2", 4 * C, C, u->parts, u->rank);
    u->head = dt_nn_add_linear(m, "head", C, VOCAB);
    int64_t act[2] = {DT_DIM_SEQ, C}, logits[2] = {DT_DIM_SEQ, VOCAB};
    dt_model_add_block(m, "embed", embed, u, 0, NULL, 2, act);
    dt_model_add_block(m, "mlp", mlp_block, u, 2, act, 2, act);
    dt_model_add_block(m, "head", head, u, 2, act, 2, logits);
    dt_model_set_loss(m, DT_LOSS_CROSS_ENTROPY, VOCAB);
    dt_status s = dt_model_build(m);
    if (s != DT_OK) { dt_model_free(m); return s; }
    *out = m;
    return DT_OK;
}

static void write_corpus(void) { t_text_corpus("tp_user_model", "a", 200, dir, text_path); }

static void opts(dt_train_opts *o, mlp *u) {
    dt_train_opts_default(o);
    o->build_model = build;
    o->build_user = u;
    o->data = DT_DATA_TEXT;
    o->data_path = text_path;
    o->batch = 4; o->seq = SEQ; o->steps = 3; o->quiet = 1; o->eval_batches = 1; o->clip = 0.05f;
}

/* fc1.weight's rows of this rank: [4C/T, C] of the whole [4C, C] */
static const float *fc1_part(const dt_model *whole, int T, int r) {
    return dt_f32(&dt_model_find_param(whole, "fc1.weight")->value) + (size_t)r * (4 * C / T) * C;
}

static void test_user_mlp(void) {
    t_begin("a user's MLP with dt_nn_add_linear_col/row under the tp strategy equals one process");
    write_corpus();
    int T = t_size(), r = t_rank();
    mlp whole_u = {.parts = 1}, part_u = {.parts = T, .rank = r};
    dt_train_opts o;
    opts(&o, &whole_u);
    dt_trainer *whole, *part;
    T_OK(dt_trainer_create(&o, NULL, &whole));
    dt_tp_opts to = {.size = T};
    dt_ddp_opts_default(&to.ddp);
    dt_strategy s;
    T_OK(dt_tp_strategy(world, &to, &s));
    opts(&o, &part_u);
    T_OK(dt_trainer_create(&o, &s, &part));
    const dt_param *p1 = dt_model_find_param(part->model, "fc1.weight");
    T_CHECK(p1->split.parts == T && p1->value.shape[0] == 4 * C / T);
    T_BITWISE(dt_f32(&p1->value), fc1_part(whole->model, T, r), (size_t)p1->value.numel, "fc1 part at start");
    float got[4], want[4];
    for (int i = 0; i < 3; i++) {
        double a, b;
        T_OK(dt_trainer_step(whole, &a));
        T_OK(dt_trainer_step(part, &b));
        got[i] = (float)b;
        want[i] = (float)a;
    }
    double la, lb, acc;
    T_OK(dt_trainer_evaluate(whole, &la, &acc));
    T_OK(dt_trainer_evaluate(part, &lb, &acc));
    got[3] = (float)lb;
    want[3] = (float)la;
    T_NEAR(got, want, 4, 1e-6, "3 training losses and the evaluation's, tp vs one process");
    T_SAME_ON_RANKS(got, 4, "losses");
    T_NEAR(dt_f32(&p1->value), fc1_part(whole->model, T, r), (size_t)p1->value.numel, 1e-5, "fc1 part after 3 steps");
    dt_trainer_free(part);
    dt_trainer_free(whole);
    /* built whole: refused by the strategy before training */
    T_OK(dt_tp_strategy(world, &to, &s));
    opts(&o, &whole_u);
    dt_error_clear();
    T_CHECK(dt_trainer_create(&o, &s, &part) == DT_EINVAL);
    T_CHECK(strstr(dt_error_message(), "dt_nn_add_linear_col") != NULL);
    MPI_Barrier(MPI_COMM_WORLD);
    if (t_rank() == 0) dt_test_rm_rf(dir);
    t_end();
}

int main(int argc, char **argv) {
    t_init(&argc, &argv);
    T_OK(dt_pg_world(&world));
    test_user_mlp();
    T_OK(dt_dist_finalize());
    return 0;
}
