#!/usr/bin/env bash
# Bad pipeline configurations fail on every rank with one clear message and
# never hang: ranks not divisible by --pp, more stages than blocks, a
# schedule's micro-batch rule, a split that does not add up, more (virtual
# stage, micro-batch) pairs than message tags. At 4 ranks the
# start-up line of 2 stages x 2 replicas describes every stage's replica
# group, also when one stays inside a machine and the other spans two, and
# its collective runs also where ranks differ on --quiet (one rank's choice).
# usage: test_pipeline_errors.sh DTRAIN NP MPIEXEC ARGS...
set -uo pipefail
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
bin=$1 np=$2
shift 2
mpiexec=("$@")
fail=0
mlp=(--model mlp --hidden 32 --threads 1 --quiet --steps 2)   # 2 blocks
expect() {   # expect NEEDLE ARGS...
    local needle=$1; shift
    local out rc
    out=$(timeout -k 15 120 "$bin" train "${mlp[@]}" "$@" < /dev/null 2>&1); rc=$?
    if [ $rc -eq 124 ]; then echo "FAIL (hang) $*"; fail=1
    elif [ $rc -eq 0 ]; then echo "FAIL (exit 0) $*"; fail=1
    elif ! grep -qF -- "$needle" <<<"$out"; then echo "FAIL $*: wanted '$needle', got:"; echo "$out" | head -5; fail=1
    else echo "ok   $* -> $needle"; fi
}
if [ "$np" -eq 2 ]; then
    expect "3 stages (the world size must be a multiple of --pp)" --pp 3 --nproc 2 --batch 30 --microbatches 3
    expect "--pp-split adds up to 3 blocks" --pp 2 --nproc 2 --pp-split 1,2
    expect "micro-batches to be a multiple of --pp (P, 2P, ...; got M=3, P=2)" --pp 2 --nproc 2 --schedule interleaved --microbatches 3 --batch 30
    expect "cannot be combined with ZeRO's interleaved step overlap" --pp 2 --nproc 2 --zero 1 --overlap-step interleaved --clip 1
    # one message tag per (virtual stage, micro-batch): refused at start-up, not in step 1 (or never)
    expect "pipeline: 2 virtual stages x 5002 micro-batches is too many (< 10000)" --pp 2 --nproc 2 --batch 5002 --microbatches 5002
else
    expect "4 virtual stages (--pp 4 x --virtual-stages 1) but model mlp has only 2 blocks" --pp 4 --nproc 4
    expect "--pp-split has 3 entries" --pp 4 --nproc 4 --pp-split 1,1,1 --hidden 32,32,32
    expect "6 virtual stages" --pp 2 --nproc 4 --schedule interleaved --virtual-stages 3 --microbatches 2
    # line MACHINES PATTERN: the start-up line of pp 2 x dp 2 on simulated machines (one id per rank)
    line() {
        local out
        out=$(DTRAIN_TEST_MACHINES=$1 timeout -k 15 120 "$bin" train --model mlp --hidden 32 --threads 1 --steps 1 \
              --pp 2 --nproc 4 --batch 16 --microbatches 2 < /dev/null 2>&1)
        if grep -qE -- "$2" <<< "$out"; then echo "ok   machines $1: $(grep -m1 -oE -- "$2" <<< "$out")"
        else echo "FAIL machines $1: /$2/ not in:"; grep "dtrain:" <<< "$out" | head -8; fail=1; fi
    }
    line 0,0,0,0 "pipeline stages x 2 replicas: ddp gradients in shared memory, summed in place$"
    line 0,1,2,3 "pipeline stages x 2 replicas: ddp gradients reduced by MPI collectives$"
    line 0,0,0,1 "pipeline stages x 2 replicas: ddp gradients in shared memory on 2 of 4 ranks, by MPI collectives on the rest"
    # rank 0 reports, the others are --quiet: the line's collective must still run on all of them
    pq=(train --model mlp --hidden 32 --threads 1 --steps 1 --pp 2 --batch 16 --microbatches 2)
    out=$(timeout -k 15 120 "${mpiexec[@]}" -n 1 "$bin" "${pq[@]}" : -n 3 "$bin" "${pq[@]}" --quiet < /dev/null 2>&1); rc=$?
    if [ $rc -eq 0 ] && grep -q "ddp gradients in shared memory" <<< "$out" && grep -q "^test accuracy: " <<< "$out"; then
        echo "ok   pp 2 x dp 2, ranks 1-3 --quiet: trains and reports"
    else
        echo "FAIL pp 2 x dp 2, ranks 1-3 --quiet (rc $rc$([ $rc -eq 124 ] && echo ': hang')):"; echo "$out" | tail -5; fail=1
    fi
fi
exit $fail
