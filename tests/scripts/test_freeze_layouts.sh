#!/usr/bin/env bash
# A checkpoint saved with --freeze moves between layouts like any other: a
# frozen parameter has no optimizer state in one process's file (zeros in a
# ZeRO or pipeline set) and 0 in its "optim_steps" metadata, and a run that
# resumes it unfrozen starts that parameter from zero state at its own step
# 1 (AdamW's bias correction), whatever the layout on either side.
#  - load: one process's frozen checkpoint resumed unfrozen under ZeRO 1/3,
#    a pipeline, a pipeline x 2 ZeRO replicas and tensor parallel x ZeRO
#    trains steps 3-4 as one process does (before, ZeRO and the pipeline
#    refused the file: "missing tensor optim.exp_avg...");
#  - save: the same frozen run saved by ZeRO, a pipeline and a pipeline x 2
#    ZeRO replicas, resumed unfrozen by one process, trains as one process
#    (before, a pipeline set recorded no step counts, so the thawed block
#    took AdamW's bias correction of step 3: step 4's loss 4.4659 became 4.4324).
# Losses within 1e-6 relative.
# usage: test_freeze_layouts.sh DTRAIN CKPT_CMP
set -uo pipefail
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
bin=$1 cmp=$2
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export OMP_NUM_THREADS=1
fail=0
common=(--model gpt2 --layers 2 --embd 32 --heads 4 --max-t 32 --seq 32 --threads 1 --optim adamw --lr 0.01
        --wd 0.1 --eval-batches 1)
args=common
# shellcheck source=lib/train_compare.sh
. "$(dirname "$0")/lib/train_compare.sh"
frz=(--freeze 'h.0.*' --steps 2)
t_run frozen --batch 8 "${frz[@]}" || exit 1
t_run ref --batch 8 --steps 4 --resume "$tmp/frozen.ck" || exit 1
if [ "$(wc -l < "$tmp/ref.loss")" -ne 2 ]; then echo "FAIL: the reference should log steps 3 and 4"; cat "$tmp/ref.loss"; exit 1; fi

# name:flags for the same global batch of 8
layouts=("zero1:--nproc 2 --zero 1 --batch 4" "zero3:--nproc 2 --zero 3 --batch 4" "pp:--nproc 2 --pp 2 --batch 8"
         "pp_zero:--nproc 4 --pp 2 --zero 1 --batch 4" "tp_zero:--nproc 4 --tp 2 --zero 3 --batch 4")
for l in "${layouts[@]}"; do
    # shellcheck disable=SC2206
    flags=(${l#*:}) name=${l%%:*}
    t_run "load_$name" "${flags[@]}" --steps 4 --resume "$tmp/frozen.ck" && t_near_metrics ref "load_$name" train
done
for name in zero1 pp pp_zero; do
    for l in "${layouts[@]}"; do [ "${l%%:*}" = "$name" ] && { read -ra flags <<< "${l#*:}"; }; done
    t_run "save_$name" "${flags[@]}" "${frz[@]}" || continue
    t_run "back_$name" --batch 8 --steps 4 --resume "$tmp/save_$name.ck" && t_near_metrics ref "back_$name" train
done
# a frozen tied parameter (GPT-2's wte: the embedding and the lm-head, on the
# first and last stage): a pipeline writes it once and records its 0 steps
# once (both stages wrote it, and the counts summed to 2)
t_run wfrozen --batch 8 --freeze 'wte.*' --steps 2 || exit 1
t_run wref --batch 8 --steps 4 --resume "$tmp/wfrozen.ck" || exit 1
t_run wsave_pp --nproc 2 --pp 2 --batch 8 --freeze 'wte.*' --steps 2 &&
    t_run wback_pp --batch 8 --steps 4 --resume "$tmp/wsave_pp.ck" && t_near_metrics wref wback_pp train
t_run wload_pp --nproc 2 --pp 2 --batch 8 --steps 4 --resume "$tmp/wfrozen.ck" && t_near_metrics wref wload_pp train
exit $fail
