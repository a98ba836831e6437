/* train.param_dtype fp16 refuses a parameter beyond fp16's range (nn.h
 * dt_working_copy). Where ranks hold different parameters only the rank
 * holding the culprit can see it; every rank must still end the step at
 * once, with an error, rather than enter a collective the refusing rank
 * never joins (before: the others waited for the watchdog).
 *   - tp W (W = the world, GPT-2): rank W-1's part of h.0.mlp.c_fc.weight
 *     (its own columns) holds 1e6. A training step and an evaluation fail on
 *     every rank: rank W-1 with DT_EINVAL naming the parameter, the others
 *     with DT_ECOMM naming rank W-1. With the value back in range the next
 *     step trains on every rank, the same loss everywhere.
 *   - pp 2 x W/2 replicas: the last stage's h.1.mlp.c_fc.weight holds 1e6 on its
 *     ranks: they fail naming it, the first stage's ranks with DT_ECOMM.
 *   - ZeRO-3 with a weight beyond 65504 from --init: every rank fails the
 *     step and the evaluation naming it (ZeRO's gathered payload carries
 *     the inf to every rank alike).
 *   - ZeRO-1/2, the same --init: their rounded copy is made whole on every
 *     rank at start-up (and after a load), so every rank refuses there,
 *     naming it (before: they trained on an inf weight to a NaN loss).
 * Without the agreement the test hangs (ctest's timeout fails it). */
#include <math.h>
#include <string.h>
#include "mpi_check.h"
#include "dtrain/parallel.h"
#include "dtrain/pipeline.h"
#include "dtrain/zero.h"
#include "dtrain/train.h"
#include "mpi_trainer.h"
#include "tmpdir.h"

enum { SEQ = 8 };
static dt_pg *world;
static char dir[128], text_path[256];

static void opts(dt_train_opts *o) {
    dt_train_opts_default(o);
    o->model = dt_model_cfg_default(DT_MODEL_GPT2);
    o->model.n_layer = 2; o->model.n_embd = 16; o->model.n_head = 4; o->model.max_t = SEQ; o->model.vocab = 256;
    o->data = DT_DATA_TEXT;
    o->data_path = text_path;
    o->batch = 4; o->seq = SEQ; o->steps = 4; o->quiet = 1; o->eval_batches = 1;
    o->param_dtype = DT_PARAMS_FP16;
}

/* st failed on this rank as it should: the culprit's own error, or the
 * others' pointer to it (a failed check prints dtrain's last error) */
static void check_refusal(dt_status st, int culprit, const char *param) {
    const char *msg = dt_error_message();
    if (culprit) {
        T_CHECK(st == DT_EINVAL);
        T_CHECK(strstr(msg, param) != NULL);
        T_CHECK(strstr(msg, "beyond fp16's range") != NULL);
    } else {
        T_CHECK(st == DT_ECOMM);
        T_CHECK(strstr(msg, "fp16 working copy") != NULL);
    }
}

/* a training step and an evaluation of t both refused on every rank (culprit: this rank holds the value) */
static void check_step_and_eval(dt_trainer *t, int culprit, const char *param, const char *others_see) {
    double loss, acc;
    dt_error_clear();
    check_refusal(dt_trainer_step(t, &loss), culprit, param);
    if (!culprit && others_see) T_CHECK(strstr(dt_error_message(), others_see) != NULL);
    dt_error_clear();
    check_refusal(dt_trainer_evaluate(t, &loss, &acc), culprit, param);
}

static void test_tp(void) {
    t_begin("fp16 working copy under tp: one rank's part beyond 65504 ends the step on every rank");
    int W = t_size(), r = t_rank();
    dt_tp_opts to = {.size = W};
    dt_ddp_opts_default(&to.ddp);
    dt_strategy s;
    T_OK(dt_tp_strategy(world, &to, &s));
    dt_train_opts o;
    opts(&o);
    dt_trainer *t;
    T_OK(dt_trainer_create(&o, &s, &t));
    double loss;
    T_OK(dt_trainer_step(t, &loss));
    dt_param *p = dt_model_find_param(t->model, "h.0.mlp.c_fc.weight");
    T_CHECK(p != NULL && p->split.parts == W);
    float keep = dt_f32(&p->value)[0];
    if (r == W - 1) dt_f32(&p->value)[0] = 1e6f;   /* the masters: no working copy between steps */
    char want[64];
    snprintf(want, sizeof want, "failed on rank %d", W - 1);
    check_step_and_eval(t, r == W - 1, "h.0.mlp.c_fc.weight", want);
    dt_f32(&p->value)[0] = keep;
    T_OK(dt_trainer_step(t, &loss));   /* every rank goes on together */
    float l = (float)loss;
    T_CHECK(isfinite(l));
    T_SAME_ON_RANKS(&l, 1, "the loss of the step after the refusal");
    dt_trainer_free(t);
    t_end();
}

static void test_pipeline(void) {
    t_begin("fp16 working copy under pp 2: the last stage's parameter beyond 65504 ends the step on every rank");
    dt_pipe_opts po;
    dt_pipe_opts_default(&po);
    po.stages = 2;
    po.param_dtype = DT_F16;
    dt_strategy s;
    T_OK(dt_pipe_strategy(world, &po, &s));
    dt_train_opts o;
    opts(&o);
    dt_trainer *t;
    T_OK(dt_trainer_create(&o, &s, &t));
    double loss;
    T_OK(dt_trainer_step(t, &loss));
    dt_param *p = dt_model_find_param(t->model, "h.1.mlp.c_fc.weight");   /* the last stage's only (ln_f is 1-D: exact) */
    int holder = p != NULL, holders = 0;
    MPI_Allreduce(&holder, &holders, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    T_CHECK(holders == t_size() / 2);
    if (holder) dt_f32(&p->value)[0] = 1e6f;
    check_step_and_eval(t, holder, "h.1.mlp.c_fc.weight", NULL);
    dt_trainer_free(t);
    t_end();
}

/* ZeRO-3 (the trainer's strategy): no agreement is needed, every rank
 * receives the same gathered payload; the step and the evaluation fail on
 * every rank with DT_EINVAL naming the parameter and the rank whose master
 * shard holds it, and freeing the trainer returns (nothing left waiting). */
/* the model's own initial weights beside the corpus (every rank has its
 * path), one of them (h.1.mlp.c_proj.weight's last) beyond fp16's range */
static void write_big_init(const dt_train_opts *o, char *init, size_t cap) {
    snprintf(init, cap, "%s", text_path);
    char *slash = strrchr(init, '/');
    T_CHECK(slash != NULL);
    snprintf(slash, cap - (size_t)(slash - init), "/init.safetensors");
    if (t_rank() == 0) {
        dt_model *m;
        T_OK(dt_model_create(&o->model, o->seed, &m));
        dt_param *p = dt_model_find_param(m, "h.1.mlp.c_proj.weight");
        T_CHECK(p != NULL && p->value.ndim == 2);
        dt_f32(&p->value)[p->value.numel - 1] = 1e6f;
        T_OK(dt_model_save_params(m, init));
        dt_model_free(m);
    }
    MPI_Barrier(MPI_COMM_WORLD);
}

/* ZeRO-1/2: refused at start-up or at the first step, on every rank, naming it */
static void test_zero12(void) {
    t_begin("fp16 working copy under ZeRO-1/2: a weight beyond 65504 (from --init) is refused on every rank");
    dt_train_opts o;
    opts(&o);
    char init[300];
    write_big_init(&o, init, sizeof init);
    o.init = init;
    for (int stage = 1; stage <= 2; stage++) {
        dt_zero_opts zo;
        dt_zero_opts_default(&zo);
        zo.stage = stage;
        zo.param_dtype = DT_F16;
        dt_strategy s;
        T_OK(dt_zero_strategy(world, &zo, DT_ZERO_CKPT_CONSOLIDATED, &s));
        dt_trainer *t = NULL;
        double loss;
        dt_error_clear();
        dt_status st = dt_trainer_create(&o, &s, &t);
        if (st == DT_OK) st = dt_trainer_step(t, &loss);
        if (t_rank() == 0) printf("  stage %d: %s\n", stage, dt_error_message());
        T_CHECK(st == DT_EINVAL);
        T_CHECK(strstr(dt_error_message(), "h.1.mlp.c_proj.weight") != NULL);
        T_CHECK(strstr(dt_error_message(), "beyond fp16's range") != NULL);
        dt_trainer_free(t);
    }
    t_end();
}

static void test_zero3(void) {
    t_begin("fp16 working copy under ZeRO-3: a weight beyond 65504 (from --init) ends the step on every rank");
    dt_train_opts o;
    opts(&o);
    char init[300];
    write_big_init(&o, init, sizeof init);
    o.init = init;
    dt_zero_opts zo;
    dt_zero_opts_default(&zo);
    zo.stage = 3;
    zo.param_dtype = DT_F16;
    dt_strategy s;
    T_OK(dt_zero_strategy(world, &zo, DT_ZERO_CKPT_CONSOLIDATED, &s));
    dt_trainer *t;
    T_OK(dt_trainer_create(&o, &s, &t));
    double loss, acc;
    for (int k = 0; k < 2; k++) {   /* a step, then an evaluation */
        dt_error_clear();
        dt_status st = k == 0 ? dt_trainer_step(t, &loss) : dt_trainer_evaluate(t, &loss, &acc);
        T_CHECK(st == DT_EINVAL);
        T_CHECK(strstr(dt_error_message(), "h.1.mlp.c_proj.weight") != NULL);
        T_CHECK(strstr(dt_error_message(), "beyond fp16's range") != NULL);
        T_CHECK(strstr(dt_error_message(), "master shard") != NULL);
    }
    dt_trainer_free(t);
    t_end();
}

int main(int argc, char **argv) {
    t_init(&argc, &argv);
    T_OK(dt_pg_world(&world));
    t_text_corpus("fp16_copy_agree", "the", 200, dir, text_path);
    test_tp();
    test_pipeline();
    test_zero3();
    test_zero12();
    MPI_Barrier(MPI_COMM_WORLD);
    if (t_rank() == 0) dt_test_rm_rf(dir);
    T_OK(dt_dist_finalize());
    return 0;
}
