#!/usr/bin/env bash
# Tensor parallelism against data parallelism on 2 ranks, same global batch
# (bench_tp.c says what each column is). Default: W2S (W2's 12 layers at
# C=768 with a byte vocabulary) and W2 itself (V=50257: at tp the embedding,
# the tied lm-head and the cross-entropy are split by vocabulary rows).
#   bench/tp.sh [BUILD_DIR] [STEPS] [WORKLOAD...]
# Measured 2026-11-27, "Intel(R) Xeon(R) Processor" (lscpu), 2 vCPUs shared
# with another job (load average 4-5: ms/step varied up to 1.7x between
# identical runs), W2 (V 50257), 3 timed steps, per rank:
#                         ms/step      params/grads/optim MiB   activations  all-reduced
#   dp 2                  2311, 5185   474.7 / 474.7 / 949.4    389.9 MiB    474.7 MiB/step
#   tp 2, vocab split     2219, 3372   239.0 / 239.0 / 477.9    726.0 MiB     75.0 MiB/step
#   tp 2, lm-head whole   2165, 2355   312.6 / 312.6 / 625.2    (not shown)   72.0 MiB/step
#   (before this branch; dp 2 in the same rounds: 1800, 3186)
# Splitting the vocabulary takes 73.6 MiB of parameters (and as much of
# gradients, twice of AdamW state) off each rank and the [512, 50257] logits
# become [512, 25129]; each rank no longer computes the whole lm-head (1/3 of
# W2's FLOPs at this batch), the new traffic is small (an all-reduce of the
# embedding's [B, T, C], 3 floats per token for the loss). The timings on
# this loaded machine do not resolve the difference; rerun on an idle one.
set -euo pipefail
build=${1:-build} steps=${2:-3}
shift $(( $# >= 2 ? 2 : $# ))
workloads=("$@"); [ ${#workloads[@]} -gt 0 ] || workloads=(W2S W2)
lscpu | grep -m1 'Model name' || true
echo "cores: $(nproc), 1 thread per rank"
for w in "${workloads[@]}"; do
    for mode in dp tp; do   # one process each: peak RSS is per process
        mpiexec -n 2 --oversubscribe -x OMP_NUM_THREADS=1 "$build/bench_tp" "$w" "$steps" "$mode"
    done
done
