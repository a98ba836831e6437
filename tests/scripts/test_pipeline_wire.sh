#!/usr/bin/env bash
# shellcheck disable=SC2054  # (--pp-split takes comma lists)
# --pp-wire bf16|fp16: a pipeline's activations and their gradients travel
# between stages in 16 bits (rounded by the sender, widened by the receiver).
#  - the rounding happens: the run differs from the float32 wire, yet its
#    losses stay within 1e-4 (relative) of it, eval included; evaluation
#    itself rounds (at --lr 0, same weights, its loss differs);
#  - it depends only on the cut (given here: the default cut is measured, so
#    it can move between runs, and the rounding with it), not on how the
#    stages are driven: every schedule (gpipe, with and without --max-outstanding, 1f1b, zb-h1) and,
#    at 4 ranks, every data-parallel reducer of the stages' replicas (DDP,
#    ZeRO-1/2/3) and 4 stages or 2 ranks x 2 interleaved chunks with the same
#    three cuts give the same bits (every tensor of the final checkpoint and
#    the logged losses);
#  - bf16 and fp16 round differently (both differ from each other); fp16
#    on the wire works under --precision fp16's loss scaling;
#  - a bad value is refused naming the flag and the choices.
# The bytes it saves on each link, so that both directions (activations on
# stage 0's, gradients on stage 1's) travel in 16 bits, are measured across
# simulated hosts by test_multihost.sh.
# usage: test_pipeline_wire.sh DTRAIN CKPT_CMP NP   (NP 2: the 2-rank cases; 4: those with replicas)
set -uo pipefail
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"   # (see test_recompute_bitwise.sh)
bin=$1 cmp=$2 np=$3
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
for i in $(seq 1 300); do echo "line $i: the quick brown fox jumps over the lazy dog $((i * 7919 % 1000))"; done > "$tmp/corpus.txt"
gpt2=(--model gpt2 --layers 2 --embd 32 --heads 2 --max-t 32 --seq 32 --data text --data-path "$tmp/corpus.txt"
      --eval-batches 2 --threads 1 --steps 4)
fail=0

# t_run TAG ARGS...: train GPT-2 quietly, keep TAG.ck and TAG.jsonl (tests/scripts/lib/train_compare.sh)
# shellcheck source=tests/scripts/lib/train_compare.sh
. "$(dirname "$0")/lib/train_compare.sh"
# shellcheck disable=SC2034  # (t_run reads it through args)
quiet=("${gpt2[@]}" --quiet)
args=quiet
nums() { sed 's/,"ms":[0-9.e+-]*//' "$tmp/$1.jsonl"; }   # TAG's metrics without the timings
same() {   # same REF TAG: bit for bit, the checkpoint and every logged loss, eval included (t_same: training only)
    if "$cmp" "$tmp/$1.ck" "$tmp/$2.ck" step optim_step epoch cursor > "$tmp/cmp.out" && cmp -s <(nums "$1") <(nums "$2"); then
        echo "ok   $2 == $1"
    else
        echo "FAIL $2 != $1:"; cat "$tmp/cmp.out"; diff <(nums "$1") <(nums "$2"); fail=1
    fi
}
# near REF TAG: some parameter differs, and every logged loss (training and
# eval) is within 1e-4 of REF's, relative
near() {
    if "$cmp" "$tmp/$1.ck" "$tmp/$2.ck" step optim_step epoch cursor > "$tmp/cmp.out" 2>&1; then
        echo "FAIL $2 == $1 bit for bit: the wire did not round"; fail=1; return
    fi
    local worst
    worst=$(paste -d' ' <(grep -oE '"(eval_)?loss":[0-9.e+-]+' "$tmp/$1.jsonl") <(grep -oE '"(eval_)?loss":[0-9.e+-]+' "$tmp/$2.jsonl") |
            awk '{ split($1, a, ":"); split($2, b, ":"); if (a[1] != b[1]) { print "mismatch"; exit }
                   d = (a[2] - b[2]) / a[2]; if (d < 0) d = -d; if (d > w) w = d; n++ }
                 END { if (n < 5) print "too few"; else printf "%.3g\n", w }')
    if awk -v w="$worst" 'BEGIN { exit !(w ~ /^[0-9.e+-]+$/ && w + 0 <= 1e-4) }'; then
        echo "ok   $2 differs from $1, losses within $worst"
    else
        echo "FAIL $2 vs $1: largest relative loss gap '$worst' (want <= 1e-4)"; paste "$tmp/$1.jsonl" "$tmp/$2.jsonl"; fail=1
    fi
}

pp=(--batch 8 --microbatches 4 --pp 2 --nproc 2 --pp-split 2,2)
if [ "$np" -lt 4 ]; then
    t_run f32 "${pp[@]}"
    t_run bf16 "${pp[@]}" --pp-wire bf16 && near f32 bf16
    # (the output whole first: grep -q leaving a pipe early can SIGPIPE mpirun, and pipefail then fails the check)
    out=$("$bin" train "${gpt2[@]}" "${pp[@]}" --pp-wire bf16 --steps 1 2>&1)
    if grep -q "activations and their gradients travel between stages as bf16 (computed in float32)" <<< "$out"; then
        echo "ok   the start-up lines name the bf16 wire"
    else
        echo "FAIL: no start-up line names the bf16 wire"; fail=1
    fi
    t_run fp16 "${pp[@]}" --pp-wire fp16 && near f32 fp16
    if [ ! -e "$tmp/bf16.ck" ] || [ ! -e "$tmp/fp16.ck" ] ||
       "$cmp" "$tmp/bf16.ck" "$tmp/fp16.ck" step optim_step epoch cursor > /dev/null 2>&1; then
        echo "FAIL fp16 == bf16 bit for bit (or a run failed)"; fail=1
    else
        echo "ok   fp16 != bf16"
    fi
    # fp16 on the wire under fp16's loss scaling (scaled gradients, skipped steps agreed)
    t_run h16 "${pp[@]}" --precision fp16 && t_run h16_fp16 "${pp[@]}" --precision fp16 --pp-wire fp16 && near h16 h16_fp16
    # evaluation rounds too: at --lr 0 the weights never move, so only the
    # wire can make bf16's evaluation differ from fp32's
    t_run f32_lr0 "${pp[@]}" --lr 0 --steps 1 && t_run bf16_lr0 "${pp[@]}" --lr 0 --steps 1 --pp-wire bf16 &&
    if e32=$(grep -o '"eval_loss":[0-9.e+-]*' "$tmp/f32_lr0.jsonl") && e16=$(grep -o '"eval_loss":[0-9.e+-]*' "$tmp/bf16_lr0.jsonl") &&
       [ "$e32" != "$e16" ] && awk -v a="${e32#*:}" -v b="${e16#*:}" 'BEGIN { d = (a - b) / a; exit !(d < 1e-4 && d > -1e-4) }'; then
        echo "ok   evaluation through the bf16 wire: ${e16#*:} against ${e32#*:} (same weights)"
    else
        echo "FAIL evaluation through the bf16 wire: '${e16:-}' against '${e32:-}' (want different, within 1e-4)"; fail=1
    fi
    t_run f32_explicit "${pp[@]}" --pp-wire fp32 && same f32 f32_explicit
    t_run bf16_gpipe "${pp[@]}" --pp-wire bf16 --schedule gpipe && same bf16 bf16_gpipe
    t_run bf16_gpipe2 "${pp[@]}" --pp-wire bf16 --schedule gpipe --max-outstanding 2 && same bf16 bf16_gpipe2
    t_run bf16_zbh1 "${pp[@]}" --pp-wire bf16 --schedule zb-h1 && same bf16 bf16_zbh1
    rc=0; out=$("$bin" train "${gpt2[@]}" "${pp[@]}" --pp-wire fp8 2>&1) || rc=$?
    if [ "$rc" -ne 0 ] && grep -q -- "--pp-wire: unknown 'fp8' (fp32, bf16, fp16)" <<< "$out"; then
        echo "ok   --pp-wire fp8 refused: $(grep -m1 -o -- "--pp-wire: unknown.*" <<< "$out")"
    else
        echo "FAIL --pp-wire fp8 not refused as expected:"; echo "$out" | tail -3; fail=1
    fi
else
    # 2 stages x 2 replicas: the stages' reducers do not change the bits
    pd=(--batch 8 --microbatches 4 --pp 2 --nproc 4 --pp-split 2,2 --pp-wire bf16)
    t_run f32_dp2 --batch 8 --microbatches 4 --pp 2 --nproc 4 --pp-split 2,2
    t_run bf16_dp2 "${pd[@]}" && near f32_dp2 bf16_dp2
    t_run bf16_dp2_zero1 "${pd[@]}" --zero 1 && same bf16_dp2 bf16_dp2_zero1
    t_run bf16_dp2_zero2 "${pd[@]}" --zero 2 --schedule zb-h1 && same bf16_dp2 bf16_dp2_zero2
    t_run bf16_dp2_zero3 "${pd[@]}" --zero 3 && same bf16_dp2 bf16_dp2_zero3
    # 4 stages: three links rounded
    p4=(--batch 8 --microbatches 4 --pp 4 --nproc 4 --pp-split 1,1,1,1)
    t_run f32_pp4 "${p4[@]}"
    t_run bf16_pp4 "${p4[@]}" --pp-wire bf16 && near f32_pp4 bf16_pp4
    t_run bf16_pp4_gpipe "${p4[@]}" --pp-wire bf16 --schedule gpipe && same bf16_pp4 bf16_pp4_gpipe
    # the same three cuts on 2 ranks x 2 chunks (interleaved): the same roundings
    t_run bf16_pp2v2 --batch 8 --microbatches 4 --pp 2 --nproc 2 --schedule interleaved --virtual-stages 2 \
        --pp-split 1,1,1,1 --pp-wire bf16 && same bf16_pp4 bf16_pp2v2
fi
exit $fail
