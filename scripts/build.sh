#!/usr/bin/env bash
# Configure + build into build/ (or $1). Extra args go to cmake.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build}; shift || true
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release -DDTRAIN_WERROR=ON "$@" >/dev/null
cmake --build "$dir" -j"$(nproc)"
