#!/usr/bin/env bash
# The collective watchdog from the CLI: the last rank SIGSTOPped for 5 s
# makes the others warn (--stall-warn 2) naming it, and the run goes on once
# it continues (rank 0 logs steps again); stopped for good with --collective-timeout 4, the job ends
# with one error line (not one per waiting rank) naming the collective and
# the rank within bounded time: the 4 s, then just over the 10 s a failed
# peer would take to report (errors.c).
# usage: test_collective_watchdog.sh DTRAIN NP MPIEXEC [MPIEXEC ARGS...]
set -uo pipefail
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
export OMP_NUM_THREADS=1
bin=$1 np=$2
shift 2
mpi=("$@")
last=$((np - 1))
fail=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
args=(train --model mlp --hidden 32 --batch 8 --steps 100000000 --threads 1 --log-every 20)

# pid of world rank $1 among the children of mpiexec $2 (waits for it to start)
rank_pid() {
    for _ in $(seq 100); do
        for p in $(pgrep -P "$2"); do
            if tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -cx "OMPI_COMM_WORLD_RANK=$1" > /dev/null; then echo "$p"; return; fi
        done
        sleep 0.2
    done
}

# until rank 0 printed a step line (training runs: start-up is over)
training() { for _ in $(seq 300); do grep -q "^step " "$1" 2>/dev/null && return; sleep 0.2; done; }

# 1. stall warning, then the run continues
"${mpi[@]}" -n "$np" "$bin" "${args[@]}" --stall-warn 2 > "$tmp/out1" 2> "$tmp/err1" < /dev/null &
job=$!
victim=$(rank_pid "$last" "$job")
training "$tmp/out1"; sleep 1
pre=$(grep -c "collective stalled" "$tmp/err1")
kill -STOP "$victim"; sleep 5
n0=$(grep -c "^step " "$tmp/out1")   # (what was in flight at the stop has landed by now)
kill -CONT "$victim"
# going on = new step lines (a run hung in the stalled collective stays alive too)
went_on=1
for _ in $(seq 150); do [ "$(grep -c "^step " "$tmp/out1")" -gt "$n0" ] && { went_on=0; break; }; sleep 0.2; done
kill -0 "$job" 2>/dev/null; alive=$?
kill -TERM "$job" 2>/dev/null; wait "$job" 2>/dev/null
re="warning: collective stalled: [a-z_()]+ #[0-9]+ \([0-9.]+[KMG]?i?B F32\) on world has waited [0-9.]+ s: .*(rank|ranks|,) $last \((its last operation #[0-9]+, )?idle [0-9.]+ s\)"
if [ -z "$victim" ]; then echo "FAIL: rank $last not found"; fail=1
elif [ "$pre" -ne 0 ]; then echo "FAIL: a stall warning before the stop:"; head -3 "$tmp/err1"; fail=1
elif ! grep -qE "$re" "$tmp/err1"; then echo "FAIL: no stall warning naming rank $last, stderr:"; head -5 "$tmp/err1"; fail=1
elif [ "$alive" -ne 0 ] || [ "$went_on" -ne 0 ]; then
    echo "FAIL: the run did not go on after SIGCONT (alive: $alive, new step lines: $went_on; 0 = yes)"; head -5 "$tmp/err1"; tail -2 "$tmp/out1"; fail=1
else echo "ok   stopped rank $last named: $(grep -m1 -oE 'collective stalled: .*' "$tmp/err1")"; fi

# 2. --collective-timeout: the job fails within bounded time, with one error
# line. At 4 ranks ranks 0 and 1 stop (a machine that hangs): ranks 2 and 3
# both time out, and only the lowest one the timeout found alive (2) reports
# (by world rank alone, both printed)
stopped=("$last"); [ "$np" -ge 4 ] && stopped=(0 1)
"${mpi[@]}" -n "$np" "$bin" "${args[@]}" --stall-warn 1 --collective-timeout 4 > "$tmp/out2" 2> "$tmp/err2" < /dev/null &
job=$!
victims=(); for r in "${stopped[@]}"; do v=$(rank_pid "$r" "$job"); [ -n "$v" ] && victims+=("$v"); done
if [ ${#victims[@]} -ne ${#stopped[@]} ]; then echo "FAIL: ranks ${stopped[*]} not all found"; kill -TERM "$job"; exit 1; fi
training "$tmp/out2"; sleep 1
kill -STOP "${victims[@]}"
t0=$(date +%s)
for _ in $(seq 300); do kill -0 "$job" 2>/dev/null || break; sleep 0.2; done
el=$(( $(date +%s) - t0 ))
if kill -0 "$job" 2>/dev/null; then
    echo "FAIL: the job still runs ${el}s after the stop"; kill -KILL "${victims[@]}" 2>/dev/null; kill -TERM "$job"; fail=1
fi
kill -CONT "${victims[@]}" 2>/dev/null; kill -KILL "${victims[@]}" 2>/dev/null
wait "$job"; rc=$?
last=$(IFS='|'; echo "(${stopped[*]})")
re="error: collective timed out \(--collective-timeout 4 s\): [a-z_()]+ #[0-9]+ \([0-9.]+[KMG]?i?B F32\) on world has waited [0-9.]+ s: .*(rank|ranks|,) $last( on [^ ]+)? \("
if [ "$rc" -eq 0 ]; then echo "FAIL: exit 0 after a timeout"; fail=1
elif ! grep -qE "$re" "$tmp/err2"; then echo "FAIL: no timeout error naming rank $last (rc $rc), stderr:"; head -8 "$tmp/err2"; fail=1
elif [ "$(grep -cE '^dtrain: (rank [0-9]+: )?error:' "$tmp/err2")" -ne 1 ]; then
    echo "FAIL: not one error line but $(grep -cE '^dtrain: (rank [0-9]+: )?error:' "$tmp/err2") (one per waiting rank?):"
    grep -E '^dtrain: (rank [0-9]+: )?error:' "$tmp/err2" | cut -c1-120; fail=1
elif [ "$el" -gt 22 ]; then echo "FAIL: took ${el}s (want the 4 s timeout and about 11 s for the error report; it took 24 s or more while a timeout waited 20 s for it)"; fail=1
else echo "ok   timeout after ${el}s: $(grep -m1 -oE 'collective timed out.*' "$tmp/err2")"; fi
exit $fail
