#!/usr/bin/env bash
# A stop reaches the final evaluation (issue 31 item 2): SIGTERM once the last
# training step is logged (evaluation follows at once, after the final save)
# ends the job within seconds with exit 143 and "interrupted at step N during
# evaluation, saved to PATH" (the final checkpoint, written before
# evaluation). The evaluation set (tens of MB of text) would take tens of
# seconds, on any CPU, to evaluate whole.
# usage: test_stop_eval.sh DTRAIN NP [MPIEXEC ARGS...]
#   NP 1: one process. NP 2|4: the --nproc launcher signalled, and under a
#   plain mpiexec one rank only (the ranks must agree to stop).
set -uo pipefail
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"   # (see test_recompute_bitwise.sh)
bin=$1 np=$2; shift 2
mpiexec=("$@")
tmp=$(mktemp -d /tmp/dt_test_stop_eval_XXXXXX)
main=$BASHPID
trap '[ "$BASHPID" = "$main" ] && { pkill -KILL -f "$tmp/" 2>/dev/null; rm -rf "$tmp"; }' EXIT
# 48 MB of text as the validation split: ~190k batches of 256 tokens
line="the quick brown fox jumps over the lazy dog while the cat sleeps by the door 0123456789"
yes "$line" | head -c 48000000 > "$tmp/val.txt"
steps=20
lm=(--model gpt2 --layers 1 --embd 32 --heads 2 --max-t 32 --seq 32 --batch 8 --steps $steps --threads 1
    --data text --val-path "$tmp/val.txt" --eval-batches 0 --log-every 10)
fail=0

# case TAG TARGET LAUNCH...: TARGET launcher | rank:R
case_() {
    local tag=$1 target=$2; shift 2
    local ck="$tmp/$tag.ck" out="$tmp/$tag.out" bad="" i
    "$@" "${lm[@]}" --save "$ck" < /dev/null > "$out" 2>&1 &
    local pid=$!
    for ((i = 0; i < 1200; i++)); do   # until the last step's line (at most 120 s: start-up under load)
        grep -q "^step $steps/$steps" "$out" 2>/dev/null && break
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    grep -q "^step $steps/$steps" "$out" || bad="never logged step $steps/$steps"
    local t0=$(date +%s%N)
    if [ -z "$bad" ] && [ "$target" = launcher ]; then kill -TERM "$pid"
    elif [ -z "$bad" ]; then   # one rank: the mpiexec descendant with OMPI_COMM_WORLD_RANK=R
        local r=${target#rank:} p rpid=""
        for p in $(pgrep -P "$pid"); do
            tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -cx "OMPI_COMM_WORLD_RANK=$r" > /dev/null && rpid=$p
        done
        if [ -n "$rpid" ]; then kill -TERM "$rpid"; else bad="no rank $r process"; fi
    fi
    for ((i = 0; i < 300; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    local ms=$(( ($(date +%s%N) - t0) / 1000000 ))
    if kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid"; [ -n "$bad" ] || bad="still running 30 s after the signal"; fi
    pkill -KILL -f "$ck" 2>/dev/null
    wait "$pid"; local rc=$?
    [ -n "$bad" ] || [ "$rc" -eq 143 ] || bad="exit status $rc, wanted 143"
    [ -n "$bad" ] || [ "$ms" -le 15000 ] || bad="took $ms ms after the signal"
    [ -n "$bad" ] || [ "$(grep -c "^interrupted at step $steps during evaluation, saved to $ck\$" "$out")" -eq 1 ] ||
        bad="no single 'interrupted at step $steps during evaluation, saved to $ck' line"
    [ -n "$bad" ] || ! grep -q "^validation loss" "$out" || bad="printed an evaluation result"
    [ -n "$bad" ] || ! grep -qiE "error|MPI_ABORT" "$out" || bad="error output"
    [ -n "$bad" ] || [ -e "$ck" ] || bad="no checkpoint $ck"
    if [ -n "$bad" ]; then echo "FAIL $tag: $bad"; tail -5 "$out"; fail=1
    else echo "ok   $tag: SIGTERM to $target during evaluation -> exit 143 ${ms} ms later, final checkpoint kept"; fi
}

if [ "$np" -eq 1 ]; then
    case_ single launcher "$bin" train
else
    case_ "nproc$np" launcher "$bin" train --nproc "$np" --zero 1
    case_ "ddp_np${np}_rank$((np - 1))" "rank:$((np - 1))" "${mpiexec[@]}" --quiet -n "$np" "$bin" train
fi
exit $fail
