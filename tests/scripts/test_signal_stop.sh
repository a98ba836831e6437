#!/usr/bin/env bash
# Preemption: SIGTERM / SIGINT / SIGHUP mid-run stops every rank after the same step,
# writes the checkpoint (--save: single file, ZeRO sharded set, pipeline),
# prints "interrupted at step N, saved to PATH" once and exits 128 + signal;
# resuming that checkpoint to the end gives bit for bit the checkpoint of an
# uninterrupted run (tests/tools/ckpt_cmp). A second signal stops at once. A
# launcher killed outright takes mpirun and the ranks with it.
# usage: test_signal_stop.sh DTRAIN CKPT_CMP NP [MPIEXEC ARGS...]
#   NP 1: one process. NP 2|4: the signal reaches one rank only under a plain
#   mpiexec (the ranks must agree), and the --nproc launcher (mpirun underneath).
set -uo pipefail
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"   # (see test_recompute_bitwise.sh)
bin=$1 cmp=$2 np=$3; shift 3
mpiexec=("$@")
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
steps=1500
mlp=(--model mlp --hidden 64 --threads 1 --batch 64 --log-every 1 --eval-batches 1 --steps $steps)
fail=0

# wait_step OUT PID: until OUT shows a progress line of step >= 20 (or PID is gone)
wait_step() {
    local i
    for i in $(seq 1 1200); do
        grep -qE '^step ([2-9][0-9]|[0-9]{3,})/' "$1" 2>/dev/null && return 0
        kill -0 "$2" 2>/dev/null || return 1
        sleep 0.05
    done
    return 1
}

# case TAG SIGNAL TARGET -- LAUNCH... : run LAUNCH (a dtrain command line
# without --save) with SIGNAL sent to TARGET (launcher | rank:R) after step 20,
# then resume it to the end; compare with the single file that the command
# line in the array REF (default: LAUNCH) saves uninterrupted.
case_() {
    local tag=$1 sig=$2 target=$3; shift 4
    local cmd=("$@") ref="$tmp/$tag.ref.st" ck="$tmp/$tag.ck" out="$tmp/$tag.out" bad=""
    [ ${#REF[@]} -gt 0 ] || REF=("${cmd[@]}")
    if ! timeout -k 15 300 "${REF[@]}" --save "$ref" --quiet < /dev/null > "$tmp/$tag.ref.out" 2>&1; then
        echo "FAIL $tag: reference run:"; tail -5 "$tmp/$tag.ref.out"; fail=1; return
    fi
    # --foreground: timeout would pass a signal it gets on to its whole
    # process group too, i.e. a second one to the launcher (which then aborts)
    timeout --foreground 300 "${cmd[@]}" --save "$ck" < /dev/null > "$out" 2>&1 &
    local pid=$!
    if ! wait_step "$out" "$pid"; then bad="never reached step 20"; fi
    if [ -z "$bad" ]; then
        if [ "$target" = launcher ]; then kill "-$sig" "$pid"
        else   # one rank only: the mpiexec descendant with OMPI_COMM_WORLD_RANK=R
            local r=${target#rank:} p rpid=""
            for p in $(pgrep -P "$(pgrep -P "$pid")"); do
                tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -cx "OMPI_COMM_WORLD_RANK=$r" > /dev/null && rpid=$p
            done
            if [ -n "$rpid" ]; then kill "-$sig" "$rpid"; else bad="no rank $r process"; kill "$pid"; fi
        fi
    fi
    wait "$pid"; local rc=$?
    local want=$((128 + $(kill -l "$sig")))
    local n=$(grep -c "^interrupted at step [0-9]*, saved to $ck\$" "$out")
    local at=$(sed -n "s/^interrupted at step \([0-9]*\), saved to .*/\1/p" "$out" | head -1)
    [ -n "$bad" ] || [ "$rc" -eq "$want" ] || bad="exit status $rc, wanted $want"
    [ -n "$bad" ] || [ "$n" -eq 1 ] || bad="$n 'interrupted at step N, saved to $ck' lines, wanted 1"
    [ -n "$bad" ] || [ "$at" -lt $steps ] || bad="stopped at step $at (the signal came too late)"
    [ -n "$bad" ] || [ -e "$ck" ] || bad="no checkpoint $ck"
    [ -n "$bad" ] || ! grep -qE "error|MPI_ABORT|terminated" "$out" || bad="error output"
    if [ -z "$bad" ] && ! timeout -k 15 300 "${cmd[@]}" --resume "$ck" --save "$ck" --quiet < /dev/null > "$tmp/$tag.res.out" 2>&1; then
        bad="resume failed: $(tail -2 "$tmp/$tag.res.out")"
    fi
    if [ -z "$bad" ] && ! "$cmp" "$ref" "$ck" step optim_step epoch cursor > "$tmp/cmp.out" 2>&1; then
        bad="resumed checkpoint differs from the uninterrupted run's: $(head -3 "$tmp/cmp.out")"
    fi
    if [ -n "$bad" ]; then echo "FAIL $tag: $bad"; grep -v '^step' "$out" | tail -8; fail=1
    else echo "ok   $tag: SIG$sig to $target -> stopped at step $at, exit $rc, resumed bit-identically"; fi
}

REF=()
if [ "$np" -eq 1 ]; then
    case_ single TERM launcher -- "$bin" train "${mlp[@]}"
    case_ single_int INT launcher -- "$bin" train "${mlp[@]}"
    # a closed terminal or ssh session (SIGHUP) saves and stops as SIGTERM does (it killed the run unsaved)
    case_ single_hup HUP launcher -- "$bin" train "${mlp[@]}"
    # a hang-up comes twice (the shell's, then the kernel's): the second only asks again, the run still saves
    "$bin" train "${mlp[@]}" --steps 100000 --save "$tmp/hup2.st" < /dev/null > "$tmp/hup2.out" 2>&1 &
    pid=$!
    if wait_step "$tmp/hup2.out" "$pid"; then kill -HUP "$pid"; kill -HUP "$pid"; fi
    wait "$pid"; rc=$?
    if [ $rc -eq 129 ] && [ -e "$tmp/hup2.st" ] && grep -q "^interrupted at step" "$tmp/hup2.out"; then
        echo "ok   SIGHUP twice: saved and stopped (exit 129)"
    else echo "FAIL SIGHUP twice: exit $rc (wanted 129), checkpoint: $(ls "$tmp"/hup2.st 2>/dev/null || echo none)"; fail=1; fi
    # under nohup (SIGHUP ignored from the start) a hang-up changes nothing; SIGTERM still stops
    bash -c 'trap "" HUP; exec "$@"' _ "$bin" train "${mlp[@]}" --steps 100000 --save "$tmp/nohup.st" < /dev/null \
        > "$tmp/nohup.out" 2>&1 &
    pid=$!
    if wait_step "$tmp/nohup.out" "$pid"; then
        kill -HUP "$pid"; sleep 1
        if kill -0 "$pid" 2>/dev/null && ! grep -q "^interrupted" "$tmp/nohup.out"; then
            echo "ok   nohup: SIGHUP ignored, still training"
        else echo "FAIL nohup: the run stopped on SIGHUP"; fail=1; fi
        kill -TERM "$pid"
    fi
    wait "$pid"; rc=$?
    [ $rc -eq 143 ] || { echo "FAIL nohup: SIGTERM after it: exit $rc (wanted 143)"; fail=1; }
    # a second signal stops at once: no step-boundary stop, no checkpoint
    "$bin" train "${mlp[@]}" --steps 100000 --save "$tmp/twice.st" < /dev/null > "$tmp/twice.out" 2>&1 &
    pid=$!
    if wait_step "$tmp/twice.out" "$pid"; then kill -INT "$pid"; kill -TERM "$pid"; fi
    wait "$pid"; rc=$?
    # (which of the two the process handles first is the kernel's choice)
    if { [ $rc -eq 143 ] || [ $rc -eq 130 ]; } && [ ! -e "$tmp/twice.st" ] && ! grep -q "^interrupted" "$tmp/twice.out"; then
        echo "ok   SIGINT then SIGTERM: dies at once (exit $rc, nothing saved)"
    else echo "FAIL SIGINT then SIGTERM: exit $rc (wanted 130 or 143), checkpoint: $(ls "$tmp"/twice.st 2>/dev/null || echo none)"; fail=1; fi
else
    last=$((np - 1))
    # (--quiet: mpiexec's own banner about a non-zero exit status)
    case_ "ddp_np${np}_rank$last" TERM "rank:$last" -- "${mpiexec[@]}" --quiet -n "$np" "$bin" train "${mlp[@]}"
    REF=("$bin" train "${mlp[@]}" --nproc "$np" --zero 1 --save-format consolidated)
    case_ "zero1_sharded_np$np" INT launcher -- "$bin" train "${mlp[@]}" --nproc "$np" --zero 1
    case_ "zero1_hup_np$np" HUP launcher -- "$bin" train "${mlp[@]}" --nproc "$np" --zero 1
    # the launcher killed outright (SIGKILL): mpirun and the ranks end too, not run on unwatched
    # (TMPDIR: the launch directory a killed launcher cannot remove goes with $tmp)
    TMPDIR="$tmp" "$bin" train "${mlp[@]}" --steps 1000000 --nproc "$np" --save "$tmp/kill9.ck" < /dev/null \
        > "$tmp/kill9.out" 2>&1 &
    pid=$!
    if wait_step "$tmp/kill9.out" "$pid"; then
        kill -KILL "$pid"; wait "$pid" 2>/dev/null
        left=""
        for i in $(seq 1 150); do left=$(pgrep -f "$tmp/kill9.ck"); [ -z "$left" ] && break; sleep 0.1; done
        if [ -z "$left" ]; then echo "ok   launcher SIGKILLed: mpirun and the ranks ended within $((i / 10)) s"
        else echo "FAIL launcher SIGKILLed: still running 15 s later: $(pgrep -fa "$tmp/kill9.ck" | cut -c1-80)"
             pkill -KILL -f "$tmp/kill9.ck"; fail=1; fi
    else echo "FAIL kill9: never reached step 20"; kill -KILL "$pid"; fail=1; fi
    # a pipeline of np stages == one process with its micro-batches accumulated
    hid=64; [ "$np" -eq 4 ] && hid=64,64,64
    REF=("$bin" train "${mlp[@]}" --hidden $hid --batch 32 --accum 2)
    case_ "pp${np}" TERM launcher -- "$bin" train "${mlp[@]}" --hidden $hid --nproc "$np" --pp "$np" --microbatches 2
    REF=()
fi
exit $fail
