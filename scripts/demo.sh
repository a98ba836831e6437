#!/usr/bin/env bash
# Install deps, build, and train the CNN on Fashion-MNIST; prints test accuracy.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
scripts/deps.sh
scripts/build.sh build
build/dtrain train --model cnn --data fashion-mnist --epochs 3 --batch 64 \
  --optim adamw --lr 2e-3 --wd 0.01 --seed 1 "$@"
