#!/usr/bin/env bash
# One error line per job: an invalid value every rank's library rejects
# (--lr -1) prints "dtrain: error: ..." once — not once per rank — and no
# MPI_ABORT banner, through the --nproc launcher and under a plain mpiexec;
# the job fails (non-zero exit) without hanging. (A failure of one rank
# mid-run printing only its own line: test_pipeline_faults.sh.)
# usage: test_one_error_line.sh DTRAIN NP MPIEXEC ARGS...
set -uo pipefail
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"   # (see test_recompute_bitwise.sh)
bin=$1 np=$2; shift 2
mpiexec=("$@")
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail=0
want="dtrain: error: --lr must be finite and >= 0 (got -1)"
args=(train --model mlp --hidden 32 --threads 1 --quiet --steps 2 --lr -1)
check() {   # check TAG COMMAND...
    local tag=$1; shift
    timeout -k 15 300 "$@" < /dev/null > "$tmp/out" 2> "$tmp/err"; local rc=$?
    local n bad=""
    n=$(grep -c "^dtrain:" "$tmp/err")
    if [ $rc -eq 124 ]; then bad="hang"
    elif [ $rc -eq 0 ]; then bad="exit 0"
    elif [ "$n" -ne 1 ] || ! grep -qxF -- "$want" "$tmp/err"; then bad="$n dtrain lines on stderr, wanted exactly '$want'"
    elif grep -q "MPI_ABORT" "$tmp/err" "$tmp/out"; then bad="MPI_ABORT banner"
    fi
    if [ -n "$bad" ]; then echo "FAIL $tag ($bad), stderr:"; head -12 "$tmp/err"; fail=1
    else echo "ok   $tag: one error line, exit $rc"; fi
}
check "--nproc $np" "$bin" "${args[@]}" --nproc "$np"
check "mpiexec -n $np" "${mpiexec[@]}" -n "$np" "$bin" "${args[@]}"
# --nproc: nothing else on stderr either (mpirun --quiet: no exit banner)
timeout -k 15 300 "$bin" "${args[@]}" --nproc "$np" < /dev/null > /dev/null 2> "$tmp/err"
if [ "$(wc -l < "$tmp/err")" -ne 1 ]; then echo "FAIL --nproc $np: stderr has more than the error line:"; head -12 "$tmp/err"; fail=1
else echo "ok   --nproc $np: stderr is that line only"; fi
exit $fail
