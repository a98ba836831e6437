#!/usr/bin/env bash
# Tensor parallelism (tp 2, and tp 2 with sequence parallelism: tp+sp)
# against data parallelism on 2 ranks, same global batch (bench_tp.c says
# what each column is). Default: W2S (W2's 12 layers at
# C=768 with a byte vocabulary) and W2 itself (V=50257: at tp the embedding,
# the tied lm-head and the cross-entropy are split by vocabulary rows).
#   [ROUNDS=R] bench/tp.sh [BUILD_DIR] [STEPS] [WORKLOAD...]   (modes dp, tp, tp+sp, pp per round)
# Measured 2026-11-27 on an idle machine, "Intel(R) Xeon(R) Processor"
# family 6 model 167 (lscpu), 2 vCPUs, 1 thread per rank, W2 (V 50257),
# ROUNDS=2 (dp, tp, tp+sp, pp in turn); per rank (pp: stage 0 / 1):
#              ms/step      params/grads/optim MiB   activations     peak RSS
#   dp 2       2831, 2189   474.7 / 474.7 / 949.4    389.9 MiB       3521 MiB    474.7 MiB/step all-reduced
#   tp 2       2302, 1994   239.0 / 239.0 / 477.9    726.0 MiB       2075 MiB     75.0 MiB/step
#   tp 2 + sp  2309, 2182   239.0 / 239.0 / 477.9    575.9 MiB       1928 MiB     78.2 MiB/step
#   pp 2       3116, 2920   ~367 / ~255 (params)     229 / 82 MiB    2372 / 1879  3 MiB activations + 147 MiB tied wte
# docs/PERFORMANCE.md has the table and what it shows.
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
