/* The tensor-parallel boundary ops (ops.h dt_op_tp_copy / dt_op_tp_reduce)
 * against their definition, with a fake group: a comm of size 2 whose
 * all-reduce adds a fixed "peer" contribution and counts its calls.
 *   tp_copy:   y == x (no call); backward dx += dy + peer (one call of numel)
 *   tp_reduce: y == x + peer (one call); backward dx += dy (no call)
 * Gradients start nonzero (+= checked). Size 1 calls nothing. Errors: no
 * comm, a failing all-reduce in forward (NULL, naming the op) and in
 * backward (backward returns it). Without the ops this file does not link. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <string.h>
#include "dtrain/autograd.h"
#include "dtrain/ops.h"

enum { N = 12 };
typedef struct fake { float peer[N]; int calls; int64_t last_n; int fail; } fake;

static dt_status fake_sum(void *ctx, float *buf, int64_t n) {
    fake *f = ctx;
    f->calls++;
    f->last_n = n;
    if (f->fail) return DT_ERR(DT_ECOMM, "fake group down");
    for (int64_t i = 0; i < n; i++) buf[i] += f->peer[i];
    return DT_OK;
}

typedef struct fix { fake f; dt_tp_comm c; dt_param x; dt_graph *g; float dy[N]; } fix;

static int setup(void **state) {
    fix *s = test_calloc(1, sizeof *s);
    s->c = (dt_tp_comm){.rank = 0, .size = 2, .allreduce_sum = fake_sum, .ctx = &s->f};
    int64_t shape[2] = {3, 4};
    if (dt_param_init(&s->x, "x", 2, shape) != DT_OK) return -1;
    for (int i = 0; i < N; i++) {
        dt_f32(&s->x.value)[i] = 0.25f * (float)i - 1.0f;
        dt_f32(&s->x.grad)[i] = 0.5f;   /* += is checked */
        s->f.peer[i] = 100.0f + (float)i;
        s->dy[i] = 1.0f / (float)(i + 1);
    }
    s->g = dt_graph_create();
    *state = s;
    return s->g ? 0 : -1;
}
static int teardown(void **state) {
    fix *s = *state;
    dt_graph_free(s->g);
    dt_param_free(&s->x);
    test_free(s);
    return 0;
}

static void copy_forward_identity_backward_sums(void **state) {
    fix *s = *state;
    dt_tensor *y = dt_op_tp_copy(s->g, &s->x.value, &s->c);
    assert_non_null(y);
    assert_int_equal(s->f.calls, 0);
    assert_memory_equal(y->data, s->x.value.data, N * sizeof(float));
    assert_int_equal(dt_graph_backward_from(s->g, y, s->dy), DT_OK);
    assert_int_equal(s->f.calls, 1);
    assert_int_equal(s->f.last_n, N);
    for (int i = 0; i < N; i++) assert_true(dt_f32(&s->x.grad)[i] == 0.5f + (s->dy[i] + s->f.peer[i]));
}

static void reduce_forward_sums_backward_identity(void **state) {
    fix *s = *state;
    dt_tensor *y = dt_op_tp_reduce(s->g, &s->x.value, &s->c);
    assert_non_null(y);
    assert_int_equal(s->f.calls, 1);
    assert_int_equal(s->f.last_n, N);
    for (int i = 0; i < N; i++) assert_true(dt_f32(y)[i] == dt_f32(&s->x.value)[i] + s->f.peer[i]);
    assert_int_equal(dt_graph_backward_from(s->g, y, s->dy), DT_OK);
    assert_int_equal(s->f.calls, 1);
    for (int i = 0; i < N; i++) assert_true(dt_f32(&s->x.grad)[i] == 0.5f + s->dy[i]);
}

static void size_one_calls_nothing(void **state) {
    fix *s = *state;
    s->c.size = 1;
    s->c.allreduce_sum = NULL;
    dt_tensor *y = dt_op_tp_reduce(s->g, &s->x.value, &s->c);
    assert_non_null(y);
    y = dt_op_tp_copy(s->g, y, &s->c);
    assert_non_null(y);
    assert_memory_equal(y->data, s->x.value.data, N * sizeof(float));
    assert_int_equal(dt_graph_backward_from(s->g, y, s->dy), DT_OK);
    for (int i = 0; i < N; i++) assert_true(dt_f32(&s->x.grad)[i] == 0.5f + s->dy[i]);
}

static void no_comm_is_an_error(void **state) {
    fix *s = *state;
    assert_null(dt_op_tp_copy(s->g, &s->x.value, NULL));
    assert_int_equal(dt_error_code(), DT_EINVAL);
    assert_non_null(strstr(dt_error_message(), "tp_copy"));
    s->c.rank = 2;   /* outside 0..size-1 */
    assert_null(dt_op_tp_reduce(s->g, &s->x.value, &s->c));
    assert_non_null(strstr(dt_error_message(), "tp_reduce"));
}

static void failing_group_forward(void **state) {
    fix *s = *state;
    s->f.fail = 1;
    assert_null(dt_op_tp_reduce(s->g, &s->x.value, &s->c));
    assert_int_equal(dt_error_code(), DT_ECOMM);
    assert_non_null(strstr(dt_error_message(), "tp_reduce"));
    assert_non_null(strstr(dt_error_message(), "fake group down"));
}

static void failing_group_backward(void **state) {
    fix *s = *state;
    dt_tensor *y = dt_op_tp_copy(s->g, &s->x.value, &s->c);
    assert_non_null(y);
    s->f.fail = 1;
    assert_int_equal(dt_graph_backward_from(s->g, y, s->dy), DT_ECOMM);
    assert_non_null(strstr(dt_error_message(), "tp_copy"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(copy_forward_identity_backward_sums, setup, teardown),
        cmocka_unit_test_setup_teardown(reduce_forward_sums_backward_identity, setup, teardown),
        cmocka_unit_test_setup_teardown(size_one_calls_nothing, setup, teardown),
        cmocka_unit_test_setup_teardown(no_comm_is_an_error, setup, teardown),
        cmocka_unit_test_setup_teardown(failing_group_forward, setup, teardown),
        cmocka_unit_test_setup_teardown(failing_group_backward, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
