#!/usr/bin/env bash
# Tensor parallelism (tp 2, and tp 2 with sequence parallelism: tp+sp)
# against data parallelism on 2 ranks, same global batch (bench_tp.c says
# what each column is). Default: W2S (W2's 12 layers at
# C=768 with a byte vocabulary) and W2 itself (V=50257: at tp the embedding,
# the tied lm-head and the cross-entropy are split by vocabulary rows).
#   [ROUNDS=R] bench/tp.sh [BUILD_DIR] [STEPS] [WORKLOAD...]   (modes dp, tp, tp+sp, pp per round)
# Measured 2026-11-27 on an idle machine, "Intel(R) Xeon(R) Processor"
# family 6 model 167 (lscpu), 2 vCPUs, 1 thread per rank, W2 (V 50257),
# 3 timed steps, two rounds run alternately dp, tp, dp, tp; per rank:
#                       ms/step       params/grads/optim MiB   activations  peak RSS   all-reduced
#   dp 2                2036, 1826    474.7 / 474.7 / 949.4    389.9 MiB    3521 MiB   474.7 MiB/step
#   tp 2, vocab split   1788, 1754    239.0 / 239.0 / 477.9    726.0 MiB    2072 MiB    75.0 MiB/step
# tp 2 holds half the parameters, gradients and optimizer state and 0.59x
# the peak RSS of dp 2, moves 0.16x the bytes, and is 4-12% faster here
# (each rank computes half of every product, the lm-head's included, on a
# batch twice dp's per-rank batch). Its activations are 1.9x dp's: both
# ranks hold the replicated [B, T, C] of the whole replica's batch.
# tp+sp (sequence parallelism), measured once on a shared machine (times are
# noise there): W2 activations 575.9 MiB and peak RSS 1921 MiB per rank
# against tp's 726.0 and 2072, all-reduced 78.2 MiB/step (tp: 75.0; the
# extra is the replicated gradients' sum). docs/PERFORMANCE.md has the table.
set -euo pipefail
build=${1:-build} steps=${2:-3}
shift $(( $# >= 2 ? 2 : $# ))
workloads=("$@"); [ ${#workloads[@]} -gt 0 ] || workloads=(W2S W2)
lscpu | grep -m1 'Model name' || true
echo "cores: $(nproc), 1 thread per rank"
rounds=${ROUNDS:-1}
for r in $(seq 1 "$rounds"); do
for w in "${workloads[@]}"; do
    for mode in dp tp tp+sp pp; do   # one process each: peak RSS is per process
        if [ "$mode" = pp ]; then
            # pp 2 on the same global batch (4 micro-batches of 2, 1f1b); bench_pipeline
            # knows W1/W2/W3 only. Between the stages: 2 x M x [2, T, C] floats per step.
            [ "$w" = W2 ] || continue
            mpiexec -n 2 --oversubscribe -x OMP_NUM_THREADS=1 "$build/bench_pipeline" W2 1f1b 4
        else
            mpiexec -n 2 --oversubscribe -x OMP_NUM_THREADS=1 "$build/bench_tp" "$w" "$steps" "$mode"
        fi
    done
done
done
