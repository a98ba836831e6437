#!/usr/bin/env bash
# A sharded save that fails on one rank is a failure of every rank (issue 31
# item 6): a 4-rank ZeRO-2 GPT-2 saving every 2 steps into a small tmpfs where
# the first set fits and the second does not ("No space left on device" on
# some rank), with background saves and with --save-sync. Each time: a
# nonzero exit, exactly one error line (the failing rank's, naming the file
# and the cause), no shard of the new set and no temp file left on any rank,
# and the previous set (step 2) still loads with every checksum verified.
# Needs mount (root, or a container that allows tmpfs); skipped (77) otherwise.
# usage: test_save_full_disk.sh DTRAIN NP
set -uo pipefail
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"   # (MPI's own allocations; see test_ckpt_dir_lock.sh)
bin=$1 np=${2:-4}
tmp=$(mktemp -d)
mnt="$tmp/mnt"
trap 'umount "$mnt" 2> /dev/null; rm -rf "$tmp"' EXIT
mkdir "$mnt"
if ! mount -t tmpfs -o size=64k tmpfs "$mnt" 2> "$tmp/mount.err"; then
    echo "SKIP: cannot mount a tmpfs here ($(head -1 "$tmp/mount.err"))"; exit 77
fi
umount "$mnt"
export OMP_NUM_THREADS=1
for i in $(seq 1 400); do echo "line $i: the quick brown fox jumps over the lazy dog $((i * 7919 % 1000))"; done > "$tmp/corpus.txt"
run=(train --nproc "$np" --zero 2 --model gpt2 --layers 2 --embd 32 --heads 2 --max-t 32 --seq 32 --data text
     --data-path "$tmp/corpus.txt" --threads 1 --eval-batches 1 --log-every 1 --save-every 2)
fail=0

# the size of one set on disk (4 KiB blocks), from a run that saves once
if ! "$bin" "${run[@]}" --steps 2 --save "$tmp/probe" < /dev/null > "$tmp/probe.out" 2>&1; then
    echo "FAIL: sizing run:"; tail -3 "$tmp/probe.out"; exit 1
fi
blocks=$(du -B4096 -s "$tmp/probe" | cut -f1)
size=$(( (blocks * 3 / 2 + 1) * 4 ))   # KiB: the first set fits, a second one beside it does not

for mode in background sync; do
    extra=(); [ $mode = sync ] && extra=(--save-sync)
    mount -t tmpfs -o size=${size}k tmpfs "$mnt" || { echo "FAIL: mount"; exit 1; }
    out=$(timeout -k 5 120 "$bin" "${run[@]}" "${extra[@]}" --steps 8 --save "$mnt/ck" < /dev/null 2>&1); rc=$?
    errs=$(grep -ci "error" <<< "$out")
    left=$(ls -A "$mnt/ck" | grep -vxE '\.dtrain\.lock|index\.json|shard-2-[0-9a-f]{8}-r[0-9]+\.safetensors' | tr '\n' ' ')
    insp=$("$bin" inspect "$mnt/ck" 2>&1); irc=$?
    if [ $rc -eq 0 ] || [ $rc -ge 124 ]; then echo "FAIL $mode: exit status $rc"; echo "$out" | tail -3; fail=1
    elif [ "$errs" -ne 1 ] || ! grep -qE "^dtrain: (rank [0-9]+: )?error: .*$mnt/ck/shard-4-.*No space left on device" <<< "$out"; then
        echo "FAIL $mode: wanted one error line naming a step-4 shard and 'No space left on device', got $errs:"
        grep -i error <<< "$out" | head -5; fail=1
    elif [ -n "$left" ]; then echo "FAIL $mode: files of the failed save left behind: $left"; fail=1
    elif [ $irc -ne 0 ] || ! grep -q "^step        2 " <<< "$insp" || ! grep -q "^checksums   ok" <<< "$insp"; then
        echo "FAIL $mode: the step-2 checkpoint does not load (inspect exit $irc):"; tail -3 <<< "$insp"; fail=1
    else
        echo "ok   $mode saves: exit $rc, nothing left of the step-4 set, step 2 loads, one line:"
        grep -i error <<< "$out" | cut -c1-200
    fi
    umount "$mnt"
done
exit $fail
