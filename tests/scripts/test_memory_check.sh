#!/usr/bin/env bash
# The memory check before allocating (issue 31 item 7): in a memory cgroup
# smaller than the model (v2 memory.max, or v1 memory.limit_in_bytes), a GPT-2
# run is refused before step 1 (one process, 2 ranks of ZeRO-1 sharing the
# machine's share, and 2 tensor-parallel ranks, each sized for its part) with the estimate, its parts and the figure it exceeded;
# the same run with --no-memory-check gets past the check (and may then be
# OOM-killed: only the refusal's absence is checked). Needs a memory cgroup it
# can create (root, cgroup v2 with the memory controller, or v1's memory
# hierarchy); skipped (77) otherwise.
# usage: test_memory_check.sh DTRAIN
set -uo pipefail
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"   # (MPI's own allocations; see test_ckpt_dir_lock.sh)
bin=$1
cg=""
if [ "$(stat -fc %T /sys/fs/cgroup 2> /dev/null)" = cgroup2fs ]; then
    grep -qw memory /sys/fs/cgroup/cgroup.subtree_control 2> /dev/null ||
        echo +memory > /sys/fs/cgroup/cgroup.subtree_control 2> /dev/null
    if grep -qw memory /sys/fs/cgroup/cgroup.subtree_control 2> /dev/null && mkdir "/sys/fs/cgroup/dtest_$$" 2> /dev/null; then
        cg="/sys/fs/cgroup/dtest_$$" limit_file=memory.max kind="memory.max"
    fi
elif [ "$(stat -fc %T /sys/fs/cgroup/memory 2> /dev/null)" = cgroupfs ] && mkdir "/sys/fs/cgroup/memory/dtest_$$" 2> /dev/null; then
    cg="/sys/fs/cgroup/memory/dtest_$$" limit_file=memory.limit_in_bytes kind="memory.limit_in_bytes"
fi
[ -n "$cg" ] || { echo "SKIP: cannot create a memory cgroup here (needs root and a writable cgroup v2 with the memory controller, or v1's memory hierarchy)"; exit 77; }
tmp=$(mktemp -d)
trap 'rmdir "$cg" 2> /dev/null; rm -rf "$tmp"' EXIT
if ! echo 200M > "$cg/$limit_file"; then echo "SKIP: cannot set $cg/$limit_file"; exit 77; fi
export OMP_NUM_THREADS=1
for i in $(seq 1 400); do echo "line $i: the quick brown fox jumps over the lazy dog $((i * 7919 % 1000))"; done > "$tmp/corpus.txt"
# about 12.8 M parameters: ~0.3 GiB estimated, more than twice that when it runs
run=(train --model gpt2 --layers 4 --embd 512 --heads 8 --max-t 128 --seq 128 --batch 8 --data text
     --data-path "$tmp/corpus.txt" --steps 2 --threads 1 --eval-batches 1 --log-every 1)
in_cg() { timeout -k 5 60 sh -c 'echo $$ > "$0/cgroup.procs" && exec "$@"' "$cg" "$bin" "$@" < /dev/null 2>&1; }
fail=0
name=${cg#/sys/fs/cgroup}; name=${name#/memory}

refused() {
    local tag=$1 ranks=$2; shift 2
    local out rc
    out=$(in_cg "${run[@]}" "$@"); rc=$?
    local want="error: memory: this run needs about [0-9.]+ (MiB|GiB) per rank \(parameters [0-9.]+ MiB, gradients [0-9.]+ MiB, optimizer state [0-9.]+ MiB, activations [0-9.]+ MiB\), $ranks on this machine, but only [0-9.]+ MiB per rank is available \(cgroup $name $kind 200 MiB, [0-9.]+ MiB of it in use\); refused before allocating \(--no-memory-check skips this check\)$"
    if [ $rc -eq 0 ] || [ $rc -ge 124 ]; then echo "FAIL $tag: exit status $rc"; echo "$out" | tail -3; fail=1
    elif grep -qE '^step [0-9]+/' <<< "$out"; then echo "FAIL $tag: trained before refusing"; fail=1
    elif [ "$(grep -c 'error' <<< "$out")" -ne 1 ] || ! grep -qE "^dtrain: (rank [0-9]+: )?$want" <<< "$out"; then
        echo "FAIL $tag: wanted one refusal line, got:"; echo "$out" | tail -3; fail=1
    else echo "ok   $tag: $(grep error <<< "$out")"; params=$(grep -oE '\(parameters [0-9.]+' <<< "$out" | head -1 | grep -oE '[0-9.]+$'); fi
}
params=""
refused "one process" "1 rank"
whole=$params
refused "2 ranks, ZeRO-1" "2 ranks" --nproc 2 --zero 1
# --tp 2: each rank holds its part of the split layers, and the check sizes that part
params=""
refused "2 ranks, --tp 2" "2 ranks" --nproc 2 --tp 2
if [ -n "$params" ] && [ -n "$whole" ]; then
    if awk -v p="$params" -v w="$whole" 'BEGIN { exit !(p < 0.6 * w && p > 0.4 * w) }'; then
        echo "ok   --tp 2 estimates $params MiB of parameters per rank, one process $whole MiB"
    else echo "FAIL --tp 2 estimates $params MiB of parameters per rank, one process $whole MiB (want about half)"; fail=1; fi
fi

# times the cgroup's limit was hit (v1 memory.failcnt, v2 memory.events "max"): the refused
# runs never reach it; a run past the check allocates the model and does (or prints its start line)
hits() { if [ -f "$cg/memory.failcnt" ]; then cat "$cg/memory.failcnt"; else awk '$1 == "max" {print $2}' "$cg/memory.events"; fi; }
before=$(hits)
out=$(in_cg "${run[@]}" --no-memory-check); rc=$?
after=$(hits)
if grep -q "error: memory:" <<< "$out"; then echo "FAIL --no-memory-check: still refused"; fail=1
elif grep -q "^dtrain: gpt2, 12807168 parameters" <<< "$out"; then
    echo "ok   --no-memory-check: past the check, the model built (exit $rc)"
elif [ $rc -eq 137 ] && [ "${after:-0}" -gt "${before:-0}" ]; then
    echo "ok   --no-memory-check: past the check, killed allocating beyond the cgroup's limit (exit 137, limit hit $((after - before)) times)"
else echo "FAIL --no-memory-check: did not get past the check (exit $rc, limit hit ${before:-?} -> ${after:-?}):"; echo "$out" | tail -3; fail=1; fi
exit $fail
