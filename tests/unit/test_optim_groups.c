/* Parameter groups (optim.h): a segment's group settings step it exactly as
 * an optimizer configured with those settings would (bitwise), and by hand
 * for one AdamW element; dt_optim_apply_groups resolves overlapping patterns
 * field by field in order, resets earlier settings, and rejects unmatched
 * patterns and out-of-range values without changing anything. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dtrain/optim.h"

enum { A = 37, N = 100 };   /* segment 0: [0, A) in a group; segment 1: [A, N) default */

static uint64_t g_rng = 0x243f6a8885a308d3ull;
static void fill(float *x, size_t n) {
    for (size_t i = 0; i < n; i++) {
        g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((g_rng >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
    }
}

/* Four steps of one optimizer whose segment 0 has group hp, against two
 * optimizers over one segment each: segment 0's with the group's values put
 * in its cfg (and lr x scale), segment 1's with the defaults. */
static void group_equals_own_cfg(const dt_optim_cfg *c) {
    dt_param_hparams hp = {0.5f, 0.3f, 0.8f, 0.95f};
    dt_optim_segment segs[2] = {{0, A, 0, NULL, &hp, 0}, {A, N - A, 1, NULL, NULL, 0}};
    dt_optim_cfg gc = *c;
    gc.weight_decay = 0.3f;
    gc.beta1 = 0.8f;
    gc.beta2 = 0.95f;
    dt_optim_segment r0 = {0, A, 1, NULL, NULL, 0}, r1 = {A, N - A, 1, NULL, NULL, 0};
    dt_optimizer o, ref0, ref1;
    assert_int_equal(dt_optimizer_init(&o, c, segs, 2, 0, N), DT_OK);
    assert_int_equal(dt_optimizer_init(&ref0, &gc, &r0, 1, 0, A), DT_OK);
    assert_int_equal(dt_optimizer_init(&ref1, c, &r1, 1, A, N), DT_OK);
    float p[N], q[N], g[N];
    fill(p, N);
    memcpy(q, p, sizeof p);
    for (int t = 0; t < 4; t++) {
        fill(g, N);
        float lr = 0.02f + 0.01f * (float)t;
        assert_int_equal(dt_optimizer_step_range(&o, lr, p, g, 0, N, 1.0f), DT_OK);
        assert_int_equal(dt_optimizer_step_range(&ref0, lr * 0.5f, q, g, 0, A, 1.0f), DT_OK);
        assert_int_equal(dt_optimizer_step_range(&ref1, lr, q, g, A, N, 1.0f), DT_OK);
        dt_optimizer_finish_step(&o);
        dt_optimizer_finish_step(&ref0);
        dt_optimizer_finish_step(&ref1);
    }
    assert_memory_equal(p, q, sizeof p);
    dt_optimizer_free(&o);
    dt_optimizer_free(&ref0);
    dt_optimizer_free(&ref1);
}

static void test_group_adamw(void **st) {
    (void)st;
    dt_optim_cfg c = dt_optim_cfg_default(DT_OPTIM_ADAMW);
    c.weight_decay = 0.1f;
    group_equals_own_cfg(&c);
}

static void test_group_sgd(void **st) {
    (void)st;
    dt_optim_cfg c = dt_optim_cfg_default(DT_OPTIM_SGD);
    c.weight_decay = 0.1f;
    c.momentum = 0.9f;
    group_equals_own_cfg(&c);
}

/* One AdamW step by hand: m^ = g, v^ = g^2 after bias correction, so
 * p1 = p0 - lr_g*wd*p0 - lr_g * g / (|g| + eps) with lr_g = lr * scale. A
 * vector (decay flag 0) decays because its group sets weight_decay. */
static void test_group_adamw_by_hand(void **st) {
    (void)st;
    dt_optim_cfg c = dt_optim_cfg_default(DT_OPTIM_ADAMW);
    c.weight_decay = 0.0f;
    dt_param_hparams hp = {0.25f, 0.5f, NAN, NAN};
    dt_optim_segment seg = {0, 1, 0, NULL, &hp, 0};
    dt_optimizer o;
    assert_int_equal(dt_optimizer_init(&o, &c, &seg, 1, 0, 1), DT_OK);
    float p = 0.75f, g = -0.2f;
    assert_int_equal(dt_optimizer_step_range(&o, 0.1f, &p, &g, 0, 1, 1.0f), DT_OK);
    double lr = 0.1 * 0.25, want = 0.75 - lr * 0.5 * 0.75 - lr * (-0.2) / (0.2 + 1e-8);
    assert_true(fabs((double)p - want) < 1e-6);
    dt_optimizer_free(&o);
}

static dt_model *mlp(void) {
    dt_model_cfg c = dt_model_cfg_default(DT_MODEL_MLP);
    c.mlp_in = 6;
    c.mlp_n_hidden = 1;
    c.mlp_hidden[0] = 4;
    c.mlp_out = 3;
    dt_model *m = NULL;
    assert_int_equal(dt_model_create(&c, 1, &m), DT_OK);
    return m;
}

static const dt_param_hparams *hp_of(dt_model *m, const char *name) {
    dt_param *p = dt_model_find_param(m, name);
    assert_non_null(p);
    return &p->hp;
}

static void test_apply_groups(void **st) {
    (void)st;
    dt_model *m = mlp();   /* fc1.weight fc1.bias fc2.weight fc2.bias */
    dt_optim_group g[3] = {dt_optim_group_make("*.bias"), dt_optim_group_make("fc1.*"), dt_optim_group_make("fc1.bias")};
    g[0].weight_decay = 0.0f;
    g[1].lr_scale = 0.1f;
    g[1].beta2 = 0.99f;
    g[2].lr_scale = 0.2f;   /* later and narrower: wins for fc1.bias */
    assert_int_equal(dt_optim_apply_groups(m, g, 3), DT_OK);
    const dt_param_hparams *b1 = hp_of(m, "fc1.bias"), *w1 = hp_of(m, "fc1.weight"), *w2 = hp_of(m, "fc2.weight"),
                           *b2 = hp_of(m, "fc2.bias");
    assert_true(b1->weight_decay == 0.0f && b1->lr_scale == 0.2f && b1->beta2 == 0.99f && isnan(b1->beta1));
    assert_true(w1->lr_scale == 0.1f && isnan(w1->weight_decay) && w1->beta2 == 0.99f);
    assert_true(b2->weight_decay == 0.0f && isnan(b2->lr_scale));
    assert_true(isnan(w2->lr_scale) && isnan(w2->weight_decay) && isnan(w2->beta1) && isnan(w2->beta2));
    /* applying again replaces, it does not accumulate */
    assert_int_equal(dt_optim_apply_groups(m, g + 2, 1), DT_OK);
    assert_true(isnan(b2->weight_decay) && isnan(w1->lr_scale) && b1->lr_scale == 0.2f && isnan(b1->weight_decay));
    dt_model_free(m);
}

static void expect_error(dt_model *m, dt_optim_group g, const char *needle) {
    dt_optim_group ok = dt_optim_group_make("fc2.*");
    ok.lr_scale = 3.0f;
    dt_optim_group two[2] = {ok, g};
    assert_int_equal(dt_optim_apply_groups(m, two, 2), DT_EINVAL);
    assert_non_null(strstr(dt_error_message(), needle));
    /* nothing changed: the earlier settings stay */
    assert_true(hp_of(m, "fc1.weight")->lr_scale == 0.5f && isnan(hp_of(m, "fc2.weight")->lr_scale));
}

static void test_group_errors(void **st) {
    (void)st;
    dt_model *m = mlp();
    dt_optim_group keep = dt_optim_group_make("fc1.weight");
    keep.lr_scale = 0.5f;
    assert_int_equal(dt_optim_apply_groups(m, &keep, 1), DT_OK);
    dt_optim_group g = dt_optim_group_make("h.*");
    g.who = "--lr-scale";
    g.lr_scale = 1.0f;
    expect_error(m, g, "--lr-scale 'h.*' matches no parameter");
    g = dt_optim_group_make("fc1.bias");
    g.lr_scale = -1.0f;
    expect_error(m, g, "lr scale -1");
    g.lr_scale = NAN;
    g.weight_decay = INFINITY;
    expect_error(m, g, "weight decay inf");
    g.weight_decay = NAN;
    g.beta2 = 1.0f;
    expect_error(m, g, "betas");
    g = dt_optim_group_make("");
    expect_error(m, g, "empty name pattern");
    dt_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_group_adamw),
        cmocka_unit_test(test_group_sgd),
        cmocka_unit_test(test_group_adamw_by_hand),
        cmocka_unit_test(test_apply_groups),
        cmocka_unit_test(test_group_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
