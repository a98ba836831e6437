#!/usr/bin/env bash
# precision.sh — --precision fp32 against bf16 on W1 and W2 (../shared/WORKLOADS.md),
# one process x 2 threads, run alternately: mean ms/step over the steps after
# the first, tokens/s, the loss at the last step, and what the start-up line
# says runs. (bf16 computes only where oneDNN has AMX; elsewhere both rows are fp32.)
#
#   bench/precision.sh BUILD_DIR [REPS] [STEPS] [DIR for W2's token shard]
set -euo pipefail
build=${1:?usage: precision.sh BUILD_DIR [REPS] [STEPS] [DIR]}
reps=${2:-2}
steps=${3:-10}
dir=${4:-$(mktemp -d)}
[ -f "$dir/w2.bin" ] || python3 - "$dir/w2.bin" << 'PY'
import random, struct, sys
random.seed(1)
n = 200000
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
    f.write(struct.pack("<%dH" % n, *[random.randrange(50257) for _ in range(n)]))
PY
w1=(--model gpt2 --layers 6 --embd 384 --heads 6 --max-t 256 --seq 256 --batch 8 --data text)
w2=(--model gpt2 --layers 12 --embd 768 --heads 12 --max-t 1024 --seq 64 --batch 4 --data shard
    --data-path "$dir/w2.bin" --vocab 50257)
echo "| workload | precision | mean ms/step | tokens/s | loss at step $steps | products |"
echo "|---|---|---|---|---|---|"
for _ in $(seq "$reps"); do
    for w in W1 W2; do
        for p in fp32 bf16; do
            if [ $w = W1 ]; then args=("${w1[@]}"); else args=("${w2[@]}"); fi
            out=$("$build/dtrain" train "${args[@]}" --threads 2 --steps "$steps" --log-every 1 --eval-batches 1 \
                  --precision $p 2>&1)
            ms=$(grep -oE '^step [0-9]+/[0-9]+ .* ([0-9.]+) ms/step' <<< "$out" | sed 1d | grep -oE '[0-9.]+ ms/step' |
                 awk '{s+=$1; n++} END {printf "%.0f", s/n}')
            tok=$(grep -oE '^step [0-9]+/[0-9]+ .* ([0-9.]+) tok/s' <<< "$out" | sed 1d | grep -oE '[0-9.]+ tok/s' |
                  awk '{s+=$1; n++} END {printf "%.0f", s/n}')
            loss=$(grep -oE "^step $steps/$steps +loss [0-9.]+" <<< "$out" | awk '{print $4}')
            what=$(grep -m1 -oE '; (fp32|bf16|--precision)[^;]*$' <<< "$out" | cut -c3- | cut -c1-60)
            echo "| $w | $p | $ms | $tok | $loss | $what |"
        done
    done
done
