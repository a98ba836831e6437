#!/usr/bin/env bash
# --precision fp16 with dynamic loss scaling (issue 29). fp16's numerics run on
# every CPU (inputs rounded to half, the fp32 GEMM multiplies), so nothing here
# depends on the CPU kind or on timing. A tiny GPT-2 starts at a loss scale of
# 2^28, far above what its fp16 products hold:
#  - one process (--batch 4 --accum 2): the first steps overflow, each is
#    skipped ("skipped":1 in the metrics) and the scale halves, then training
#    proceeds and the loss falls; the summary line counts the skipped steps;
#  - DDP at 2 ranks: the same skips at the same scales, losses to rounding
#    (the global batch is cut otherwise); ZeRO-2 at 2 ranks equals DDP and
#    --pp 2 --microbatches 2 equals one process, bit for bit (checkpoints and
#    logged losses), as in fp32 (test_dropout_bitwise.sh): the verdict is
#    global although each rank sees only its shards or its stage;
#  - a run saved at step 9 (scale halved from its start, mid-way through a
#    growth window) resumes to the same bits as the uninterrupted run: scale
#    and clean-step count come from the checkpoint;
#  - bad --loss-scale values (a subnormal one too) are refused with one line.
# usage: test_fp16.sh DTRAIN CKPT_CMP
set -uo pipefail
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"   # (see test_recompute_bitwise.sh)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
bin=$1 cmp=$2
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
for i in $(seq 1 300); do echo "line $i: the quick brown fox jumps over the lazy dog $((i * 7919 % 1000))"; done > "$tmp/corpus.txt"
gpt2=(--model gpt2 --layers 2 --embd 64 --heads 2 --max-t 32 --seq 32 --data text --data-path "$tmp/corpus.txt"
      --eval-batches 2 --threads 1 --deterministic --precision fp16 --loss-scale-init 268435456)
fail=0

run() {   # run TAG ARGS...: train, keep TAG.ck, TAG.jsonl and TAG.out
    local tag=$1; shift
    if ! "$bin" train "${gpt2[@]}" "$@" --save "$tmp/$tag.ck" --metrics "$tmp/$tag.jsonl" < /dev/null > "$tmp/$tag.out" 2>&1; then
        echo "FAIL $tag: $*"; tail -5 "$tmp/$tag.out"; fail=1; return 1
    fi
}
# "step loss_scale skipped" and "step loss" of the training lines
pattern() { grep '"skipped"' "$1" | sed -E 's/.*"step":([0-9]+).*"loss_scale":([0-9.e+]+),"skipped":([01]).*/\1 \2 \3/'; }
losses() { grep '"skipped"' "$1" | sed -E 's/.*"step":([0-9]+),"loss":([0-9.e+-]+).*/\1 \2/'; }
same() {   # same A B: checkpoints and logged losses bit for bit
    if "$cmp" "$tmp/$1.ck" "$tmp/$2.ck" step optim_step > "$tmp/cmp.out" 2>&1 && cmp -s <(losses "$tmp/$1.jsonl") <(losses "$tmp/$2.jsonl"); then
        echo "ok   $2 == $1 bit for bit ($(tail -1 "$tmp/cmp.out"))"
    else echo "FAIL $2 != $1:"; cat "$tmp/cmp.out"; diff <(losses "$tmp/$1.jsonl") <(losses "$tmp/$2.jsonl"); fail=1; fi
}

run single --steps 12 --batch 4 --accum 2 || exit 1
pattern "$tmp/single.jsonl" > "$tmp/single.pat"
# skipped from step 1, each at half the scale before, then clean steps
if awk 'NR == 1 { s = $2 } { if (k == 0 && $3 == 1) { if ($2 != s) bad = 1; s /= 2; n++ } else { k = 1; if ($3 != 0) bad = 1 } }
        END { exit !(!bad && n >= 3 && k) }' "$tmp/single.pat"; then
    echo "ok   $(awk '$3 == 1' "$tmp/single.pat" | wc -l) steps skipped, the scale halving from 268435456 to $(awk '$3 == 0 { print $2; exit }' "$tmp/single.pat"), then trained"
else echo "FAIL skip pattern:"; cat "$tmp/single.pat"; fail=1; fi
first=$(losses "$tmp/single.jsonl" | head -1 | cut -d' ' -f2) last=$(losses "$tmp/single.jsonl" | tail -1 | cut -d' ' -f2)
if awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 0.3) }'; then echo "ok   loss falls: $first -> $last"
else echo "FAIL loss does not fall: $first -> $last"; fail=1; fi
nskip=$(awk '$3 == 1' "$tmp/single.pat" | wc -l)
if grep -c "loss scaling: $nskip of 12 steps skipped" "$tmp/single.out" > /dev/null; then echo "ok   summary: $(grep -o 'loss scaling: .*' "$tmp/single.out")"
else echo "FAIL summary line:"; tail -4 "$tmp/single.out"; fail=1; fi

run ddp2 --steps 12 --batch 4 --nproc 2 && {
    if cmp -s "$tmp/single.pat" <(pattern "$tmp/ddp2.jsonl") &&
       paste <(losses "$tmp/single.jsonl") <(losses "$tmp/ddp2.jsonl") |
       awk '{ d = ($2 - $4) / $2; if (d < 0) d = -d; if (d > 1e-5) bad = 1 } END { exit bad }'; then
        echo "ok   DDP at 2 ranks: the same skips and scales, losses within 1e-5"
    else echo "FAIL DDP at 2 ranks differs from one process:"; paste "$tmp/single.pat" <(pattern "$tmp/ddp2.jsonl"); fail=1; fi
}
run zero2 --steps 12 --batch 4 --nproc 2 --zero 2 --save-format consolidated && same ddp2 zero2
run pp2 --steps 12 --batch 8 --microbatches 2 --pp 2 --nproc 2 && same single pp2

# resume: a run of 14 steps with a growth window of 3, against 9 steps + resume
run whole --steps 14 --batch 4 --accum 2 --loss-scale-window 3 &&
run part --steps 9 --batch 4 --accum 2 --loss-scale-window 3 &&
if "$bin" train "${gpt2[@]}" --steps 14 --batch 4 --accum 2 --loss-scale-window 3 --resume "$tmp/part.ck" \
       --save "$tmp/resumed.ck" --metrics "$tmp/part.jsonl" < /dev/null > "$tmp/resumed.out" 2>&1; then
    grows=$(pattern "$tmp/whole.jsonl" | awk 'NR > 1 && $2 > p { n++ } { p = $2 } END { print n + 0 }')
    if [ "$grows" -ge 1 ] && "$cmp" "$tmp/whole.ck" "$tmp/resumed.ck" step optim_step > "$tmp/cmp.out" 2>&1 &&
       cmp -s <(pattern "$tmp/whole.jsonl"; losses "$tmp/whole.jsonl") <(pattern "$tmp/part.jsonl"; losses "$tmp/part.jsonl"); then
        echo "ok   resumed at step 9 == uninterrupted, bit for bit (scale grew $grows times)"
    else echo "FAIL resume differs (grows $grows):"; cat "$tmp/cmp.out"; paste <(pattern "$tmp/whole.jsonl") <(pattern "$tmp/part.jsonl"); fail=1; fi
else echo "FAIL resume run:"; tail -3 "$tmp/resumed.out"; fail=1; fi

refuses() {   # refuses MESSAGE ARGS...
    local msg=$1 out rc; shift
    out=$("$bin" train "${gpt2[@]}" --steps 1 --batch 4 "$@" 2>&1); rc=$?
    if [ $rc -eq 2 ] && [ "$(wc -l <<< "$out")" -eq 1 ] && grep -c -- "$msg" <<< "$out" > /dev/null; then echo "ok   refused: $out"
    else echo "FAIL $*: exit $rc: $out"; fail=1; fi
}
refuses "--loss-scale: 'big' is not dynamic, off or a number from 1.2e-38" --loss-scale big
refuses "--loss-scale-init applies to --loss-scale dynamic" --loss-scale 1024
refuses "needs loss scaling (--precision fp16, or --loss-scale dynamic)" --precision fp32 --loss-scale-window 5
gpt2=("${gpt2[@]:0:${#gpt2[@]}-2}")   # without --loss-scale-init: the window alone with a fixed scale
refuses "--loss-scale-window applies to --loss-scale dynamic, not to a fixed scale" --loss-scale 1024 --loss-scale-window 5
refuses "--loss-scale: '1e-40' is not dynamic, off or a number from 1.2e-38" --loss-scale 1e-40   # (subnormal: flushed)
# a forward that overflows (weights blown up by --lr 1000) ends the run with
# a hint at fp16's range, not only at the learning rate
out=$("$bin" train "${gpt2[@]}" --steps 30 --batch 4 --lr 1000 2>&1); rc=$?
if [ $rc -eq 1 ] && grep -c "loss is .* (fp16 products overflow past 65504 in the forward pass? try --precision bf16" \
       <<< "$out" > /dev/null; then echo "ok   a non-finite loss in fp16: $(tail -1 <<< "$out")"
else echo "FAIL --lr 1000 in fp16: exit $rc: $(tail -2 <<< "$out")"; fail=1; fi
exit $fail
