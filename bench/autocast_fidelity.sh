#!/usr/bin/env bash
# bf16 fidelity against PyTorch's CPU autocast (issue 29): from the same
# initial weights and tokens, a GPT-2 is trained STEPS steps in fp32 and in
# bf16 by dtrain and by PyTorch; each framework's bf16 run is measured
# against its own fp32 run (largest relative loss gap over the steps, the
# last step's, and the relative distance of the final weights). dtrain's bf16
# runs with DTRAIN_BF16=force, so its products have bf16 numerics on every
# CPU (oneDNN's kernels on AVX-512, emulated below: ops.h); it is run with
# bf16 products and bf16 saved activations (--precision bf16's defaults where
# its products run in bf16), then also with a bf16 working copy of the
# weights (--param-dtype bf16), then with the products alone in bf16; and
# each framework's one-step gradient at the initial weights, which does not
# compound over steps as the loss gaps do. Every
# flag is spelled out, so the rows do not depend on the CPU's defaults. A last row checks that
# the two fp32 runs are the same training. The model is W1's GPT-2 shape
# (../shared/WORKLOADS.md) unless overridden.
#
# usage: bench/autocast_fidelity.sh [BUILD_DIR] [STEPS]
#   env: LAYERS EMBD HEADS SEQ BATCH LR THREADS (defaults: W1, lr 3e-4, 2 threads)
# needs Debian's python3-torch (apt-get install python3-torch) for /usr/bin/python3
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build} steps=${2:-20}
layers=${LAYERS:-6} embd=${EMBD:-384} heads=${HEADS:-6} seq=${SEQ:-256} batch=${BATCH:-8}
lr=${LR:-3e-4} threads=${THREADS:-2}
py=/usr/bin/python3
if ! "$py" -c 'import torch' 2>/dev/null; then
    echo "autocast_fidelity: $py cannot import torch; install Debian's python3-torch (apt-get install python3-torch)" >&2
    exit 2
fi
fortunes=/usr/share/games/fortunes
[ -r "$fortunes/fortunes" ] || { echo "autocast_fidelity: $fortunes/fortunes missing (apt-get install fortunes)" >&2; exit 2; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
corpus_src=$tmp/all.txt   # every fortune file, in name order (2.5 MB)
find "$fortunes" -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' | sort | xargs cat > "$corpus_src"
# the training file holds STEPS batches of windows (a new batch every step,
# in the order dtrain's sampler draws them: autocast_fidelity.py re-draws
# it); the next bytes validate (--val-path)
bytes=$((steps * batch * seq + 1))
head -c "$bytes" "$corpus_src" > "$tmp/corpus.txt"
{ tail -c +$((bytes + 1)) "$corpus_src" || true; } | head -c $((4 * seq + 1)) > "$tmp/val.txt"   # tail: SIGPIPE
run=(train --model gpt2 --layers "$layers" --embd "$embd" --heads "$heads" --max-t "$seq" --seq "$seq"
     --batch "$batch" --data text --data-path "$tmp/corpus.txt" --val-path "$tmp/val.txt" --threads "$threads" --lr "$lr" --wd 0
     --log-every 1000)
export OMP_NUM_THREADS=$threads
# the initial weights: one step at learning rate 0 changes nothing (AdamW's
# update and decay are both scaled by it)
"$build/dtrain" "${run[@]}" --steps 1 --lr 0 --save "$tmp/init.st" > "$tmp/init.out" 2>&1 ||
    { cat "$tmp/init.out"; exit 1; }
go() {   # label, extra flags...
    local label=$1; shift
    "$build/dtrain" "${run[@]}" --init "$tmp/init.st" --steps "$steps" --metrics "$tmp/$label.jsonl" \
        --save "$tmp/$label.st" "$@" > "$tmp/$label.out" 2>&1 || { cat "$tmp/$label.out"; exit 1; }
    echo "dtrain $label: $(grep -m1 -o 'GEMM: [^;]*; [^(;]*' "$tmp/$label.out" || true)"
}
go fp32
DTRAIN_BF16=force go bf16 --precision bf16 --saved-activations bf16 --param-dtype fp32
DTRAIN_BF16=force go bf16_weights --precision bf16 --saved-activations bf16 --param-dtype bf16
DTRAIN_BF16=force go bf16_products --precision bf16 --saved-activations fp32 --param-dtype fp32
# one SGD step at learning rate 1000 from the same weights and first batch:
# (w0 - w1) / 1000 is each run's gradient (autocast_fidelity.py --dtrain-grad)
grad() {   # label, extra flags...
    local label=$1; shift
    "$build/dtrain" "${run[@]}" --init "$tmp/init.st" --steps 1 --optim sgd --lr 1000 --save "$tmp/grad_$label.st" "$@" \
        > "$tmp/grad_$label.out" 2>&1 || { cat "$tmp/grad_$label.out"; exit 1; }
}
grad fp32
DTRAIN_BF16=force grad bf16 --precision bf16 --saved-activations bf16 --param-dtype fp32
DTRAIN_BF16=force grad bf16_products --precision bf16 --saved-activations fp32 --param-dtype fp32
echo "model: GPT-2 L=$layers C=$embd H=$heads T=$seq B=$batch, $steps steps, AdamW lr $lr; $(lscpu | grep -m1 'Model name' | sed 's/ \+/ /g')"
"$py" bench/autocast_fidelity.py --init "$tmp/init.st" --corpus "$tmp/corpus.txt" --seq "$seq" --batch "$batch" \
    --steps "$steps" --lr "$lr" --threads "$threads" --out "${OUT:-autocast_fidelity.json}" \
    --dtrain fp32 "$tmp/fp32" --dtrain "bf16 products + saved activations" "$tmp/bf16" \
    --dtrain "bf16 + weights (--param-dtype bf16)" "$tmp/bf16_weights" \
    --dtrain "bf16 products only" "$tmp/bf16_products" \
    --dtrain-grad fp32 "$tmp/grad_fp32.st" --dtrain-grad "bf16 products + saved activations" "$tmp/grad_bf16.st" \
    --dtrain-grad "bf16 products only" "$tmp/grad_bf16_products.st" --grad-lr 1000
