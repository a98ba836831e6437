/* Sequence parallelism (--tp W --sequence-parallel) cuts the activation
 * memory each rank holds (issue 30): GPT-2 with the embedding width large
 * against the vocabulary (L = 2, C = 128, V = 256, B = 4, T = 32) trained
 * for 2 steps and evaluated through the trainer at --tp W (W = the world:
 * 2 or 4) without and with sequence parallelism. The tape arena's
 * high-water mark (dt_graph_arena_bytes: every activation of the run,
 * evaluation included) is measured on each rank. Without sequence
 * parallelism every rank holds, per layer, at least these whole [B, T, C]
 * tensors outside attention and the MLP: ln_1's and ln_2's outputs, the two
 * sums after the row-parallel layers, the two bias adds and the two residual
 * sums -- 8 of them; with it each is [B, T/W, C]. So the bound
 *   arena(sp) + L * 8 * B*T*C*4 * (1 - 1/W) <= arena(tp)
 * (the embedding's sums and ln_f save more, unclaimed);
 * without sequence parallelism the two runs are the same and it fails. The three runs' losses (whole on each
 * rank alone, tp, tp + sp) agree within 1e-5 relative. */
#include <math.h>
#include "mpi_check.h"
#include "dtrain/parallel.h"
#include "dtrain/train.h"
#include "mpi_trainer.h"
#include "tmpdir.h"

enum { B = 4, SEQ = 32, L = 2, C = 128 };
static dt_pg *world;
static char dir[128], text_path[256];

static void write_corpus(void) { t_text_corpus("tp_seq_memory", "the", 200, dir, text_path); }

static void opts(dt_train_opts *o) {
    dt_train_opts_default(o);
    o->model = dt_model_cfg_default(DT_MODEL_GPT2);
    o->model.n_layer = L; o->model.n_embd = C; o->model.n_head = 4; o->model.max_t = SEQ; o->model.vocab = 256;
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

static size_t run_tp(int sp, double loss[3]) {
    dt_tp_opts to = {.size = t_size(), .sequence_parallel = sp};
    dt_ddp_opts_default(&to.ddp);
    dt_strategy s;
    T_OK(dt_tp_strategy(world, &to, &s));
    return run(&s, loss);
}

static void test_memory(void) {
    t_begin("sequence parallelism: the arena per rank falls by >= L * 8 * B*T*C*4 * (1 - 1/W)");
    write_corpus();
    int W = t_size();
    size_t saving = (size_t)L * 8 * B * SEQ * C * sizeof(float) / (size_t)W * (size_t)(W - 1);
    double whole_loss[3], tp_loss[3], sp_loss[3];
    size_t whole = run(NULL, whole_loss);
    size_t tp = run_tp(0, tp_loss);
    size_t sp = run_tp(1, sp_loss);
    printf("rank %d: arena high-water: whole %zu, tp %d %zu, tp %d + sp %zu bytes; claimed saving %zu\n", t_rank(),
           whole, W, tp, W, sp, saving);
    T_CHECK(sp + saving <= tp);
    float got[3], want[3], tpl[3];
    for (int i = 0; i < 3; i++) { got[i] = (float)sp_loss[i]; want[i] = (float)whole_loss[i]; tpl[i] = (float)tp_loss[i]; }
    T_NEAR(got, want, 3, 1e-5, "losses of 2 steps and the evaluation, tp + sp vs whole");
    T_NEAR(tpl, want, 3, 1e-5, "losses of 2 steps and the evaluation, tp vs whole");
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
