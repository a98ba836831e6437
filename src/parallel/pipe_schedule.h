#ifndef DT_PIPE_SCHEDULE_H
#define DT_PIPE_SCHEDULE_H
/* Static pipeline-parallel schedules: which action each rank runs, in order.
 *
 * P ranks (1..64), M micro-batches per step, V model chunks per rank. The
 * model's blocks are cut into S = P*V consecutive virtual stages; virtual
 * stage v = c*P + s is chunk c of rank s (Megatron's interleaving: rank s
 * holds virtual stages s, P+s, 2P+s, ...). Activations flow v -> v+1,
 * gradients v+1 -> v; virtual stage S-1 (rank P-1, chunk V-1) computes the
 * loss. Each rank runs its list act[s][0..n[s]) in order; a send never
 * blocks, a receive blocks until the message is there.
 *
 * One rule for every schedule: on every rank, the backwards (B) of a chunk
 * run in increasing micro-batch order, and the weight-gradient passes (W)
 * in the order of their B's. Gradients then accumulate in the same order
 * as sequential gradient accumulation over micro-batches 0..M-1, so they
 * are bitwise equal to it. dt_pipe_schedule_check enforces the rule.
 *
 * The schedules (s = rank, 0 is the first stage):
 *   gpipe        V = 1, any M. All F's, then all B's (mb 0 first). With
 *                max_outstanding L: fill-drain in groups of L micro-batches.
 *   1f1b         V = 1, any M (PipeDream-Flush). min(P-s-1, M) warm-up F's,
 *                then F,B pairs, then the remaining B's. M < P is allowed:
 *                it degenerates to fill-drain (the bubble is GPipe's).
 *   interleaved  V >= 2, M a multiple of P (Megatron-LM's virtual pipeline).
 *                The k-th forward of a rank is micro-batch (k / PV)*P + k % P
 *                on chunk (k % PV) / P; the k-th backward the same micro-
 *                batch on chunk V-1-(k % PV)/P. Warm-up min((P-s-1)*2 +
 *                (V-1)*P, M*V) forwards, then forward k+warm-up and backward
 *                k alternate, then the remaining backwards.
 *   zb-h1        V = 1, any M, B split from W (Zero Bubble, handcrafted
 *                schedule 1). F and B in 1F1B's order; W(i - s) runs right
 *                after B(i), the remaining W's at the end. Rank s so holds
 *                up to s+1 W's back and ends with B(M-1) followed by s+1
 *                W's: with tf = tb = tw and no latency every rank ends at
 *                3M+P-1, idle P-1 per rank (1f1b with tb = 2tf: 3(P-1)).
 *                The deferred W's grow toward the LAST stage: it must end
 *                with P W's after its last B so the B chain to rank 0 fits
 *                before the common end (rank s needs s+1). Memory: at most P
 *                micro-batches forwarded but not yet W'ed on every rank,
 *                rank 0's 1F1B peak. */
#include <stddef.h>
#include <stdint.h>
#include "dtrain/error.h"
#include "dtrain/pipeline.h"   /* dt_pipe_kind */

#define DT_PIPE_MAX_RANKS 64

/* F: forward of micro-batch mb through chunk c. B: backward (input gradient;
 * also the weight gradient unless the schedule splits W). W: weight gradient
 * of (mb, c), zb-h1 only. */
typedef enum dt_pipe_op { DT_PIPE_F = 0, DT_PIPE_B, DT_PIPE_W } dt_pipe_op;
typedef struct dt_pipe_action { uint8_t op, chunk; int32_t mb; } dt_pipe_action;
typedef struct dt_pipe_schedule {
    dt_pipe_kind kind;
    int P, M, V;
    int split_w;          /* 1: B computes input gradients only, W the weight gradients (zb-h1) */
    int max_outstanding;  /* gpipe: micro-batches forwarded but not yet backwarded per rank, at most
                             (1..M after build; build's 0 means M: plain fill-drain); else 0 */
    int *n;               /* n[s]: actions of rank s */
    dt_pipe_action **act; /* act[s][0..n[s]) */
} dt_pipe_schedule;

/* Builds every rank's list. DT_EINVAL names the offending value: P outside
 * 1..64, M < 1, V outside 1..255, V != 1 for gpipe/1f1b/zb-h1, V < 2 or
 * M % P != 0 for interleaved, max_outstanding < 0 or set for a schedule
 * other than gpipe. max_outstanding > M is M. Free with
 * dt_pipe_schedule_free (also safe on a zeroed or failed schedule). */
dt_status dt_pipe_schedule_build(dt_pipe_kind kind, int P, int M, int V, int max_outstanding,
                                 dt_pipe_schedule *out);
void dt_pipe_schedule_free(dt_pipe_schedule *s);
/* "gpipe" "1f1b" "interleaved" "zb-h1" -> 0; else -1 and DT_EINVAL recorded. */
/* dt_pipe_kind_parse / dt_pipe_kind_name: dtrain/pipeline.h */
/* Rank's list as "F0 F1 B0 ..." (V = 1) or "F0c0 F1c0 F0c1 ..." (V > 1:
 * micro-batch then chunk), snprintf-style: writes at most n bytes (always
 * terminated when n > 0) and returns the length of the whole text; -1 for a
 * rank out of range. */
int dt_pipe_schedule_format(const dt_pipe_schedule *s, int rank, char *buf, size_t n);

/* Textbook bubble fraction (idle / step time per rank): gpipe and 1f1b
 * (P-1)/(M+P-1) (plain fill-drain; the simulator gives exactly this on every
 * rank at tb = 2tf, no latency), interleaved that divided by V (Megatron's
 * approximation: the simulated value at tb = 2tf, no latency, is exactly
 * (P-1)/(MV+P-1), higher by the factor 1 + (V-1)(P-1)/(MV+P-1)), zb-h1
 * (P-1)/(3M+P-1): the paper's idle (P-1)(tf+tb-tw) over the step 3M+P-1 at
 * tf = tb = tw (simulated exactly when M >= P; fewer micro-batches idle
 * more). Use dt_pipe_schedule_simulate for the value of a built schedule. */
/* dt_pipe_bubble_formula(kind, P, M, V): declared in dtrain/pipeline.h */

/* Every action takes its cost (tf, tb or tw, chunks equal), a message to
 * another rank arrives lat after the end of the action that produced it (the
 * same rank: at once), and an action starts when its rank is free and its
 * inputs are there. Per rank s < P: busy time, bubble (makespan - busy) /
 * makespan (0 when makespan is 0), peak_outstanding: most (mb, chunk)
 * forwarded but not yet B'ed at once (deferred W's not counted). Entries
 * from P on are 0. DT_EINVAL as dt_pipe_schedule_check, and when the lists
 * deadlock: names the rank, action index and (op, mb, chunk) that can never
 * start and the input it waits for. */
typedef struct dt_pipe_sim {
    double makespan;
    double busy[DT_PIPE_MAX_RANKS];
    double bubble[DT_PIPE_MAX_RANKS];
    int peak_outstanding[DT_PIPE_MAX_RANKS];
} dt_pipe_sim;
dt_status dt_pipe_schedule_simulate(const dt_pipe_schedule *s, double tf, double tb, double tw, double lat,
                                    dt_pipe_sim *out);
/* DT_OK when: P, M, V in range; every rank runs each F(mb, c) and B(mb, c),
 * and W(mb, c) when split_w (never otherwise), exactly once; the lists can
 * run to the end (F(mb, v) after F(mb, v-1) wherever that runs, B(mb, v)
 * after B(mb, v+1) and after F(mb, v), W(mb, c) after B(mb, c)); on every
 * rank the B's of a chunk run in increasing mb order and the W's in the order
 * of the B's. Else DT_EINVAL naming the rank, the action index and the
 * action. */
dt_status dt_pipe_schedule_check(const dt_pipe_schedule *s);
#endif
