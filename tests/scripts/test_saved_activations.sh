#!/usr/bin/env bash
# --saved-activations bf16|fp16 (issue 29: activations kept in 16 bits from
# forward to backward, dt_graph_pack16). Products stay fp32 here, so nothing
# depends on the CPU's bf16 support.
#  - the forward is unchanged: step 1's loss is bitwise the fp32 run's; the
#    gradients read rounded activations, so step 3 differs, within 1%;
#  - every layout that is bitwise in fp32 stays bitwise (the rounding is
#    element-wise; dropout inside the packed blocks): one process
#    --batch 2 --accum 4 == --pp 2 (1F1B, GPipe, ZB-H1: packed blocks compute
#    their weight gradients in B) with 4 micro-batches, and
#    DDP at 2 ranks == ZeRO-1/2/3 (stage 3 gathers again in the restored
#    blocks' backward hooks); fp16 alike for DDP == ZeRO-3; --tp 2 (with and
#    without --sequence-parallel) equals one process to 1e-6, as in fp32;
#  - --precision fp16 keeps activations in 16 bits by default, bf16 where its
#    products run in bf16, and the start-up line says which; the flag
#    overrides the default either way;
#  - a bad value, and fp16 without loss scaling, are refused with one line;
#    --precision fp16 --loss-scale off keeps fp32 activations.
# usage: test_saved_activations.sh DTRAIN CKPT_CMP
set -uo pipefail
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
bin=$1 cmp=$2
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
for i in $(seq 1 300); do echo "line $i: the quick brown fox jumps over the lazy dog $((i * 7919 % 1000))"; done > "$tmp/corpus.txt"
gpt2=(--model gpt2 --layers 2 --embd 32 --heads 2 --max-t 32 --seq 32 --dropout 0.1 --deterministic --lr 3e-3
      --data text --data-path "$tmp/corpus.txt" --eval-batches 2 --threads 1 --steps 3)
fail=0
args=gpt2
# shellcheck source=lib/train_compare.sh
. "$(dirname "$0")/lib/train_compare.sh"

says() {   # says TAG TEXT: the start-up line of TAG has TEXT (or, with !, has not)
    local line; line=$(grep -m1 -o 'GEMM: .*' "$tmp/$1.out")
    if [ "$2" = "!" ]; then
        if grep -q "activations kept" <<< "$line"; then echo "FAIL $1 start-up line: $line"; fail=1; else echo "ok   $1: $line"; fi
    elif grep -qF "$2" <<< "$line"; then echo "ok   $1: $line"
    else echo "FAIL $1 start-up line lacks '$2': $line"; fail=1; fi
}

refused() {   # refused RC WANT ARGS...: exit RC (2: a flag's value, 1: the options' check), one line naming WANT
    local code=$1 want=$2 out rc; shift 2
    out=$("$bin" train "${gpt2[@]}" "$@" 2>&1); rc=$?
    if [ $rc -eq "$code" ] && [ "$(wc -l <<< "$out")" -eq 1 ] && grep -q -- "$want" <<< "$out"; then echo "ok   refused: $out"
    else echo "FAIL $*: exit $rc: $out"; fail=1; fi
}
refused 2 "'fp8' is not one of fp32, bf16, fp16" --saved-activations fp8
# fp16 keeps an activation beyond 65504 as inf: only a loss-scaled step is skipped for it
refused 1 "saved-activations fp16 needs loss scaling (--loss-scale" --saved-activations fp16
refused 1 "saved-activations fp16 needs loss scaling" --saved-activations fp16 --precision fp16 --loss-scale off

t_run fp32 --batch 2 --accum 4 || exit 1
t_run single --batch 2 --accum 4 --saved-activations bf16 || exit 1
says fp32 "!"
says single "activations kept for backward in bf16"
# every block recomputed: nothing is kept to pack, and the line says so
t_run recomp --batch 2 --accum 4 --recompute blocks --saved-activations bf16 &&
    says recomp "every block recomputed in backward, so none kept in 16 bits"
l1a=$(awk '$1 == 1 { print $2 }' "$tmp/fp32.loss") l1b=$(awk '$1 == 1 { print $2 }' "$tmp/single.loss")
l3a=$(awk '$1 == 3 { print $2 }' "$tmp/fp32.loss") l3b=$(awk '$1 == 3 { print $2 }' "$tmp/single.loss")
if [ -n "$l1a" ] && [ "$l1a" = "$l1b" ]; then echo "ok   step 1 loss bitwise the fp32 run's ($l1a): the forward is unchanged"
else echo "FAIL step 1 loss: fp32 $l1a, bf16 activations $l1b"; fail=1; fi
if awk -v a="$l3a" -v b="$l3b" 'BEGIN { d = (a - b) / a; if (d < 0) d = -d; exit !(d < 0.01 && a != b) }'; then
    echo "ok   step 3 loss: fp32 $l3a, bf16 activations $l3b (within 1%, not equal: the gradients read 16 bits)"
else echo "FAIL step 3 loss: fp32 $l3a, bf16 activations $l3b"; fail=1; fi

t_run ddp2 --batch 2 --accum 2 --nproc 2 --saved-activations bf16
while IFS='|' read -r ref tag extra; do
    # shellcheck disable=SC2086
    t_run "$tag" $extra && t_same "$ref" "$tag"
done <<'CONFIGS'
single|pp2_1f1b|--batch 8 --microbatches 4 --pp 2 --nproc 2 --saved-activations bf16
single|pp2_gpipe|--batch 8 --microbatches 4 --pp 2 --nproc 2 --schedule gpipe --saved-activations bf16
single|pp2_zbh1|--batch 8 --microbatches 4 --pp 2 --nproc 2 --schedule zb-h1 --saved-activations bf16
ddp2|zero1|--batch 2 --accum 2 --nproc 2 --zero 1 --saved-activations bf16
ddp2|zero2|--batch 2 --accum 2 --nproc 2 --zero 2 --save-format consolidated --saved-activations bf16
ddp2|zero3|--batch 2 --accum 2 --nproc 2 --zero 3 --save-format consolidated --saved-activations bf16
CONFIGS
# tensor parallelism (with and without sequence parallelism) equals one
# process to rounding in fp32, and so it does with 16-bit activations
t_run tp2 --batch 8 --tp 2 --nproc 2 --saved-activations bf16 && t_close single tp2
t_run tp2_sp --batch 8 --tp 2 --sequence-parallel --nproc 2 --saved-activations bf16 && t_close single tp2_sp
t_run tp2_fp32 --batch 8 --tp 2 --nproc 2
if ! cmp -s "$tmp/tp2.loss" "$tmp/tp2_fp32.loss"; then echo "ok   tp2 with bf16 activations is not the fp32 run"
else echo "FAIL tp2: bf16 activations changed nothing"; fail=1; fi
t_run ddp2_fp16 --batch 2 --accum 2 --nproc 2 --saved-activations fp16 --loss-scale dynamic &&
t_run zero3_fp16 --batch 2 --accum 2 --nproc 2 --zero 3 --save-format consolidated --saved-activations fp16 --loss-scale dynamic &&
t_same ddp2_fp16 zero3_fp16
if ! cmp -s "$tmp/ddp2.loss" "$tmp/ddp2_fp16.loss"; then echo "ok   fp16 activations train differently from bf16"
else echo "FAIL fp16 and bf16 activations gave the same losses"; fail=1; fi

# the default follows --precision: fp16 keeps fp16; bf16 keeps bf16 where its
# products run in bf16 (AMX, or DTRAIN_BF16=force), else fp32 and
# the start-up line says how to ask
t_run prec_fp16 --batch 2 --accum 4 --precision fp16 && says prec_fp16 "activations kept for backward in fp16"
t_run prec_bf16 --batch 2 --accum 4 --precision bf16 &&
if grep -q "bf16 matrix products with fp32 accumulation" "$tmp/prec_bf16.out"; then
    says prec_bf16 "activations kept for backward in bf16"
else
    says prec_bf16 "activations fp32 (--saved-activations bf16 halves them"
fi
t_run prec_off --batch 2 --accum 4 --precision bf16 --saved-activations fp32 && says prec_off "!"
t_run prec_fp16_noscale --batch 2 --accum 4 --precision fp16 --loss-scale off && says prec_fp16_noscale "!"
t_run prec_on --batch 2 --accum 4 --precision bf16 --saved-activations bf16 && says prec_on "activations kept for backward in bf16"
exit $fail
