/* Checkpoint metadata "optim_steps" (strategy.h): each parameter's own step
 * count survives a save/load round trip; consecutive equal counts collapse
 * into one run; an absent key means every parameter took every step; a
 * malformed value or a count above the optimizer's is refused naming the
 * file. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <string.h>

#include "dtrain/strategy.h"

static dt_model *mlp(void) {   /* fc1.weight fc1.bias fc2.weight fc2.bias */
    dt_model_cfg c = dt_model_cfg_default(DT_MODEL_MLP);
    c.mlp_in = 6;
    c.mlp_n_hidden = 1;
    c.mlp_hidden[0] = 4;
    c.mlp_out = 3;
    dt_model *m = NULL;
    assert_int_equal(dt_model_create(&c, 1, &m), DT_OK);
    return m;
}

/* 5 steps; parameter i has a gradient in step t when use[i] has bit t. */
static void train(dt_model *m, dt_optimizer *o, const unsigned *use) {
    for (int t = 0; t < 5; t++) {
        for (int i = 0; i < m->n_params; i++) m->params[i]->has_grad = (int)(use[i] >> t & 1u);
        assert_int_equal(dt_optimizer_step_range(o, 0.01f, m->param_flat.data, m->grad_flat.data, 0, m->param_flat.numel, 1.0f),
                         DT_OK);
        dt_optimizer_finish_step(o);
    }
}

static const char *meta_get(const void *src, const char *key) {
    const dt_ckpt_meta *mb = src;
    for (int i = 0; i < mb->n; i++)
        if (!strcmp(mb->m[i].key, key)) return mb->m[i].value;
    return NULL;
}

static void test_round_trip(void **st) {
    (void)st;
    dt_model *m = mlp();
    dt_optim_cfg c = dt_optim_cfg_default(DT_OPTIM_ADAMW);
    dt_optimizer o, back;
    assert_int_equal(dt_optimizer_init_model(&o, &c, m), DT_OK);
    const unsigned use[4] = {0x00, 0x05, 0x0b, 0x1c};   /* never; steps 0,2; 0,1,3; 2,3,4 */
    train(m, &o, use);
    dt_ckpt_meta mb = {.n = 0};
    dt_optimizer *po = &o;
    assert_int_equal(dt_checkpoint_meta_steps(&mb, m, &po, 1), DT_OK);
    assert_string_equal(meta_get(&mb, "optim_steps"), "0-0:0,1-1:2,2-3:3");
    assert_int_equal(dt_optimizer_init_model(&back, &c, m), DT_OK);
    back.step = 5;
    dt_optimizer *pb = &back;
    assert_int_equal(dt_checkpoint_apply_steps(meta_get, &mb, "x.st", m, &pb, 1), DT_OK);
    static const int64_t want[4] = {0, 2, 3, 3};
    for (int i = 0; i < 4; i++) {
        int k = dt_optimizer_find_segment(&back, m->offsets[i]);
        assert_true(k >= 0);
        assert_int_equal(dt_optimizer_segment_steps(&back, k), want[i]);
    }
    /* no key (an older checkpoint): every parameter took every step */
    dt_ckpt_meta none = {.n = 0};
    assert_int_equal(dt_checkpoint_apply_steps(meta_get, &none, "old.st", m, &pb, 1), DT_OK);
    for (int k = 0; k < back.n_segs; k++) assert_int_equal(dt_optimizer_segment_steps(&back, k), 5);
    /* every parameter stepped: an empty value */
    const unsigned all[4] = {0x1f, 0x1f, 0x1f, 0x1f};
    dt_optimizer fresh;
    assert_int_equal(dt_optimizer_init_model(&fresh, &c, m), DT_OK);
    train(m, &fresh, all);
    dt_ckpt_meta mb2 = {.n = 0};
    dt_optimizer *pf = &fresh;
    assert_int_equal(dt_checkpoint_meta_steps(&mb2, m, &pf, 1), DT_OK);
    assert_string_equal(meta_get(&mb2, "optim_steps"), "");
    dt_optimizer_free(&o);
    dt_optimizer_free(&back);
    dt_optimizer_free(&fresh);
    dt_model_free(m);
}

static void expect_bad(dt_model *m, dt_optimizer *o, const char *value, const char *needle) {
    dt_ckpt_meta mb = {.n = 1};
    mb.m[0] = (dt_st_meta){"optim_steps", value};
    assert_int_equal(dt_checkpoint_apply_steps(meta_get, &mb, "bad.st", m, &o, 1), DT_EFORMAT);
    assert_non_null(strstr(dt_error_message(), "bad.st"));
    assert_non_null(strstr(dt_error_message(), needle));
}

static void test_bad_values(void **st) {
    (void)st;
    dt_model *m = mlp();
    dt_optim_cfg c = dt_optim_cfg_default(DT_OPTIM_SGD);
    dt_optimizer o;
    assert_int_equal(dt_optimizer_init_model(&o, &c, m), DT_OK);
    o.step = 3;
    expect_bad(m, &o, "0-0", "malformed");
    expect_bad(m, &o, "0-9:1", "malformed");      /* index past the last parameter */
    expect_bad(m, &o, "2-1:1", "malformed");
    expect_bad(m, &o, "0-0:1;", "malformed");
    expect_bad(m, &o, "1-1:4", "'fc1.bias' took 4 steps");
    expect_bad(m, &o, "0-3:-5", "STEPS >= 0");   /* (it said "took -5 steps, more than the optimizer's 3") */
    dt_optimizer_free(&o);
    dt_model_free(m);
}

/* A frozen parameter has no segment (compact state): recorded with 0 steps,
 * so a resume that unfreezes it starts it from step 0 with zero state. */
static void test_frozen_recorded_as_zero(void **st) {
    (void)st;
    dt_model *m = mlp();
    m->params[2]->requires_grad = 0;   /* fc2.weight */
    dt_optim_cfg c = dt_optim_cfg_default(DT_OPTIM_ADAMW);
    dt_optimizer o;
    assert_int_equal(dt_optimizer_init_model(&o, &c, m), DT_OK);
    assert_int_equal(o.n_segs, 3);
    const unsigned all[4] = {0x1f, 0x1f, 0x00, 0x1f};
    train(m, &o, all);
    dt_ckpt_meta mb = {.n = 0};
    dt_optimizer *po = &o;
    assert_int_equal(dt_checkpoint_meta_steps(&mb, m, &po, 1), DT_OK);
    assert_string_equal(meta_get(&mb, "optim_steps"), "2-2:0");
    m->params[2]->requires_grad = 1;   /* unfrozen in the resuming run */
    dt_optimizer back;
    assert_int_equal(dt_optimizer_init_model(&back, &c, m), DT_OK);
    back.step = 5;
    dt_optimizer *pb = &back;
    assert_int_equal(dt_checkpoint_apply_steps(meta_get, &mb, "x.st", m, &pb, 1), DT_OK);
    assert_int_equal(dt_optimizer_segment_steps(&back, dt_optimizer_find_segment(&back, m->offsets[2])), 0);
    assert_int_equal(dt_optimizer_segment_steps(&back, dt_optimizer_find_segment(&back, m->offsets[3])), 5);
    dt_optimizer_free(&o);
    dt_optimizer_free(&back);
    dt_model_free(m);
}

/* A pipeline stage holds some of the model's parameters: the writer records
 * a list over the whole model (own[g] < 0: every step), and a stage applies
 * it through local_of (global index -> its parameter, -1 not held here). */
static void test_list_and_map(void **st) {
    (void)st;
    dt_ckpt_meta mb = {.n = 0};
    static const int64_t own[7] = {-1, 0, 0, 4, -1, -1, 2};
    assert_int_equal(dt_checkpoint_meta_steps_list(&mb, own, 7, "the model"), DT_OK);
    assert_string_equal(meta_get(&mb, "optim_steps"), "1-2:0,3-3:4,6-6:2");
    dt_model *m = mlp();   /* this stage: globals 2, 3, 5, 6 as its parameters 0..3 */
    static const int local_of[7] = {-1, -1, 0, 1, -1, 2, 3};
    dt_optim_cfg c = dt_optim_cfg_default(DT_OPTIM_ADAMW);
    dt_optimizer o;
    assert_int_equal(dt_optimizer_init_model(&o, &c, m), DT_OK);
    o.step = 5;
    dt_optimizer *po = &o;
    assert_int_equal(dt_checkpoint_apply_steps_of(meta_get, &mb, "set", m, &po, 1, local_of, 7), DT_OK);
    static const int64_t want[4] = {0, 4, 5, 2};
    for (int i = 0; i < 4; i++) assert_int_equal(dt_checkpoint_param_steps(m, i, &po, 1), want[i]);
    /* an index past the whole model's parameters is malformed (7 of 7; 4..6 above lie past this stage's 4) */
    dt_ckpt_meta bad = {.n = 1};
    bad.m[0] = (dt_st_meta){"optim_steps", "7-7:1"};
    assert_int_equal(dt_checkpoint_apply_steps_of(meta_get, &bad, "set", m, &po, 1, local_of, 7), DT_EFORMAT);
    assert_non_null(strstr(dt_error_message(), "below 7"));
    /* frozen here: no optimizer has it */
    m->params[1]->requires_grad = 0;
    dt_optimizer f;
    assert_int_equal(dt_optimizer_init_model(&f, &c, m), DT_OK);
    dt_optimizer *pf = &f;
    assert_int_equal(dt_checkpoint_param_steps(m, 1, &pf, 1), -1);
    dt_optimizer_free(&o);
    dt_optimizer_free(&f);
    dt_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_bad_values),
        cmocka_unit_test(test_frozen_recorded_as_zero),
        cmocka_unit_test(test_list_and_map),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
