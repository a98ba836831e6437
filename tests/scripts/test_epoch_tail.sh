#!/usr/bin/env bash
# A step never spans two epochs (src/train/trainer.c, skip_epoch_tail):
# with --epochs 3 on a set whose size per rank leaves a tail of whole
# micro-batches, one process --batch 8, --batch 2 --accum 4, a pipeline
# --pp 2 --batch 8 (micro-batches of 4), DDP --nproc 2 --batch 4,
# --nproc 2 --batch 2 --accum 2, DDP at 4 ranks and --pp 2 x 2 replicas
# train on the same samples every step: the
# same number of steps, losses within 1e-6 relative. (Before, the micro-batch
# runs carried the tail into the next epoch's first step and drifted from
# there.) Each run's checkpoint records the same epoch and cursor.
# usage: test_epoch_tail.sh DTRAIN CKPT_CMP
set -uo pipefail
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
bin=$1 cmp=$2
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export OMP_NUM_THREADS=1
fail=0
# 3000 bytes: a training split whose size leaves a tail of 2 or more (mod 8)
for i in $(seq 1 80); do echo "line $i: brown fox $((i * 7919 % 1000)) dog"; done | head -c 3000 > "$tmp/corpus.txt"
common=(--model gpt2 --layers 2 --embd 32 --heads 4 --max-t 32 --seq 32 --data text --data-path "$tmp/corpus.txt"
        --eval-batches 1 --threads 1 --epochs 3 --lr 3e-3)
args=common
# shellcheck source=lib/train_compare.sh
. "$(dirname "$0")/lib/train_compare.sh"
t_run one --batch 8 || exit 1
n=$(wc -l < "$tmp/one.loss")
per_epoch=$(grep -m1 -oE '[0-9]+ steps of' "$tmp/one.out" | cut -d' ' -f1)
echo "     one process: $n steps (the start-up line: $per_epoch in 3 epochs)"
t_run accum --batch 2 --accum 4 && t_close one accum
t_run pp --nproc 2 --pp 2 --batch 8 --pp-split 2,2 && t_close one pp
t_run ddp --nproc 2 --batch 4 && t_close one ddp
t_run ddp_accum --nproc 2 --batch 2 --accum 2 && t_close one ddp_accum
# 4 ranks: DDP, and 2 stages x 2 replicas (a replica's --batch 4 in 2 micro-batches)
t_run ddp4 --nproc 4 --batch 2 && t_close one ddp4
t_run pp_dp2 --nproc 4 --pp 2 --batch 4 --pp-split 2,2 && t_close one pp_dp2
# the data position each saved: epoch and cursor in the global order agree
pos() { "$bin" inspect "$tmp/$1.ck" 2>/dev/null | grep -m1 -oE 'data epoch [0-9]+, cursor [0-9]+'; }
for tag in accum pp; do
    if [ -n "$(pos one)" ] && [ "$(pos one)" = "$(pos $tag)" ]; then echo "ok   $tag saved at '$(pos $tag)' as one process"
    else echo "FAIL $tag saved at '$(pos $tag)', one process at '$(pos one)'"; fail=1; fi
done
exit $fail
