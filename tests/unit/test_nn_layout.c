/* dt_model_set_layout: parameters move to new offsets with their values and
 * gradients, gaps are zero; bad layouts (overlap, out of range) fail and leave
 * the model untouched; a model whose gradients were dropped (ZeRO-2/3) gets no
 * gradient buffer, and dt_model_alloc_grads gives it zeroed ones back. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>
#include "dtrain/nn.h"

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

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_move),
        cmocka_unit_test(test_bad_layouts),
        cmocka_unit_test(test_without_grads),
        cmocka_unit_test(test_grad_buffer),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
