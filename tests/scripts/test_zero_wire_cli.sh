#!/usr/bin/env bash
# --compress with --zero: `dtrain train --zero 2 --compress bf16 --nproc 2`
# trains GPT-2 (the loss falls), --zero 1 --compress fp16 --no-shm too, the
# two 16-bit wires give other weights than float32 with otherwise the same
# flags (the flag reaches ZeRO; tensors compared, not files: the metadata names
# the stage), and a bad --compress value is refused naming the flag and the
# choices.
# usage: test_zero_wire_cli.sh DTRAIN_BINARY CKPT_CMP
set -uo pipefail
# Ranks under mpirun: Open MPI unloads its plugins at finalize, so
# LeakSanitizer sees their allocations from an unknown module (see
# test_recompute_bitwise.sh).
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
bin=$1
cmp_bin=$2
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
for i in $(seq 1 300); do echo "line $i: the quick brown fox jumps over the lazy dog $((i * 7919 % 1000))"; done > "$tmp/corpus.txt"
model=(--model gpt2 --layers 2 --embd 32 --heads 2 --max-t 32 --seq 32 --batch 4
       --data text --data-path "$tmp/corpus.txt" --steps 30 --lr 3e-3 --eval-batches 2 --threads 1 --quiet)
fail=0

# loss of step 1 and mean of the last 5 steps from a metrics file
losses() { grep -o '"loss":[0-9.e+-]*' "$1" | cut -d: -f2 | awk '{l[NR]=$1} END {s=0; for (i=NR-4;i<=NR;i++) s+=l[i]; printf "%s %s\n", l[1], s/5}'; }

while IFS='|' read -r tag extra; do
    # shellcheck disable=SC2086
    if ! "$bin" train "${model[@]}" --nproc 2 $extra --metrics "$tmp/$tag.jsonl" --save "$tmp/$tag.st" \
            --save-format consolidated < /dev/null > "$tmp/$tag.out" 2>&1; then
        echo "FAIL $tag: did not train:"; cat "$tmp/$tag.out"; fail=1; continue
    fi
    read -r first last <<< "$(losses "$tmp/$tag.jsonl")"
    if awk -v f="$first" -v l="$last" 'BEGIN {exit !(l < 0.8 * f)}'; then
        echo "ok   $tag: loss $first -> $last"
    else
        echo "FAIL $tag: loss did not fall ($first -> $last)"; fail=1
    fi
done <<'CONFIGS'
zero2_f32|--zero 2
zero2_bf16|--zero 2 --compress bf16
zero1_f32_noshm|--zero 1 --no-shm
zero1_fp16_noshm|--zero 1 --compress fp16 --no-shm
CONFIGS

# the wire changes the result (rounded gradients), so the flag was applied:
# each 16-bit run against the float32 run with the same other flags
while read -r tag ref; do
    "$cmp_bin" "$tmp/$ref.st" "$tmp/$tag.st" > "$tmp/$tag.cmp" 2>&1; rc=$?
    if [ $rc -eq 1 ]; then
        echo "ok   $tag: weights differ from $ref's ($(head -1 "$tmp/$tag.cmp"))"
    elif [ $rc -eq 0 ]; then
        echo "FAIL $tag: every tensor equals $ref's: --compress did not reach ZeRO"; fail=1
    else
        echo "FAIL $tag: cannot compare with $ref:"; cat "$tmp/$tag.cmp"; fail=1
    fi
done <<'PAIRS'
zero2_bf16 zero2_f32
zero1_fp16_noshm zero1_f32_noshm
PAIRS

# a resume continues bit for bit: each rank holds the other ranks' shards as the
# 16-bit wire rounded them, and the load gathers them so again (it gathered the
# exact masters: steps after the resume, and the final weights, differed)
for cfg in "zero2_bf16_res|--zero 2 --compress bf16" "zero1_fp16_res|--zero 1 --compress fp16 --no-shm"; do
    tag=${cfg%%|*}
    # shellcheck disable=SC2206
    extra=(${cfg#*|})
    r=(train "${model[@]}" --nproc 2 "${extra[@]}" --save-format consolidated)
    if ! "$bin" "${r[@]}" --steps 8 --save "$tmp/$tag.full.st" --metrics "$tmp/$tag.full.jsonl" < /dev/null > "$tmp/$tag.out" 2>&1 ||
       ! "$bin" "${r[@]}" --steps 4 --save "$tmp/$tag.half.st" < /dev/null >> "$tmp/$tag.out" 2>&1 ||
       ! "$bin" "${r[@]}" --steps 8 --resume "$tmp/$tag.half.st" --save "$tmp/$tag.res.st" \
            --metrics "$tmp/$tag.res.jsonl" < /dev/null >> "$tmp/$tag.out" 2>&1; then
        echo "FAIL $tag: run:"; tail -3 "$tmp/$tag.out"; fail=1; continue
    fi
    a=$(grep -o '"step":[5-8],"loss":[^,]*' "$tmp/$tag.full.jsonl" | tr '\n' ' ')
    b=$(grep -o '"step":[5-8],"loss":[^,]*' "$tmp/$tag.res.jsonl" | tr '\n' ' ')
    if [ -z "$a" ] || [ "$a" != "$b" ]; then
        echo "FAIL $tag: losses after the resume differ: '$b' vs uninterrupted '$a'"; fail=1
    elif ! "$cmp_bin" "$tmp/$tag.full.st" "$tmp/$tag.res.st" > "$tmp/$tag.cmp" 2>&1; then
        echo "FAIL $tag: final weights differ from the uninterrupted run's:"; head -2 "$tmp/$tag.cmp"; fail=1
    else
        echo "ok   $tag: resumed at step 4, steps 5-8 and the weights bit for bit"
    fi
done

# a bad value is refused before anything runs, naming the flag and the choices
out=$("$bin" train "${model[@]}" --zero 2 --compress int8 < /dev/null 2>&1); rc=$?
if [ $rc -ne 0 ] && grep -q -- "--compress: unknown 'int8' (none, bf16, fp16)" <<< "$out"; then
    echo "ok   --compress int8 refused: $out"
else
    echo "FAIL --compress int8: exit $rc, output: $out"; fail=1
fi
exit $fail
