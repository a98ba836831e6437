#!/usr/bin/env bash
# Install deps, build with -Werror, run every test; then the fast tests again
# under ASan+UBSan. Exit non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
scripts/deps.sh
scripts/check_layers.sh   # every file includes only its own or lower layers
scripts/build.sh build
(cd build && ctest --output-on-failure -j1)
scripts/build.sh build-asan -DCMAKE_BUILD_TYPE=Debug -DDTRAIN_SANITIZE=ON
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 LSAN_OPTIONS=suppressions=$PWD/tests/lsan.supp
(cd build-asan && ctest --output-on-failure -j1 -LE slow)
# libFuzzer harnesses of the file readers (tests/fuzz): built with clang and
# run 12 s each from their seed corpora (about 50 s in all)
if command -v clang >/dev/null; then
    cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=Debug -DDTRAIN_FUZZ=ON -DDTRAIN_WERROR=ON >/dev/null
    cmake --build build-fuzz -j"$(nproc)" --target fuzz_all
    tests/scripts/run_fuzz.sh build-fuzz 12
else
    echo "FAIL: clang not found, so the fuzzers cannot run (scripts/deps.sh installs it)"
    exit 1
fi
