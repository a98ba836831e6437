#!/usr/bin/env bash
# save_background.sh — what a checkpoint costs the training loop, written
# synchronously (--save-sync) or in the background (default), run alternately,
# for W1 and W2 (../shared/WORKLOADS.md) with AdamW and --save-every 1 (and W2
# with --save-every 3: a writer that keeps up). One process, 2 threads.
# Per run: wall time, mean ms/step, the time each save blocked training
# (background: the copy plus any wait for the previous save, as the log line
# gives them; sync: the whole write, as its log line gives it), the copy
# buffer held, peak RSS. Against: bench_memcpy, a copy of the same bytes.
#
#   bench/save_background.sh BUILD_DIR [REPS] [DIR for the data and checkpoints]
set -euo pipefail
build=${1:?usage: save_background.sh BUILD_DIR [REPS] [DIR]}
reps=${2:-2}
dir=${3:-$(mktemp -d)}
# W2's tokens: an llm.c shard of random GPT-2 token ids (the data do not change the cost of a save)
python3 - "$dir/w2.bin" << 'EOF'
import random, struct, sys
random.seed(1)
n = 200000
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
    f.write(struct.pack("<%dH" % n, *[random.randrange(50257) for _ in range(n)]))
EOF
w1=(--model gpt2 --layers 6 --embd 384 --heads 6 --max-t 256 --seq 256 --batch 8 --data text)
w2=(--model gpt2 --layers 12 --embd 768 --heads 12 --max-t 1024 --seq 64 --batch 4 --data shard
    --data-path "$dir/w2.bin" --vocab 50257)
common=(--threads 2 --log-every 1 --eval-batches 1)
run() {   # NAME STEPS EVERY ARGS...
    local name=$1 steps=$2 every=$3; shift 3
    local mode extra out wall rss ms blocked held copy wait
    for mode in sync background; do
        extra=(); [ $mode = sync ] && extra=(--save-sync)
        rm -rf "$dir/ck.st"
        out=$( { /usr/bin/time -f "TIME %e %M" "$build/dtrain" train "$@" "${common[@]}" --steps "$steps" \
                   --save-every "$every" "${extra[@]}" --save "$dir/ck.st"; } 2>&1 )
        read -r wall rss <<< "$(grep '^TIME' <<< "$out" | cut -d' ' -f2-)"
        ms=$(grep -oE '^step [0-9]+/[0-9]+ .* ([0-9.]+) ms/step' <<< "$out" | grep -oE '[0-9.]+ ms/step' |
             awk '{s+=$1; n++} END {printf "%.0f", s/n}')
        if [ $mode = background ]; then   # every save but the first (its buffer is new pages) and the last (overlaps eval)
            blocked=$(grep -oE 'paused [0-9]+ ms: [0-9]+ for the copy, [0-9]+ waiting' <<< "$out" | sed '1d;$d' |
                      awk '{b+=$2; c+=$4; w+=$8; n++} END {if (n) printf "%.0f (copy %.0f + wait %.0f)", b/n, c/n, w/n; else print "-"}')
            held=$(grep -oE '[0-9.]+ MiB held' <<< "$out" | tail -1 | cut -d' ' -f1)
        else
            blocked=$(grep -oE 'written to .* \(([0-9.]+) s; training paused for the whole write' <<< "$out" |
                      grep -oE '\(([0-9.]+) s' | tr -d '( s' | awk '{s+=$1; n++} END {printf "%.0f", 1000*s/n}')
            held=0
        fi
        printf "| %s | %s | %s | %s | %s | %s | %.0f |\n" "$name" "$mode" "$wall" "$ms" "$blocked" "$held" "$((rss / 1024))"
    done
}
"$build/bench_memcpy" 1424 3 | sed 's/^/W2 state, /' | grep -E 'reused|fresh' || true
"$build/bench_memcpy" 124 3 | sed 's/^/W1 state, /' | grep -E 'reused|fresh' || true
echo
echo "| workload | mode | wall s | mean ms/step | blocked per save, ms | copy MiB held | peak RSS MiB |"
echo "|---|---|---|---|---|---|---|"
for _ in $(seq "$reps"); do
    run "W1 every 1" 8 1 "${w1[@]}"
    run "W2 every 1" 6 1 "${w2[@]}"
    run "W2 every 3" 9 3 "${w2[@]}"
done
