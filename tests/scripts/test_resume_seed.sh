#!/usr/bin/env bash
# --resume continues the saved run bit for bit without repeating --seed: the
# data order (the shuffle) and the dropout masks come from the checkpoint's
# seed (it used to take the command line's default, 1, and train on another
# order); a --seed that contradicts the file is refused naming both; --init
# (a new run from saved weights) keeps its own --seed. Nor the optimizer's
# settings: SGD's --lr and --momentum (its momentum buffers were dropped and
# the default lr taken) and AdamW's --lr and --beta2 come from the file, and
# a flag given on top still applies.
# usage: test_resume_seed.sh DTRAIN_BINARY
set -uo pipefail
bin=$1
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
for i in $(seq 1 300); do echo "line $i: the quick brown fox jumps over the lazy dog $((i * 7919 % 1000))"; done > "$tmp/corpus.txt"
run=(train --model gpt2 --layers 1 --embd 32 --heads 2 --max-t 16 --seq 16 --batch 4 --dropout 0.1 --data text
     --data-path "$tmp/corpus.txt" --eval-batches 2 --threads 1 --quiet)
fail=0
loss_at() { grep -oE "\"step\":$2,\"loss\":[0-9.e+-]+" "$1" | cut -d: -f3; }

"$bin" "${run[@]}" --steps 6 --seed 9 --metrics "$tmp/whole.jsonl" > "$tmp/whole.out" 2>&1 &&
"$bin" "${run[@]}" --steps 4 --seed 9 --save "$tmp/part.st" > "$tmp/part.out" 2>&1 &&
"$bin" "${run[@]}" --steps 6 --resume "$tmp/part.st" --metrics "$tmp/resumed.jsonl" > "$tmp/resumed.out" 2>&1 ||
    { echo "FAIL a run failed:"; tail -3 "$tmp"/*.out; exit 1; }
for s in 5 6; do
    a=$(loss_at "$tmp/whole.jsonl" $s) b=$(loss_at "$tmp/resumed.jsonl" $s)
    if [ -n "$a" ] && [ "$a" = "$b" ]; then echo "ok   step $s without --seed: $b, the uninterrupted run's"
    else echo "FAIL step $s: resumed without --seed $b, uninterrupted $a"; fail=1; fi
done
out=$("$bin" "${run[@]}" --steps 6 --resume "$tmp/part.st" --seed 1 2>&1); rc=$?
if [ $rc -eq 2 ] && grep -q -- "--seed 1 contradicts $tmp/part.st, saved with --seed 9" <<< "$out"; then echo "ok   refused: $out"
else echo "FAIL --seed 1 on a --seed 9 checkpoint: exit $rc: $out"; fail=1; fi
if "$bin" "${run[@]}" --steps 2 --init "$tmp/part.st" --seed 3 > "$tmp/init.out" 2>&1; then echo "ok   --init with its own --seed"
else echo "FAIL --init --seed 3:"; tail -2 "$tmp/init.out"; fail=1; fi
# the optimizer's settings: saved with non-default ones, resumed without them
for o in "sgd:--optim sgd --lr 0.05 --momentum 0.9 --nesterov --wd 0.01" "adamw:--optim adamw --lr 0.003 --beta2 0.99 --wd 0.05"; do
    tag=${o%%:*}
    # shellcheck disable=SC2206
    args=(${o#*:})
    "$bin" "${run[@]}" --steps 6 "${args[@]}" --metrics "$tmp/$tag-whole.jsonl" > "$tmp/$tag-whole.out" 2>&1 &&
    "$bin" "${run[@]}" --steps 4 "${args[@]}" --save "$tmp/$tag-part.st" > "$tmp/$tag-part.out" 2>&1 &&
    "$bin" "${run[@]}" --steps 6 --resume "$tmp/$tag-part.st" --metrics "$tmp/$tag-res.jsonl" > "$tmp/$tag-res.out" 2>&1 &&
    "$bin" "${run[@]}" --steps 6 --resume "$tmp/$tag-part.st" --lr 0.5 --metrics "$tmp/$tag-lr.jsonl" > "$tmp/$tag-lr.out" 2>&1 ||
        { echo "FAIL $tag: a run failed:"; tail -3 "$tmp/$tag"-*.out; fail=1; continue; }
    for st in 5 6; do
        a=$(loss_at "$tmp/$tag-whole.jsonl" $st) b=$(loss_at "$tmp/$tag-res.jsonl" $st)
        if [ -n "$a" ] && [ "$a" = "$b" ]; then echo "ok   $tag step $st without its flags: $b, the uninterrupted run's"
        else echo "FAIL $tag step $st: resumed without its flags $b, uninterrupted $a"; fail=1; fi
    done
    c=$(loss_at "$tmp/$tag-lr.jsonl" 6) a=$(loss_at "$tmp/$tag-whole.jsonl" 6)
    if [ -n "$c" ] && [ "$c" != "$a" ]; then echo "ok   $tag: --lr 0.5 given on resume applies ($c)"
    else echo "FAIL $tag: --lr 0.5 on resume changed nothing ($c)"; fail=1; fi
done
# the saved run used Nesterov: --momentum 0 on resume makes it plain SGD (there is no --no-nesterov)
if "$bin" "${run[@]}" --steps 6 --resume "$tmp/sgd-part.st" --momentum 0 > "$tmp/sgd-m0.out" 2>&1; then
    echo "ok   a Nesterov checkpoint resumed with --momentum 0"
else echo "FAIL --momentum 0 on a Nesterov checkpoint:"; tail -2 "$tmp/sgd-m0.out"; fail=1; fi
exit $fail
