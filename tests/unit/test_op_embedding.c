/* dt_op_embedding: gathered rows, output shape, gradient with repeated ids
 * (scatter-add), out-of-range ids and shape mismatches are errors. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include "op_test_util.h"

typedef struct emb_ctx { const int32_t *ids; int64_t n; int ndim; int64_t shape[3]; } emb_ctx;

static dt_tensor *f_emb(dt_graph *g, dt_param **in, void *ctx) {
    emb_ctx *c = ctx;
    return dt_op_embedding(g, &in[0]->value, c->ids, c->n, c->ndim, c->shape);
}

static void test_forward_and_grad(void **state) {
    (void)state;
    int64_t ws[2] = {5, 3};
    dt_param w;
    opt_param(&w, "w", 2, ws, 1, 1.0f);
    int32_t ids[6] = {4, 0, 4, 2, 4, 0};   /* repeats; ids 1 and 3 unused */
    emb_ctx c = {ids, 6, 3, {2, 3, 3}};
    dt_graph *g = dt_graph_create();
    dt_tensor *y = f_emb(g, (dt_param *[]){&w}, &c);
    opt_assert_shape(y, 3, c.shape);
    for (int i = 0; i < 6; i++)
        for (int k = 0; k < 3; k++) assert_float_equal(dt_f32(y)[i * 3 + k], dt_f32(&w.value)[ids[i] * 3 + k], 0.0);
    dt_graph_free(g);
    dt_param *in[1] = {&w};
    assert_int_equal(dt_gradcheck(f_emb, &c, in, 1, NULL), 0);
    /* rows never looked up get exactly zero gradient */
    for (int k = 0; k < 3; k++) {
        assert_float_equal(dt_f32(&w.grad)[1 * 3 + k], 0.0f, 0.0);
        assert_float_equal(dt_f32(&w.grad)[3 * 3 + k], 0.0f, 0.0);
    }
    dt_param_free(&w);
}

/* C spanning several column blocks, many repeated ids: OpenMP scatter path. */
static void test_grad_large(void **state) {
    (void)state;
    int64_t ws[2] = {17, 200};
    dt_param w;
    opt_param(&w, "w", 2, ws, 2, 1.0f);
    int32_t ids[300];
    for (int i = 0; i < 300; i++) ids[i] = (int32_t)((i * 7) % 17);
    emb_ctx c = {ids, 300, 2, {300, 200}};
    dt_param *in[1] = {&w};
    dt_gc_opts o = {.seed = 3, .max_checks = 80};
    assert_int_equal(dt_gradcheck(f_emb, &c, in, 1, &o), 0);
    dt_param_free(&w);
}

static void test_bad_args(void **state) {
    (void)state;
    int64_t ws[2] = {5, 3}, sh[2] = {2, 3}, bad[2] = {2, 4};
    dt_param w;
    opt_param(&w, "w", 2, ws, 1, 1.0f);
    int32_t ids[2] = {1, 5}, neg[2] = {-1, 0}, ok[2] = {1, 4};
    dt_graph *g = dt_graph_create();
    opt_expect_error(dt_op_embedding(g, &w.value, ids, 2, 2, sh), "embedding");
    assert_non_null(strstr(dt_error_message(), "5"));
    opt_expect_error(dt_op_embedding(g, &w.value, neg, 2, 2, sh), "embedding");
    opt_expect_error(dt_op_embedding(g, &w.value, ok, 2, 2, bad), "embedding");
    opt_expect_error(dt_op_embedding(g, &w.value, NULL, 2, 2, sh), "embedding");
    opt_expect_error(dt_op_embedding(g, NULL, ok, 2, 2, sh), "embedding");
    assert_non_null(dt_op_embedding(g, &w.value, ok, 2, 2, sh));
    dt_graph_free(g);
    dt_param_free(&w);
}

static void test_input_used_twice(void **state) {
    (void)state;
    int64_t ws[2] = {4, 3};
    dt_param w;
    opt_param(&w, "w", 2, ws, 131, 1.0f);
    int32_t ids[3] = {2, 0, 2};
    emb_ctx c = {ids, 3, 2, {3, 3}};
    dt_param *in[1] = {&w};
    assert_int_equal(opt_gradcheck_twice(f_emb, &c, in, 1), 0);
    dt_param_free(&w);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_forward_and_grad),
        cmocka_unit_test(test_grad_large),
        cmocka_unit_test(test_input_used_twice),
        cmocka_unit_test(test_bad_args),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
