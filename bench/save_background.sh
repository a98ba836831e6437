#!/usr/bin/env bash
# save_background.sh — what a checkpoint costs the training loop, written
# synchronously (--save-sync) or in the background (default), run alternately.
# Model: GPT-2 124M's body (L=12 C=768 H=12) with a byte vocabulary, 85M
# parameters: AdamW state makes each save about 1 GB. One process, 2 threads,
# --save-every 2 over --steps 8 (4 saves; the last overlaps the final
# evaluation). Per run: wall time, ms/step of the steps, the training time
# a save blocked (background: the copy, from the log), peak RSS.
#
#   bench/save_background.sh BUILD_DIR [REPS] [DIR for the checkpoints]
set -euo pipefail
build=${1:?usage: save_background.sh BUILD_DIR [REPS] [DIR]}
reps=${2:-2}
dir=${3:-$(mktemp -d)}
model=(--model gpt2 --layers 12 --embd 768 --heads 12 --max-t 64 --seq 64 --batch 4 --data text --threads 2
       --steps 8 --save-every 2 --log-every 1 --eval-batches 2)
echo "| mode | wall s | mean ms/step | blocked per save (ms) | peak RSS MiB |"
echo "|---|---|---|---|---|"
for _ in $(seq "$reps"); do
    for mode in sync background; do
        extra=(); [ $mode = sync ] && extra=(--save-sync)
        rm -rf "$dir/ck.st"
        out=$( { /usr/bin/time -f "TIME %e %M" "$build/dtrain" train "${model[@]}" "${extra[@]}" --save "$dir/ck.st"; } 2>&1 )
        read -r wall rss <<< "$(grep '^TIME' <<< "$out" | cut -d' ' -f2-)"
        ms=$(grep -oE '^step [0-9]+/8 .* ([0-9.]+) ms/step' <<< "$out" | grep -oE '[0-9.]+ ms/step' | awk '{s+=$1; n++} END {printf "%.0f", s/n}')
        if [ $mode = background ]; then
            blocked=$(grep -oE 'paused [0-9]+ ms' <<< "$out" | awk '{s+=$2; n++} END {printf "%.0f", s/n}')
        else
            blocked="(whole write)"
        fi
        printf "| %s | %s | %s | %s | %.0f |\n" "$mode" "$wall" "$ms" "$blocked" "$((rss / 1024))"
    done
done
