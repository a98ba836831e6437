#!/usr/bin/env bash
# --param-dtype bf16|fp16 (issue 29: a 16-bit working copy of fp32 master
# weights). The products stay fp32 here, so nothing depends on the CPU's bf16
# support: the working copy alone changes what every op computes with.
#  - the weights really are rounded: step 1's loss differs from fp32 (within
#    1%), and the start-up line says so;
#  - every layout computes with the same rounded weights, so every layout
#    that is bitwise in fp32 stays bitwise: one process --batch 2 --accum 4
#    == --pp 2 (1F1B, GPipe, ZB-H1, and with ZeRO-2 inside the stages);
#    DDP at 2 ranks == ZeRO-1/2/3 (ZeRO-2 also with the interleaved step),
#    fp16 alike for DDP == ZeRO-3; at 4 ranks DDP == ZeRO-3, and dp 2 x pp 2
#    with ZeRO-2 in the stages == DDP at 2; --tp 2 equals one process to 1e-6;
#  - checkpoints hold the fp32 masters, in every layout: 2 steps under one
#    layout, saved, then resumed to step 4 under another equal 4 steps in one
#    go bit for bit (ZeRO-3 -> DDP, DDP -> ZeRO-2, pipeline+ZeRO-2 -> one
#    process); rounded values in a checkpoint would change steps 3 and 4;
#  - a bf16 checkpoint resumes in fp32 (--param-dtype fp32) and that run
#    computes with fp32 weights (it differs from the bf16 continuation);
#  - 1-D parameters (biases, LayerNorm's) stay fp32 in the copy: an MLP
#    with bf16 products (DTRAIN_BF16=force), which round their own inputs,
#    trains bit for bit the same with a bf16 copy as with fp32 weights --
#    one process, DDP, ZeRO-2 and ZeRO-3 (16-bit gathers) at 2 ranks --
#    and with fp32 products the copy is not fp32's run (it does round);
#  - DDP's memory report counts the masters beside the copy;
#  - a bad value, and --node-params with a 16-bit copy, are refused;
#  - the default is fp32 weights also under --precision bf16 / fp16 (as
#    autocast: only the products round; docs/PERFORMANCE.md has why).
# usage: test_param_dtype.sh DTRAIN CKPT_CMP
set -uo pipefail
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
bin=$1 cmp=$2
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
for i in $(seq 1 300); do echo "line $i: the quick brown fox jumps over the lazy dog $((i * 7919 % 1000))"; done > "$tmp/corpus.txt"
gpt2=(--model gpt2 --layers 2 --embd 32 --heads 2 --max-t 32 --seq 32 --dropout 0.1 --deterministic --lr 3e-3
      --data text --data-path "$tmp/corpus.txt" --eval-batches 2 --threads 1 --precision fp32)
fail=0
args=gpt2
# shellcheck source=lib/train_compare.sh
. "$(dirname "$0")/lib/train_compare.sh"

refused() {   # refused RC WANT ARGS...: exit RC (2: a flag's value, 1: the options' check), one line naming WANT
    local code=$1 want=$2 out rc; shift 2
    out=$("$bin" train "${gpt2[@]}" --steps 3 "$@" 2>&1); rc=$?
    if [ $rc -eq "$code" ] && [ "$(wc -l <<< "$out")" -eq 1 ] && grep -q -- "$want" <<< "$out"; then echo "ok   refused: $out"
    else echo "FAIL $*: exit $rc: $out"; fail=1; fi
}
refused 2 "param-dtype: unknown 'fp8' (fp32, bf16, fp16)" --param-dtype fp8
refused 1 "--node-params shares the float32 masters" --param-dtype bf16 --zero 2 --node-params --nproc 2

t_run fp32 --steps 3 --batch 2 --accum 4 || exit 1
t_run single --steps 3 --batch 2 --accum 4 --param-dtype bf16 || exit 1
if grep -q "weights: a bf16 working copy of fp32 masters" "$tmp/single.out" && ! grep -q "working copy" "$tmp/fp32.out"; then
    echo "ok   start-up line: $(grep -o 'weights: [^;]*' "$tmp/single.out")"
else echo "FAIL start-up line: $(grep -m1 'GEMM' "$tmp/single.out")"; fail=1; fi
for prec in fp16 bf16; do
    t_run "default_$prec" --steps 1 --batch 2 --precision "$prec" || exit 1
    if grep -q "GEMM: " "$tmp/default_$prec.out" && ! grep -q "working copy" "$tmp/default_$prec.out"; then
        echo "ok   --precision $prec alone keeps fp32 weights"
    else echo "FAIL --precision $prec default weights: $(grep -o 'weights: [^;]*' "$tmp/default_$prec.out")"; fail=1; fi
done
l1a=$(awk '$1 == 1 { print $2 }' "$tmp/fp32.loss") l1b=$(awk '$1 == 1 { print $2 }' "$tmp/single.loss")
if awk -v a="$l1a" -v b="$l1b" 'BEGIN { d = (a - b) / a; if (d < 0) d = -d; exit !(d < 0.01 && a != b) }'; then
    echo "ok   step 1 loss: fp32 weights $l1a, bf16 weights $l1b (within 1%, not equal: the forward reads rounded weights)"
else echo "FAIL step 1 loss: fp32 weights $l1a, bf16 weights $l1b"; fail=1; fi

t_run ddp2 --steps 3 --batch 2 --accum 2 --nproc 2 --param-dtype bf16
t_run ddp2_fp16 --steps 3 --batch 2 --accum 2 --nproc 2 --param-dtype fp16
while IFS='|' read -r ref tag extra; do
    # shellcheck disable=SC2086
    t_run "$tag" --steps 3 $extra && t_same "$ref" "$tag"
done <<'CONFIGS'
single|pp2_1f1b|--batch 8 --microbatches 4 --pp 2 --nproc 2 --param-dtype bf16
single|pp2_gpipe|--batch 8 --microbatches 4 --pp 2 --nproc 2 --schedule gpipe --param-dtype bf16
single|pp2_zbh1|--batch 8 --microbatches 4 --pp 2 --nproc 2 --schedule zb-h1 --param-dtype bf16
single|pp2_zero2|--batch 8 --microbatches 4 --pp 2 --zero 2 --nproc 2 --param-dtype bf16
ddp2|zero1|--batch 2 --accum 2 --nproc 2 --zero 1 --param-dtype bf16
ddp2|zero2|--batch 2 --accum 2 --nproc 2 --zero 2 --save-format consolidated --param-dtype bf16
ddp2|zero2_il|--batch 2 --accum 2 --nproc 2 --zero 2 --overlap-step interleaved --save-format consolidated --param-dtype bf16
ddp2|zero3|--batch 2 --accum 2 --nproc 2 --zero 3 --save-format consolidated --param-dtype bf16
ddp2_fp16|zero3_fp16|--batch 2 --accum 2 --nproc 2 --zero 3 --save-format consolidated --param-dtype fp16
CONFIGS
# at 4 ranks too (oversubscribed on 2 cores): DDP == ZeRO-3; dp 2 x pp 2 with ZeRO-2 in the stages == DDP at 2
t_run ddp4r --steps 3 --batch 1 --accum 2 --nproc 4 --param-dtype bf16
t_run zero3_4r --steps 3 --batch 1 --accum 2 --nproc 4 --zero 3 --save-format consolidated --param-dtype bf16 &&
    t_same ddp4r zero3_4r
t_run pp2dp2_z2 --steps 3 --batch 4 --microbatches 2 --pp 2 --zero 2 --nproc 4 --param-dtype bf16 && t_same ddp2 pp2dp2_z2
t_run tp2 --steps 3 --batch 8 --tp 2 --nproc 2 --param-dtype bf16 && t_close single tp2
# without the working copy ZeRO-3's 16-bit gathers (--compress) are not DDP's
t_run zero3_compress --steps 3 --batch 2 --accum 2 --nproc 2 --zero 3 --compress bf16 --save-format consolidated
t_run ddp2_fp32 --steps 3 --batch 2 --accum 2 --nproc 2
if ! "$cmp" "$tmp/ddp2_fp32.ck" "$tmp/zero3_compress.ck" step optim_step > /dev/null 2>&1; then
    echo "ok   control: ZeRO-3 with --compress bf16 (a 16-bit wire, exact own chunk) is not DDP's run"
else echo "FAIL control: ZeRO-3 --compress bf16 equals DDP fp32: the layouts above prove nothing"; fail=1; fi

# the memory report counts the masters beside the working copy: DDP's
# parameters per rank are twice fp32's (they were reported as fp32's alone)
params_mib() { grep -A1 "memory per rank" "$tmp/$1.out" | awk -F'[:/]' '/rank 0:/ { print $2 + 0 }'; }
a=$(params_mib ddp2_fp32) b=$(params_mib ddp2)
if [ -n "$a" ] && [ -n "$b" ] && awk -v a="$a" -v b="$b" 'BEGIN { d = b - 2 * a; exit !(a > 0 && d < 0.02 && d > -0.02) }'; then
    echo "ok   memory report: DDP params $a MiB per rank in fp32, $b with a bf16 working copy"
else echo "FAIL memory report: DDP params '$a' MiB in fp32, '$b' with a bf16 working copy (want twice)"; fail=1; fi

# checkpoints hold the masters: resumed under another layout, bit for bit
resume() {   # resume REF TAG FIRST_ARGS | SECOND_ARGS: 2 steps under FIRST, resumed to 4 under SECOND
    local ref=$1 tag=$2 first=$3 second=$4
    # shellcheck disable=SC2086
    t_run "${tag}_a" --steps 2 $first && t_run "$tag" --steps 4 --resume "$tmp/${tag}_a.ck" $second || return
    if "$cmp" "$tmp/$ref.ck" "$tmp/$tag.ck" step optim_step > "$tmp/cmp.out" && [ "$(wc -l < "$tmp/$tag.loss")" -eq 2 ] &&
        cmp -s <(tail -n 2 "$tmp/$ref.loss") "$tmp/$tag.loss"; then
        echo "ok   $tag: resumed at step 2, == $ref bit for bit (steps 3-4 and the final checkpoint)"
    else
        echo "FAIL $tag != $ref:"; cat "$tmp/cmp.out"; diff <(tail -n 2 "$tmp/$ref.loss") "$tmp/$tag.loss"; fail=1
    fi
}
t_run ddp4 --steps 4 --batch 2 --accum 2 --nproc 2 --param-dtype bf16
t_run single4 --steps 4 --batch 2 --accum 4 --param-dtype bf16
resume ddp4 z3_to_ddp "--batch 2 --accum 2 --nproc 2 --zero 3 --save-format consolidated --param-dtype bf16" \
                      "--batch 2 --accum 2 --nproc 2 --param-dtype bf16"
resume ddp4 ddp_to_z2 "--batch 2 --accum 2 --nproc 2 --param-dtype bf16" \
                      "--batch 2 --accum 2 --nproc 2 --zero 2 --param-dtype bf16"
resume single4 ppz2_to_single "--batch 8 --microbatches 4 --pp 2 --zero 2 --nproc 2 --param-dtype bf16" \
                              "--batch 2 --accum 4 --param-dtype bf16"
# and in fp32: the same masters, computed with unrounded weights
t_run to_fp32 --steps 4 --resume "$tmp/z3_to_ddp_a.ck" --batch 2 --accum 2 --nproc 2 --param-dtype fp32
if [ -s "$tmp/to_fp32.loss" ] && ! cmp -s "$tmp/to_fp32.loss" "$tmp/z3_to_ddp.loss"; then
    echo "ok   a bf16 checkpoint resumed with fp32 weights: $(tr '\n' ' ' < "$tmp/to_fp32.loss")"
else echo "FAIL fp32 resume of a bf16 checkpoint"; fail=1; fi
# 1-D parameters exact: with products that round their inputs anyway, a bf16
# copy that rounds only the matrices changes nothing (a rounded bias would).
# DTRAIN_BF16=force: bf16 products on every CPU (oneDNN or emulated); every
# product here is large enough to take them (M*N*K >= 2^18 at 64 rows a rank)
mlp=(--model mlp --hidden 512,512 --batch 64 --threads 1 --eval-batches 1 --deterministic --lr 3e-3 --steps 4)
args=mlp
export DTRAIN_BF16=force
t_run mlp_fp32w --precision bf16 --param-dtype fp32
t_run mlp_bf16w --precision bf16 --param-dtype bf16 && t_same mlp_fp32w mlp_bf16w
t_run mlp_ddp_fp32w --precision bf16 --param-dtype fp32 --nproc 2
t_run mlp_ddp_bf16w --precision bf16 --param-dtype bf16 --nproc 2 && t_same mlp_ddp_fp32w mlp_ddp_bf16w
for z in 2 3; do
    t_run "mlp_zero${z}_bf16w" --precision bf16 --param-dtype bf16 --nproc 2 --zero $z --save-format consolidated &&
        t_same mlp_ddp_fp32w "mlp_zero${z}_bf16w"
done
unset DTRAIN_BF16
t_run mlp_fp32p_bf16w --precision fp32 --param-dtype bf16
t_run mlp_fp32p --precision fp32
if [ -s "$tmp/mlp_fp32p.loss" ] && ! cmp -s "$tmp/mlp_fp32p.loss" "$tmp/mlp_fp32p_bf16w.loss"; then
    echo "ok   control: with fp32 products the MLP's bf16 copy is not fp32's run (its matrices are rounded)"
else echo "FAIL control: the MLP's bf16 copy with fp32 products equals fp32 weights"; fail=1; fi
exit $fail
