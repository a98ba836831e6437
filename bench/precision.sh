#!/usr/bin/env bash
# precision.sh — --precision fp32, bf16 (with its defaults: 16-bit activations where its
# products run in bf16, fp32 weights; and with a 16-bit working copy of the weights,
# --param-dtype bf16, and with --saved-activations fp32) and fp16 on W1 and W2 (../shared/WORKLOADS.md),
# one process x 2 threads, run alternately: mean ms/step over the steps after
# the first, tokens/s, the loss at the last step, and what the start-up line
# says runs. (bf16 computes only where oneDNN has AMX; elsewhere both rows are fp32.)
#
#   bench/precision.sh BUILD_DIR [REPS] [STEPS] [DIR for W2's token shard]
#
# Convergence (issue 29: "fp16 with loss scaling converges on W1 text like
# fp32, final loss within 1% after 300 steps"): W1 on its text (the fortunes)
# in fp32, in fp16 with dynamic loss scaling and in bf16 (each precision's
# defaults: 16-bit products, activations kept in 16 bits), same seed and
# data, STEPS steps each (lr 3e-4, wd 0 as WORKLOADS.md): the final training
# loss, the mean loss of the last 10 steps (less noisy), their relative
# difference to fp32, the steps loss scaling skipped and the last scale.
#
#   bench/precision.sh BUILD_DIR converge [STEPS=300]
#   bench/precision.sh BUILD_DIR optim-state [STEPS=300]   (--optim-state fp32 vs bf16 on W1 text)
set -euo pipefail
build=${1:?usage: precision.sh BUILD_DIR [REPS] [STEPS] [DIR] | BUILD_DIR converge [STEPS] | BUILD_DIR optim-state [STEPS]}
if [ "${2:-}" = converge ]; then
    steps=${3:-300}
    tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
    w1=(--model gpt2 --layers 6 --embd 384 --heads 6 --max-t 256 --seq 256 --batch 8 --data text --lr 3e-4 --wd 0)
    echo "$(lscpu | grep -m1 'Model name' | sed 's/  */ /g'), $(lscpu | grep -m1 '^Model:' | sed 's/  */ /g'); W1, 1 process x 2 threads, $steps steps"
    echo "| precision | loss at step $steps | mean loss, last 10 steps | ms/step | skipped steps | last loss scale |"
    echo "|---|---|---|---|---|---|"
    for p in fp32 fp16 bf16; do
        "$build/dtrain" train "${w1[@]}" --threads 2 --steps "$steps" --eval-batches 1 --log-every "$steps" \
            --precision $p --metrics "$tmp/$p.jsonl" > "$tmp/$p.out" 2>&1
        grep '"loss":' "$tmp/$p.jsonl" | sed -E 's/.*"step":([0-9]+),"loss":([0-9.e+-]+),"lr":[^,]+,"ms":([0-9.e+-]+)(,"loss_scale":([0-9.e+-]+),"skipped":([01]))?.*/\1 \2 \3 \5 \6/' \
            > "$tmp/$p.tsv"
        awk -v p=$p -v n="$steps" '{ l[$1] = $2; if ($1 > 1) { ms += $3; k++ } if ($5 == 1) sk++; sc = $4 }
            END { for (i = n - 9; i <= n; i++) m += l[i]; printf "| %s | %.4f | %.4f | %.0f | %s | %s |\n", p, l[n], m / 10,
                  ms / k, p == "fp16" ? sk + 0 : "-", p == "fp16" ? sc : "-" }' "$tmp/$p.tsv"
    done
    grep -h -m1 -o 'GEMM: .*' "$tmp"/fp32.out "$tmp"/fp16.out "$tmp"/bf16.out
    for p in fp16 bf16; do
        paste "$tmp/fp32.tsv" "$tmp/$p.tsv" | awk -v n="$steps" -v p=$p '$1 > n - 10 { a += $2; b += $5 } $1 == n { la = $2; lb = $5 }
            END { d = (lb - la) / la; e = (b - a) / a; printf "%s vs fp32: final loss %+.2f%%, mean of the last 10 steps %+.2f%%\n", p, 100 * d, 100 * e }'
    done
    exit 0
fi
if [ "${2:-}" = optim-state ]; then   # --optim-state fp32 against bf16 on W1 text (issue 29)
    steps=${3:-300}
    tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
    w1=(--model gpt2 --layers 6 --embd 384 --heads 6 --max-t 256 --seq 256 --batch 8 --data text --lr 3e-4 --wd 0)
    echo "$(lscpu | grep -m1 'Model name' | sed 's/  */ /g'), $(lscpu | grep -m1 '^Model:' | sed 's/  */ /g'); W1, 1 process x 2 threads, $steps steps"
    echo "| optimizer state | loss at step $steps | mean loss, last 10 steps | ms/step | optimizer state MiB per rank: DDP 2 / ZeRO-2 on 2 |"
    echo "|---|---|---|---|---|"
    for s in fp32 bf16; do
        "$build/dtrain" train "${w1[@]}" --threads 2 --steps "$steps" --eval-batches 1 --log-every "$steps" \
            --optim-state $s --metrics "$tmp/$s.jsonl" > "$tmp/$s.out" 2>&1
        mem=""
        for z in "" "--zero 2"; do   # the start-up memory report of a 2-rank run (one step)
            # shellcheck disable=SC2086
            m=$("$build/dtrain" train "${w1[@]}" --nproc 2 --threads 1 --steps 1 --eval-batches 1 --optim-state $s $z 2>&1 |
                grep -m1 -E '^ *rank 0:' | awk -F'[:/]' '{ print $4 + 0 }')
            mem="$mem${mem:+ / }$m"
        done
        grep '"loss":' "$tmp/$s.jsonl" | grep -v eval | sed -E 's/.*"step":([0-9]+),"loss":([0-9.e+-]+),"lr":[^,]+,"ms":([0-9.e+-]+).*/\1 \2 \3/' > "$tmp/$s.tsv"
        awk -v s=$s -v n="$steps" -v mem="$mem" '{ l[$1] = $2; if ($1 > 1) { ms += $3; k++ } }
            END { for (i = n - 9; i <= n; i++) m += l[i]; printf "| %s | %.4f | %.4f | %.0f | %s |\n", s, l[n], m / 10, ms / k, mem }' "$tmp/$s.tsv"
    done
    paste "$tmp/fp32.tsv" "$tmp/bf16.tsv" | awk -v n="$steps" '$1 > n - 10 { a += $2; b += $5 } $1 == n { la = $2; lb = $5 }
        END { printf "bf16 vs fp32 state: final loss %+.3f%%, mean of the last 10 steps %+.3f%%\n", 100 * (lb - la) / la, 100 * (b - a) / a }'
    exit 0
fi
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
echo "| workload | precision | mean ms/step | tokens/s | loss at step $steps | products | activations for backward | weights |"
echo "|---|---|---|---|---|---|---|---|"
for _ in $(seq "$reps"); do
    for w in W1 W2; do
        for p in fp32 bf16 "bf16 --param-dtype bf16" "bf16 --saved-activations fp32" fp16; do
            if [ $w = W1 ]; then args=("${w1[@]}"); else args=("${w2[@]}"); fi
            out=$("$build/dtrain" train "${args[@]}" --threads 2 --steps "$steps" --log-every 1 --eval-batches 1 \
                  --precision $p 2>&1)   # (word-split on purpose: a flag may follow)
            ms=$(grep -oE '^step [0-9]+/[0-9]+ .* ([0-9.]+) ms/step' <<< "$out" | sed 1d | grep -oE '[0-9.]+ ms/step' |
                 awk '{s+=$1; n++} END {printf "%.0f", s/n}')
            tok=$(grep -oE '^step [0-9]+/[0-9]+ .* ([0-9.]+) tok/s' <<< "$out" | sed 1d | grep -oE '[0-9.]+ tok/s' |
                  awk '{s+=$1; n++} END {printf "%.0f", s/n}')
            loss=$(grep -oE "^step $steps/$steps +loss [0-9.]+" <<< "$out" | awk '{print $4}')
            what=$(grep -m1 -oE 'GEMM: [^;]*; [^;]*' <<< "$out" | cut -d';' -f2 | cut -c2-61 || true)
            acts=$(grep -m1 -oE 'activations kept for backward in [a-z0-9]+' <<< "$out" | awk '{ print $NF }' || true)
            wts=$(grep -m1 -oE 'weights: an? [a-z0-9]+ working copy' <<< "$out" | awk '{ print $3 }' || true)
            echo "| $w | $p | $ms | $tok | $loss | $what | ${acts:-fp32} | ${wts:-fp32} |"
        done
    done
done
