#!/usr/bin/env bash
# Background checkpoints (--save-every without --save-sync): the files a run
# writes in the background are the files a synchronous run writes, and they
# resume the same:
#  - DDP (one file) and ZeRO-2 consolidated (streamed to rank 0): byte for
#    byte the --save-sync file, for the last --save-every step of a run
#    stopped there (--stop-after) and for the final save;
#  - ZeRO-2 sharded and pp 2 x dp 1 sharded sets: committed (index.json, one
#    set's shards) and every tensor equal to the synchronous consolidated
#    file (ZeRO) / resumed to the same losses (pipeline);
#  - a run resumed from a background checkpoint ends byte for byte where an
#    uninterrupted run ends;
#  - the log says what was written in the background; --save-sync says nothing.
# usage: test_save_background.sh DTRAIN CKPT_CMP
set -uo pipefail
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
bin=$1 cmp=$2
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export OMP_NUM_THREADS=1
for i in $(seq 1 300); do echo "line $i: the quick brown fox jumps over the lazy dog $((i * 7919 % 1000))"; done > "$tmp/corpus.txt"
base=(train --model gpt2 --layers 2 --embd 32 --heads 2 --max-t 32 --seq 32 --data text --data-path "$tmp/corpus.txt"
      --eval-batches 2 --threads 1 --batch 2 --nproc 2 --save-every 2)
fail=0
run() {   # run TAG ARGS...
    local tag=$1; shift
    if "$bin" "${base[@]}" "$@" < /dev/null > "$tmp/$tag.out" 2>&1; then return 0; fi
    echo "FAIL $tag: did not train:"; tail -5 "$tmp/$tag.out"; fail=1; return 1
}
same_bytes() {   # same_bytes A B WHAT
    if cmp -s "$1" "$2"; then echo "ok   $3: identical bytes ($(stat -c %s "$1") B)"
    else echo "FAIL $3: $1 and $2 differ"; fail=1; fi
}
says() {   # says TAG PATTERN
    if grep -qE "$2" "$tmp/$1.out"; then echo "ok   $1 says: $(grep -m1 -oE "$2" "$tmp/$1.out")"
    else echo "FAIL $1 does not say /$2/:"; head -12 "$tmp/$1.out"; fail=1; fi
}

for strat in ddp zero2; do
    extra=(); [ $strat = zero2 ] && extra=(--zero 2 --save-format consolidated)
    # stopped right after the step-4 save: that save is the last file
    run "$strat-bg4" "${extra[@]}" --steps 6 --stop-after 4 --save "$tmp/$strat-bg4.st" &&
        run "$strat-sync4" "${extra[@]}" --steps 6 --stop-after 4 --save "$tmp/$strat-sync4.st" --save-sync &&
        same_bytes "$tmp/$strat-bg4.st" "$tmp/$strat-sync4.st" "$strat: step-4 checkpoint, background == --save-sync"
    says "$strat-bg4" "checkpoint of step 4 written to .* in the background"
    if grep -q "in the background" "$tmp/$strat-sync4.out"; then echo "FAIL $strat --save-sync wrote in the background"; fail=1; fi
    # the final save (written while the final evaluation runs) and a resume from step 4
    run "$strat-bg6" "${extra[@]}" --steps 6 --save "$tmp/$strat-bg6.st" &&
        run "$strat-sync6" "${extra[@]}" --steps 6 --save "$tmp/$strat-sync6.st" --save-sync &&
        same_bytes "$tmp/$strat-bg6.st" "$tmp/$strat-sync6.st" "$strat: final checkpoint, background == --save-sync"
    cp "$tmp/$strat-bg4.st" "$tmp/$strat-res.st"
    run "$strat-res" "${extra[@]}" --steps 6 --resume "$tmp/$strat-res.st" --save "$tmp/$strat-res.st" &&
        same_bytes "$tmp/$strat-res.st" "$tmp/$strat-sync6.st" "$strat: resumed from the background step-4 checkpoint == 6 steps"
done

# sharded sets
run zsh --zero 2 --steps 6 --stop-after 4 --save "$tmp/zsh" &&
    if [ -f "$tmp/zsh/index.json" ] && [ "$(ls "$tmp/zsh" | grep -c '^shard-')" = 2 ]; then
        echo "ok   zero2 sharded set committed in the background: $(ls "$tmp/zsh" | tr '\n' ' ')"
    else echo "FAIL zero2 sharded set: $(ls "$tmp/zsh")"; fail=1; fi
if "$cmp" "$tmp/zero2-sync4.st" "$tmp/zsh" step optim_step epoch cursor > "$tmp/cmp.out" 2>&1; then
    echo "ok   zero2 sharded background set == synchronous consolidated file: $(tail -1 "$tmp/cmp.out")"
else echo "FAIL zero2 sharded set differs:"; cat "$tmp/cmp.out"; fail=1; fi
pp=(--pp 2 --microbatches 2 --batch 4)
run ppbg "${pp[@]}" --steps 6 --stop-after 4 --save "$tmp/ppbg" && run ppsync "${pp[@]}" --steps 6 --stop-after 4 --save "$tmp/ppsync" --save-sync &&
    run ppbg_res "${pp[@]}" --steps 6 --resume "$tmp/ppbg" --save "$tmp/ppbg" && run ppsync_res "${pp[@]}" --steps 6 --resume "$tmp/ppsync" --save "$tmp/ppsync" --save-sync &&
    if [ -n "$(grep -E '^step 6/6|loss:' "$tmp/ppbg_res.out" | sed 's/ *[0-9.]* tok.*//')" ] &&
       [ "$(grep -E '^step 6/6|loss:' "$tmp/ppbg_res.out" | sed 's/ *[0-9.]* tok.*//')" = "$(grep -E '^step 6/6|loss:' "$tmp/ppsync_res.out" | sed 's/ *[0-9.]* tok.*//')" ]; then
        echo "ok   pp 2 sharded background set resumes like the synchronous one: $(grep -m1 'loss:' "$tmp/ppbg_res.out")"
    else echo "FAIL pp 2: resumed runs differ:"; grep -E '^step 6/6|loss:' "$tmp/ppbg_res.out" "$tmp/ppsync_res.out"; fail=1; fi
exit $fail
