#!/usr/bin/env bash
# pipeline_zero3.sh — ZeRO-3 inside pipeline stages against ZeRO-2 (and DDP)
# per stage: --pp 2 at 4 ranks (2 stages x 2 replicas, --nproc 4, which
# oversubscribes a smaller machine), GPT-2 W1 by default (../shared/WORKLOADS.md;
# W2 with WORKLOAD=W2 and a token shard), run alternately: mean ms/step over the
# steps after the first, and the start-up memory report of rank 0 and rank 2
# (one of each stage): parameters / gradients / optimizer state MiB per rank
# and peak RSS at start-up, and each rank's peak RSS over the whole run
# (VmHWM, sampled from /proc every 0.2 s while the job runs: it includes the
# gathered parameters and the activations of the schedule, and the pipeline's
# start-up probe, which runs the whole model once on every rank).
#
#   bench/pipeline_zero3.sh BUILD_DIR [REPS] [STEPS] [DIR for W2's token shard]
#   WORKLOAD=W1|W2 (default W1), MODES="ddp 2 3" (default "2 3": --zero 2, --zero 3)
set -euo pipefail
build=${1:?usage: pipeline_zero3.sh BUILD_DIR [REPS] [STEPS] [DIR]}
reps=${2:-1}
steps=${3:-6}
dir=${4:-$(mktemp -d)}
workload=${WORKLOAD:-W1}
modes=${MODES:-2 3}
# shellcheck disable=SC2054  # (--pp-split takes a comma list)
if [ "$workload" = W2 ]; then
    [ -f "$dir/w2.bin" ] || python3 - "$dir/w2.bin" << 'PY'
import random, struct, sys
random.seed(1)
n = 200000
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
    f.write(struct.pack("<%dH" % n, *[random.randrange(50257) for _ in range(n)]))
PY
    args=(--model gpt2 --layers 12 --embd 768 --heads 12 --max-t 1024 --seq 64 --batch 8 --data shard
          --data-path "$dir/w2.bin" --vocab 50257 --pp-split 7,7)
else
    args=(--model gpt2 --layers 6 --embd 384 --heads 6 --max-t 256 --seq 256 --batch 8 --data text --pp-split 4,4)
fi
# (a fixed cut: the balanced one follows a timing probe, which differs from run to run on a busy machine)
# descendants of pid $1, one per line
descendants() { local c; for c in $(ps -o pid= --ppid "$1" 2>/dev/null); do echo "$c"; descendants "$c"; done; }
# rank's VmHWM in MiB into hwm[rank], while pid $1 lives
declare -A hwm
sample_hwm() {
    hwm=()
    while kill -0 "$1" 2>/dev/null; do
        for c in $(descendants "$1"); do
            [ "$(cat "/proc/$c/comm" 2>/dev/null)" = dtrain ] || continue
            # (a rank may end between the listing and the reads)
            r=$( { tr '\0' '\n' < "/proc/$c/environ"; } 2>/dev/null | sed -n 's/^OMPI_COMM_WORLD_RANK=//p') || true
            kb=$(sed -n 's/^VmHWM:[[:space:]]*\([0-9]*\) kB/\1/p' "/proc/$c/status" 2>/dev/null) || true
            if [ -n "$r" ] && [ -n "$kb" ] && [ "$kb" -gt "${hwm[$r]:-0}" ]; then hwm[$r]=$kb; fi
        done
        sleep 0.2
    done
}
log=$(mktemp)
echo "| workload | per stage | mean ms/step | rank 0 params / grads / optim MiB, RSS at start-up | rank 2 (stage 1) | peak RSS MiB, ranks 0-3 |"
echo "|---|---|---|---|---|---|"
for _ in $(seq "$reps"); do
    for z in $modes; do
        zero=(); [ "$z" = ddp ] || zero=(--zero "$z")
        "$build/dtrain" train "${args[@]}" --pp 2 --microbatches 4 --nproc 4 "${zero[@]}" --threads 1 \
            --steps "$steps" --log-every 1 --eval-batches 1 > "$log" 2>&1 &
        sample_hwm $!
        wait $! || { cat "$log"; exit 1; }
        out=$(cat "$log")
        peaks=$(for r in 0 1 2 3; do printf "%.0f " "$(echo "${hwm[$r]:-0} / 1024" | bc -l)"; done)
        ms=$(grep -oE '^step [0-9]+/[0-9]+ .* ([0-9.]+) ms/step' <<< "$out" | sed 1d | grep -oE '[0-9.]+ ms/step' |
             awk '{s+=$1; n++} END {printf "%.0f", s/n}')
        mem() { grep -A4 'memory per rank' <<< "$out" | grep -oE "rank $1: .*" | cut -d' ' -f3-; }
        echo "| $workload | ${z/ddp/DDP} | $ms | $(mem 0) | $(mem 2) | $peaks|"
    done
done
rm -f "$log"
