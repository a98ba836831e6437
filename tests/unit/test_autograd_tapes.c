/* Autograd: several tapes alive at once. Each graph keeps its own parameter
 * use counts; micro-batch tapes run interleaved give the gradients of
 * running them one after the other; grad-ready fires once per parameter,
 * on the final graph only; a graph may be freed after its parameters.
 * Backward from a received gradient (backward_from) equals the scalar
 * backward of the weighted sum sum(out * G); graph inputs get gradients. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dtrain/ops.h"
#include "gradcheck.h"

/* ---- a small net: logits[N, 5] = (x + W2·ln(gelu(W1·x + b1)) + b2) · W1ᵀ ----
 * x[N, 4]; W1[5, 4] is used twice (first layer and, tied, the last). */
enum { N = 3, C = 4, H = 5, NP = 6 };
typedef struct net { dt_param p[NP]; } net;   /* W1 b1 lnw lnb W2 b2 */
static const char *pname[NP] = {"W1", "b1", "lnw", "lnb", "W2", "b2"};

static void net_init(net *n) {
    const int64_t shapes[NP][2] = {{H, C}, {H, 1}, {H, 1}, {H, 1}, {C, H}, {C, 1}};
    for (int i = 0; i < NP; i++) {
        int nd = shapes[i][1] == 1 ? 1 : 2;
        assert_int_equal(dt_param_init(&n->p[i], pname[i], nd, shapes[i]), DT_OK);
        dt_gc_fill(&n->p[i], 10 + (uint64_t)i, 0.5f);
    }
}
static void net_free(net *n) { for (int i = 0; i < NP; i++) dt_param_free(&n->p[i]); }
static void net_zero_grad(net *n) {
    for (int i = 0; i < NP; i++) memset(n->p[i].grad.data, 0, (size_t)n->p[i].grad.numel * sizeof(float));
}

static dt_tensor *net_forward(dt_graph *g, net *n, dt_tensor *x) {
    dt_tensor *h = dt_op_linear(g, x, &n->p[0].value, &n->p[1].value, DT_W_OUT_IN);
    h = dt_op_gelu(g, h);
    h = dt_op_layernorm(g, h, &n->p[2].value, &n->p[3].value, 1e-5f);
    h = dt_op_linear(g, h, &n->p[4].value, &n->p[5].value, DT_W_OUT_IN);
    h = dt_op_add(g, h, x);
    h = dt_op_linear(g, h, &n->p[0].value, NULL, DT_W_OUT_IN);
    assert_non_null(h);
    return h;
}

/* Micro-batch k's input (no gradient) and targets. */
static dt_tensor *batch_x(dt_graph *g, int k) {
    dt_tensor *x = dt_graph_tensor(g, 2, (int64_t[]){N, C});
    for (int i = 0; i < N * C; i++) dt_f32(x)[i] = (float)sin(0.7 * i + 1.3 * k + 0.2);
    return x;
}
static const int32_t targets[2][N] = {{1, 4, 0}, {3, 2, 2}};

static dt_tensor *forward_loss(dt_graph *g, net *n, int k) {
    dt_tensor *loss = dt_op_cross_entropy(g, net_forward(g, n, batch_x(g, k)), targets[k]);
    assert_non_null(loss);
    return loss;
}

/* Every parameter gradient, concatenated. */
static int grads_of(net *n, float *out) {
    int pos = 0;
    for (int i = 0; i < NP; i++) {
        memcpy(out + pos, n->p[i].grad.data, (size_t)n->p[i].grad.numel * sizeof(float));
        pos += (int)n->p[i].grad.numel;
    }
    return pos;
}

/* ---- grad-ready probe ---- */
typedef struct probe {
    const char *order[32]; int n;
    float grad0_at_fire[32];   /* the parameter's grad[0] when its hook fired */
} probe;
static dt_status on_ready(dt_param *p, void *user) {
    probe *pr = user;
    pr->grad0_at_fire[pr->n] = dt_f32(&p->grad)[0];
    pr->order[pr->n++] = p->name;
    return DT_OK;
}
static void net_probe(net *n, probe *pr) {
    memset(pr, 0, sizeof *pr);
    for (int i = 0; i < NP; i++) { n->p[i].on_grad_ready = on_ready; n->p[i].on_grad_ready_user = pr; }
}
/* The order backward produces final gradients on one tape of net_forward
 * (see the diagram above): the last linear releases W1's second-to-last use
 * only; then W2, b2 (second linear), lnw, lnb (layernorm), then the first
 * linear's W1 (now final) and b1. */
static const char *ready_order[NP] = {"W2", "b2", "lnw", "lnb", "W1", "b1"};
static void expect_ready_order(const probe *pr) {
    assert_int_equal(pr->n, NP);
    for (int i = 0; i < NP; i++) assert_string_equal(pr->order[i], ready_order[i]);
}

static void test_param_uses_per_graph(void **state) {
    (void)state;
    net n;
    net_init(&n);
    dt_graph *g1 = dt_graph_create(), *g2 = dt_graph_create();
    forward_loss(g1, &n, 0);
    /* g2 uses only the first layer */
    dt_op_linear(g2, batch_x(g2, 1), &n.p[0].value, &n.p[1].value, DT_W_OUT_IN);
    assert_int_equal(dt_graph_param_uses(g1, &n.p[0]), 2);   /* tied */
    assert_int_equal(dt_graph_param_uses(g1, &n.p[4]), 1);
    assert_int_equal(dt_graph_param_uses(g2, &n.p[0]), 1);
    assert_int_equal(dt_graph_param_uses(g2, &n.p[4]), 0);
    dt_graph_reset(g2);   /* g1's counts are its own */
    assert_int_equal(dt_graph_param_uses(g2, &n.p[0]), 0);
    assert_int_equal(dt_graph_param_uses(g1, &n.p[0]), 2);
    /* frozen parameters are not counted */
    n.p[5].requires_grad = 0;
    dt_graph_reset(g1);
    forward_loss(g1, &n, 0);
    assert_int_equal(dt_graph_param_uses(g1, &n.p[5]), 0);
    dt_graph_free(g1);
    dt_graph_free(g2);
    net_free(&n);
}

/* Runs under ASan in the sanitizer build: a graph never touches the
 * parameters it recorded once they are gone. */
static void test_graph_freed_after_params(void **state) {
    (void)state;
    net *n = malloc(sizeof *n);
    net_init(n);
    dt_graph *g = dt_graph_create(), *h = dt_graph_create();
    assert_int_equal(dt_graph_backward(g, forward_loss(g, n, 0)), DT_OK);
    forward_loss(h, n, 1);   /* h: recorded, never back-propagated */
    net_free(n);
    free(n);
    dt_graph_reset(g);
    dt_graph_free(g);
    dt_graph_free(h);
}

static void test_non_final_graph_fires_nothing(void **state) {
    (void)state;
    net n;
    net_init(&n);
    probe pr;
    net_probe(&n, &pr);
    dt_graph *g = dt_graph_create();
    assert_int_equal(dt_graph_final(g), 1);   /* default */
    dt_graph_set_final(g, 0);
    assert_int_equal(dt_graph_backward(g, forward_loss(g, &n, 0)), DT_OK);
    assert_int_equal(pr.n, 0);
    dt_graph_reset(g);
    assert_int_equal(dt_graph_final(g), 0);   /* kept across resets */
    dt_graph_set_final(g, 1);
    assert_int_equal(dt_graph_backward(g, forward_loss(g, &n, 0)), DT_OK);
    expect_ready_order(&pr);
    dt_graph_free(g);
    net_free(&n);
}

/* Two micro-batches, sequential: F1 B1 F2 B2 on one graph reset between. */
static void sequential_grads(net *n, float *out) {
    net_zero_grad(n);
    dt_graph *g = dt_graph_create();
    for (int k = 0; k < 2; k++) {
        dt_graph_reset(g);
        assert_int_equal(dt_graph_backward(g, forward_loss(g, n, k)), DT_OK);
    }
    grads_of(n, out);
    dt_graph_free(g);
}

enum { NG = H * C + H + H + H + C * H + C };

/* F1 F2 B1 B2 with graph 2 final: bitwise the sequential gradients (same
 * accumulation order); hooks fire once per parameter, during B2 only, in
 * B2's order, with the final gradient. */
static void test_interleaved_b1_b2(void **state) {
    (void)state;
    net n;
    net_init(&n);
    float want[NG], got[NG];
    sequential_grads(&n, want);
    net_zero_grad(&n);
    probe pr;
    net_probe(&n, &pr);
    dt_graph *g1 = dt_graph_create(), *g2 = dt_graph_create();
    dt_graph_set_final(g1, 0);
    dt_tensor *l1 = forward_loss(g1, &n, 0), *l2 = forward_loss(g2, &n, 1);
    assert_int_equal(dt_graph_backward(g1, l1), DT_OK);
    assert_int_equal(pr.n, 0);
    assert_int_equal(dt_graph_backward(g2, l2), DT_OK);
    expect_ready_order(&pr);
    assert_int_equal(grads_of(&n, got), NG);
    assert_memory_equal(got, want, sizeof want);
    for (int i = 0; i < NP; i++)   /* final when fired: ready_order[i] is p[idx] */
        for (int j = 0; j < NP; j++)
            if (!strcmp(ready_order[i], pname[j])) assert_true(pr.grad0_at_fire[i] == dt_f32(&n.p[j].grad)[0]);
    dt_graph_free(g1);
    dt_graph_free(g2);
    net_free(&n);
}

static double rel_diff(const float *a, const float *b, int n) {
    double num = 0, den = 0;
    for (int i = 0; i < n; i++) { num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]); den += (double)b[i] * b[i]; }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* F1 F2 B2 B1: the graph whose backward runs last (1) is the final one. Same
 * gradients up to summation order; hooks during B1 only, with the final
 * gradient. Marking graph 2 final instead fires its hooks during B2, before
 * B1's contribution arrived (documented: mark the last backward final). */
static void test_interleaved_b2_b1(void **state) {
    (void)state;
    net n;
    net_init(&n);
    float want[NG], got[NG];
    sequential_grads(&n, want);
    for (int final_g = 1; final_g <= 2; final_g++) {
        net_zero_grad(&n);
        probe pr;
        net_probe(&n, &pr);
        dt_graph *g1 = dt_graph_create(), *g2 = dt_graph_create();
        dt_graph_set_final(g1, final_g == 1);
        dt_graph_set_final(g2, final_g == 2);
        dt_tensor *l1 = forward_loss(g1, &n, 0), *l2 = forward_loss(g2, &n, 1);
        assert_int_equal(dt_graph_backward(g2, l2), DT_OK);
        assert_int_equal(pr.n, final_g == 2 ? NP : 0);
        assert_int_equal(dt_graph_backward(g1, l1), DT_OK);
        expect_ready_order(&pr);
        grads_of(&n, got);
        assert_true(rel_diff(got, want, NG) <= 1e-6);
        int stale = 0;   /* hooks saw the final gradient iff graph 1 was final */
        for (int i = 0; i < NP; i++)
            for (int j = 0; j < NP; j++)
                if (!strcmp(ready_order[i], pname[j])) stale |= pr.grad0_at_fire[i] != dt_f32(&n.p[j].grad)[0];
        assert_int_equal(stale, final_g == 2);
        dt_graph_free(g1);
        dt_graph_free(g2);
    }
    net_free(&n);
}

/* ---- backward from a received gradient ---- */

/* sum(x * R) as an op of its own (as in the op tests): its backward adds
 * 1 * R into x's gradient, i.e. exactly the upstream gradient R. */
static void wsum_bw(dt_graph *g, dt_node *n) {
    float *dx = dt_grad_of(g, n->in[0]);
    const float *R = n->saved;
    float d = dt_f32(n->out->grad)[0];
    if (dx) for (int64_t i = 0; i < n->in[0]->numel; i++) dx[i] += d * R[i];
}
static dt_tensor *wsum(dt_graph *g, dt_tensor *x, const float *R) {
    dt_tensor *out = dt_graph_tensor(g, 0, NULL);
    double s = 0;
    for (int64_t i = 0; i < x->numel; i++) s += (double)dt_f32(x)[i] * R[i];
    dt_f32(out)[0] = (float)s;
    dt_node *n = dt_graph_record(g, "wsum", wsum_bw, out, 1, &x);
    if (n) n->saved = (void *)R;
    return out;
}

static float xdata[N * C], Gout[N * H];
static void fill_inputs(void) {
    for (int i = 0; i < N * C; i++) xdata[i] = (float)cos(0.9 * i + 0.4);
    for (int i = 0; i < N * H; i++) Gout[i] = (float)sin(1.7 * i + 0.3);
}

/* The net on a graph input x that requires grad; backward_from(out, G) vs
 * backward(sum(out * G)): same parameter and input gradients, bitwise (the
 * seed is G either way, then the same nodes run in the same order), and the
 * same grad-ready order. */
static void test_backward_from_equals_weighted_sum(void **state) {
    (void)state;
    fill_inputs();
    net n;
    net_init(&n);
    float got[NG], want[NG], gx[2][N * C];
    for (int way = 0; way < 2; way++) {
        net_zero_grad(&n);
        probe pr;
        net_probe(&n, &pr);
        dt_graph *g = dt_graph_create();
        dt_tensor *x = dt_graph_input(g, 2, (int64_t[]){N, C}, xdata, 1);
        assert_non_null(x);
        assert_true(x->data == (void *)xdata && x->requires_grad && !x->grad_fn);
        dt_tensor *out = net_forward(g, &n, x);
        assert_int_equal(out->numel, N * H);
        if (way == 0) assert_int_equal(dt_graph_backward_from(g, out, Gout), DT_OK);
        else assert_int_equal(dt_graph_backward(g, wsum(g, out, Gout)), DT_OK);
        expect_ready_order(&pr);
        const float *dx = dt_graph_grad(g, x);
        assert_non_null(dx);
        memcpy(gx[way], dx, sizeof gx[way]);
        grads_of(&n, way == 0 ? got : want);
        dt_graph_free(g);
    }
    assert_memory_equal(got, want, sizeof got);
    assert_memory_equal(gx[0], gx[1], sizeof gx[0]);
    int nonzero = 0;
    for (int i = 0; i < N * C; i++) nonzero |= gx[0][i] != 0.f;
    assert_true(nonzero);
    net_free(&n);
}

/* Backward from a tensor in the middle of the tape: nodes after it got no
 * gradient, so their parameters get none, but their uses are released and
 * grad-ready still fires for them (first, as backward passes them first). */
static void test_backward_from_mid_tape(void **state) {
    (void)state;
    fill_inputs();
    net n;
    net_init(&n);
    float want[NG], got[NG];
    for (int way = 0; way < 2; way++) {
        net_zero_grad(&n);
        probe pr;
        net_probe(&n, &pr);
        dt_graph *g = dt_graph_create();
        dt_tensor *x = dt_graph_input(g, 2, (int64_t[]){N, C}, xdata, 0);
        dt_tensor *b = dt_op_gelu(g, dt_op_linear(g, x, &n.p[0].value, &n.p[1].value, DT_W_OUT_IN));
        assert_non_null(b);
        if (way == 0) {   /* reference: the tape ends at b */
            assert_int_equal(dt_graph_backward(g, wsum(g, b, Gout)), DT_OK);
            assert_int_equal(pr.n, 2);
        } else {
            assert_non_null(dt_op_linear(g, b, &n.p[4].value, &n.p[5].value, DT_W_OUT_IN));
            assert_int_equal(dt_graph_backward_from(g, b, Gout), DT_OK);
            const char *order[4] = {"W2", "b2", "W1", "b1"};
            assert_int_equal(pr.n, 4);
            for (int i = 0; i < 4; i++) assert_string_equal(pr.order[i], order[i]);
        }
        grads_of(&n, way == 0 ? want : got);
        dt_graph_free(g);
    }
    assert_memory_equal(got, want, sizeof got);   /* W2, b2 zero in both */
    net_free(&n);
}

static void expect_err(dt_status s, dt_status code, const char *needle) {
    assert_int_equal(s, code);
    if (!strstr(dt_error_message(), needle)) fail_msg("message '%s' lacks '%s'", dt_error_message(), needle);
    dt_error_clear();
}

static void test_backward_from_errors(void **state) {
    (void)state;
    fill_inputs();
    net n;
    net_init(&n);
    dt_graph *g = dt_graph_create();
    dt_tensor *x = dt_graph_input(g, 2, (int64_t[]){N, C}, xdata, 1);
    dt_tensor *unused = dt_graph_input(g, 2, (int64_t[]){N, C}, xdata, 1);
    dt_tensor *plain = dt_graph_input(g, 2, (int64_t[]){N, C}, xdata, 0);
    dt_tensor *out = net_forward(g, &n, x);
    dt_tensor *no_grad = dt_op_relu(g, plain);
    assert_null(dt_graph_input(g, 2, (int64_t[]){N, C}, NULL, 1));
    expect_err(dt_error_code(), DT_EINVAL, "data is NULL");
    expect_err(dt_graph_backward_from(g, out, NULL), DT_EINVAL, "upstream");
    expect_err(dt_graph_backward_from(g, NULL, Gout), DT_EINVAL, "NULL");
    expect_err(dt_graph_backward_from(g, no_grad, Gout), DT_ESTATE, "require grad");
    assert_int_equal(dt_graph_backward_from(g, out, Gout), DT_OK);   /* the refusals left the tape usable */
    expect_err(dt_graph_backward_from(g, out, Gout), DT_ESTATE, "twice");
    expect_err(dt_graph_backward(g, out), DT_ESTATE, "twice");
    assert_null(dt_graph_grad(g, &n.p[0].value));
    expect_err(dt_error_code(), DT_EINVAL, "p->grad");
    assert_null(dt_graph_grad(g, plain));
    expect_err(dt_error_code(), DT_ESTATE, "does not require grad");
    const float *z = dt_graph_grad(g, unused);   /* no gradient reached it: zeros */
    assert_non_null(z);
    for (int i = 0; i < N * C; i++) assert_true(z[i] == 0.f);
    /* a non-scalar start through the scalar entry point */
    dt_graph_reset(g);
    x = dt_graph_input(g, 2, (int64_t[]){N, C}, xdata, 1);
    expect_err(dt_graph_backward(g, net_forward(g, &n, x)), DT_EINVAL, "scalar");
    dt_graph_free(g);
    net_free(&n);
}

/* dt_graph_scratch refuses a size whose rounding to the arena's 64-byte
 * granule would wrap, with an out-of-memory error naming the size, and the
 * graph still allocates afterwards. */
static void test_scratch_huge_size_refused(void **state) {
    (void)state;
    dt_graph *g = dt_graph_create();
    const size_t sizes[3] = {SIZE_MAX, SIZE_MAX - 10, SIZE_MAX - 62};
    for (int i = 0; i < 3; i++) {
        dt_error_clear();
        assert_null(dt_graph_scratch(g, sizes[i]));
        assert_int_equal(dt_error_code(), DT_ENOMEM);
        char num[32];
        snprintf(num, sizeof num, "%zu", sizes[i]);
        if (!strstr(dt_error_message(), num)) fail_msg("message '%s' lacks the size %s", dt_error_message(), num);
    }
    dt_error_clear();
    assert_non_null(dt_graph_scratch(g, 100));
    dt_graph_free(g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_param_uses_per_graph),
        cmocka_unit_test(test_graph_freed_after_params),
        cmocka_unit_test(test_non_final_graph_fires_nothing),
        cmocka_unit_test(test_interleaved_b1_b2),
        cmocka_unit_test(test_interleaved_b2_b1),
        cmocka_unit_test(test_backward_from_equals_weighted_sum),
        cmocka_unit_test(test_backward_from_mid_tape),
        cmocka_unit_test(test_backward_from_errors),
        cmocka_unit_test(test_scratch_huge_size_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
