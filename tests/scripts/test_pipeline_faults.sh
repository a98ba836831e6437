#!/usr/bin/env bash
# A rank failing mid-schedule (DTRAIN_PIPE_FAULT, pipe/engine.c's test hook):
# the job exits non-zero without hanging and prints one error line: the
# failing rank's, naming its stage, micro-batch and rank. The ranks blocked on
# it fail too ("stage F (rank X) failed at micro-batch K (see its error)"), but
# that consequence is not printed (cli/errors.c: one line per job). (A fault
# where the other stages have finished their step — the first stage's last B —
# leaves the others waiting in the trainer's collectives until MPI_Abort.)
# usage: test_pipeline_faults.sh DTRAIN NP
set -uo pipefail
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
bin=$1 np=$2
fail=0
args=(--model mlp --hidden 32,32,32 --threads 1 --quiet --steps 3 --pp "$np" --nproc "$np" --microbatches 4 --batch 32)
# expect FAULT STAGE MB WHAT [RANK...]: the fault RANK:MB:OP on stage STAGE
# (one replica: stage = rank) fails in WHAT; each RANK listed fails on it
# (its consequence line must not be printed)
expect() {
    local fault=$1 stage=$2 mb=$3 what=$4; shift 4
    local out rc shown=$fault
    [[ $fault == *:*:* ]] || shown=$fault:F
    out=$(DTRAIN_PIPE_FAULT=$fault timeout -k 15 120 "$bin" train "${args[@]}" < /dev/null 2>&1); rc=$?
    local bad=""
    if [ $rc -eq 124 ]; then bad="hang"
    elif [ $rc -eq 0 ]; then bad="exit 0"
    else
        local needle="dtrain: rank $stage: error: pipeline stage $stage (rank $stage), micro-batch $mb, chunk 0: $what: injected fault (DTRAIN_PIPE_FAULT=$shown)"
        grep -qF -- "$needle" <<<"$out" || bad="no '$needle'"
        for r in "$@"; do
            ! grep -qF -- "dtrain: rank $r: error:" <<<"$out" || bad="${bad:+$bad; }rank $r printed an error line too"
        done
        local lines
        lines=$(grep -c "error" <<<"$out")
        [ "$lines" -eq 1 ] || bad="${bad:+$bad; }$lines lines mention an error, wanted 1"
    fi
    if [ -n "$bad" ]; then echo "FAIL DTRAIN_PIPE_FAULT=$fault ($bad), got:"; echo "$out" | grep -v '^$' | head -12; fail=1
    else echo "ok   DTRAIN_PIPE_FAULT=$fault: stage $stage fails in $what, one error line${*:+ (not ranks $*)}"; fi
}
if [ "$np" -eq 2 ]; then
    expect 1:2:F 1 2 forward 0
    expect 1:2:B 1 2 backward 0
    expect 1:2 1 2 forward 0                 # OP defaults to F
    expect 0:3:B 0 3 backward
else
    expect 1:2:F 1 2 forward 0 2 3
    expect 3:2:F 3 2 forward 0 1 2
    expect 3:2:B 3 2 backward 0 1 2
    expect 2:2:B 2 2 backward 0 1            # stage 3 may finish its step first
    expect 0:3:B 0 3 backward
fi
# a malformed value fails the first step on every rank, naming the variable
out=$(DTRAIN_PIPE_FAULT=1:x timeout -k 15 120 "$bin" train "${args[@]}" < /dev/null 2>&1); rc=$?
if [ $rc -eq 124 ] || [ $rc -eq 0 ] || ! grep -qF 'DTRAIN_PIPE_FAULT="1:x": expected RANK:MB[:F|B]' <<<"$out"; then
    echo "FAIL DTRAIN_PIPE_FAULT=1:x (rc $rc), got:"; echo "$out" | head -5; fail=1
else echo "ok   DTRAIN_PIPE_FAULT=1:x -> names the variable"; fi
exit $fail
