#!/usr/bin/env bash
# Ranks started with different settings (MPMD: mpiexec -n A dtrain ... : -n B
# dtrain ...) fail at start-up, within seconds, with the configuration
# agreement's message naming the setting and the ranks on each side -- never
# a hang, a crash, a sanitizer report or a silently wrong run. Mismatches:
# --layers (ZeRO-2: was a heap overflow), --heads and --batch (trained
# silently), --steps (hung), ZeRO-2 vs DDP (hung), pipeline vs DDP both ways,
# the pipeline's --pp and --pp-wire (a 16-bit sender and a float32 receiver),
# the progress mode; one odd rank among 4 in the middle and at the end.
# Identical settings still train.
# usage: test_config_agreement.sh DTRAIN NP MPIEXEC [MPIEXEC ARGS...]
set -uo pipefail
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
export OMP_NUM_THREADS=1
bin=$1 np=$2
shift 2
mpi=("$@")
fail=0
base=(train --model gpt2 --embd 32 --heads 4 --layers 2 --vocab 256 --seq 16 --batch 4 --steps 3 --threads 1 --quiet)

# run ODD_AT "ARGS A" "ARGS B": rank ODD_AT runs B, the others A
run() {
    local odd=$1 a=$2 b=$3 spec=()
    # shellcheck disable=SC2206
    local A=($a) B=($b)
    [ "$odd" -gt 0 ] && spec+=(-n "$odd" "$bin" "${base[@]}" "${A[@]}" :)
    spec+=(-n 1 "$bin" "${base[@]}" "${B[@]}")
    [ $((np - odd - 1)) -gt 0 ] && spec+=(: -n $((np - odd - 1)) "$bin" "${base[@]}" "${A[@]}")
    timeout -k 15 120 "${mpi[@]}" "${spec[@]}" < /dev/null 2>&1
}

# expect ODD_AT "ARGS A" "ARGS B" NEEDLE
expect() {
    local odd=$1 a=$2 b=$3 needle=$4 out rc t0 el bad=""
    t0=$(date +%s)
    out=$(run "$odd" "$a" "$b"); rc=$?
    el=$(( $(date +%s) - t0 ))
    if [ $rc -eq 124 ]; then bad="hang"
    elif [ $rc -eq 0 ]; then bad="exit 0"
    elif ! grep -qF -- "error: configuration differs between ranks: $needle" <<<"$out"; then bad="no '$needle'"
    elif grep -qE 'AddressSanitizer|runtime error|LeakSanitizer|free\(\)|corrupted|Segmentation' <<<"$out"; then bad="crash"
    elif [ "$el" -gt 60 ]; then bad="took ${el}s"
    fi
    if [ -n "$bad" ]; then
        echo "FAIL rank $odd runs '$b', the others '$a' ($bad, rc $rc), got:"; grep -v '^$' <<<"$out" | head -12; fail=1
    else echo "ok   rank $odd '$b' vs '$a': $needle (${el}s)"; fi
}

last=$((np - 1))
others() {   # "rank 0" / "ranks 0-2" / "ranks 0, 2-3": every rank but $1
    local odd=$1
    if [ "$np" -eq 2 ]; then echo "rank $((1 - odd))"
    elif [ "$odd" -eq 0 ]; then echo "ranks 1-$last"
    elif [ "$odd" -eq "$last" ]; then echo "ranks 0-$((last - 1))"
    elif [ "$odd" -eq 1 ]; then echo "ranks 0, 2-$last"
    else echo "ranks 0-$((odd - 1)), $((odd + 1))-$last"; fi
}
have() { [ "$np" -eq 2 ] && echo has || echo have; }
O=$last; R="$(others $O) $(have)"
expect $O "--zero 2" "--zero 2 --layers 3" "--layers: rank $O has 3, $R 2"
expect $O "" "--heads 8" "--heads: rank $O has 8, $R 4"
expect $O "" "--batch 8" "--batch: rank $O has 8, $R 4"
# the data-parallel settings, named by the library as fields and by the CLI as flags
expect $O "" "--bucket-mb 2" "--bucket-mb: rank $O has 2, $R 1"
expect $O "" "--compress bf16" "--compress: rank $O has bf16, $R f32"
expect $O "--steps 200" "--steps 300" "--steps: rank $O has 300, $R 200"
expect $O "--zero 2" "" "strategy: rank $O has ddp, $R zero-2"
expect $O "--progress poll" "--progress thread" "--progress (DTRAIN_PROGRESS): rank $O has thread, $R poll"
if [ "$np" -eq 2 ]; then
    expect 1 "--pp 2" "" "strategy: rank 1 has ddp, rank 0 has pipeline"
    expect 0 "--pp 2" "" "strategy: rank 1 has pipeline, rank 0 has ddp"
else
    O=1; R="$(others $O) $(have)"
    expect $O "" "--layers 3" "--layers: rank 1 has 3, $R 2"
    expect $O "--zero 2" "" "strategy: rank 1 has ddp, $R zero-2"
    expect $O "--pp 2" "--pp 4" "--pp: rank 1 has 4, $R 2"
    expect $O "--pp 2" "--pp 2 --pp-wire bf16" "--pp-wire: rank 1 has bf16, $R fp32"
    expect 0 "" "--zero 1 --steps 7" "strategy: ranks 1-3 have ddp, rank 0 has zero-1"
fi
# the control: the same settings everywhere train to the end
out=$(run "$last" "--zero 2" "--zero 2"); rc=$?
if [ $rc -ne 0 ]; then echo "FAIL equal settings (rc $rc):"; grep -v '^$' <<<"$out" | head -8; fail=1
else echo "ok   equal settings train"; fi
exit $fail
