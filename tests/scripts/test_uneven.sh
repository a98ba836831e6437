#!/usr/bin/env bash
# --uneven: a text directory split by file between 2 ranks (--nproc 2), with
# files of very different sizes, so the ranks hold different numbers of
# batches. Under DDP, ZeRO 1 and ZeRO 2 the run trains to the end: every rank
# reports the same final step, which is the largest rank's step count, and
# each rank's own count is what its files hold (computed here from the file
# sizes, independently of dtrain); the validation loss is the same under the
# three strategies (ZeRO + join equals DDP + join). When rank 0 is not the
# rank that trains longest, its checkpoint still holds the optimizer state of
# one that did. Combinations that cannot
# join (--zero 3, a pipeline) and data that cannot be split by file fail
# with a message naming them.
# usage: test_uneven.sh DTRAIN
set -uo pipefail
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"   # (see test_recompute_bitwise.sh)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
bin=$1
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
names=(a b c d) seq=16 batch=4
# split_steps DIR SIZE0..SIZE3: writes DIR/{a,b,c,d}.txt of those sizes and sets
# steps=(rank 0's, rank 1's) batches: training tokens = the first total -
# total/10 of the name-ordered stream; rank r's tokens = its files' (k % 2 == r)
# part of them
split_steps() {
    local dir=$1 sz=("${@:2}") total=0 ntr start=0 end r i
    mkdir -p "$dir"
    for i in 0 1 2 3; do
        yes "the quick brown fox $i jumps over the lazy dog" | head -c "${sz[$i]}" > "$dir/${names[$i]}.txt"
        total=$((total + sz[i]))
    done
    ntr=$((total - total / 10))
    steps=(0 0)
    for i in 0 1 2 3; do
        end=$((start + sz[i])); [ $end -gt $ntr ] && end=$ntr; [ $start -gt $end ] && start=$end
        r=$((i % 2)); steps[$r]=$((steps[r] + end - start)); start=$((start + sz[i]))
    done
    for r in 0 1; do steps[$r]=$(( (steps[r] - 1) / seq / batch )); done
}
# rank 0 gets a.txt + c.txt (5000 + 4000 bytes), rank 1 b.txt + d.txt (800 + 3000,
# d.txt mostly in the held-out last 10%)
split_steps "$tmp/txt" 5000 800 4000 3000
expect=("${steps[@]}")
final=${expect[0]}; [ "${expect[1]}" -gt "$final" ] && final=${expect[1]}
[ "${expect[0]}" -ne "${expect[1]}" ] || { echo "FAIL: test data is not uneven (${expect[*]})"; exit 1; }

base=(train --model gpt2 --layers 1 --embd 32 --heads 2 --max-t 32 --seq $seq --batch $batch --data text
      --data-path "$tmp/txt" --uneven --threads 1 --eval-batches 4 --nproc 2)
fail=0
declare -A val
for strat in "ddp:" "zero1:--zero 1" "zero2:--zero 2"; do
    tag=${strat%%:*}
    # shellcheck disable=SC2206
    args=(${strat#*:})
    if ! timeout 300 "$bin" "${base[@]}" "${args[@]}" > "$tmp/$tag.out" 2>&1; then
        echo "FAIL $tag: run failed:"; tail -5 "$tmp/$tag.out"; fail=1; continue
    fi
    ok=1
    for r in 0 1; do
        want="dtrain: rank $r: trained ${expect[$r]} steps on its own data, joined for $((final - expect[r])); finished at step $final/$final"
        if ! grep -qF -- "$want" "$tmp/$tag.out"; then
            echo "FAIL $tag: no line '$want':"; cat "$tmp/$tag.out"; ok=0
        fi
    done
    val[$tag]=$(grep -o 'validation loss: [0-9.]*' "$tmp/$tag.out")
    [ -n "${val[$tag]}" ] || { echo "FAIL $tag: no validation loss:"; cat "$tmp/$tag.out"; ok=0; }
    [ $ok -eq 1 ] && echo "ok $tag: ranks trained ${expect[*]} steps, all finished at step $final" || fail=1
done
for tag in zero1 zero2; do
    if [ -n "${val[$tag]:-}" ] && [ "${val[$tag]}" != "${val[ddp]:-}" ]; then
        echo "FAIL $tag: ${val[$tag]} differs from ddp's ${val[ddp]:-}"; fail=1
    fi
done

# The rank that trains longest need not be rank 0: with the sizes swapped
# (rank 0: a + c = 800 + 3000 bytes, rank 1: b + d = 5000 + 4000) rank 0 joins
# first. Every rank ends with the model of a rank that trained to the end,
# and the checkpoint (written by rank 0) must hold that rank's optimizer too:
# its step count is the final step, not rank 0's own count.
split_steps "$tmp/swap" 800 5000 3000 4000
exp2=("${steps[@]}")
[ "${exp2[0]}" -lt "${exp2[1]}" ] || { echo "FAIL: swapped data does not make rank 1 lead (${exp2[*]})"; exit 1; }
if ! timeout 300 "$bin" "${base[@]}" --data-path "$tmp/swap" --optim adamw --save "$tmp/swap.st" > "$tmp/swap.out" 2>&1; then
    echo "FAIL swap: run failed:"; tail -5 "$tmp/swap.out"; fail=1
elif ! grep -aq "\"optim_step\":\"${exp2[1]}\"" "$tmp/swap.st"; then
    echo "FAIL swap: the checkpoint's optimizer should be the longest-training rank's (step ${exp2[1]}), found:"
    grep -ao '"optim_step":"[0-9]*"' "$tmp/swap.st"; fail=1
elif grep -ao '"optim_steps":"[^"]*"' "$tmp/swap.st" | grep -q ":${exp2[0]}\(,\|\"\)"; then
    echo "FAIL swap: per-parameter step counts are rank 0's ${exp2[0]}:"; grep -ao '"optim_steps":"[^"]*"' "$tmp/swap.st"; fail=1
else
    echo "ok swap: rank 0 trained ${exp2[0]} steps, rank 1 ${exp2[1]}; the checkpoint's optimizer is at step ${exp2[1]}"
fi

check_error() {   # expected message, extra flags...
    local want=$1; shift
    if timeout 120 "$bin" "${base[@]}" "$@" > "$tmp/err.out" 2>&1; then
        echo "FAIL: $* with --uneven was accepted"; fail=1
    elif ! grep -qF -- "$want" "$tmp/err.out"; then
        echo "FAIL: $* with --uneven: no '$want' in:"; cat "$tmp/err.out"; fail=1
    else
        echo "ok error: $*"
    fi
}
check_error "--uneven does not combine with --zero 3" --zero 3
check_error "--uneven does not combine with a pipeline" --pp 2
check_error "not a directory" --data-path "$tmp/txt/a.txt"
exit $fail
