#!/usr/bin/env bash
# Runs every libFuzzer harness of a DTRAIN_FUZZ build for SECONDS each, from
# its seed corpus (tests/fuzz/corpus/<harness>/, read only: new inputs go to a
# temporary directory). Prints executions per harness; a crash, sanitizer
# finding, leak or timeout fails, leaving the input in ARTIFACTS (default
# BUILD_DIR/fuzz-artifacts) to reproduce with: BUILD_DIR/fuzz_<h> FILE
# usage: run_fuzz.sh BUILD_DIR SECONDS [ARTIFACTS]
set -uo pipefail
build=$1 secs=$2 art=${3:-$1/fuzz-artifacts}
src=$(cd "$(dirname "$0")/../.." && pwd)
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=1:allocator_may_return_null=1"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
mkdir -p "$art"
fail=0 n=0
for bin in "$build"/fuzz_*; do
    [ -x "$bin" ] || continue
    h=$(basename "$bin"); h=${h#fuzz_}; n=$((n + 1))
    mkdir -p "$tmp/$h"
    "$bin" -max_total_time="$secs" -timeout=20 -rss_limit_mb=2048 -print_final_stats=1 \
        -artifact_prefix="$art/$h-" "$tmp/$h" "$src/tests/fuzz/corpus/$h" > "$tmp/$h.log" 2>&1
    rc=$?
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$tmp/$h.log")
    if [ $rc -ne 0 ]; then
        echo "FAIL fuzz_$h (exit $rc after ${execs:-?} executions):"
        grep -E "ERROR|SUMMARY|^    #[0-9]|Test unit written" "$tmp/$h.log" | head -25
        fail=1
    else echo "ok   fuzz_$h: ${execs:-?} executions in ${secs} s, no finding"; fi
done
[ $n -gt 0 ] || { echo "FAIL no fuzz_* harness in $build"; exit 1; }
exit $fail
