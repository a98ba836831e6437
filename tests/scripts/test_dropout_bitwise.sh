#!/usr/bin/env bash
# GPT-2 with --dropout draws the same masks in every layout of the same
# global batch: a mask is a function of (seed, step, the sample's global
# position, the dropout site, the element), not of a generator whose state
# depends on the layout (ops.h dt_op_dropout, train.h row_keys). So
#  - bit for bit (final checkpoint, tests/tools/ckpt_cmp, and the logged
#    losses): one process --batch 2 --accum 4 == --recompute blocks ==
#    --pp 2 --batch 8 --microbatches 4 (1F1B; ZB-H1 with recompute), and
#    DDP --nproc 2 --batch 2 --accum 2 --deterministic == ZeRO-1 at 2 ranks,
#    DDP --nproc 4 --batch 2 == ZeRO-1 and ZeRO-3 at 4 ranks, and --pp 2 at 4
#    ranks (2 replicas, --batch 4 --microbatches 2) == DDP --nproc 2;
#  - to rounding (training losses within 1e-6 relative): one process ==
#    --batch 4 --accum 2 == DDP --nproc 2 == DDP --nproc 4. These change how the global batch
#    is cut into micro-batches, i.e. the order of the loss and gradient sums,
#    and are not bitwise without dropout either (a different mask moves the
#    first loss by ~1e-3).
# usage: test_dropout_bitwise.sh DTRAIN CKPT_CMP
set -uo pipefail
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"   # (see test_recompute_bitwise.sh)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
bin=$1 cmp=$2
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
for i in $(seq 1 300); do echo "line $i: the quick brown fox jumps over the lazy dog $((i * 7919 % 1000))"; done > "$tmp/corpus.txt"
gpt2=(--model gpt2 --layers 2 --embd 32 --heads 2 --max-t 32 --seq 32 --dropout 0.1 --deterministic
      --data text --data-path "$tmp/corpus.txt" --eval-batches 2 --threads 1 --quiet --steps 3)
fail=0
args=gpt2
# shellcheck source=lib/train_compare.sh
. "$(dirname "$0")/lib/train_compare.sh"

t_run single --batch 2 --accum 4 || exit 1
[ "$(wc -l < "$tmp/single.loss")" -eq 3 ] || { echo "FAIL: expected 3 logged losses"; cat "$tmp/single.jsonl"; exit 1; }
t_run ddp2 --batch 2 --accum 2 --nproc 2 && t_close single ddp2
while IFS='|' read -r how ref tag extra; do
    # shellcheck disable=SC2086
    t_run "$tag" $extra && "t_$how" "$ref" "$tag"
done <<'CONFIGS'
same|single|recompute|--batch 2 --accum 4 --recompute blocks
same|single|pp2|--batch 8 --microbatches 4 --pp 2 --nproc 2
same|single|pp2_zbh1_recompute|--batch 8 --microbatches 4 --pp 2 --nproc 2 --schedule zb-h1 --recompute blocks
same|ddp2|zero1_np2|--batch 2 --accum 2 --nproc 2 --zero 1
close|single|accum2|--batch 4 --accum 2
close|single|ddp4|--batch 2 --nproc 4
same|ddp4|zero1_np4|--batch 2 --nproc 4 --zero 1
same|ddp4|zero3_np4|--batch 2 --nproc 4 --zero 3 --save-format consolidated
same|ddp2|pp2_dp2|--batch 4 --microbatches 2 --pp 2 --nproc 4
CONFIGS
exit $fail
