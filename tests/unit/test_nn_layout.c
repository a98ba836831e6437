/* dt_model_set_layout: parameters move to new offsets with their values and
 * gradients, gaps are zero; bad layouts (overlap, out of range) fail and leave
 * the model untouched; a model whose gradients were dropped (ZeRO-2/3) gets no
 * gradient buffer, and dt_model_alloc_grads gives it zeroed ones back.
 * Frozen parameters take no gradient memory: the gradient layout leaves them
 * out, dt_model_refresh_grads follows requires_grad changes (in a caller's
 * buffer while it fits), and an optimizer over a stale layout is refused. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>
#include "dtrain/nn.h"
#include "dtrain/strategy.h"

static dt_model *small_mlp(void) {
    dt_model_cfg c = dt_model_cfg_default(DT_MODEL_MLP);
    c.mlp_in = 6; c.mlp_out = 3; c.mlp_n_hidden = 1; c.mlp_hidden[0] = 5;
    dt_model *m = NULL;
    assert_int_equal(dt_model_create(&c, 7, &m), DT_OK);
    return m;
}

/* copies of every parameter's values (and grads) in registration order */
static float *snapshot(const dt_model *m, int grads) {
    float *out = malloc(dt_model_num_params(m) * sizeof(float)), *o = out;
    for (int i = 0; i < m->n_params; i++) {
        const dt_param *p = m->params[i];
        memcpy(o, grads ? p->grad.data : p->value.data, (size_t)p->value.numel * sizeof(float));
        o += p->value.numel;
    }
    return out;
}

/* registration order, each parameter followed by a 3-element gap */
static size_t *gapped(const dt_model *m, size_t *total) {
    size_t *off = malloc((size_t)m->n_params * sizeof *off), pos = 0;
    for (int i = 0; i < m->n_params; i++) { off[i] = pos; pos += (size_t)m->params[i]->value.numel + 3; }
    *total = pos;
    return off;
}

static void test_move(void **state) {
    (void)state;
    dt_model *m = small_mlp();
    for (int i = 0; i < m->n_params; i++)   /* distinct gradient values to follow */
        for (int64_t k = 0; k < m->params[i]->grad.numel; k++) ((float *)m->params[i]->grad.data)[k] = (float)(i * 100 + k);
    float *v0 = snapshot(m, 0), *g0 = snapshot(m, 1);
    size_t total, *off = gapped(m, &total);
    assert_int_equal(dt_model_set_layout(m, off, total), DT_OK);
    assert_int_equal(m->param_flat.numel, total);
    assert_int_equal(m->grad_flat.numel, total);
    float *v1 = snapshot(m, 0), *g1 = snapshot(m, 1);
    size_t n = dt_model_num_params(m);
    assert_memory_equal(v0, v1, n * sizeof(float));
    assert_memory_equal(g0, g1, n * sizeof(float));
    for (int i = 0; i < m->n_params; i++) {
        dt_param *p = m->params[i];
        assert_int_equal(m->offsets[i], off[i]);
        assert_ptr_equal(p->value.data, m->param_flat.data + off[i]);
        assert_ptr_equal(p->grad.data, m->grad_flat.data + off[i]);
        for (int k = 0; k < 3; k++) {   /* the gap after it */
            assert_true(m->param_flat.data[off[i] + (size_t)p->value.numel + (size_t)k] == 0.0f);
            assert_true(m->grad_flat.data[off[i] + (size_t)p->value.numel + (size_t)k] == 0.0f);
        }
    }
    free(v0); free(g0); free(v1); free(g1); free(off);
    dt_model_free(m);
}

static void test_bad_layouts(void **state) {
    (void)state;
    dt_model *m = small_mlp();
    float *v0 = snapshot(m, 0), *old_flat = m->param_flat.data;
    size_t total, *off = gapped(m, &total);
    off[1] = off[0];   /* overlap */
    assert_int_equal(dt_model_set_layout(m, off, total), DT_EINVAL);
    assert_non_null(strstr(dt_error_message(), "overlap"));
    free(off);
    off = gapped(m, &total);
    assert_int_equal(dt_model_set_layout(m, off, total - 4), DT_EINVAL);   /* last one past the end */
    assert_non_null(strstr(dt_error_message(), "exceeds"));
    assert_ptr_equal(m->param_flat.data, old_flat);
    float *v1 = snapshot(m, 0);
    assert_memory_equal(v0, v1, dt_model_num_params(m) * sizeof(float));
    free(v0); free(v1); free(off);
    dt_model_free(m);
}

static void test_without_grads(void **state) {
    (void)state;
    dt_model *m = small_mlp();
    float *v0 = snapshot(m, 0);
    dt_model_drop_grads(m);   /* what ZeRO-2/3 does */
    size_t total, *off = gapped(m, &total);
    assert_int_equal(dt_model_set_layout(m, off, total), DT_OK);
    assert_null(m->grad_flat.data);
    for (int i = 0; i < m->n_params; i++) assert_null(m->params[i]->grad.data);
    assert_int_equal(dt_model_alloc_grads(m), DT_OK);
    assert_int_equal(m->grad_flat.numel, total);
    for (int i = 0; i < m->n_params; i++) {
        assert_ptr_equal(m->params[i]->grad.data, m->grad_flat.data + off[i]);
        for (int64_t k = 0; k < m->params[i]->grad.numel; k++) assert_true(((float *)m->params[i]->grad.data)[k] == 0.0f);
    }
    float *v1 = snapshot(m, 0);
    assert_memory_equal(v0, v1, dt_model_num_params(m) * sizeof(float));
    free(v0); free(v1); free(off);
    dt_model_free(m);
}

/* Gradients moved into caller memory (DDP's node-shared buffer) and back:
 * values kept, views re-pointed, the borrowed buffer never freed by the model. */
static void test_grad_buffer(void **state) {
    (void)state;
    dt_model *m = small_mlp();
    size_t n = m->param_flat.numel;
    for (size_t i = 0; i < n; i++) m->grad_flat.data[i] = (float)i * 0.25f - 3.0f;
    float *g0 = snapshot(m, 1);
    float *buf = malloc((n + 8) * sizeof *buf);
    for (size_t i = 0; i < n + 8; i++) buf[i] = 99.0f;
    assert_int_equal(dt_model_set_grad_buffer(m, buf), DT_OK);
    assert_ptr_equal(m->grad_flat.data, buf);
    assert_true(m->grad_flat.borrowed);
    for (int i = 0; i < m->n_params; i++) assert_ptr_equal(m->params[i]->grad.data, buf + m->offsets[i]);
    float *g1 = snapshot(m, 1);
    assert_memory_equal(g0, g1, dt_model_num_params(m) * sizeof(float));
    assert_true(buf[n] == 99.0f);   /* nothing written past the layout */
    dt_model_zero_grad(m);
    buf[0] = 5.0f;                  /* the model sees writes to the caller's memory */
    assert_int_equal(m->offsets[m->n_params - 1], 0);   /* reverse registration order */
    assert_true(((float *)m->params[m->n_params - 1]->grad.data)[0] == 5.0f);
    assert_int_equal(dt_model_set_grad_buffer(m, NULL), DT_OK);   /* back to private memory */
    assert_false(m->grad_flat.borrowed);
    assert_true(m->grad_flat.data != buf);
    assert_true(m->grad_flat.data[0] == 5.0f);
    for (int i = 0; i < m->n_params; i++) assert_ptr_equal(m->params[i]->grad.data, m->grad_flat.data + m->offsets[i]);
    free(buf);   /* the model no longer refers to it (ASan would see a use after free) */
    dt_model_zero_grad(m);
    free(g0); free(g1);
    dt_model_free(m);
}

/* each parameter's gradient filled with index*100 + k */
static void mark_grads(dt_model *m) {
    for (int i = 0; i < m->n_params; i++)
        for (int64_t k = 0; k < m->params[i]->grad.numel; k++) ((float *)m->params[i]->grad.data)[k] = (float)(i * 100 + k);
}
static void check_marks(const dt_param *p, int mark) {
    for (int64_t k = 0; k < p->value.numel; k++) assert_true(((const float *)p->grad.data)[k] == (float)(mark * 100 + k));
}
static void check_zero(const dt_param *p) {
    for (int64_t k = 0; k < p->value.numel; k++) assert_true(((const float *)p->grad.data)[k] == 0.0f);
}

/* MLP 6-5-3 at the default layout (reverse registration order): fc2.bias
 * [0, 3), fc2.weight [3, 18), fc1.bias [18, 23), fc1.weight [23, 53). */
static void test_frozen_take_no_grad_memory(void **state) {
    (void)state;
    dt_model *m = small_mlp();
    assert_int_equal(m->grad_flat.numel, 53);
    mark_grads(m);
    assert_int_equal(dt_model_freeze(m, "fc2.*"), 2);
    assert_int_equal(dt_model_refresh_grads(m), DT_OK);
    assert_int_equal(m->grad_flat.numel, 35);   /* 53 - 15 - 3 */
    assert_int_equal(dt_model_grad_numel(m), 35);
    assert_int_equal(dt_model_num_trainable(m), 35);
    dt_param *w1 = dt_model_find_param(m, "fc1.weight"), *b1 = dt_model_find_param(m, "fc1.bias");
    dt_param *w2 = dt_model_find_param(m, "fc2.weight"), *b2 = dt_model_find_param(m, "fc2.bias");
    assert_null(w2->grad.data);
    assert_null(b2->grad.data);
    assert_ptr_equal(b1->grad.data, m->grad_flat.data + 0);   /* 18 - 18 */
    assert_ptr_equal(w1->grad.data, m->grad_flat.data + 5);   /* 23 - 18 */
    assert_int_equal(dt_model_grad_offset(m, 18), 0);
    assert_int_equal(dt_model_grad_offset(m, 23), 5);
    check_marks(w1, w1->index);   /* kept through the re-layout */
    check_marks(b1, b1->index);
    assert_int_equal(dt_model_refresh_grads(m), DT_OK);   /* unchanged: no-op, same buffer */
    float *same = m->grad_flat.data;
    assert_int_equal(dt_model_refresh_grads(m), DT_OK);
    assert_ptr_equal(m->grad_flat.data, same);

    /* a layout with gaps, fc1.weight frozen instead: registration order, 3 apart:
     * fc1.weight [0, 30), fc1.bias [33, 38), fc2.weight [41, 56), fc2.bias [59, 62) */
    w2->requires_grad = b2->requires_grad = 1;
    w1->requires_grad = 0;
    size_t total, *off = gapped(m, &total);
    assert_int_equal(total, 65);
    assert_int_equal(dt_model_set_layout(m, off, total), DT_OK);
    assert_int_equal(m->grad_flat.numel, 35);   /* 65 - 30 */
    assert_null(w1->grad.data);
    assert_ptr_equal(b1->grad.data, m->grad_flat.data + 3);
    assert_ptr_equal(w2->grad.data, m->grad_flat.data + 11);
    assert_ptr_equal(b2->grad.data, m->grad_flat.data + 29);
    check_marks(b1, b1->index);
    check_zero(w2);   /* newly trainable: zeros */
    check_zero(b2);
    free(off);
    dt_model_free(m);
}

/* In the caller's buffer: a refresh that fits stays in it, one that needs
 * more moves to private memory (values kept both times). */
static void test_refresh_in_borrowed_buffer(void **state) {
    (void)state;
    dt_model *m = small_mlp();
    mark_grads(m);
    assert_int_equal(dt_model_freeze(m, "fc1.weight"), 1);
    float *buf = malloc(64 * sizeof *buf);
    for (int i = 0; i < 64; i++) buf[i] = 99.0f;
    assert_int_equal(dt_model_set_grad_buffer(m, buf), DT_OK);   /* 53 - 30 = 23 floats */
    assert_ptr_equal(m->grad_flat.data, buf);
    assert_int_equal(m->grad_flat.numel, 23);
    assert_true(buf[23] == 99.0f);   /* nothing past the layout */
    dt_param *w1 = dt_model_find_param(m, "fc1.weight"), *b1 = dt_model_find_param(m, "fc1.bias");
    dt_param *w2 = dt_model_find_param(m, "fc2.weight");
    assert_null(w1->grad.data);
    check_marks(b1, b1->index);
    assert_int_equal(dt_model_freeze(m, "fc1.bias"), 1);   /* smaller: stays in buf */
    assert_int_equal(dt_model_refresh_grads(m), DT_OK);
    assert_ptr_equal(m->grad_flat.data, buf);
    assert_int_equal(m->grad_flat.numel, 18);
    assert_null(b1->grad.data);
    check_marks(w2, w2->index);
    w1->requires_grad = b1->requires_grad = 1;   /* larger than buf's 23: private */
    assert_int_equal(dt_model_refresh_grads(m), DT_OK);
    assert_false(m->grad_flat.borrowed);
    assert_int_equal(m->grad_flat.numel, 53);
    check_marks(w2, w2->index);
    check_zero(w1);
    free(buf);   /* the model no longer refers to it (ASan would see a use after free) */
    dt_model_zero_grad(m);
    dt_model_free(m);
}

/* requires_grad changed without dt_model_refresh_grads: an optimizer over
 * the model names the parameter instead of reading a gradient it lacks. */
static void test_stale_layout_refused(void **state) {
    (void)state;
    dt_model *m = small_mlp();
    assert_int_equal(dt_model_freeze(m, "fc2.weight"), 1);
    assert_int_equal(dt_model_refresh_grads(m), DT_OK);
    dt_model_find_param(m, "fc2.weight")->requires_grad = 1;
    dt_optim_cfg oc = dt_optim_cfg_default(DT_OPTIM_ADAMW);
    dt_optimizer o;
    assert_int_equal(dt_optimizer_init_model(&o, &oc, m), DT_ESTATE);
    assert_non_null(strstr(dt_error_message(), "fc2.weight"));
    assert_non_null(strstr(dt_error_message(), "dt_model_refresh_grads"));
    assert_int_equal(dt_model_refresh_grads(m), DT_OK);
    assert_int_equal(dt_optimizer_init_model(&o, &oc, m), DT_OK);
    dt_optimizer_free(&o);
    dt_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_move),
        cmocka_unit_test(test_bad_layouts),
        cmocka_unit_test(test_without_grads),
        cmocka_unit_test(test_grad_buffer),
        cmocka_unit_test(test_frozen_take_no_grad_memory),
        cmocka_unit_test(test_refresh_in_borrowed_buffer),
        cmocka_unit_test(test_stale_layout_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
