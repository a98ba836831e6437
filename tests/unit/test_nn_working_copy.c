/* dt_working_copy (nn.h): the 16-bit working copy of a model's parameters.
 *  - enter points every parameter's value at a buffer holding its master
 *    rounded to bf16 / fp16 (our own rounding here, not dtrain's converter),
 *    the 1-D ones (biases) exact, and leaves the masters in param_flat
 *    untouched; leave points them back;
 *  - enter after the masters changed rounds them again (a step's update is
 *    seen by the next step); enter twice is once;
 *  - fp32 does nothing (the views stay the masters);
 *  - fp16 refuses a master beyond 65504, naming the parameter, and leaves
 *    the views on the masters; a bias beyond it is kept exact, not refused. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "dtrain/error.h"
#include "dtrain/nn.h"

static dt_model *small_mlp(void) {
    dt_model_cfg c = dt_model_cfg_default(DT_MODEL_MLP);
    c.mlp_in = 12; c.mlp_out = 4; c.mlp_n_hidden = 1; c.mlp_hidden[0] = 9;
    dt_model *m = NULL;
    assert_int_equal(dt_model_create(&c, 7, &m), DT_OK);
    return m;
}

static float round_bf16(float x) {   /* nearest even */
    uint32_t u;
    memcpy(&u, &x, 4);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    memcpy(&x, &u, 4);
    return x;
}
static float round_f16(float x) { return (float)(_Float16)x; }

/* every parameter's view is the rounded master, bit for bit -- the biases
 * (1-D) the master itself, which carries more bits -- and not the master's memory */
static void expect_rounded(const dt_model *m, const float *masters, dt_dtype t) {
    int n_bias = 0;
    for (int i = 0; i < m->n_params; i++) {
        const dt_param *p = m->params[i];
        const float *v = p->value.data, *mv = masters + m->offsets[i];
        int bias = p->value.ndim == 1;
        size_t unrounded = 0;
        n_bias += bias;
        assert_ptr_not_equal(v, m->param_flat.data + m->offsets[i]);
        for (int64_t k = 0; k < p->value.numel; k++) {
            float r = t == DT_BF16 ? round_bf16(mv[k]) : round_f16(mv[k]);
            float want = bias ? mv[k] : r;
            assert_memory_equal(&v[k], &want, 4);
            unrounded += r != mv[k];
        }
        if (bias) assert_true(unrounded > 0);   /* so "exact" is not "rounded" here */
    }
    assert_int_equal(n_bias, 2);   /* the MLP's two biases */
}

static void expect_masters(const dt_model *m) {
    for (int i = 0; i < m->n_params; i++) assert_ptr_equal(m->params[i]->value.data, m->param_flat.data + m->offsets[i]);
}

static void check_dtype(dt_dtype t) {
    dt_model *m = small_mlp();
    size_t n = m->param_flat.numel;
    float *before = malloc(n * sizeof *before);
    memcpy(before, m->param_flat.data, n * sizeof *before);
    dt_working_copy w = {.dtype = t};
    assert_int_equal(dt_working_copy_enter(&w, m), DT_OK);
    assert_int_equal(dt_working_copy_enter(&w, m), DT_OK);   /* once */
    expect_rounded(m, before, t);
    assert_memory_equal(m->param_flat.data, before, n * sizeof *before);   /* masters untouched */
    size_t changed = 0;
    for (size_t k = 0; k < n; k++) changed += w.buf[k] != before[k];
    assert_true(changed > n / 2);   /* the masters carry more bits than the copy */
    dt_working_copy_leave(&w, m);
    expect_masters(m);
    for (size_t k = 0; k < n; k++) m->param_flat.data[k] += 1e-3f * (float)(k % 7);   /* an optimizer step */
    memcpy(before, m->param_flat.data, n * sizeof *before);
    assert_int_equal(dt_working_copy_enter(&w, m), DT_OK);
    expect_rounded(m, before, t);
    dt_working_copy_leave(&w, m);
    dt_working_copy_leave(&w, m);   /* twice is once */
    expect_masters(m);
    dt_working_copy_free(&w);
    free(before);
    dt_model_free(m);
}

static void test_bf16(void **s) { (void)s; check_dtype(DT_BF16); }
static void test_f16(void **s) { (void)s; check_dtype(DT_F16); }

static void test_fp32_is_nothing(void **s) {
    (void)s;
    dt_model *m = small_mlp();
    dt_working_copy w = {.dtype = DT_F32};
    assert_int_equal(dt_working_copy_enter(&w, m), DT_OK);
    expect_masters(m);
    assert_null(w.buf);
    dt_working_copy_leave(&w, m);
    dt_working_copy_free(&w);
    dt_model_free(m);
}

static void test_f16_range(void **s) {
    (void)s;
    dt_model *m = small_mlp();
    int wi = m->n_params - 1, bi = m->n_params - 1;   /* the last matrix, the last bias */
    while (m->params[wi]->value.ndim != 2) wi--;
    while (m->params[bi]->value.ndim != 1) bi--;
    const dt_param *p = m->params[wi];
    m->param_flat.data[m->offsets[bi] + 1] = 1e6f;   /* a bias stays float32: no refusal */
    dt_working_copy w = {.dtype = DT_F16};
    assert_int_equal(dt_working_copy_enter(&w, m), DT_OK);
    assert_true(((const float *)m->params[bi]->value.data)[1] == 1e6f);
    dt_working_copy_leave(&w, m);
    m->param_flat.data[m->offsets[wi] + 1] = 1e6f;
    assert_int_equal(dt_working_copy_enter(&w, m), DT_EINVAL);
    assert_non_null(strstr(dt_error_message(), p->name));
    assert_non_null(strstr(dt_error_message(), "65504"));
    expect_masters(m);
    w.dtype = DT_BF16;   /* bf16 has float32's range */
    assert_int_equal(dt_working_copy_enter(&w, m), DT_OK);
    assert_true(((const float *)m->params[wi]->value.data)[1] == round_bf16(1e6f));
    dt_working_copy_leave(&w, m);
    dt_working_copy_free(&w);
    dt_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bf16), cmocka_unit_test(test_f16), cmocka_unit_test(test_fp32_is_nothing),
        cmocka_unit_test(test_f16_range),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
