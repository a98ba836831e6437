#!/usr/bin/env bash
# Output paths are checked at start-up on every rank that writes them: a
# sharded --save DIR (ZeRO), a consolidated --save FILE and per-rank --trace
# files that cannot be written fail before step 1 with the flag and path named,
# never after training, on every rank alike (one line, no rank: the ranks
# agree on the check); writable ones produce every rank's file and leave no
# probe files behind. --quiet leaves the result line alone.
# usage: test_output_paths.sh DTRAIN NP
set -uo pipefail
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
bin=$1 np=$2
fail=0
tmp=$(mktemp -d /tmp/dt_test_outputs_XXXXXX)
trap 'rm -rf "$tmp"' EXIT
# 10^9 steps: a run that starts training cannot finish within the timeout
run=(train --nproc "$np" --model mlp --hidden 16 --batch 8 --threads 1 --log-every 1)
expect_early() {   # expect_early NEEDLE ARGS...
    local needle=$1; shift
    local out rc
    out=$(timeout -k 15 60 "$bin" "${run[@]}" --steps 1000000000 "$@" < /dev/null 2>&1); rc=$?
    if [ $rc -eq 124 ]; then echo "FAIL (still running after 60 s) $*"; fail=1
    elif [ $rc -eq 0 ]; then echo "FAIL (exit 0) $*"; fail=1
    elif grep -q "step 1/" <<<"$out"; then echo "FAIL (trained first) $*"; fail=1
    elif ! grep -qF -- "$needle" <<<"$out"; then echo "FAIL $*: wanted '$needle', got:"; echo "$out" | head -5; fail=1
    else echo "ok   $* -> $needle"; fi
}
touch "$tmp/a_file"
expect_early "--save /nonexistent_dt_dir/ck: cannot create files in /nonexistent_dt_dir" --zero 2 --save /nonexistent_dt_dir/ck
expect_early "--save $tmp/a_file: exists and is not a directory" --zero 1 --save "$tmp/a_file"
# paths only rank 0 writes: every rank fails with its error at once, so the
# job's one line has no rank in it (without that agreement the others went
# on into the first collective and rank 0 named itself after a timeout)
expect_early "dtrain: error: --save /nonexistent_dt_dir/ck.st" --zero 1 --save-format consolidated --save /nonexistent_dt_dir/ck.st
expect_early "dtrain: error: --save /nonexistent_dt_dir/ck.st" --save /nonexistent_dt_dir/ck.st
expect_early "dtrain: error: --metrics /nonexistent_dt_dir/m.jsonl" --metrics /nonexistent_dt_dir/m.jsonl
# every rank's own file: the lowest rank's error is the job's
expect_early "dtrain: error: --trace /nonexistent_dt_dir/t.json.rank0" --trace /nonexistent_dt_dir/t.json

# writable: every rank's trace, the sharded set, the metrics; nothing else
out=$(timeout -k 15 120 "$bin" "${run[@]}" --steps 2 --zero 1 --save "$tmp/ck" --trace "$tmp/t.json" \
      --metrics "$tmp/m.jsonl" < /dev/null 2>&1); rc=$?
if [ $rc -ne 0 ]; then echo "FAIL writable run: rc=$rc"; echo "$out" | tail -5; fail=1; fi
for ((r = 0; r < np; r++)); do
    [ -s "$tmp/t.json.rank$r" ] || { echo "FAIL no trace for rank $r"; fail=1; }
done
[ -s "$tmp/ck/index.json" ] || { echo "FAIL no sharded checkpoint index"; fail=1; }
[ "$(grep -c '"step"' "$tmp/m.jsonl")" -eq 3 ] || { echo "FAIL metrics: want 2 step lines + 1 eval line"; fail=1; }
if find "$tmp" -name '.dtrain-probe*' | grep -c . > /dev/null; then echo "FAIL probe files left behind"; fail=1; fi
[ $fail -eq 0 ] && echo "ok   writable outputs: $np traces, sharded set, metrics"

# --quiet: no start-up or progress lines, but the result, once for the job
out=$(timeout -k 15 120 "$bin" "${run[@]}" --steps 2 --quiet < /dev/null 2>&1); rc=$?
if [ $rc -eq 0 ] && [ "$(wc -l <<< "$out")" -eq 1 ] && grep -qE "^test accuracy: [0-9.]+  test loss: [0-9.]+$" <<< "$out"; then
    echo "ok   --quiet prints the result only: $out"
else
    echo "FAIL --quiet (rc $rc): want the one line 'test accuracy: ...  test loss: ...', got:"; echo "$out" | head -5; fail=1
fi
exit $fail
