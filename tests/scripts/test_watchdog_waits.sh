#!/usr/bin/env bash
# The collective timeout (2 s) ends the waits outside dt_work_wait too: a
# node-shared allreduce waiting in its start for a peer that issued the one
# before and then went busy without polling (POLL mode), the fingerprint
# exchange of --debug-collectives, and dt_pg_agree (both progress modes).
# The last rank is 12 s late: every other rank must report the timeout,
# naming what it waited for, within 8 s (without the watch they waited the
# 12 s, or forever).
# usage: test_watchdog_waits.sh WD_WAITS NP MPIEXEC [MPIEXEC ARGS...]
set -uo pipefail
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
export OMP_NUM_THREADS=1
tool=$1 np=$2
shift 2
mpi=("$@")
fail=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# mode, progress, what the message must name
late=$((np - 1))
for c in "node-start poll allreduce\(node\) #2.*rank $late " "debug poll allreduce #0.*: rank $late " \
         "debug thread allreduce #0.*: rank $late " \
         "agree poll configuration agreement" "agree thread configuration agreement"; do
    read -r mode prog what <<< "$c"
    DTRAIN_PROGRESS=$prog timeout 120 "${mpi[@]}" -n "$np" "$tool" "$mode" > "$tmp/out" 2> "$tmp/err" < /dev/null
    rc=$?
    bad=0
    for r in $(seq 0 $((np - 2))); do
        line=$(grep -m1 -E "^rank $r: (timed out|no timeout)" "$tmp/err")
        secs=$(sed -nE 's/^rank [0-9]+: timed out after ([0-9.]+) s: .*/\1/p' <<< "$line")
        if [ -z "$secs" ]; then echo "FAIL: $mode ($prog): rank $r: ${line:-no report} (mpiexec rc $rc)"; bad=1
        elif ! awk -v s="$secs" 'BEGIN { exit !(s < 8) }'; then echo "FAIL: $mode ($prog): rank $r waited ${secs} s"; bad=1
        elif ! grep -qE "collective timed out \(dist.collective_timeout_s 2 s\): .*$what" <<< "$line"; then
            echo "FAIL: $mode ($prog): rank $r's message does not name $what: $line"; bad=1
        fi
    done
    if [ "$bad" -ne 0 ]; then head -5 "$tmp/err"; fail=1
    else echo "ok   $mode ($prog): $(grep -m1 '^rank 0:' "$tmp/err" | cut -c1-200)"; fi
done
exit $fail
