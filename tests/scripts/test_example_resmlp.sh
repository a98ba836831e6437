#!/usr/bin/env bash
# Runs the example (the command line is "$@" after two words: WHAT, the
# result line's strategy as it must read, e.g. "zero with recompute", and
# STEPS, e.g. test_example_resmlp.sh ddp 40 mpiexec -n 2 resmlp --steps 40)
# and checks it ran that and trained: the last loss is well below the first,
# and the test accuracy beats chance (10 classes) by far.
set -uo pipefail
# Ranks under mpirun: Open MPI unloads its plugins at finalize, so LeakSanitizer
# sees their allocations from an unknown module that no suppression can name
# (as tests/common/cli_env.c does for the CLI tests; our own code's leaks are
# caught by the unit tests of the same features).
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
what=$1 steps=$2
shift 2
out=$("$@" 2>&1); rc=$?
echo "$out"
[ $rc -eq 0 ] || { echo "FAIL: exit code $rc"; exit 1; }
line=$(grep -E "^resmlp: $what, loss [0-9.]+ -> [0-9.]+ over $steps steps, test accuracy [0-9.]+\$" <<<"$out")
[ -n "$line" ] || { echo "FAIL: no result line 'resmlp: $what, ... over $steps steps, ...'"; exit 1; }
read -r first last acc < <(sed -E 's/.* loss ([0-9.]+) -> ([0-9.]+) over .* accuracy ([0-9.]+)$/\1 \2 \3/' <<<"$line")
awk -v f="$first" -v l="$last" -v a="$acc" 'BEGIN { exit !(l < 0.6 * f && a > 0.5) }' \
    || { echo "FAIL: loss $first -> $last, accuracy $acc (want last < 0.6 * first, accuracy > 0.5)"; exit 1; }
echo "ok: loss $first -> $last, accuracy $acc"
