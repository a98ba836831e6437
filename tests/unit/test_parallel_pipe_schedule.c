/* Static pipeline schedules (parallel/pipe/pipe_internal.h). Expected action
 * lists are worked out by hand from the published schedules (GPipe's
 * fill-drain, PipeDream-Flush's warm-up P-s-1, Megatron's interleaved
 * grouping and warm-up (P-s-1)*2 + (V-1)*P, Zero Bubble's H1 with W(i-s)
 * after B(i)), and simulator times by hand from its message model. The
 * table test runs every kind over P in {1,2,3,4,8}, M in {1,2,3,4,8,16}, V in
 * {1,2,3}: valid combinations must check, simulate without deadlock (latency
 * 0 and 0.3) and meet the bubble and memory numbers below; invalid ones must
 * fail with DT_EINVAL naming the offending value. The lists are also
 * re-verified here, independently of dt_pipe_schedule_check. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include "parallel/pipe/pipe_internal.h"

/* The combination under test, for failure messages. */
static char ctx[96] = "";
#define assert_near(a, b, tol)                                                                         \
    do {                                                                                               \
        double a_ = (a), b_ = (b);                                                                     \
        if (!(fabs(a_ - b_) <= (tol))) fail_msg("%s: %s = %.12g, want %.12g", ctx, #a, a_, b_);        \
    } while (0)

static const char *fmt(const dt_pipe_schedule *s, int rank) {
    static char buf[8192];
    assert_true(dt_pipe_schedule_format(s, rank, buf, sizeof buf) < (int)sizeof buf);
    return buf;
}

static void build(dt_pipe_kind k, int P, int M, int V, int L, dt_pipe_schedule *s) {
    if (dt_pipe_schedule_build(k, P, M, V, L, s) != DT_OK) fail_msg("build: %s", dt_error_message());
    if (dt_pipe_schedule_check(s) != DT_OK) fail_msg("check: %s", dt_error_message());
}

static void expect_lists(dt_pipe_kind k, int P, int M, int V, const char *const *want) {
    dt_pipe_schedule s;
    build(k, P, M, V, 0, &s);
    for (int r = 0; r < P; r++) assert_string_equal(fmt(&s, r), want[r]);
    dt_pipe_schedule_free(&s);
}

/* ---- hand-written lists ---- */

/* GPipe: every rank forwards both micro-batches, then backs them in mb order. */
static void test_gpipe_lists(void **st) {
    (void)st;
    const char *want[] = {"F0 F1 B0 B1", "F0 F1 B0 B1"};
    expect_lists(DT_PIPE_GPIPE, 2, 2, 1, want);
    /* max_outstanding 3, M = 8: groups {0,1,2} {3,4,5} {6,7} */
    dt_pipe_schedule s;
    build(DT_PIPE_GPIPE, 3, 8, 1, 3, &s);
    assert_int_equal(s.max_outstanding, 3);
    for (int r = 0; r < 3; r++) assert_string_equal(fmt(&s, r), "F0 F1 F2 B0 B1 B2 F3 F4 F5 B3 B4 B5 F6 F7 B6 B7");
    dt_pipe_schedule_free(&s);
    build(DT_PIPE_GPIPE, 2, 2, 1, 5, &s);   /* a cap above M is M */
    assert_int_equal(s.max_outstanding, 2);
    assert_string_equal(fmt(&s, 0), "F0 F1 B0 B1");
    dt_pipe_schedule_free(&s);
}

/* 1F1B, P = 2, M = 4: rank 0 warms up with P-0-1 = 1 forward, then F,B pairs
 * (F1 B0, F2 B1, F3 B2), then the last B; rank 1 has no warm-up. */
static void test_1f1b_lists(void **st) {
    (void)st;
    const char *want[] = {"F0 F1 B0 F2 B1 F3 B2 B3", "F0 B0 F1 B1 F2 B2 F3 B3"};
    expect_lists(DT_PIPE_1F1B, 2, 4, 1, want);
    /* M < P: rank 0's warm-up is capped at M = 1 (fill-drain). */
    const char *small[] = {"F0 B0", "F0 B0", "F0 B0"};
    expect_lists(DT_PIPE_1F1B, 3, 1, 1, small);
}

/* Interleaved, P = 2, M = 4, V = 2. Forward order (groups of P = 2 micro-
 * batches per chunk): 0c0 1c0 0c1 1c1 2c0 3c0 2c1 3c1; backward order the
 * same groups with the chunks reversed: 0c1 1c1 0c0 1c0 2c1 3c1 2c0 3c0.
 * Rank 0 warms up (2-0-1)*2 + (2-1)*2 = 4 forwards, then 4 F,B pairs, then
 * 4 B's; rank 1 warms up 0*2 + 2 = 2, then 6 pairs, then 2 B's. */
static void test_interleaved_lists(void **st) {
    (void)st;
    const char *want[] = {
        "F0c0 F1c0 F0c1 F1c1 F2c0 B0c1 F3c0 B1c1 F2c1 B0c0 F3c1 B1c0 B2c1 B3c1 B2c0 B3c0",
        "F0c0 F1c0 F0c1 B0c1 F1c1 B1c1 F2c0 B0c0 F3c0 B1c0 F2c1 B2c1 F3c1 B3c1 B2c0 B3c0",
    };
    expect_lists(DT_PIPE_INTERLEAVED, 2, 4, 2, want);
}

/* ZB-H1, P = 2, M = 4: 1F1B's F/B order, W(i - s) right after B(i), the rest
 * at the end. By hand, tf = tb = tw = 1, no latency (start times):
 *   rank 0: F0@0 F1@1 (idle 2) B0@3 W0@4 F2@5 B1@6 W1@7 F3@8 B2@9 W2@10 B3@11 W3@12
 *   rank 1: (idle 0) F0@1 B0@2 F1@3 B1@4 W0@5 F2@6 B2@7 W1@8 F3@9 B3@10 W2@11 W3@12
 * Both end at 13 = 3M+P-1, idle 1 each; 1F1B (tb = 2) ends at 15, idle 3. */
static void test_zbh1_lists(void **st) {
    (void)st;
    const char *want[] = {"F0 F1 B0 W0 F2 B1 W1 F3 B2 W2 B3 W3", "F0 B0 F1 B1 W0 F2 B2 W1 F3 B3 W2 W3"};
    expect_lists(DT_PIPE_ZBH1, 2, 4, 1, want);
    dt_pipe_schedule s;
    dt_pipe_sim sim;
    build(DT_PIPE_ZBH1, 2, 4, 1, 0, &s);
    assert_int_equal(s.split_w, 1);
    assert_int_equal(dt_pipe_schedule_simulate(&s, 1, 1, 1, 0, &sim), DT_OK);
    assert_true(sim.makespan == 13 && sim.busy[0] == 12 && sim.busy[1] == 12);
    dt_pipe_schedule_free(&s);
    build(DT_PIPE_1F1B, 2, 4, 1, 0, &s);
    assert_int_equal(dt_pipe_schedule_simulate(&s, 1, 2, 0, 0, &sim), DT_OK);
    assert_true(sim.makespan == 15 && sim.busy[0] == 12);
    dt_pipe_schedule_free(&s);
}

/* Message latency, by hand: 1F1B P = 2, M = 1, tf = 1, tb = 2, lat = 0.25:
 * F0 on rank 0 [0,1], arrives 1.25; rank 1 F0 [1.25,2.25], B0 [2.25,4.25],
 * arrives 4.5; rank 0 B0 [4.5,6.5]. Same-rank inputs (P = 1, V = 2) pay no
 * latency: 2 F's + 2 B's back to back = 6. */
static void test_simulator_by_hand(void **st) {
    (void)st;
    dt_pipe_schedule s;
    dt_pipe_sim sim;
    build(DT_PIPE_1F1B, 2, 1, 1, 0, &s);
    assert_int_equal(dt_pipe_schedule_simulate(&s, 1, 2, 0, 0.25, &sim), DT_OK);
    assert_true(sim.makespan == 6.5 && sim.busy[0] == 3 && sim.busy[1] == 3 && sim.busy[2] == 0);
    assert_true(sim.bubble[0] == 3.5 / 6.5);
    assert_int_equal(dt_pipe_schedule_simulate(&s, -1, 2, 0, 0, &sim), DT_EINVAL);
    assert_non_null(strstr(dt_error_message(), "tf=-1"));
    dt_pipe_schedule_free(&s);
    build(DT_PIPE_INTERLEAVED, 1, 1, 2, 0, &s);
    assert_string_equal(fmt(&s, 0), "F0c0 F0c1 B0c1 B0c0");
    assert_int_equal(dt_pipe_schedule_simulate(&s, 1, 2, 0, 5, &sim), DT_OK);
    assert_true(sim.makespan == 6 && sim.bubble[0] == 0);
    dt_pipe_schedule_free(&s);
}

/* ---- the table ---- */

static int valid_combo(dt_pipe_kind k, int P, int M, int V) {
    return k == DT_PIPE_INTERLEAVED ? V >= 2 && M % P == 0 : V == 1;
}

/* The rules check enforces, verified here on the lists directly: counts, B's
 * per chunk in increasing mb, W's in the order of the B's. Returns the most
 * (mb, chunk) forwarded but not yet W'ed (zb-h1) on the rank. */
static int verify_rank(const dt_pipe_schedule *s, int r) {
    int per = s->M * s->V, count[3] = {0}, last_b[8], bq[512], nb = 0, nw = 0, open = 0, peak = 0;
    assert_true(per <= 256 && s->V <= 8);
    for (int c = 0; c < s->V; c++) last_b[c] = -1;
    for (int i = 0; i < s->n[r]; i++) {
        const dt_pipe_action *a = &s->act[r][i];
        count[a->op]++;
        int key = a->chunk * s->M + a->mb;
        if (a->op == DT_PIPE_F) open++;
        if (a->op == DT_PIPE_B) {
            assert_true(a->mb > last_b[a->chunk]);
            last_b[a->chunk] = a->mb;
            bq[nb++] = key;
        }
        if (a->op == DT_PIPE_W) {
            assert_true(nw < nb && bq[nw++] == key);
            open--;
        }
        if (open > peak) peak = open;
    }
    assert_int_equal(count[DT_PIPE_F], per);
    assert_int_equal(count[DT_PIPE_B], per);
    assert_int_equal(count[DT_PIPE_W], s->split_w ? per : 0);
    return peak;
}

static void check_bubbles(const dt_pipe_schedule *s, const dt_pipe_sim *sim, const dt_pipe_sim *ref) {
    int P = s->P, M = s->M, V = s->V;
    for (int r = 0; r < P; r++) {
        switch (s->kind) {
        case DT_PIPE_GPIPE:
        case DT_PIPE_1F1B:
            /* With tb = 2tf and no latency every rank is busy M(tf+tb) and
             * the step takes (M+P-1)(tf+tb): the textbook fraction holds for
             * EVERY rank (the first rank idles at the end, the last at the
             * start, the same amount), not only on average. */
            assert_near(sim->bubble[r], (P - 1.0) / (M + P - 1.0), 1e-9);
            assert_near(sim->bubble[r], dt_pipe_bubble_formula(s->kind, P, M, V), 1e-9);
            break;
        case DT_PIPE_INTERLEAVED:
            /* Same idle time as 1F1B, 3(P-1) chunk costs, but over V times the
             * work: exactly (P-1)/(MV+P-1). Megatron's (P-1)/(M+P-1)/V (the
             * formula) is the same to first order and lower by the factor
             * 1 + (V-1)(P-1)/(MV+P-1) exactly, so that is the tolerance. */
            assert_near(sim->bubble[r], (P - 1.0) / (M * V + P - 1.0), 1e-9);
            assert_near(sim->bubble[r] / (1 + (V - 1.0) * (P - 1) / (M * V + P - 1.0)),
                               dt_pipe_bubble_formula(s->kind, P, M, V), 1e-9);
            if (P > 1) assert_true(sim->bubble[r] < ref->bubble[r]);
            break;
        case DT_PIPE_ZBH1:
            /* Idle time (not the fraction: the step shrinks too, so the
             * fraction's ratio is (M+P-1)/(3M+P-1), just over 1/3) is at most
             * a third of 1F1B's (tb = 2: B includes W), and exactly P-1, the
             * paper's (P-1)(tf+tb-tw), once M >= P. */
            assert_true(sim->makespan - sim->busy[r] <= (ref->makespan - ref->busy[r]) / 3 + 1e-9 || M < P);
            if (M >= P) {
                assert_near(sim->makespan - sim->busy[r], P - 1.0, 1e-9);
                assert_near(sim->bubble[r], dt_pipe_bubble_formula(s->kind, P, M, V), 1e-9);
            }
            break;
        }
    }
}

static void check_valid(dt_pipe_kind k, int P, int M, int V) {
    dt_pipe_schedule s, one;
    dt_pipe_sim sim, ref, lat;
    snprintf(ctx, sizeof ctx, "%s P=%d M=%d V=%d", dt_pipe_kind_name(k), P, M, V);
    build(k, P, M, V, 0, &s);
    build(DT_PIPE_1F1B, P, M, 1, 0, &one);
    double tb = k == DT_PIPE_ZBH1 ? 1 : 2, tw = k == DT_PIPE_ZBH1 ? 1 : 0;
    assert_int_equal(dt_pipe_schedule_simulate(&s, 1, tb, tw, 0, &sim), DT_OK);
    assert_int_equal(dt_pipe_schedule_simulate(&s, 1, tb, tw, 0.3, &lat), DT_OK);
    assert_int_equal(dt_pipe_schedule_simulate(&one, 1, 2, 0, 0, &ref), DT_OK);
    assert_true(lat.makespan >= sim.makespan);
    for (int r = 0; r < P; r++) {
        int fw_not_w = verify_rank(&s, r);
        assert_near(sim.busy[r], M * V * (1 + tb + tw), 1e-9);
        if (k == DT_PIPE_1F1B || k == DT_PIPE_ZBH1)
            assert_int_equal(sim.peak_outstanding[r], P - r < M ? P - r : M);
        if (k == DT_PIPE_GPIPE) assert_int_equal(sim.peak_outstanding[r], M);
        if (k == DT_PIPE_INTERLEAVED) {
            int warm = (P - r - 1) * 2 + (V - 1) * P;
            assert_int_equal(sim.peak_outstanding[r], warm + 1 < M * V ? warm + 1 : M * V);
        }
        /* zb-h1 holds W's back but never more micro-batches than rank 0 of
         * 1F1B does: P (or M). */
        if (k == DT_PIPE_ZBH1) assert_true(fw_not_w <= (P < M ? P : M));
    }
    for (int r = P; r < DT_PIPE_MAX_RANKS; r++) assert_true(sim.busy[r] == 0 && sim.peak_outstanding[r] == 0);
    check_bubbles(&s, &sim, &ref);
    dt_pipe_schedule_free(&s);
    dt_pipe_schedule_free(&one);
}

static void check_invalid(dt_pipe_kind k, int P, int M, int V) {
    dt_pipe_schedule s;
    char want[64];
    dt_error_clear();
    assert_int_equal(dt_pipe_schedule_build(k, P, M, V, 0, &s), DT_EINVAL);
    assert_null(s.n);
    if (k == DT_PIPE_INTERLEAVED && V >= 2) snprintf(want, sizeof want, "got M=%d, P=%d", M, P);
    else snprintf(want, sizeof want, "V=%d", V);
    if (!strstr(dt_error_message(), want)) fail_msg("'%s' does not say '%s'", dt_error_message(), want);
    dt_pipe_schedule_free(&s);
}

static void test_table(void **st) {
    (void)st;
    static const int Ps[] = {1, 2, 3, 4, 8}, Ms[] = {1, 2, 3, 4, 8, 16};
    int valid = 0, invalid = 0;
    for (int k = DT_PIPE_GPIPE; k <= DT_PIPE_ZBH1; k++)
        for (int a = 0; a < 5; a++)
            for (int b = 0; b < 6; b++)
                for (int V = 1; V <= 3; V++) {
                    if (valid_combo(k, Ps[a], Ms[b], V)) check_valid(k, Ps[a], Ms[b], V), valid++;
                    else check_invalid(k, Ps[a], Ms[b], V), invalid++;
                }
    /* 3 V=1 kinds x 30 (P, M); interleaved: V in {2,3} x the (P, M) with P | M:
     * P=1: 6, P=2: M 2 4 8 16, P=3: 3, P=4: 4 8 16, P=8: 8 16 = 16 */
    assert_int_equal(valid, 3 * 30 + 2 * 16);
    assert_int_equal(invalid, 4 * 90 - valid);
}

/* The targets of the brief: zb-h1 idle <= a third of 1f1b's at P 2, 4 and M
 * 4, 8, 16 (also covered by the table; stated here on its own). */
static void test_zbh1_third_of_1f1b(void **st) {
    (void)st;
    static const int Ps[] = {2, 4}, Ms[] = {4, 8, 16};
    for (int a = 0; a < 2; a++)
        for (int b = 0; b < 3; b++) {
            dt_pipe_schedule z, o;
            dt_pipe_sim zs, os;
            build(DT_PIPE_ZBH1, Ps[a], Ms[b], 1, 0, &z);
            build(DT_PIPE_1F1B, Ps[a], Ms[b], 1, 0, &o);
            assert_int_equal(dt_pipe_schedule_simulate(&z, 1, 1, 1, 0, &zs), DT_OK);
            assert_int_equal(dt_pipe_schedule_simulate(&o, 1, 2, 0, 0, &os), DT_OK);
            for (int r = 0; r < Ps[a]; r++) assert_true(zs.makespan - zs.busy[r] <= (os.makespan - os.busy[r]) / 3 + 1e-9);
            assert_true(zs.makespan < os.makespan);
            dt_pipe_schedule_free(&z);
            dt_pipe_schedule_free(&o);
        }
}

static void expect_build_error(dt_pipe_kind k, int P, int M, int V, int L, const char *want) {
    dt_pipe_schedule s;
    assert_int_equal(dt_pipe_schedule_build(k, P, M, V, L, &s), DT_EINVAL);
    if (!strstr(dt_error_message(), want)) fail_msg("'%s' does not say '%s'", dt_error_message(), want);
}

static void test_build_errors(void **st) {
    (void)st;
    expect_build_error(DT_PIPE_1F1B, 0, 4, 1, 0, "P=0");
    expect_build_error(DT_PIPE_GPIPE, 65, 4, 1, 0, "P=65");
    expect_build_error(DT_PIPE_1F1B, 65, 4, 1, 0, "<= 64");
    expect_build_error(DT_PIPE_ZBH1, 2, 0, 1, 0, "M=0");
    expect_build_error(DT_PIPE_INTERLEAVED, 2, 4, 0, 0, "V=0");
    expect_build_error(DT_PIPE_INTERLEAVED, 4, 6, 2, 0, "got M=6, P=4");
    expect_build_error(DT_PIPE_INTERLEAVED, 4, 2, 2, 0, "got M=2, P=4");
    expect_build_error(DT_PIPE_INTERLEAVED, 4, 8, 1, 0, "V=1");
    expect_build_error(DT_PIPE_GPIPE, 2, 4, 1, -1, "got -1");
    expect_build_error(DT_PIPE_1F1B, 2, 4, 1, 2, "gpipe only (got 2)");
    expect_build_error((dt_pipe_kind)7, 2, 4, 1, 0, "kind 7");
}

/* ---- the check catches broken lists ---- */

static void put(dt_pipe_schedule *s, int r, const char *text) {
    int i = 0;
    for (const char *p = text; *p; i++) {
        char op;
        int mb, used;
        assert_int_equal(sscanf(p, " %c%d%n", &op, &mb, &used), 2);
        s->act[r][i] = (dt_pipe_action){(uint8_t)(op == 'F' ? DT_PIPE_F : op == 'B' ? DT_PIPE_B : DT_PIPE_W), 0, mb};
        p += used;
    }
    s->n[r] = i;
}

static void expect_check_error(dt_pipe_kind k, int P, int M, int r, const char *text, const char *want) {
    dt_pipe_schedule s;
    dt_pipe_sim sim;
    build(k, P, M, 1, 0, &s);
    put(&s, r, text);
    assert_int_equal(dt_pipe_schedule_check(&s), DT_EINVAL);
    if (!strstr(dt_error_message(), want)) fail_msg("'%s' does not say '%s'", dt_error_message(), want);
    assert_int_equal(dt_pipe_schedule_simulate(&s, 1, 2, 1, 0, &sim), DT_EINVAL);
    if (!strstr(dt_error_message(), want)) fail_msg("simulate: '%s' does not say '%s'", dt_error_message(), want);
    dt_pipe_schedule_free(&s);
}

static void test_check_errors(void **st) {
    (void)st;
    /* rank 0 wants B0 before forwarding mb 1; rank 1 wants F1 before B0. */
    expect_check_error(DT_PIPE_GPIPE, 2, 2, 0, "F0 B0 F1 B1",
                       "deadlocks: rank 0 action 1 (B mb=0 chunk=0) waits for B mb=0 chunk=0 of rank 1");
    expect_check_error(DT_PIPE_1F1B, 2, 2, 1, "B0 F0 F1 B1", "rank 1 action 0 (B mb=0 chunk=0) waits for F mb=0");
    expect_check_error(DT_PIPE_1F1B, 2, 4, 1, "F0 F1 B1 B0 F2 B2 F3 B3",
                       "rank 1 action 3 (B mb=0 chunk=0) runs after B of mb 1");
    expect_check_error(DT_PIPE_1F1B, 2, 2, 0, "F0 F1 B0 B0", "rank 0 action 3 (B mb=0 chunk=0) runs twice");
    expect_check_error(DT_PIPE_1F1B, 2, 2, 0, "F0 F1 B0", "rank 0 never runs B mb=1 chunk=0");
    expect_check_error(DT_PIPE_1F1B, 2, 2, 0, "F0 F1 B0 W1", "rank 0 action 3 (W mb=1 chunk=0) is not an action");
    expect_check_error(DT_PIPE_1F1B, 2, 2, 0, "F0 F1 B0 B7", "rank 0 action 3 (B mb=7 chunk=0) is not an action");
    expect_check_error(DT_PIPE_ZBH1, 2, 2, 1, "F0 B0 F1 B1 W1 W0",
                       "rank 1 action 4 (W mb=1 chunk=0) is W number 0 but B number 0 is B mb=0");
    expect_check_error(DT_PIPE_ZBH1, 2, 2, 1, "F0 W0 B0 F1 B1 W1", "rank 1 action 1 (W mb=0 chunk=0) waits for B mb=0");
    dt_pipe_schedule empty = {0};
    assert_int_equal(dt_pipe_schedule_check(&empty), DT_EINVAL);
    dt_pipe_schedule_free(&empty);
}

static void test_names_and_format(void **st) {
    (void)st;
    static const char *names[] = {"gpipe", "1f1b", "interleaved", "zb-h1"};
    for (int k = 0; k < 4; k++) {
        dt_pipe_kind got;
        assert_int_equal(dt_pipe_kind_parse(names[k], &got), 0);
        assert_int_equal(got, k);
        assert_string_equal(dt_pipe_kind_name(got), names[k]);
    }
    dt_pipe_kind got = DT_PIPE_1F1B;
    assert_int_equal(dt_pipe_kind_parse("zb-h2", &got), -1);
    assert_int_equal(got, DT_PIPE_1F1B);
    assert_non_null(strstr(dt_error_message(), "'zb-h2'"));
    assert_string_equal(dt_pipe_kind_name((dt_pipe_kind)9), "?");

    dt_pipe_schedule s;
    char buf[8];
    build(DT_PIPE_1F1B, 2, 4, 1, 0, &s);   /* rank 0: "F0 F1 B0 F2 B1 F3 B2 B3", 23 chars */
    assert_int_equal(dt_pipe_schedule_format(&s, 0, buf, sizeof buf), 23);
    assert_string_equal(buf, "F0 F1 B");
    assert_int_equal(dt_pipe_schedule_format(&s, 0, NULL, 0), 23);
    assert_int_equal(dt_pipe_schedule_format(&s, 2, buf, sizeof buf), -1);
    dt_pipe_schedule_free(&s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpipe_lists),
        cmocka_unit_test(test_1f1b_lists),
        cmocka_unit_test(test_interleaved_lists),
        cmocka_unit_test(test_zbh1_lists),
        cmocka_unit_test(test_simulator_by_hand),
        cmocka_unit_test(test_table),
        cmocka_unit_test(test_zbh1_third_of_1f1b),
        cmocka_unit_test(test_build_errors),
        cmocka_unit_test(test_check_errors),
        cmocka_unit_test(test_names_and_format),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
