#!/usr/bin/env bash
# Combinations that cannot work are refused before step 1 (issue 27 item 6),
# not after training up to the point where they fail: each command exits
# non-zero naming the culprit, and prints no progress line and writes no
# checkpoint. (Before: --pp 2 --freeze --unfreeze-at 3 --save trained 3 steps
# and failed; an empty validation split failed after the last step; a batch
# larger than the training split failed in step 1; --pp with --save-format
# consolidated saved a sharded set instead.)
# usage: test_refuse_upfront.sh DTRAIN
set -uo pipefail
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"   # (see test_recompute_bitwise.sh)
bin=$1
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail=0
mlp=(--model mlp --hidden 32 --threads 1 --batch 16)
expect() {   # expect TAG NEEDLE ARGS...
    local tag=$1 needle=$2; shift 2
    local out rc
    rm -rf "$tmp/ck"
    out=$(timeout -k 15 120 "$bin" train "$@" --save "$tmp/ck" < /dev/null 2>&1); rc=$?
    if [ $rc -eq 124 ]; then echo "FAIL $tag (hang)"; fail=1
    elif [ $rc -eq 0 ]; then echo "FAIL $tag: exit 0"; fail=1
    elif ! grep -qF -- "$needle" <<<"$out"; then echo "FAIL $tag: wanted '$needle', got:"; echo "$out" | tail -3; fail=1
    elif grep -q '^step ' <<<"$out"; then echo "FAIL $tag: refused only after training:"; echo "$out" | tail -3; fail=1
    elif [ -e "$tmp/ck" ]; then echo "FAIL $tag: wrote $tmp/ck"; fail=1
    else echo "ok $tag -> $(grep -F -- "$needle" <<<"$out")"; fi
}
expect "pipeline unfreeze" "--unfreeze-at 3: strategy pipeline cannot change the trainable parameters" \
    "${mlp[@]}" --nproc 2 --pp 2 --steps 5 --freeze 'fc1.*' --unfreeze-at 3
# a text shorter than one sequence: its last 10% (the validation split) holds none
head -c 400 /dev/urandom | base64 > "$tmp/short.txt"
expect "empty validation split" "the validation split of $tmp/short.txt (--data text) holds no sample" \
    --model gpt2 --layers 1 --embd 16 --heads 2 --max-t 64 --seq 64 --batch 2 --steps 3 --threads 1 \
    --data text --data-path "$tmp/short.txt"
expect "batch beyond the training split" "--batch 100000 is more than the" \
    --model mlp --hidden 32 --threads 1 --batch 100000 --steps 3
expect "batch beyond a rank's share" "per data rank (2 ranks share them)" \
    --model mlp --hidden 32 --threads 1 --batch 40000 --steps 3 --nproc 2
expect "pipeline consolidated save" "--save-format consolidated does not combine with --pp" \
    "${mlp[@]}" --nproc 2 --pp 2 --zero 1 --steps 2 --save-format consolidated
exit $fail
