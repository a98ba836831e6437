#!/usr/bin/env bash
# --optim-state bf16 converges like fp32 state (issue 29) on a W1-like run:
# GPT-2 (W1's architecture, scaled to L=2 C=128 T=64 to stay short) on W1's
# text, the fortunes, 200 AdamW steps (wd 0), one process.
# Criterion: the mean training loss of the last 20 steps with bf16 state is
# within 0.5% (relative) of fp32 state's. Why 0.5%: on this machine the two
# differ by about 0.02%, while halving the learning rate (a 2x error in the
# step size, what a mis-stored second moment would cause) moves the same mean
# by about 1.1%. The test runs that control too and requires it to fall
# outside the bound, so the bound is shown able to fail.
# Skipped (77) when the fortunes are not installed.
# usage: test_optim_bf16_converge.sh DTRAIN
set -uo pipefail
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
bin=$1
[ -d /usr/share/games/fortunes ] || { echo "SKIP (exit 77): no /usr/share/games/fortunes (package fortunes)"; exit 77; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
run=(train --model gpt2 --layers 2 --embd 128 --heads 4 --max-t 64 --seq 64 --batch 8 --data text --wd 0
     --eval-batches 1 --threads 1 --steps 200 --log-every 1000)
mean() { grep '"loss"' "$1" | grep -v eval | tail -20 | sed -E 's/.*"loss":([0-9.e+-]+).*/\1/' | awk '{ s += $1 } END { printf "%.6f", s / NR }'; }
for v in "fp32" "bf16" "fp32 --lr 5e-4"; do
    set -- $v; tag=$1${2:+half}
    "$bin" "${run[@]}" --optim-state $v --metrics "$tmp/$tag.jsonl" < /dev/null > "$tmp/$tag.out" 2>&1 ||
        { echo "FAIL run --optim-state $v"; tail -3 "$tmp/$tag.out"; exit 1; }
done
a=$(mean "$tmp/fp32.jsonl") b=$(mean "$tmp/bf16.jsonl") h=$(mean "$tmp/fp32half.jsonl")
fail=0
d() { awk -v x="$1" -v y="$2" 'BEGIN { d = (x - y) / y; printf "%.4f", d < 0 ? -100 * d : 100 * d }'; }
if awk -v x="$(d "$b" "$a")" 'BEGIN { exit !(x < 0.5) }'; then echo "ok   bf16 state $b vs fp32 state $a: $(d "$b" "$a")% apart (bound 0.5%)"
else echo "FAIL bf16 state $b vs fp32 state $a: $(d "$b" "$a")% apart (bound 0.5%)"; fail=1; fi
if awk -v x="$(d "$h" "$a")" 'BEGIN { exit !(x >= 0.5) }'; then echo "ok   control, fp32 at half the lr: $h, $(d "$h" "$a")% apart: outside the bound"
else echo "FAIL control (half lr) $h within 0.5% of $a: the bound cannot tell"; fail=1; fi
exit $fail
