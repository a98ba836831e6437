#!/usr/bin/env bash
# One writer per sharded checkpoint directory (issue 31 item 3): while job A
# (--nproc NP, ZeRO-1, --save DIR every few steps) runs, a second job saving
# into DIR (ZeRO at NP ranks, a pipeline, ZeRO in one process) is refused
# before step 1, naming DIR and A's rank 0 (pid and host, from the lock file
# DIR/.dtrain.lock); A is unharmed: it stops on SIGTERM with its checkpoint
# saved, which resumes to the end, and once A has ended its directory is free.
# usage: test_ckpt_dir_lock.sh DTRAIN NP
set -uo pipefail
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"   # (see test_recompute_bitwise.sh)
bin=$1 np=$2
tmp=$(mktemp -d /tmp/dt_test_ckpt_lock_XXXXXX)
main=$BASHPID
trap '[ "$BASHPID" = "$main" ] && { pkill -KILL -f "$tmp/" 2>/dev/null; rm -rf "$tmp"; }' EXIT
dir="$tmp/ck"
mlp=(--model mlp --hidden 32 --batch 16 --threads 1 --eval-batches 1 --log-every 1)
fail=0

# A: runs until stopped (10^8 steps), saving every 5
"$bin" train --nproc "$np" --zero 1 "${mlp[@]}" --steps 100000000 --save-every 5 --save "$dir" < /dev/null > "$tmp/a.out" 2>&1 &
a=$!
for ((i = 0; i < 1200; i++)); do   # until A has saved (at most 120 s: start-up under load)
    [ -s "$dir/index.json" ] && grep -qE '^step ([1-9][0-9])/' "$tmp/a.out" && break
    kill -0 "$a" 2>/dev/null || break
    sleep 0.1
done
holder=""
for p in $(pgrep -P "$(pgrep -P "$a")"); do   # A's rank 0: it holds the lock
    tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -cx "OMPI_COMM_WORLD_RANK=0" > /dev/null && holder=$p
done
if [ ! -s "$dir/index.json" ] || [ -z "$holder" ]; then
    echo "FAIL job A never saved or has no rank 0:"; tail -5 "$tmp/a.out"; exit 1
fi
host=$(hostname)

# refused TAG ARGS...: a second writer into DIR, refused before step 1
refused() {
    local tag=$1; shift
    local out rc
    out=$(timeout -k 5 120 "$bin" train "${mlp[@]}" --steps 100000000 "$@" --save "$dir" < /dev/null 2>&1); rc=$?
    local want="sharded checkpoint $dir is in use by another job (pid $holder on host $host holds $dir/.dtrain.lock)"
    if [ $rc -eq 0 ] || [ $rc -ge 124 ]; then echo "FAIL $tag: exit status $rc"; echo "$out" | tail -3; fail=1
    elif grep -qE '^step [0-9]+/' <<< "$out"; then echo "FAIL $tag: trained before refusing"; fail=1
    elif [ "$(grep -c "^dtrain: error: --save: $want" <<< "$out")" -ne 1 ]; then
        echo "FAIL $tag: wanted one line 'dtrain: error: --save: $want', got:"; echo "$out" | tail -3; fail=1
    else echo "ok   $tag refused at start: $(grep -o 'in use by another job ([^)]*)' <<< "$out")"; fi
}
refused "second job, ZeRO-1 x$np" --nproc "$np" --zero 1
refused "second job, pipeline x$np" --nproc "$np" --pp "$np"
refused "second job, one process ZeRO-2" --zero 2

# A is unharmed: still running, stops on SIGTERM with its checkpoint, which resumes
if ! kill -0 "$a" 2>/dev/null; then echo "FAIL job A died:"; tail -5 "$tmp/a.out"; fail=1; fi
kill -TERM "$a"
for ((i = 0; i < 600; i++)); do kill -0 "$a" 2>/dev/null || break; sleep 0.1; done
kill -0 "$a" 2>/dev/null && { kill -KILL "$a"; echo "FAIL job A did not stop within 60 s"; fail=1; }
wait "$a"; rc=$?
at=$(sed -n "s/^interrupted at step \([0-9]*\), saved to .*/\1/p" "$tmp/a.out")
if [ $rc -ne 143 ] || [ -z "$at" ] || grep -qiE "error|not visible" "$tmp/a.out"; then
    echo "FAIL job A: exit $rc (wanted 143), interrupted at '${at}':"; grep -v '^step' "$tmp/a.out" | tail -5; fail=1
else
    # the directory is free now: a job resumes A's checkpoint there and saves to it
    out=$(timeout -k 5 120 "$bin" train --nproc "$np" --zero 1 "${mlp[@]}" --steps $((at + 3)) --resume "$dir" \
          --save "$dir" < /dev/null 2>&1); rc=$?
    if [ $rc -eq 0 ] && grep -q "^step $((at + 3))/$((at + 3))" <<< "$out"; then
        echo "ok   job A unharmed: stopped at step $at (exit 143), resumed in the freed directory to step $((at + 3))"
    else echo "FAIL resuming job A's checkpoint in $dir: exit $rc"; echo "$out" | tail -3; fail=1; fi
fi
exit $fail
