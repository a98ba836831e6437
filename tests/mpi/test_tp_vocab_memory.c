/* The vocabulary-parallel lm-head and cross-entropy never hold the whole
 * logits [B*T, V] on one rank (issue 30): GPT-2 with V = 50304 (other dims
 * tiny, B*T = 16) trained for 2 steps and evaluated through the trainer, at
 * --tp W (W = the world: 2 or 4) and, on every rank alone, whole (no
 * strategy). The tape arena's high-water mark (dt_graph_arena_bytes: every
 * activation of the run, evaluation included) is measured on each rank:
 *   whole:   >= B*T*V*4 bytes (the logits alone: the bound can fail)
 *   tp W:    <  B*T*V*4 bytes on every rank (this rank's V/W columns)
 * and the tp run's losses equal the whole run's within 1e-5 relative (the
 * split sum of exp rounds differently). */
#include <math.h>
#include "mpi_check.h"
#include "dtrain/parallel.h"
#include "dtrain/train.h"
#include "mpi_trainer.h"
#include "tmpdir.h"

enum { B = 2, SEQ = 8, VOCAB = 50304 };
static dt_pg *world;
static char dir[128], text_path[256];

static void write_corpus(void) { t_text_corpus("tp_vocab_memory", "the", 200, dir, text_path); }

static void opts(dt_train_opts *o) {
    dt_train_opts_default(o);
    o->model = dt_model_cfg_default(DT_MODEL_GPT2);
    o->model.n_layer = 1; o->model.n_embd = 16; o->model.n_head = 4; o->model.max_t = SEQ; o->model.vocab = VOCAB;
    o->data = DT_DATA_TEXT;
    o->data_path = text_path;
    o->batch = B; o->seq = SEQ; o->steps = 2; o->quiet = 1; o->eval_batches = 1;
}

/* 2 steps and one evaluation: the losses and the arena's high-water mark. */
static size_t run(const dt_strategy *s, double loss[3]) {
    dt_train_opts o;
    opts(&o);
    return t_train_arena(&o, s, 2, loss);
}

static void test_memory(void) {
    t_begin("vocabulary-parallel lm-head + cross-entropy: arena below B*T*V*4 per rank at V = 50304");
    write_corpus();
    size_t bound = (size_t)B * SEQ * VOCAB * sizeof(float);
    double whole_loss[3], tp_loss[3];
    size_t whole = run(NULL, whole_loss);
    dt_tp_opts to = {.size = t_size()};
    dt_ddp_opts_default(&to.ddp);
    dt_strategy s;
    T_OK(dt_tp_strategy(world, &to, &s));
    size_t tp = run(&s, tp_loss);
    printf("rank %d: arena high-water: whole %zu bytes, tp %d %zu bytes; B*T*V*4 = %zu\n", t_rank(), whole, t_size(),
           tp, bound);
    T_CHECK(whole >= bound);
    T_CHECK(tp < bound);
    float got[3], want[3];
    for (int i = 0; i < 3; i++) { got[i] = (float)tp_loss[i]; want[i] = (float)whole_loss[i]; }
    T_NEAR(got, want, 3, 1e-5, "losses of 2 steps and the evaluation, tp vs whole");
    MPI_Barrier(MPI_COMM_WORLD);
    if (t_rank() == 0) dt_test_rm_rf(dir);
    t_end();
}

int main(int argc, char **argv) {
    t_init(&argc, &argv);
    T_OK(dt_pg_world(&world));
    test_memory();
    T_OK(dt_dist_finalize());
    return 0;
}
