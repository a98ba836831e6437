#!/usr/bin/env bash
# --recompute blocks trains GPT-2 with dropout bitwise like --recompute none:
# one process (also with --accum 2), DDP at 2 ranks, ZeRO-3 at 2 and 4 ranks.
# Checkpoints (parameters, optimizer state, RNG) and logged losses must be
# byte-identical. (That recompute really recomputes - lower activation memory -
# is tests/unit/test_nn_recompute.c.)
# usage: test_recompute_bitwise.sh DTRAIN_BINARY
set -uo pipefail
# Ranks under mpirun: Open MPI unloads its plugins at finalize, so LeakSanitizer
# sees their allocations from an unknown module that no suppression can name
# (as tests/common/cli_env.c does for the CLI tests; our own code's leaks are
# caught by the unit tests of the same features).
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
bin=$1
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
for i in $(seq 1 300); do echo "line $i: the quick brown fox jumps over the lazy dog $((i * 7919 % 1000))"; done > "$tmp/corpus.txt"
model=(--model gpt2 --layers 2 --embd 32 --heads 2 --max-t 32 --seq 32 --batch 4 --dropout 0.1
       --data text --data-path "$tmp/corpus.txt" --steps 3 --eval-batches 2 --threads 1 --quiet)
fail=0
while IFS='|' read -r tag extra; do
    for mode in none blocks; do
        # shellcheck disable=SC2086
        if ! "$bin" train "${model[@]}" $extra --recompute $mode --save "$tmp/$tag.$mode.st" \
                --metrics "$tmp/$tag.$mode.jsonl" < /dev/null > "$tmp/$tag.$mode.out" 2>&1; then
            echo "FAIL $tag --recompute $mode:"; cat "$tmp/$tag.$mode.out"; fail=1; continue 2
        fi
        sed -i 's/,"ms":[0-9.e+-]*//' "$tmp/$tag.$mode.jsonl"
    done
    if cmp -s "$tmp/$tag.none.st" "$tmp/$tag.blocks.st" && cmp -s "$tmp/$tag.none.jsonl" "$tmp/$tag.blocks.jsonl"; then
        echo "ok   $tag: bitwise identical"
    else
        echo "FAIL $tag: recompute changed the result"; diff "$tmp/$tag.none.jsonl" "$tmp/$tag.blocks.jsonl"; fail=1
    fi
done <<'CONFIGS'
single|
single_accum2|--accum 2
ddp_np2|--nproc 2
zero3_np2|--nproc 2 --zero 3 --save-format consolidated
zero3_np4|--nproc 4 --zero 3 --save-format consolidated
CONFIGS
exit $fail
