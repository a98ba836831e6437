#!/usr/bin/env bash
# Install deps, build, and train the CNN on Fashion-MNIST with 2 data-parallel
# ranks (MPI, one thread each); prints the test accuracy at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
scripts/deps.sh
scripts/build.sh build
build/dtrain train --nproc 2 --model cnn --data fashion-mnist --epochs 3 --batch 32 \
  --optim adamw --lr 2e-3 --min-lr 1e-5 --warmup 100 --seed 1 "$@"
