/* Autograd: grad-ready fires once per used parameter after all its uses,
 * module hooks fire in the documented order, no-grad records nothing. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdio.h>
#include <string.h>
#include "dtrain/ops.h"
#include "gradcheck.h"

typedef struct probe {
    const char *order[16]; int n;
    float grad_at_fire[16];   /* grad[0] of the param when its hook fired */
} probe;

static dt_status on_ready(dt_param *p, void *user) {
    probe *pr = user;
    pr->grad_at_fire[pr->n] = dt_f32(&p->grad)[0];
    pr->order[pr->n++] = p->name;
    return DT_OK;
}

/* y = relu(x W^T) W'... : W used twice (like GPT-2's tied wte), U once, Z never. */
static void test_grad_ready_once_after_all_uses(void **state) {
    (void)state;
    dt_param W, U, Z, X;
    int64_t ws[2] = {3, 3}, xs[2] = {2, 3};
    assert_int_equal(dt_param_init(&W, "W", 2, ws), DT_OK);
    assert_int_equal(dt_param_init(&U, "U", 2, ws), DT_OK);
    assert_int_equal(dt_param_init(&Z, "Z", 2, ws), DT_OK);
    assert_int_equal(dt_param_init(&X, "X", 2, xs), DT_OK);
    dt_gc_fill(&W, 1, 0.5f); dt_gc_fill(&U, 2, 0.5f); dt_gc_fill(&X, 3, 1.0f);
    X.requires_grad = 0; X.value.requires_grad = 0;
    probe pr = {0};
    dt_param *ps[3] = {&W, &U, &Z};
    for (int i = 0; i < 3; i++) { ps[i]->on_grad_ready = on_ready; ps[i]->on_grad_ready_user = &pr; }
    int32_t tgt[2] = {0, 2};
    dt_graph *g = dt_graph_create();
    dt_tensor *h = dt_op_linear(g, &X.value, &W.value, NULL, DT_W_OUT_IN);
    h = dt_op_linear(g, h, &U.value, NULL, DT_W_OUT_IN);
    h = dt_op_linear(g, h, &W.value, NULL, DT_W_OUT_IN);   /* second use of W */
    dt_tensor *loss = dt_op_cross_entropy(g, h, tgt);
    assert_non_null(loss);
    assert_int_equal(dt_graph_param_uses(g, &W), 2);
    assert_int_equal(dt_graph_param_uses(g, &U), 1);
    assert_int_equal(dt_graph_param_uses(g, &Z), 0);
    assert_int_equal(dt_graph_backward(g, loss), DT_OK);
    assert_int_equal(pr.n, 2);                    /* Z unused: no call */
    assert_string_equal(pr.order[0], "U");        /* U's only use is reached before W's first use */
    assert_string_equal(pr.order[1], "W");
    assert_true(pr.grad_at_fire[1] == dt_f32(&W.grad)[0]);   /* final when fired */
    /* a second backward on the same tape is refused */
    assert_int_equal(dt_graph_backward(g, loss), DT_ESTATE);
    dt_graph_free(g);
    dt_param_free(&W); dt_param_free(&U); dt_param_free(&Z); dt_param_free(&X);
}

typedef struct mod_log { char ev[16][128]; int n; } mod_log;
static dt_status mod_hook(dt_module *m, dt_module_hook_kind k, void *user) {
    static const char *names[] = {"pre_fwd", "post_fwd", "pre_bwd", "post_bwd"};
    mod_log *l = user;
    snprintf(l->ev[l->n++], 128, "%s:%s", m->name, names[k]);
    return DT_OK;
}

static void test_module_hook_order(void **state) {
    (void)state;
    dt_param W, X;
    int64_t ws[2] = {2, 2};
    assert_int_equal(dt_param_init(&W, "a.W", 2, ws), DT_OK);
    assert_int_equal(dt_param_init(&X, "X", 2, ws), DT_OK);
    dt_gc_fill(&W, 4, 1.f); dt_gc_fill(&X, 5, 1.f);
    mod_log log = {0};
    dt_module a = {.hook = mod_hook, .hook_user = &log}, b = {.hook = mod_hook, .hook_user = &log};
    strcpy(a.name, "a"); strcpy(b.name, "b");
    int32_t tgt[2] = {1, 0};
    dt_graph *g = dt_graph_create();
    assert_int_equal(dt_module_enter(g, &a), DT_OK);
    dt_tensor *h = dt_op_linear(g, &X.value, &W.value, NULL, DT_W_OUT_IN);
    assert_int_equal(dt_module_leave(g, &a), DT_OK);
    assert_int_equal(dt_module_enter(g, &b), DT_OK);
    h = dt_op_relu(g, h);
    assert_int_equal(dt_module_leave(g, &b), DT_OK);
    dt_tensor *loss = dt_op_cross_entropy(g, h, tgt);
    assert_int_equal(dt_graph_backward(g, loss), DT_OK);
    const char *want[] = {"a:pre_fwd", "a:post_fwd", "b:pre_fwd", "b:post_fwd",
                          "b:pre_bwd", "b:post_bwd", "a:pre_bwd", "a:post_bwd"};
    assert_int_equal(log.n, 8);
    for (int i = 0; i < 8; i++) assert_string_equal(log.ev[i], want[i]);
    dt_graph_free(g);
    dt_param_free(&W); dt_param_free(&X);
}

static void test_no_grad_records_nothing(void **state) {
    (void)state;
    dt_param W, X;
    int64_t ws[2] = {2, 2};
    assert_int_equal(dt_param_init(&W, "W", 2, ws), DT_OK);
    assert_int_equal(dt_param_init(&X, "X", 2, ws), DT_OK);
    dt_gc_fill(&W, 6, 1.f);
    dt_graph *g = dt_graph_create();
    dt_graph_set_grad_enabled(g, 0);
    int32_t tgt[2] = {1, 0};
    dt_tensor *loss = dt_op_cross_entropy(g, dt_op_linear(g, &X.value, &W.value, NULL, DT_W_OUT_IN), tgt);
    assert_non_null(loss);
    assert_false(loss->requires_grad);
    assert_int_equal(dt_graph_param_uses(g, &W), 0);
    assert_int_equal(dt_graph_backward(g, loss), DT_ESTATE);
    assert_non_null(strstr(dt_error_message(), "grad"));
    /* reset clears use counts for the next step */
    dt_graph_set_grad_enabled(g, 1);
    dt_op_linear(g, &X.value, &W.value, NULL, DT_W_OUT_IN);
    assert_int_equal(dt_graph_param_uses(g, &W), 1);
    dt_graph_reset(g);
    assert_int_equal(dt_graph_param_uses(g, &W), 0);
    dt_graph_free(g);
    dt_param_free(&W); dt_param_free(&X);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_grad_ready_once_after_all_uses),
        cmocka_unit_test(test_module_hook_order),
        cmocka_unit_test(test_no_grad_records_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
