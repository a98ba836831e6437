#!/usr/bin/env bash
# ZeRO-3 inside pipeline stages (--pp 2 --zero 3 at 4 ranks: P = 2 stages x
# D = 2 replicas, each stage's parameters sharded over its replicas) trains
# bit-identically to the same pipeline with DDP and with ZeRO-2 per stage:
#   - every tensor of the final checkpoint (parameters, optimizer state,
#     buffers; tests/tools/ckpt_cmp, sets compared directly) and the logged
#     losses (eval included) are the same bits, after 4 AdamW steps;
#   - schedules 1f1b, gpipe, zb-h1 (with recompute) and interleaved (2 chunks
#     per rank), GPT-2 with its wte tied across the first and last stage;
#     --node-params (stage 3 then keeps a machine's parameters whole, as
#     stage 2: its set must still hold every value);
#   - with --clip (the norm over both stages, summed in rank order): bitwise
#     ZeRO-2 (the same shards give the same norm) and DDP. DDP sums the norm
#     per parameter, ZeRO per shard: the doubles may differ in their last
#     bits; the float clip scale rounds the same at each step here (a fixed
#     computation: this holds or fails every run), where a change of kernels
#     might make it differ by an ulp -- then compare losses within 1e-6;
#   - evaluation: 3 batches over 2 replicas (the second repeats one, counted
#     nowhere: ZeRO-3's forwards gather, so replicas run as many);
#   - checkpoints: a --zero 3 set saved after 2 steps resumes at --zero 3,
#     --pp 2 DDP and --zero 2 bitwise as the uninterrupted run, in one process
#     with the same losses (1e-6: another summation order), and a --zero 2 set
#     resumes at --zero 3 bitwise.
# usage: test_pipeline_zero3.sh DTRAIN CKPT_CMP
set -uo pipefail
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"   # (see test_recompute_bitwise.sh)
bin=$1 cmp=$2
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
for i in $(seq 1 300); do echo "line $i: the quick brown fox jumps over the lazy dog $((i * 7919 % 1000))"; done > "$tmp/corpus.txt"
model=(--model gpt2 --layers 2 --embd 32 --heads 2 --max-t 32 --seq 32 --data text --data-path "$tmp/corpus.txt"
       --eval-batches 3 --threads 1 --steps 4)
pp=(--batch 8 --microbatches 4 --pp 2 --nproc 4)
# ZeRO: buckets of 1 KB (the first too), about 10 per stage, so that stage 3 gathers and frees
# as modules come and go (at the default 4 MiB one bucket holds a stage)
zb=(--bucket-mb 0.001 --first-bucket-mb 0.001)
fail=0

# run TAG ARGS...: train, keep TAG.ck and TAG.jsonl (timings dropped)
run() {
    local tag=$1; shift
    if ! timeout -k 15 120 "$bin" train "${model[@]}" "$@" --save "$tmp/$tag.ck" --metrics "$tmp/$tag.jsonl" \
            < /dev/null > "$tmp/$tag.out" 2>&1; then
        echo "FAIL $tag: $*"; cat "$tmp/$tag.out"; fail=1; return 1
    fi
    sed -i 's/,"ms":[0-9.e+-]*//' "$tmp/$tag.jsonl"
}
same() {   # same REF TAG: checkpoint tensors and metrics, bitwise
    if "$cmp" "$tmp/$1.ck" "$tmp/$2.ck" step optim_step epoch cursor > "$tmp/cmp.out" && cmp -s "$tmp/$1.jsonl" "$tmp/$2.jsonl"; then
        echo "ok   $2 == $1"
    else
        echo "FAIL $2 != $1:"; cat "$tmp/cmp.out"; diff "$tmp/$1.jsonl" "$tmp/$2.jsonl"; fail=1
    fi
}
losses() { grep '"loss"' "$tmp/$1.jsonl" | sed 's/.*"step":\([0-9]*\),"loss":\([0-9.e+-]*\).*/\1 \2/'; }
near() {   # near REF TAG N: the training losses of TAG's N steps within 1e-6 relative of REF's
    if join <(losses "$1") <(losses "$2") |
        awk -v want="$3" '{ d = $2 - $3; if (d < 0) d = -d; if (d > 1e-6 * $2) bad = 1; n++ } END { exit bad || n != want }'; then
        echo "ok   $2 losses within 1e-6 of $1"
    else
        echo "FAIL $2 losses vs $1:"; join <(losses "$1") <(losses "$2"); fail=1
    fi
}

# the memory report: each rank holds half its stage's parameters (stage 0:
# 21920 floats = 0.08 MiB, its shard 0.04; stage 1: 20960). The cut is fixed
# (embed + h.0 | h.1 + head): the default balances by measured time, which
# moved h.1 to stage 0 under ASan
run z3 "${pp[@]}" "${zb[@]}" --zero 3 --pp-split 2,2 && {
    if grep -A4 "pipeline+zero-3 memory per rank" "$tmp/z3.out" | grep -c "rank [0-3]: 0.04 / 0.04 / 0.08 /" | grep -c "^4$" > /dev/null
    then echo "ok   z3: each rank holds half its stage's parameters and gradients"
    else echo "FAIL z3's memory report:"; cat "$tmp/z3.out"; fail=1; fi
}
run ddp "${pp[@]}" && same ddp z3
run z2 "${pp[@]}" "${zb[@]}" --zero 2 && same z2 z3
while IFS='|' read -r tag extra; do
    # shellcheck disable=SC2086
    run "$tag" "${pp[@]}" "${zb[@]}" --zero 3 $extra && same ddp "$tag"
done <<CONFIGS
z3_gpipe|--schedule gpipe
z3_zbh1_recompute|--schedule zb-h1 --recompute blocks
z3_interleaved|--schedule interleaved --zero-prefetch 1
z3_node_params|--node-params
CONFIGS

# clipping over both stages (0.5: active at every step)
run z2_clip "${pp[@]}" "${zb[@]}" --zero 2 --clip 0.5 &&
    run z3_clip "${pp[@]}" "${zb[@]}" --zero 3 --clip 0.5 && same z2_clip z3_clip
run ddp_clip "${pp[@]}" --clip 0.5 && same ddp_clip z3_clip

# checkpoints across layouts: saved by --zero 3 after 2 steps
if run z3_half "${pp[@]}" "${zb[@]}" --zero 3 --stop-after 2 --save-every 2; then
    for kind in "z3:--zero 3" "ddp:" "z2:--zero 2"; do
        tag=resume_${kind%%:*}
        # shellcheck disable=SC2086
        run "$tag" "${pp[@]}" ${kind#*:} --resume "$tmp/z3_half.ck" || continue
        if "$cmp" "$tmp/ddp.ck" "$tmp/$tag.ck" step optim_step epoch cursor > "$tmp/cmp.out"; then
            echo "ok   --zero 3 checkpoint resumed as $tag == uninterrupted"
        else
            echo "FAIL $tag:"; cat "$tmp/cmp.out"; fail=1
        fi
    done
    run resume_single --batch 4 --accum 4 --resume "$tmp/z3_half.ck" && near ddp resume_single 2
fi
if run z2_half "${pp[@]}" --zero 2 --stop-after 2 --save-every 2 &&
    run resume_z2_as_z3 "${pp[@]}" "${zb[@]}" --zero 3 --resume "$tmp/z2_half.ck"; then
    if "$cmp" "$tmp/ddp.ck" "$tmp/resume_z2_as_z3.ck" step optim_step epoch cursor > "$tmp/cmp.out"; then
        echo "ok   --zero 2 checkpoint resumed at --zero 3 == uninterrupted"
    else
        echo "FAIL --zero 2 checkpoint resumed at --zero 3:"; cat "$tmp/cmp.out"; fail=1
    fi
fi
exit $fail
