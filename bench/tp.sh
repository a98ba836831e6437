#!/usr/bin/env bash
# Tensor parallelism against data parallelism on 2 ranks, same global batch
# (bench_tp.c says what each column is). Default: W2S (W2's 12 layers at
# C=768 with a byte vocabulary) and W2 itself (V=50257: its replicated
# embedding and lm-head weigh on tp until the vocabulary is split).
#   bench/tp.sh [BUILD_DIR] [STEPS] [WORKLOAD...]
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
