#!/usr/bin/env bash
# pipeline_wire.sh — a pipeline's 16-bit wire (dtrain --pp-wire,
# dt_pipe_opts.wire) across simulated hosts: 2 hosts x 1 rank
# (../shared/tools/netsim.sh; stage 0 on one host, stage 1 on the other, one
# core each), a rate-limited link between them. bench_pipeline runs the
# workload with the float32 and the bf16 wire alternately, REPS times each,
# at each rate. Per run: ms/step (median of 6 timed steps), the time each
# stage blocked on messages, the activation / gradient payload each rank sent
# per step (the pipeline's own count) and the bytes each host's interface sent
# over the whole run (set-up and 8 steps; interface counters).
#
#   sudo bench/pipeline_wire.sh BUILD_DIR [--rates 1gbit,100mbit] [--workload W1]
#                               [--schedule 1f1b] [--M 4] [--reps 2] [--netsim PATH]
set -euo pipefail
build=${1:?usage: pipeline_wire.sh BUILD_DIR [options]}
shift
rates=1gbit,100mbit workload=W1 schedule=1f1b M=4 reps=2
ns=$(dirname "$0")/../../shared/tools/netsim.sh
while [ $# -gt 0 ]; do
    case $1 in
        --rates) rates=$2; shift 2 ;;
        --workload) workload=$2; shift 2 ;;
        --schedule) schedule=$2; shift 2 ;;
        --M) M=$2; shift 2 ;;
        --reps) reps=$2; shift 2 ;;
        --netsim) ns=$2; shift 2 ;;
        *) echo "pipeline_wire.sh: unknown option $1" >&2; exit 2 ;;
    esac
done
export NETSIM_PREFIX=dtw NETSIM_SUBNET=10.215.0 NETSIM_STATE=/run/netsim-dtrain-wire OMP_NUM_THREADS=1
trap '"$ns" down --kill > /dev/null 2>&1' EXIT
tx() { "$ns" exec "dtw$1" cat /sys/class/net/nsim0/statistics/tx_bytes; }

echo "| link | wire | ms/step | blocked ms (stage 0 / 1) | payload MiB sent per step (stage 0 / 1) | MiB sent by each host, whole run |"
echo "|---|---|---|---|---|---|"
IFS=, read -r -a R <<< "$rates"
for rate in "${R[@]}"; do
    "$ns" up --hosts 2 --rate "$rate" > /dev/null 2>&1
    for rep in $(seq "$reps"); do
        for wire in fp32 bf16; do
            a0=$(tx 0); a1=$(tx 1)
            out=$("$ns" run -np 2 -- "$build/bench_pipeline" --wire "$wire" "$workload" "$schedule" "$M")
            [ "$rep" = 1 ] && [ "$wire" = fp32 ] && echo "<!-- $rate: $(head -1 <<< "$out") -->"
            r0=$(grep "rank 0:" <<< "$out"); r1=$(grep "rank 1:" <<< "$out")
            ms=$(sed -E 's/.*: +([0-9.]+) ms\/step.*/\1/' <<< "$r0")
            w0=$(sed -E 's/.*waited +([0-9.]+) ms.*/\1/' <<< "$r0"); w1=$(sed -E 's/.*waited +([0-9.]+) ms.*/\1/' <<< "$r1")
            s0=$(sed -E 's/.*sent +([0-9.]+) MiB.*/\1/' <<< "$r0"); s1=$(sed -E 's/.*sent +([0-9.]+) MiB.*/\1/' <<< "$r1")
            t0=$(( $(tx 0) - a0 )); t1=$(( $(tx 1) - a1 ))
            printf "| %s | %s | %s | %s / %s | %s / %s | %.1f / %.1f |\n" "$rate" "$wire" "$ms" "$w0" "$w1" "$s0" "$s1" \
                "$(bc -l <<< "$t0 / 1048576")" "$(bc -l <<< "$t1 / 1048576")"
        done
    done
    "$ns" down --kill > /dev/null 2>&1
done
