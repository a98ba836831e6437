#!/usr/bin/env bash
# multihost.sh — ../shared/WORKLOADS.md M1/M2: DDP, ZeRO-2 and ZeRO-3 on
# simulated hosts (2 hosts x 2 ranks, netsim.sh), flat vs hierarchical
# collectives vs (ZeRO) hierarchical with node-shared parameters, run
# alternately in one session. Per configuration: ms/step and
# the time blocked on reductions / parameter gathers (bench_zero, max over
# ranks), and the bytes each host sent per training step, read from the
# namespaces' interface counters (a run of 1 step subtracted from a run of
# --steps, so set-up traffic cancels out).
#
#   sudo bench/multihost.sh BUILD_DIR [--rates 1gbit,10gbit] [--workloads W3,W1]
#                           [--stages 0,2,3] [--steps 4] [--netsim PATH]
#                           [--modes flat,hierarchical,node] [--param-dtypes fp32,bf16]
#
# --param-dtypes: ZeRO's parameter type (--param-dtype: a 16-bit working copy
# of fp32 masters, gathered in 16 bits); node-shared parameters take fp32 only.
#
# 4 ranks on 2 cores: compute is oversubscribed (each host gets one core),
# so compare ratios and bytes, not absolute step times.
set -euo pipefail
build=${1:?usage: multihost.sh BUILD_DIR [options]}
shift
rates=1gbit,10gbit workloads=W3,W1 stages=0,2,3 steps=4 modes_opt=flat,hierarchical,node pdts=fp32
ns=$(dirname "$0")/../../shared/tools/netsim.sh
while [ $# -gt 0 ]; do
    case $1 in
        --rates) rates=$2; shift 2 ;;
        --workloads) workloads=$2; shift 2 ;;
        --stages) stages=$2; shift 2 ;;
        --steps) steps=$2; shift 2 ;;
        --netsim) ns=$2; shift 2 ;;
        --modes) modes_opt=$2; shift 2 ;;
        --param-dtypes) pdts=$2; shift 2 ;;
        *) echo "multihost.sh: unknown option $1" >&2; exit 2 ;;
    esac
done
export NETSIM_PREFIX=dtb NETSIM_SUBNET=10.214.0 NETSIM_STATE=/run/netsim-dtrain-bench OMP_NUM_THREADS=1
trap '"$ns" down --kill > /dev/null 2>&1' EXIT
tx() { "$ns" exec "dtb$1" cat /sys/class/net/nsim0/statistics/tx_bytes; }

# run STEPS STAGE W MODE [PARAM_DTYPE]: prints "ms wait gather params_mib tx0 tx1"; MODE flat,
# hierarchical or node (hierarchical with --node-params 1: ZeRO's parameters
# once per host)
run() {
    local a0 a1 out coll=$4 node=0 pd=${5:-fp32}
    [ "$4" = node ] && { coll=hierarchical; node=1; }
    a0=$(tx 0); a1=$(tx 1)
    out=$("$ns" run -np 4 -x DTRAIN_COLLECTIVES="$coll" -- "$build/bench_zero" "$3" --stage "$2" --steps "$1" \
              --node-params "$node" --param-dtype "$pd" | grep '^RESULT')
    echo "$(sed -E 's/.* ms=([0-9.]+) params_mib=([0-9.]+) .* wait_ms=([0-9.]+) gather_ms=([0-9.]+).*/\1 \3 \4 \2/' <<< "$out") $(( $(tx 0) - a0 )) $(( $(tx 1) - a1 ))"
}

echo "| workload | strategy | link | collectives | params | ms/step | blocked ms (reduce + gather) | param MiB per rank | MiB sent per host per step (h0 / h1) |"
echo "|---|---|---|---|---|---|---|---|---|"
IFS=, read -r -a R <<< "$rates"
IFS=, read -r -a W <<< "$workloads"
IFS=, read -r -a S <<< "$stages"
for rate in "${R[@]}"; do
    "$ns" up --hosts 2 --rate "$rate" > /dev/null
    for w in "${W[@]}"; do
        for st in "${S[@]}"; do
            for mode in ${modes_opt//,/ }; do   # alternately, per configuration
                [ "$st" = 0 ] && [ "$mode" = node ] && continue
                for pd in ${pdts//,/ }; do
                    { [ "$st" = 0 ] || [ "$mode" = node ]; } && [ "$pd" != fp32 ] && continue
                    read -r _ _ _ _ s0 s1 <<< "$(run 1 "$st" "$w" "$mode" "$pd")"
                    read -r ms wt gt pm b0 b1 <<< "$(run "$steps" "$st" "$w" "$mode" "$pd")"
                    name=$([ "$st" = 0 ] && echo DDP || echo "ZeRO-$st")
                    awk -v w="$w" -v n="$name" -v r="$rate" -v m="$mode" -v pd="$pd" -v ms="$ms" -v wt="$wt" -v gt="$gt" \
                        -v b0="$b0" -v s0="$s0" -v b1="$b1" -v s1="$s1" -v k="$((steps - 1))" -v pm="$pm" 'BEGIN {
                        printf "| %s | %s | %s | %s | %s | %.0f | %.0f + %.0f | %.1f | %.1f / %.1f |\n", w, n, r, m, pd, ms, wt, gt, pm,
                               (b0 - s0) / k / 1048576, (b1 - s1) / k / 1048576 }'
                done
            done
        done
    done
done
