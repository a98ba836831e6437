#!/usr/bin/env bash
# A scheduler's cancel at any moment stops the job (issue 31 item 1): SIGTERM
# to `dtrain train --nproc NP` 0, 30, 50, 80 and 150 ms after launch (before,
# while and after mpirun starts the ranks) exits 143 every time, within 30 s,
# with no rank process and no launch directory left behind. A checkpoint the
# stop wrote (at step 0, when the ranks got that far) resumes.
# usage: test_stop_at_launch.sh DTRAIN NP
set -uo pipefail
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"   # (see test_recompute_bitwise.sh)
bin=$1 np=$2
tmp=$(mktemp -d /tmp/dt_test_stop_launch_XXXXXX)
export TMPDIR=$tmp   # the launcher's directory goes here: checked below
main=$BASHPID   # (a job killed before its exec would run the trap too)
trap '[ "$BASHPID" = "$main" ] && { pkill -KILL -f "$tmp/" 2>/dev/null; rm -rf "$tmp"; }' EXIT
# a job that would run for minutes: it must be the stop that ends it
run=(train --nproc "$np" --model mlp --hidden 32 --batch 16 --threads 1 --log-every 1000 --steps 100000000)
fail=0
for ms in 0 30 50 80 150; do
    ck="$tmp/ck$ms.st" out="$tmp/out$ms" bad=""
    t0=$(date +%s%N)
    "$bin" "${run[@]}" --save "$ck" < /dev/null > "$out" 2>&1 &
    pid=$!
    [ "$ms" -gt 0 ] && sleep "$(printf '0.%03d' "$ms")"
    kill -TERM "$pid"
    # at most 30 s (not timeout(1): it would send the job a second signal of its own)
    for ((i = 0; i < 300; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid"; hung=1; else hung=0; fi
    wait "$pid"; rc=$?
    [ $hung -eq 0 ] || bad="still running 30 s after the signal"
    secs=$(( ($(date +%s%N) - t0) / 1000000000 ))
    left=$(pgrep -f "$ck" | tr '\n' ' ')
    [ -n "$bad" ] || [ "$rc" -eq 143 ] || bad="exit status $rc, wanted 143"
    [ -n "$bad" ] || [ -z "$left" ] || bad="rank processes left: $left"
    [ -n "$bad" ] || ! ls -d "$tmp"/dtrain-launch.* > /dev/null 2>&1 || bad="launch directory left: $(ls -d "$tmp"/dtrain-launch.*)"
    touch "$out"   # (none when the signal came before the job's shell redirected)
    [ -n "$bad" ] || ! grep -qE "^step [0-9]+/" "$out" || bad="trained: $(grep -E '^step' "$out" | tail -1)"
    [ -n "$bad" ] || ! grep -qiE "error|MPI_ABORT" "$out" || bad="error output"
    if [ -z "$bad" ] && [ -e "$ck" ]; then   # stopped at step 0 with a checkpoint: it resumes
        grep -q "^interrupted at step 0, saved to $ck\$" "$out" || bad="checkpoint without 'interrupted at step 0' line"
        [ -n "$bad" ] || timeout -k 5 120 "$bin" train --model mlp --hidden 32 --batch 32 --threads 1 --steps 2 \
            --eval-batches 1 --resume "$ck" < /dev/null > "$tmp/res$ms" 2>&1 || bad="its checkpoint does not resume: $(tail -2 "$tmp/res$ms")"
    fi
    if [ -n "$bad" ]; then echo "FAIL SIGTERM at $ms ms: $bad"; tail -5 "$out"; fail=1
    else echo "ok   SIGTERM at $ms ms -> exit 143 after ${secs}s, nothing left$([ -e "$ck" ] && echo ", step-0 checkpoint resumes")"; fi
    pkill -KILL -f "$ck" 2>/dev/null
done
exit $fail
