/* GPT-2: HF names/shapes, finite decreasing loss, and gradients (including the
 * tied wte, used by the embedding and the lm-head) match finite differences. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <math.h>
#include <string.h>
#include "dtrain/nn.h"
#include "dtrain/optim.h"
#include "gradcheck.h"

static dt_model_cfg tiny(void) {
    dt_model_cfg c = dt_model_cfg_default(DT_MODEL_GPT2);
    c.n_layer = 2; c.n_embd = 12; c.n_head = 3; c.vocab = 11; c.max_t = 8;
    return c;
}

static int32_t ids[2 * 5] = {1, 4, 2, 7, 1, 3, 3, 9, 0, 5};
static int32_t tgt[2 * 5] = {4, 2, 7, 1, 3, 3, 9, 0, 5, 6};

/* ids [B, T] as the batch's "ids" input */
static dt_batch ids_batch(int64_t B, int64_t T) {
    dt_batch b = {.B = B, .T = T, .y = tgt};
    assert_int_equal(dt_batch_add_input(&b, "ids", DT_I32, 2, (int64_t[]){B, T}, ids), DT_OK);
    return b;
}

static dt_tensor *model_loss(dt_graph *g, dt_param **in, void *ctx) {
    (void)in;
    dt_batch b = ids_batch(2, 5);
    return dt_model_forward(ctx, g, &b, NULL);
}

static void test_names_and_shapes(void **state) {
    (void)state;
    dt_model_cfg c = tiny();
    dt_model *m;
    assert_int_equal(dt_model_create(&c, 1, &m), DT_OK);
    const char *names[] = {"wte.weight", "wpe.weight", "h.0.ln_1.weight", "h.0.attn.c_attn.weight",
                           "h.1.mlp.c_proj.bias", "ln_f.bias"};
    for (int i = 0; i < 6; i++) assert_non_null(dt_model_find_param(m, names[i]));
    dt_param *ca = dt_model_find_param(m, "h.0.attn.c_attn.weight");
    assert_int_equal(ca->value.shape[0], 12);
    assert_int_equal(ca->value.shape[1], 36);   /* Conv1D layout [in, out] */
    assert_string_equal(m->params[0]->name, "wte.weight");
    assert_int_equal(m->n_params, 2 + 2 * 12 + 2);
    /* flat layout: reverse registration order, contiguous */
    assert_int_equal(m->offsets[m->n_params - 1], 0);
    assert_true(dt_f32(&m->params[0]->value) == m->param_flat.data + m->offsets[0]);
    dt_model_free(m);
}

static void test_gradients_match_finite_differences(void **state) {
    (void)state;
    dt_model_cfg c = tiny();
    dt_model *m;
    assert_int_equal(dt_model_create(&c, 2, &m), DT_OK);
    dt_param *check[4] = {dt_model_find_param(m, "wte.weight"), dt_model_find_param(m, "h.1.attn.c_attn.weight"),
                          dt_model_find_param(m, "h.0.ln_2.weight"), dt_model_find_param(m, "wpe.weight")};
    /* Scale weights up so the loss is sensitive enough for float differences. */
    for (int i = 0; i < 4; i++)
        for (int64_t k = 0; k < check[i]->value.numel; k++) dt_f32(&check[i]->value)[k] *= check[i] == check[2] ? 1.f : 10.f;
    dt_gc_opts o = {.eps = 1e-2, .rtol = 5e-2, .atol = 2e-3, .max_checks = 40};
    assert_int_equal(dt_gradcheck(model_loss, m, check, 4, &o), 0);
    /* The tied weight gets both uses: rows of tokens absent from the input still
     * get a gradient (lm-head), and a row present in the input differs from a
     * pure lm-head gradient — the finite-difference match above covers both. */
    dt_param *wte = check[0];
    double absent = 0;
    for (int k = 0; k < 12; k++) absent += fabs(dt_f32(&wte->grad)[8 * 12 + k]);   /* token 8 never input */
    assert_true(absent > 0);
    dt_model_free(m);
}

static void test_loss_finite_and_decreasing(void **state) {
    (void)state;
    dt_model_cfg c = tiny();
    dt_model *m;
    assert_int_equal(dt_model_create(&c, 3, &m), DT_OK);
    dt_optim_cfg oc = dt_optim_cfg_default(DT_OPTIM_ADAMW);
    oc.lr = 1e-2f;
    dt_optimizer opt;
    dt_optim_segment seg = {0, m->param_flat.numel, 1, NULL, NULL, 0};
    assert_int_equal(dt_optimizer_init(&opt, &oc, &seg, 1, 0, m->param_flat.numel), DT_OK);
    dt_graph *g = dt_graph_create();
    dt_batch b = ids_batch(2, 5);
    float first = 0, last = 0;
    for (int s = 0; s < 30; s++) {
        dt_graph_reset(g);
        dt_tensor *loss = dt_model_forward(m, g, &b, NULL);
        assert_non_null(loss);
        float l = dt_f32(loss)[0];
        assert_true(isfinite(l));
        if (s == 0) { first = l; assert_true(fabsf(l - logf(11.f)) < 0.5f); }
        last = l;
        assert_int_equal(dt_graph_backward(g, loss), DT_OK);
        assert_int_equal(dt_optimizer_step_range(&opt, oc.lr, m->param_flat.data, m->grad_flat.data, 0, m->param_flat.numel, 1.f), DT_OK);
        dt_optimizer_finish_step(&opt);
        dt_model_zero_grad(m);
    }
    assert_true(last < 0.5f * first);
    /* bad input: sequence longer than maxT is an error, not a crash */
    dt_batch bad = ids_batch(1, 9);
    dt_graph_reset(g);
    assert_null(dt_model_forward(m, g, &bad, NULL));
    assert_non_null(strstr(dt_error_message(), "maxT"));
    dt_graph_free(g);
    dt_optimizer_free(&opt);
    dt_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names_and_shapes),
        cmocka_unit_test(test_gradients_match_finite_differences),
        cmocka_unit_test(test_loss_finite_and_decreasing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
