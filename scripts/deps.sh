#!/usr/bin/env bash
# Installs every build/run dependency from Debian packages (needs root or sudo).
set -euo pipefail
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
PKGS="build-essential cmake pkg-config libopenblas-openmp-dev libdnnl-dev libopenmpi-dev openmpi-bin
      libcjson-dev libcmocka-dev zlib1g-dev dataset-fashion-mnist fortunes
      clang libclang-rt-dev libomp-dev iproute2 libxml2-utils"   # clang: the libFuzzer harnesses (tests/fuzz); iproute2: simulated hosts (test_multihost); libxml2-utils: xmllint (test_plot_cli)
missing=""
for p in $PKGS; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if [ -n "$missing" ]; then
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends $missing
fi
