/* The vocabulary-parallel ops (ops.h) on T = 2 ranks that are threads of
 * this process (tests/common/tp_threads.h), against the one-process ops on
 * the whole tensors:
 *   cross-entropy: V = 7 split as 4 + 4 columns (one of padding, set to 1e3
 *     on rank 1 to show it is ignored), one ignored row, targets in both
 *     parts: the loss within 1e-6 relative of dt_op_cross_entropy on every
 *     rank (the same bits on both), the gradient of each rank's columns within
 *     1e-6 of the whole's, 0 on the padding.
 *   accuracy: ties across the parts and inside one go to the lowest global
 *     column, as dt_count_correct's first argmax: the counts are equal for
 *     labels at the first maximum, at a later tied maximum and elsewhere.
 *   embedding_rows + tp_reduce: bitwise dt_op_embedding, each rank's table
 *     gradient its rows of the whole one's.
 * Without the ops this file does not link. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <math.h>
#include <string.h>
#include "dtrain/autograd.h"
#include "dtrain/ops.h"
#include "tp_threads.h"

enum { N = 5, V = 7, T = 2, NP = 4 /* dt_vocab_part(7, 2) */, C = 3 };
static const int32_t targets[N] = {0, 6, -1, 3, 4};

static float whole_logit(int r, int j) { return sinf(0.7f * (float)(r * V + j)) * 2.0f + (float)(j == r); }

typedef struct ce_arg {
    float loss, grad[N * NP];
    int ok;
} ce_arg;

static void ce_rank(const dt_tp_comm *c, void *p) {
    ce_arg *a = p;
    dt_param x;
    int64_t shape[2] = {N, NP};
    dt_graph *g = dt_graph_create();
    if (!g || dt_param_init(&x, "x", 2, shape) != DT_OK) return;
    for (int r = 0; r < N; r++)
        for (int j = 0; j < NP; j++) {
            int col = c->rank * NP + j;
            dt_f32(&x.value)[r * NP + j] = col < V ? whole_logit(r, col) : 1e3f;   /* padding: ignored */
        }
    dt_tensor *loss = dt_op_vocab_parallel_cross_entropy(g, &x.value, targets, V, c);
    if (loss && dt_graph_backward(g, loss) == DT_OK) {
        a->loss = dt_f32(loss)[0];
        memcpy(a->grad, x.grad.data, sizeof a->grad);
        a->ok = 1;
    }
    dt_param_free(&x);
    dt_graph_free(g);
}

static void cross_entropy_equals_whole(void **state) {
    (void)state;
    dt_param x;
    int64_t shape[2] = {N, V};
    dt_graph *g = dt_graph_create();
    assert_non_null(g);
    assert_int_equal(dt_param_init(&x, "x", 2, shape), DT_OK);
    for (int r = 0; r < N; r++)
        for (int j = 0; j < V; j++) dt_f32(&x.value)[r * V + j] = whole_logit(r, j);
    dt_tensor *loss = dt_op_cross_entropy(g, &x.value, targets);
    assert_non_null(loss);
    assert_int_equal(dt_graph_backward(g, loss), DT_OK);
    ce_arg a[T];
    memset(a, 0, sizeof a);
    assert_int_equal(tp_threads_run(T, ce_rank, a, sizeof a[0]), 0);
    float ref = dt_f32(loss)[0];
    for (int k = 0; k < T; k++) {
        if (!a[k].ok) fail_msg("rank %d: the op failed", k);
        if (fabsf(a[k].loss - ref) > 1e-6f * fabsf(ref)) fail_msg("rank %d: loss %.9g, whole %.9g", k, a[k].loss, ref);
        assert_true(a[k].loss == a[0].loss);   /* every rank the same bits */
        for (int r = 0; r < N; r++)
            for (int j = 0; j < NP; j++) {
                int col = k * NP + j;
                float got = a[k].grad[r * NP + j], want = col < V ? dt_f32(&x.grad)[r * V + col] : 0.0f;
                if (fabsf(got - want) > 1e-6f)
                    fail_msg("rank %d: d logits[%d, %d] = %.9g, whole %.9g", k, r, col, got, want);
            }
    }
    dt_param_free(&x);
    dt_graph_free(g);
}

/* accuracy: row 0 ties at columns 1 (rank 0) and 5 (rank 1); row 1 at 4 and
 * 6 (both rank 1); row 2 at 0 and 2 (both rank 0); row 3 a single max at 3;
 * row 4 all equal (column 0 wins) */
static float acc_logit(int r, int j) {
    static const float rows[N][V] = {{0, 5, 1, 2, 0, 5, 3}, {1, 0, 0, 2, 7, 1, 7}, {4, 1, 4, 0, 0, 1, 2},
                                     {0, 0, 1, 9, 2, 3, 1}, {1, 1, 1, 1, 1, 1, 1}};
    return rows[r][j];
}
typedef struct acc_arg { const int32_t *labels; int64_t correct; } acc_arg;

static void acc_rank(const dt_tp_comm *c, void *p) {
    acc_arg *a = p;
    float d[N * NP];
    for (int r = 0; r < N; r++)
        for (int j = 0; j < NP; j++) {
            int col = c->rank * NP + j;
            d[r * NP + j] = col < V ? acc_logit(r, col) : 100.0f;   /* padding never wins */
        }
    int64_t shape[2] = {N, NP};
    dt_tensor x;
    dt_tensor_view(&x, d, DT_F32, 2, shape);
    a->correct = dt_count_correct_vocab_parallel(&x, a->labels, V, c);
}

static void accuracy_ties_lowest_column(void **state) {
    (void)state;
    static const int32_t sets[3][N] = {{1, 4, 0, 3, 0}, {5, 6, 2, 3, 6}, {1, 6, 0, -1, 2}};
    float d[N * V];
    for (int r = 0; r < N; r++)
        for (int j = 0; j < V; j++) d[r * V + j] = acc_logit(r, j);
    dt_tensor whole;
    dt_tensor_view(&whole, d, DT_F32, 2, (int64_t[]){N, V});
    for (int s = 0; s < 3; s++) {
        int64_t want = dt_count_correct(&whole, sets[s]);
        acc_arg a[T] = {{sets[s], -2}, {sets[s], -2}};
        assert_int_equal(tp_threads_run(T, acc_rank, a, sizeof a[0]), 0);
        for (int k = 0; k < T; k++)
            if (a[k].correct != want) fail_msg("labels %d, rank %d: %lld correct, one process %lld", s, k,
                                               (long long)a[k].correct, (long long)want);
    }
    assert_int_equal(dt_count_correct(&whole, sets[0]), N);   /* the first set is the argmax */
}

static const int32_t ids[6] = {0, 6, 3, 4, 6, 1};
typedef struct emb_arg { float y[6 * C], dw[NP * C]; int ok; } emb_arg;

static float table(int v, int c) { return 0.5f * (float)v - 0.25f * (float)c + 0.125f; }

static void emb_rank(const dt_tp_comm *c, void *p) {
    emb_arg *a = p;
    dt_param w;
    int64_t shape[2] = {NP, C}, out[2] = {6, C};
    dt_graph *g = dt_graph_create();
    if (!g || dt_param_init(&w, "w", 2, shape) != DT_OK) return;
    for (int v = 0; v < NP; v++)
        for (int k = 0; k < C; k++) dt_f32(&w.value)[v * C + k] = c->rank * NP + v < V ? table(c->rank * NP + v, k) : 0;
    dt_tensor *y = dt_op_embedding_rows(g, &w.value, (int64_t)c->rank * NP, ids, 6, 2, out);
    if (y) y = dt_op_tp_reduce(g, y, c);
    float dy[6 * C];
    for (int i = 0; i < 6 * C; i++) dy[i] = 1.0f / (float)(i + 1);
    if (y && dt_graph_backward_from(g, y, dy) == DT_OK) {
        memcpy(a->y, y->data, sizeof a->y);
        memcpy(a->dw, w.grad.data, sizeof a->dw);
        a->ok = 1;
    }
    dt_param_free(&w);
    dt_graph_free(g);
}

static void embedding_rows_equal_whole(void **state) {
    (void)state;
    dt_param w;
    int64_t shape[2] = {V, C}, out[2] = {6, C};
    dt_graph *g = dt_graph_create();
    assert_int_equal(dt_param_init(&w, "w", 2, shape), DT_OK);
    for (int v = 0; v < V; v++)
        for (int k = 0; k < C; k++) dt_f32(&w.value)[v * C + k] = table(v, k);
    dt_tensor *y = dt_op_embedding(g, &w.value, ids, 6, 2, out);
    assert_non_null(y);
    float dy[6 * C];
    for (int i = 0; i < 6 * C; i++) dy[i] = 1.0f / (float)(i + 1);
    assert_int_equal(dt_graph_backward_from(g, y, dy), DT_OK);
    emb_arg a[T];
    memset(a, 0, sizeof a);
    assert_int_equal(tp_threads_run(T, emb_rank, a, sizeof a[0]), 0);
    for (int k = 0; k < T; k++) {
        if (!a[k].ok) fail_msg("rank %d: the ops failed", k);
        assert_memory_equal(a[k].y, y->data, sizeof a[k].y);
        for (int v = 0; v < NP; v++)
            for (int c = 0; c < C; c++) {
                int row = k * NP + v;
                float want = row < V ? dt_f32(&w.grad)[row * C + c] : 0.0f;
                if (a[k].dw[v * C + c] != want) fail_msg("rank %d: dw[%d, %d] %.9g, whole %.9g", k, row, c,
                                                         a[k].dw[v * C + c], want);
            }
    }
    int32_t bad = -1;
    assert_null(dt_op_embedding_rows(g, &w.value, 0, &bad, 1, 2, (int64_t[]){1, C}));
    assert_non_null(strstr(dt_error_message(), "embedding_rows"));
    dt_param_free(&w);
    dt_graph_free(g);
}

static dt_status unused_sum(void *ctx, float *buf, int64_t n) { (void)ctx; (void)buf; (void)n; return DT_OK; }

static void wrong_part_is_an_error(void **state) {
    (void)state;
    dt_param x;
    int64_t shape[2] = {N, 3};   /* not ceil(7 / 2) columns */
    dt_graph *g = dt_graph_create();
    assert_int_equal(dt_param_init(&x, "x", 2, shape), DT_OK);
    dt_tp_comm c = {.rank = 0, .size = 1};
    assert_null(dt_op_vocab_parallel_cross_entropy(g, &x.value, targets, V, &c));
    assert_non_null(strstr(dt_error_message(), "vocab_parallel_cross_entropy"));
    dt_tp_comm no_max = {.rank = 0, .size = 2, .allreduce_sum = unused_sum};
    assert_null(dt_op_vocab_parallel_cross_entropy(g, &x.value, targets, 6, &no_max));
    assert_non_null(strstr(dt_error_message(), "allreduce_max"));
    dt_param_free(&x);
    dt_graph_free(g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(cross_entropy_equals_whole),
        cmocka_unit_test(accuracy_ties_lowest_column),
        cmocka_unit_test(embedding_rows_equal_whole),
        cmocka_unit_test(wrong_part_is_an_error),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
