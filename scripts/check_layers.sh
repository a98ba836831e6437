#!/usr/bin/env bash
# Layering check: every file may include headers of its own layer or of layers
# below it, never above. Exit 1 listing each violation; 0 when the order holds.
#
#   scripts/check_layers.sh [ROOT]      (ROOT defaults to the repository)
#
# The order, bottom to top (docs/ARCHITECTURE.md explains each layer):
#   util tensor autograd ops nn optim data io dist strategy parallel train cli
# A file's layer: include/dtrain/<h> by the table below, src/<layer>/*, cli/*.
# An include's layer: "dtrain/<h>" by the table, "<layer>/x.h" (another
# layer's internal header) by its folder, a bare "x.h" is the file's own folder.
# tests/, bench/ and examples/ sit on top and are not checked.
#
# A layer may have rooms, src/<layer>/<room>/, ordered the same way: a file in
# a room includes headers of its own room or of lower rooms of its layer
# (rooms of equal rank are siblings and never include each other). Today:
#   parallel: common < ddp = zero < tp < pipe
# (the pipeline runs DDP or ZeRO over each stage's replicas, and tp's
# collective inside tensor-parallel stages through tp_internal.h; tp runs
# ZeRO over its replicas through zero_internal.h, and DDP through its public
# header only). A folder under a
# layer that is not a room in the table is an error.
set -euo pipefail
root=${1:-$(cd "$(dirname "$0")/.." && pwd)}

layers=(util tensor autograd ops nn optim data io dist strategy parallel train cli)
declare -A rank
for i in "${!layers[@]}"; do rank[${layers[$i]}]=$i; done

# public header -> layer
declare -A header=(
  [error.h]=util [log.h]=util [version.h]=util [tensor.h]=tensor [autograd.h]=autograd [ops.h]=ops [nn.h]=nn [generate.h]=nn
  [optim.h]=optim [data.h]=data [io.h]=io [trace.h]=io [dist.h]=dist
  [strategy.h]=strategy [parallel.h]=parallel [zero.h]=parallel [pipeline.h]=parallel [train.h]=train
  [dtrain.h]=cli
)

# room -> rank, per layer that has rooms
declare -A room_rank=( [parallel/common]=0 [parallel/ddp]=1 [parallel/zero]=1 [parallel/tp]=2 [parallel/pipe]=3 )

bad=0
fail() { echo "layering: $*" >&2; bad=1; }

# The file's layer into fl (empty: not checked) and its room into fr
# ("layer/room" for src/<layer>/<room>/x, else empty); 1 when it is unusable
# (said). Sets globals, no subshell: this runs once per file.
classify() {
  local f=$1 l
  fl="" fr=""
  case $f in
    include/dtrain/*) local h=${f#include/dtrain/}
                      [ -n "${header[$h]:-}" ] || { fail "$f: header not in the layer table of scripts/check_layers.sh"; return 1; }
                      fl=${header[$h]} ;;
    src/*/*)          l=${f#src/}; fl=${l%%/*} ;;
    cli/*)            fl=cli ;;
  esac
  [ -n "$fl" ] || return 0
  [ -n "${rank[$fl]:-}" ] || { fail "$f: folder src/$fl is not a layer (add it to scripts/check_layers.sh)"; fl=""; return 1; }
  case $f in
    src/*/*/*) fr=${f#src/}; fr=${fr%/*}
               [ -n "${room_rank[$fr]:-}" ] || { fail "$f: folder src/$fr is not a room (add it to room_rank in scripts/check_layers.sh)"; fl=""; return 1; } ;;
  esac
  return 0
}

cd "$root"
files=$(find include/dtrain src cli -name '*.[ch]' 2>/dev/null | sort)
[ -n "$files" ] || { echo "layering: no sources under $root" >&2; exit 1; }
declare -A file_layer file_room
for f in $files; do
  classify "$f" || true
  file_layer[$f]=$fl
  file_room[$f]=$fr
done
# every include of every file at once: "file:line:header"
# shellcheck disable=SC2086  # (the file list splits on purpose; no names with spaces)
while IFS=: read -r f line inc; do
  fl=${file_layer[$f]:-} fr=${file_room[$f]:-}
  [ -n "$fl" ] || continue
  # the included header's room, when it is one: "layer/room/x.h", or a bare
  # "x.h" from a file in a room
  ir=""
  case $inc in
    dtrain/*) ;;
    */*/*)    ir=${inc%/*} ;;
    */*)      ;;
    *)        ir=$fr ;;
  esac
  if [ -n "$fr" ] && [ -n "$ir" ] && [ "$ir" != "$fr" ] && [ "${ir%%/*}" = "${fr%%/*}" ]; then
    if [ -z "${room_rank[$ir]:-}" ]; then fail "$f:$line: includes $inc from unknown room '$ir'"
    elif [ "${room_rank[$ir]}" -ge "${room_rank[$fr]}" ]; then
      fail "$f:$line: room '$fr' includes $inc of room '$ir', which is not below it"
    fi
  fi
  case $inc in
    dtrain/*) il=${header[${inc#dtrain/}]:-}
              [ -n "$il" ] || { fail "$f:$line: includes $inc, which is not in the layer table"; continue; } ;;
    */*)      il=${inc%%/*} ;;
    *)        il=$fl ;;
  esac
  [ -n "${rank[$il]:-}" ] || { fail "$f:$line: includes $inc from unknown layer '$il'"; continue; }
  if [ "${rank[$il]}" -gt "${rank[$fl]}" ]; then
    fail "$f:$line: layer '$fl' includes $inc of higher layer '$il'"
  fi
done < <(grep -Hn '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' $files | sed -E 's/^([^:]+):([0-9]+):.*"([^"]+)".*/\1:\2:\3/')

if [ $bad -ne 0 ]; then
  echo "layering: FAILED (order: ${layers[*]})" >&2
  exit 1
fi
echo "layering: ok ($(echo "$files" | wc -l) files; order: ${layers[*]})"
