#!/usr/bin/env bash
# Pipeline parallelism trains bit-identically to the run it stands for:
#   --pp P --microbatches M --batch B  ==  one process --batch B/M --accum M
#   --pp P x D replicas                ==  DDP at D ranks --batch B/M --accum M
#     (--eval-batches N counts batches of --batch: N x M for the references,
#     which evaluate the same sequences in the same micro-batches)
#     (the replicas of a stage run DDP or ZeRO-1/2: bitwise the same; ZeRO-3:
#     test_pipeline_zero3.sh)
# for GPT-2 (tied wte across the first and last stage) and the MLP, every
# schedule (gpipe, 1f1b, interleaved, zb-h1: so ZB-H1 == 1F1B bitwise too), odd stage counts, recompute, and checkpoints that move between
# layouts (saved by a pipeline, resumed by one process and vice versa).
# Compared: every tensor of the final checkpoint (parameters, optimizer state,
# buffers; tests/tools/ckpt_cmp) and the logged losses, eval included.
# usage: test_pipeline_bitwise.sh DTRAIN CKPT_CMP NP
#   NP: the largest world size to use (2 or 4)
set -uo pipefail
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"   # (see test_recompute_bitwise.sh)
bin=$1 cmp=$2 np=$3
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
for i in $(seq 1 300); do echo "line $i: the quick brown fox jumps over the lazy dog $((i * 7919 % 1000))"; done > "$tmp/corpus.txt"
gpt2=(--model gpt2 --layers 2 --embd 32 --heads 2 --max-t 32 --seq 32 --data text --data-path "$tmp/corpus.txt"
      --eval-batches 2 --threads 1 --quiet --steps 4)
mlp=(--model mlp --hidden 64,48,32 --threads 1 --quiet --steps 4 --eval-batches 2)
fail=0

# run TAG MODEL ARGS...: train, keep TAG.st(dir) and TAG.jsonl (timings dropped)
run() {
    local tag=$1 model=$2; shift 2
    local -n margs=$model
    if ! "$bin" train "${margs[@]}" "$@" --save "$tmp/$tag.ck" --metrics "$tmp/$tag.jsonl" < /dev/null > "$tmp/$tag.out" 2>&1; then
        echo "FAIL $tag: $*"; cat "$tmp/$tag.out"; fail=1; return 1
    fi
    sed -i 's/,"ms":[0-9.e+-]*//' "$tmp/$tag.jsonl"
}
same() {   # same REF TAG
    if "$cmp" "$tmp/$1.ck" "$tmp/$2.ck" step optim_step epoch cursor > "$tmp/cmp.out" && cmp -s "$tmp/$1.jsonl" "$tmp/$2.jsonl"; then
        echo "ok   $2 == $1"
    else
        echo "FAIL $2 != $1:"; cat "$tmp/cmp.out"; diff "$tmp/$1.jsonl" "$tmp/$2.jsonl"; fail=1
    fi
}

# references
run g_single gpt2 --batch 2 --accum 4 --eval-batches 8
run m_single mlp --batch 16 --accum 2 --eval-batches 4

while IFS='|' read -r ref tag model need extra; do
    [ "$need" -le "$np" ] || continue
    # shellcheck disable=SC2086
    run "$tag" "$model" $extra && same "$ref" "$tag"
done <<CONFIGS
g_single|g_pp2_1f1b|gpt2|2|--batch 8 --microbatches 4 --pp 2 --nproc 2
g_single|g_pp2_gpipe|gpt2|2|--batch 8 --microbatches 4 --pp 2 --nproc 2 --schedule gpipe
g_single|g_pp2_recompute|gpt2|2|--batch 8 --microbatches 4 --pp 2 --nproc 2 --recompute blocks
g_single|g_pp2_split|gpt2|2|--batch 8 --microbatches 4 --pp 2 --nproc 2 --pp-split 1,3
g_single|g_pp2_zbh1|gpt2|2|--batch 8 --microbatches 4 --pp 2 --nproc 2 --schedule zb-h1
g_single|g_pp2_zbh1_recompute|gpt2|2|--batch 8 --microbatches 4 --pp 2 --nproc 2 --schedule zb-h1 --recompute blocks
g_single|g_pp2_interleaved|gpt2|2|--batch 8 --microbatches 4 --pp 2 --nproc 2 --schedule interleaved --virtual-stages 2
m_single|m_pp2|mlp|2|--batch 32 --microbatches 2 --pp 2 --nproc 2
m_single|m_pp2_zbh1|mlp|2|--batch 32 --microbatches 2 --pp 2 --nproc 2 --schedule zb-h1
m_single|m_pp2_interleaved|mlp|2|--batch 32 --microbatches 2 --pp 2 --nproc 2 --schedule interleaved
g_single|g_pp4_1f1b|gpt2|4|--batch 8 --microbatches 4 --pp 4 --nproc 4
g_single|g_pp4_zbh1|gpt2|4|--batch 8 --microbatches 4 --pp 4 --nproc 4 --schedule zb-h1
g_single|g_pp4_gpipe_out2|gpt2|4|--batch 8 --microbatches 4 --pp 4 --nproc 4 --schedule gpipe --max-outstanding 2
g_single|g_pp3_1f1b|gpt2|4|--batch 8 --microbatches 4 --pp 3 --nproc 3
m_single|m_pp4|mlp|4|--batch 32 --microbatches 2 --pp 4 --nproc 4
CONFIGS

# P x D: against DDP at D ranks with the same micro-batches; each stage's
# replicas run DDP (default) or ZeRO-1/2 over the stage's parameters
if [ "$np" -ge 4 ]; then
    run g_ddp2 gpt2 --batch 2 --accum 4 --nproc 2 --eval-batches 8
    run m_ddp2 mlp --batch 16 --accum 2 --nproc 2 --eval-batches 4
    while IFS='|' read -r ref tag model extra; do
        # shellcheck disable=SC2086
        run "$tag" "$model" $extra && same "$ref" "$tag"
    done <<CONFIGS
g_ddp2|g_pp2_dp2|gpt2|--batch 8 --microbatches 4 --pp 2 --nproc 4
g_ddp2|g_pp2_dp2_zero1|gpt2|--batch 8 --microbatches 4 --pp 2 --nproc 4 --zero 1
g_ddp2|g_pp2_dp2_zero2|gpt2|--batch 8 --microbatches 4 --pp 2 --nproc 4 --zero 2
g_ddp2|g_pp2_dp2_zero2_zbh1|gpt2|--batch 8 --microbatches 4 --pp 2 --nproc 4 --zero 2 --schedule zb-h1
g_ddp2|g_pp2_dp2_zero1_interleaved|gpt2|--batch 8 --microbatches 4 --pp 2 --nproc 4 --zero 1 --schedule interleaved --overlap-step interleaved
g_ddp2|g_pp2_dp2_nooverlap|gpt2|--batch 8 --microbatches 4 --pp 2 --nproc 4 --no-overlap --no-shm
m_ddp2|m_pp2_dp2_zero2|mlp|--batch 32 --microbatches 2 --pp 2 --nproc 4 --zero 2 --recompute blocks
CONFIGS

    # Resharding: saved at (P=2, D=2, ZeRO-1) after 2 steps; resumed at
    # (P=2, D=2, ZeRO-2) it is bitwise the uninterrupted run; at (P=1, D=4),
    # (P=4, D=1) and in one process (same global batch of 16) it continues
    # with the same losses (summation order differs: 1e-6 relative).
    run g_z1_half gpt2 --batch 8 --microbatches 4 --pp 2 --nproc 4 --zero 1 --stop-after 2 --save-every 2 &&
        run g_z1_resume_z2 gpt2 --batch 8 --microbatches 4 --pp 2 --nproc 4 --zero 2 --resume "$tmp/g_z1_half.ck" &&
        "$cmp" "$tmp/g_ddp2.ck" "$tmp/g_z1_resume_z2.ck" step optim_step epoch cursor > "$tmp/cmp.out" &&
        echo "ok   (P2,D2,zero-1) checkpoint resumed at (P2,D2,zero-2) == uninterrupted" ||
        { echo "FAIL resume at (P2,D2,zero-2):"; cat "$tmp/cmp.out"; fail=1; }
    losses() { grep '"loss"' "$tmp/$1.jsonl" | grep -v eval | sed 's/.*"step":\([0-9]*\),"loss":\([0-9.e+-]*\).*/\1 \2/'; }
    while IFS='|' read -r tag extra; do
        # shellcheck disable=SC2086
        run "$tag" gpt2 $extra --resume "$tmp/g_z1_half.ck" || continue
        if join <(losses g_ddp2) <(losses "$tag") |
            awk 'BEGIN { n = 0 } { d = $2 - $3; if (d < 0) d = -d; if (d > 1e-6 * $2) bad = 1; n++ } END { exit bad || n != 2 }'; then
            echo "ok   (P2,D2,zero-1) checkpoint resumed as $tag: steps 3-4 losses match"
        else
            echo "FAIL $tag losses after resume:"; join <(losses g_ddp2) <(losses "$tag"); fail=1
        fi
    done <<CONFIGS
g_z1_resume_dp4|--batch 1 --accum 4 --nproc 4
g_z1_resume_dp4_zero1|--batch 1 --accum 4 --nproc 4 --zero 1
g_z1_resume_pp4|--batch 16 --microbatches 4 --pp 4 --nproc 4
g_z1_resume_single|--batch 4 --accum 4
CONFIGS
fi

# checkpoints move between layouts: 2 steps, save, resume to 4 steps
run g_pp2_half gpt2 --batch 8 --microbatches 4 --pp 2 --nproc 2 --stop-after 2 --save-every 2 &&
    run g_resume_single gpt2 --batch 2 --accum 4 --resume "$tmp/g_pp2_half.ck" &&
    "$cmp" "$tmp/g_single.ck" "$tmp/g_resume_single.ck" step optim_step epoch cursor > "$tmp/cmp.out" &&
    echo "ok   pipeline checkpoint resumed in one process" || { echo "FAIL resume in one process:"; cat "$tmp/cmp.out"; fail=1; }
run g_single_half gpt2 --batch 2 --accum 4 --stop-after 2 --save-every 2 &&
    run g_resume_pp gpt2 --batch 8 --microbatches 4 --pp "$np" --nproc "$np" --resume "$tmp/g_single_half.ck" &&
    "$cmp" "$tmp/g_single.ck" "$tmp/g_resume_pp.ck" step optim_step epoch cursor > "$tmp/cmp.out" &&
    echo "ok   one-process checkpoint resumed at --pp $np" || { echo "FAIL resume at --pp $np:"; cat "$tmp/cmp.out"; fail=1; }
# --trace: every rank's file shows its F, B and W actions and the messages
"$bin" train "${gpt2[@]}" --batch 8 --microbatches 4 --pp 2 --nproc 2 --schedule zb-h1 --steps 1 \
    --trace "$tmp/pp.trace" < /dev/null > "$tmp/trace.out" 2>&1 || { echo "FAIL traced run"; cat "$tmp/trace.out"; fail=1; }
for r in 0 1; do
    missing=""
    for ev in F0 F3 B0 B3 W0 W3; do grep -q "\"name\":\"$ev\"" "$tmp/pp.trace.rank$r" 2>/dev/null || missing="$missing $ev"; done
    for ev in send recv; do grep -q "\"name\":\"$ev " "$tmp/pp.trace.rank$r" 2>/dev/null || missing="$missing $ev"; done
    if [ -z "$missing" ]; then echo "ok   trace of rank $r shows F, B, W, send, recv"
    else echo "FAIL trace of rank $r lacks:$missing"; fail=1; fi
done
exit $fail
