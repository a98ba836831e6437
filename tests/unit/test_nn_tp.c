/* GPT-2 built for tensor-parallel rank r of T (nn.h cfg.tp_size / tp_rank)
 * holds exactly the slices of the model one process builds from the same
 * seed: for T = 2 and 4, every parameter of every rank equals the part of
 * the whole one its split names (dt_split_copy), the split ones carry their
 * split (c_attn dim 1 as 3 groups, c_fc dim 1, c_proj weights dim 0, biases
 * along), replicated ones are bitwise the whole ones, names and order are
 * the same and the architecture fingerprint is the whole model's (so
 * checkpoints are interchangeable). Placing every rank's part back gives the
 * whole tensor. wte is split by vocabulary rows (rank r: rows [r n, r n + n),
 * n = ceil(V / T)); a V that T does not divide (65 at T = 2, 66 at T = 4)
 * pads the last part with zero rows that the whole shape leaves out.
 * Configurations T does not divide are refused naming the setting, and so
 * is sequence parallelism without tensor parallelism; with it the parts are
 * the same (it splits activations, not parameters). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>
#include "dtrain/nn.h"

static dt_model_cfg cfg_tp(int T, int r, int V) {
    dt_model_cfg c = dt_model_cfg_default(DT_MODEL_GPT2);
    c.n_layer = 2; c.n_embd = 32; c.n_head = 4; c.vocab = V; c.max_t = 16;
    c.tp_size = T; c.tp_rank = r;
    return c;
}

static void expect_split(const dt_param *p, int T, int r, int V) {
    const char *n = p->name;
    if (!strcmp(n, "wte.weight")) {   /* vocabulary rows, padded to a multiple of T */
        int rows = (V + T - 1) / T;
        assert_int_equal(p->split.parts, T);
        assert_int_equal(p->split.index, r);
        assert_int_equal(p->split.dim, 0);
        assert_int_equal(p->split.groups, 1);
        assert_int_equal(p->split.pad, rows * T - V);
        assert_int_equal(p->value.shape[0], rows);
        return;
    }
    int col = strstr(n, "c_attn") || strstr(n, "c_fc");
    int row = strstr(n, "c_proj.weight") != NULL;
    if (!col && !row) { assert_true(p->split.parts <= 1); return; }
    assert_int_equal(p->split.parts, T);
    assert_int_equal(p->split.index, r);
    assert_int_equal(p->split.groups, strstr(n, "c_attn") ? 3 : 1);
    assert_int_equal(p->split.dim, col && p->value.ndim == 2 ? 1 : 0);
}

static void run_T(int T, int V) {
    dt_model *whole, *part[4];
    dt_model_cfg c = cfg_tp(1, 0, V);
    assert_int_equal(dt_model_create(&c, 7, &whole), DT_OK);
    for (int r = 0; r < T; r++) {
        c = cfg_tp(T, r, V);
        assert_int_equal(dt_model_create(&c, 7, &part[r]), DT_OK);
        assert_int_equal(part[r]->n_params, whole->n_params);
        assert_int_equal(part[r]->arch_crc, whole->arch_crc);
    }
    for (int i = 0; i < whole->n_params; i++) {
        const dt_param *w = whole->params[i];
        float *rebuilt = calloc((size_t)w->value.numel, sizeof *rebuilt);
        assert_non_null(rebuilt);
        for (int r = 0; r < T; r++) {
            dt_param *p = part[r]->params[i];
            assert_string_equal(p->name, w->name);
            expect_split(p, T, r, V);
            int64_t full[DT_MAX_DIMS];
            assert_int_equal(dt_param_full_shape(p, full), w->value.ndim);
            assert_memory_equal(full, w->value.shape, (size_t)w->value.ndim * sizeof full[0]);
            if (p->split.parts <= 1) {
                assert_memory_equal(p->value.data, w->value.data, (size_t)w->value.numel * sizeof(float));
                memcpy(rebuilt, w->value.data, (size_t)w->value.numel * sizeof(float));
                continue;
            }
            int64_t inner = p->value.numel / p->value.shape[p->split.dim];   /* elements per slab of dim */
            assert_int_equal(p->value.numel * T - p->split.pad * inner, w->value.numel);
            if (p->split.pad && r == T - 1)   /* the last part ends in zero rows */
                for (int64_t k = (p->value.shape[0] - p->split.pad) * inner; k < p->value.numel; k++)
                    assert_true(dt_f32(&p->value)[k] == 0.0f);
            float *slice = malloc((size_t)p->value.numel * sizeof *slice);
            assert_non_null(slice);
            dt_split_copy(&p->split, w->value.ndim, full, r, w->value.data, slice, 0);
            if (memcmp(slice, p->value.data, (size_t)p->value.numel * sizeof *slice))
                fail_msg("T=%d rank %d: %s is not its part of the whole model's", T, r, p->name);
            dt_split_copy(&p->split, w->value.ndim, full, r, rebuilt, p->value.data, 1);
            free(slice);
        }
        if (memcmp(rebuilt, w->value.data, (size_t)w->value.numel * sizeof(float)))
            fail_msg("T=%d: %s put together from its parts differs from the whole", T, w->name);
        free(rebuilt);
    }
    /* column-parallel c_attn: rank r's q columns are the whole's columns of heads r*H/T.. */
    const dt_param *wa = dt_model_find_param(whole, "h.0.attn.c_attn.weight");
    const dt_param *pa = dt_model_find_param(part[T - 1], "h.0.attn.c_attn.weight");
    int64_t C = 32, cl = C / T;
    for (int64_t row = 0; row < C; row++)
        for (int g = 0; g < 3; g++)   /* q, k, v */
            assert_true(dt_f32(&pa->value)[row * 3 * cl + g * cl] ==
                        dt_f32(&wa->value)[row * 3 * C + g * C + (T - 1) * cl]);
    /* wte: rank r's first row is the whole's row r n */
    const dt_param *we = dt_model_find_param(whole, "wte.weight"), *pe = dt_model_find_param(part[T - 1], "wte.weight");
    assert_memory_equal(dt_f32(&pe->value), dt_f32(&we->value) + (T - 1) * pe->value.shape[0] * C, C * sizeof(float));
    for (int r = 0; r < T; r++) dt_model_free(part[r]);
    dt_model_free(whole);
}

static void tp2(void **state) { (void)state; run_T(2, 64); }
static void tp4(void **state) { (void)state; run_T(4, 64); }
static void tp2_padded(void **state) { (void)state; run_T(2, 65); }
static void tp4_padded(void **state) { (void)state; run_T(4, 66); }

static void refused(void **state) {
    (void)state;
    dt_model *m = NULL;
    dt_model_cfg c = cfg_tp(3, 0, 64);   /* 4 heads */
    assert_int_equal(dt_model_create(&c, 7, &m), DT_EINVAL);
    assert_null(m);
    assert_non_null(strstr(dt_error_message(), "arch.heads 4 is not divisible"));
    c = cfg_tp(2, 2, 64);
    assert_int_equal(dt_model_create(&c, 7, &m), DT_EINVAL);
    assert_non_null(strstr(dt_error_message(), "rank 2"));
    c = cfg_tp(1, 0, 64);   /* sequence parallelism without tensor parallelism */
    c.tp_seq = 1;
    assert_int_equal(dt_model_create(&c, 7, &m), DT_EINVAL);
    assert_non_null(strstr(dt_error_message(), "sequence parallelism needs tensor parallelism"));
}

/* Sequence parallelism changes no parameter: a tp_seq rank builds the same
 * parts (so checkpoints and the fingerprint are the tensor-parallel ones). */
static void seq_same_params(void **state) {
    (void)state;
    dt_model *a, *b;
    dt_model_cfg c = cfg_tp(2, 1, 64);
    assert_int_equal(dt_model_create(&c, 7, &a), DT_OK);
    c.tp_seq = 1;
    assert_int_equal(dt_model_create(&c, 7, &b), DT_OK);
    assert_int_equal(a->n_params, b->n_params);
    assert_int_equal(a->arch_crc, b->arch_crc);
    for (int i = 0; i < a->n_params; i++) {
        assert_string_equal(a->params[i]->name, b->params[i]->name);
        assert_int_equal(a->params[i]->value.numel, b->params[i]->value.numel);
        assert_memory_equal(a->params[i]->value.data, b->params[i]->value.data,
                            (size_t)a->params[i]->value.numel * sizeof(float));
    }
    dt_model_free(a);
    dt_model_free(b);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(tp2), cmocka_unit_test(tp4), cmocka_unit_test(tp2_padded),
                                       cmocka_unit_test(tp4_padded), cmocka_unit_test(refused),
                                       cmocka_unit_test(seq_same_params)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
