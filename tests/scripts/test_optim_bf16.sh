#!/usr/bin/env bash
# --optim-state bf16 (issue 29): the optimizer's per-element state stored as
# bfloat16, parameters fp32. Tiny GPT-2s on a generated corpus; nothing here
# depends on the CPU kind or on timing.
#  - layouts: for fp32 and for bf16 state alike, DDP at 2 ranks == ZeRO-1, -2
#    and -3 at 2 ranks, and --pp 2 == one process, bit for bit (checkpoints
#    and logged losses); one process vs DDP (the global batch cut otherwise,
#    not bitwise with fp32 state either) and --tp 2 vs one process within
#    1e-5. bf16 state is not fp32
#    state (the flag reaches the optimizer), and reaches ZeRO's shards and the
#    pipeline's stages (their checkpoints hold bf16 values);
#  - checkpoints: a bf16-state run saves its state widened to fp32 under the
#    usual names, every value a bfloat16 (tests/tools/ckpt_bf16), its
#    parameters fp32 (not all bfloat16);
#  - resume: bf16 -> bf16 is bit for bit the uninterrupted run (one process,
#    ZeRO-2 sharded set, --pp 2, --tp 2); fp32 -> bf16 and bf16 -> fp32
#    continue within 1e-3 of the uninterrupted runs, the saved state then being bf16
#    and fp32 respectively;
#  - --unfreeze-at (ZeRO re-partitions, carrying state): ZeRO-2 == DDP bit for bit;
#  - memory report: optimizer state MiB per rank = state values x 2 bytes,
#    computed here from GPT-2's parameter count (AdamW under DDP and ZeRO-2,
#    SGD momentum), half of fp32's;
#  - a bad value is refused with one line.
# usage: test_optim_bf16.sh DTRAIN CKPT_CMP CKPT_BF16
set -uo pipefail
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"   # (see test_recompute_bitwise.sh)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
bin=$1 cmp=$2 bf=$3
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
for i in $(seq 1 300); do echo "line $i: the quick brown fox jumps over the lazy dog $((i * 7919 % 1000))"; done > "$tmp/corpus.txt"
gpt2=(--model gpt2 --layers 2 --embd 32 --heads 2 --max-t 32 --seq 32 --data text --data-path "$tmp/corpus.txt"
      --eval-batches 2 --threads 1 --deterministic --quiet)
fail=0

run() {   # run TAG ARGS...: train, keep TAG.ck, TAG.jsonl, TAG.out
    local tag=$1; shift
    if ! "$bin" train "${gpt2[@]}" "$@" --save "$tmp/$tag.ck" --metrics "$tmp/$tag.jsonl" < /dev/null > "$tmp/$tag.out" 2>&1; then
        echo "FAIL $tag: $*"; tail -5 "$tmp/$tag.out"; fail=1; return 1
    fi
}
losses() { grep '"loss"' "$1" | grep -v eval | sed -E 's/.*"step":([0-9]+),"loss":([0-9.e+-]+).*/\1 \2/'; }
same() {   # same A B: checkpoints and logged losses bit for bit
    if "$cmp" "$tmp/$1.ck" "$tmp/$2.ck" step optim_step > "$tmp/cmp.out" 2>&1 && cmp -s <(losses "$tmp/$1.jsonl") <(losses "$tmp/$2.jsonl"); then
        echo "ok   $2 == $1 bit for bit ($(tail -1 "$tmp/cmp.out"))"
    else echo "FAIL $2 != $1:"; cat "$tmp/cmp.out"; fail=1; fi
}
close() {   # close A B TOL: logged losses of the steps both have within TOL (relative), and the same steps
    if join <(losses "$tmp/$1.jsonl") <(losses "$tmp/$2.jsonl") |
       awk -v t="$3" '{ d = ($2 - $3) / $2; if (d < 0) d = -d; if (d > t) bad = 1; n++ } END { exit !(n >= 3 && !bad) }'; then
        echo "ok   $2 ~ $1: losses within $3"
    else echo "FAIL $2 vs $1 (tolerance $3):"; join <(losses "$tmp/$1.jsonl") <(losses "$tmp/$2.jsonl"); fail=1; fi
}
# bfck TAG GLOB all|none|some: how many values of the matching tensors bfloat16 holds exactly
bfck() {
    local out; out=$("$bf" "$tmp/$1.ck" "$2" 2>&1) || { echo "FAIL ckpt_bf16 $1 '$2': $out"; fail=1; return; }
    local wide; wide=$(awk '{ print $5 }' <<< "$out")
    local vals; vals=$(awk '{ print $3 }' <<< "$out")
    case $3 in
        all) [ "$wide" -eq 0 ] ;;
        none) [ "$wide" -ge $((vals * 9 / 10)) ] ;;   # fp32 values: bfloat16 holds almost none
    esac && echo "ok   $1 '$2': $out" || { echo "FAIL $1 '$2' expected $3 bfloat16: $out"; fail=1; }
}

# ---- refusal ----
out=$("$bin" train "${gpt2[@]}" --steps 1 --optim-state fp8 < /dev/null 2>&1); rc=$?
if [ $rc -eq 2 ] && [ "$(wc -l <<< "$out")" -eq 1 ] && grep -q -- "--optim-state: 'fp8' is not one of fp32, bf16" <<< "$out"; then
    echo "ok   refused: $out"
else echo "FAIL --optim-state fp8: exit $rc: $out"; fail=1; fi

# ---- layouts, fp32 and bf16 state alike ----
for st in fp32 bf16; do
    o=(--steps 6 --optim-state $st)
    run single_$st "${o[@]}" --batch 2 --accum 2
    run ddp_$st "${o[@]}" --batch 2 --nproc 2
    for z in 1 2 3; do run zero${z}_$st "${o[@]}" --batch 2 --nproc 2 --zero $z --save-format consolidated && same ddp_$st zero${z}_$st; done
    run pp_$st "${o[@]}" --batch 4 --microbatches 2 --pp 2 --nproc 2 && same single_$st pp_$st
    close single_$st ddp_$st 1e-5
    run tp_$st "${o[@]}" --batch 2 --accum 2 --tp 2 --nproc 2 && close single_$st tp_$st 1e-5
done
if "$cmp" "$tmp/single_fp32.ck" "$tmp/single_bf16.ck" > /dev/null 2>&1; then echo "FAIL bf16 state gave fp32 state's bits"; fail=1
else echo "ok   bf16 state differs from fp32 state"; fi
for t in single ddp zero2 zero3 pp tp; do bfck ${t}_bf16 'optim.*' all; done
bfck single_fp32 'optim.*' none
bfck single_bf16 '[!o]*' none   # the parameters (no name starts with o): fp32 masters

# ---- resume ----
run whole_bf16 --steps 8 --batch 2 --accum 2 --optim-state bf16
run part_bf16 --steps 4 --batch 2 --accum 2 --optim-state bf16
run whole_fp32 --steps 8 --batch 2 --accum 2
run part_fp32 --steps 4 --batch 2 --accum 2
cp "$tmp/part_bf16.jsonl" "$tmp/res_bb.jsonl"; cp "$tmp/part_fp32.jsonl" "$tmp/res_fb.jsonl"; cp "$tmp/part_bf16.jsonl" "$tmp/res_bf.jsonl"
run res_bb --steps 8 --batch 2 --accum 2 --optim-state bf16 --resume "$tmp/part_bf16.ck" && same whole_bf16 res_bb
run res_fb --steps 8 --batch 2 --accum 2 --optim-state bf16 --resume "$tmp/part_fp32.ck" && {
    close whole_fp32 res_fb 1e-3; bfck res_fb 'optim.*' all; }
run res_bf --steps 8 --batch 2 --accum 2 --optim-state fp32 --resume "$tmp/part_bf16.ck" && {
    close whole_bf16 res_bf 1e-3; bfck res_bf 'optim.*' none; }
# ZeRO-2 sharded set and --pp 2: bf16 -> bf16 bit for bit
z2=(--batch 2 --nproc 2 --zero 2 --optim-state bf16)
run zwhole "${z2[@]}" --steps 8 && run zpart "${z2[@]}" --steps 4 && cp "$tmp/zpart.jsonl" "$tmp/zres.jsonl" &&
    run zres "${z2[@]}" --steps 8 --resume "$tmp/zpart.ck" && same zwhole zres && bfck zpart 'optim.*' all
p2=(--batch 4 --microbatches 2 --pp 2 --nproc 2 --optim-state bf16)
run pwhole "${p2[@]}" --steps 8 && run ppart "${p2[@]}" --steps 4 && cp "$tmp/ppart.jsonl" "$tmp/pres.jsonl" &&
    run pres "${p2[@]}" --steps 8 --resume "$tmp/ppart.ck" && same pwhole pres
t2=(--batch 2 --accum 2 --tp 2 --nproc 2 --optim-state bf16)
run twhole "${t2[@]}" --steps 8 && run tpart "${t2[@]}" --steps 4 && cp "$tmp/tpart.jsonl" "$tmp/tres.jsonl" &&
    run tres "${t2[@]}" --steps 8 --resume "$tmp/tpart.ck" && same twhole tres

# ---- re-partition: --unfreeze-at (DDP re-cuts, ZeRO carries state over by name through fp32 copies) ----
uf=(--steps 6 --optim-state bf16 --batch 2 --nproc 2 --freeze 'h.0.*' --unfreeze-at 3)
run uf_ddp "${uf[@]}" && run uf_zero2 "${uf[@]}" --zero 2 --save-format consolidated && same uf_ddp uf_zero2 &&
    bfck uf_zero2 'optim.*' all

# ---- the memory report: state values x bytes, from the parameter count ----
L=2 C=256 T=64 V=256
n=$((V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C))   # GPT-2, tied lm-head
mem=(--model gpt2 --layers $L --embd $C --heads 4 --max-t $T --seq $T --batch 2 --data text --data-path "$tmp/corpus.txt"
     --eval-batches 1 --threads 1 --steps 1 --nproc 2)
report() {   # report TAG ARGS...: the optimizer-state MiB of ranks 0 and 1
    "$bin" train "${mem[@]}" "${@:2}" < /dev/null > "$tmp/$1.mem" 2>&1 || { echo "FAIL memory run $1"; tail -3 "$tmp/$1.mem"; fail=1; return; }
    grep -E '^ *rank [01]:' "$tmp/$1.mem" | awk -F'[:/]' '{ printf "%s ", $4 + 0 }'
}
expect_mib() {   # expect_mib WHAT "R0 R1" BYTES_PER_RANK
    if awk -v got="$2" -v b="$3" 'BEGIN { split(got, g, " "); w = b / 1048576; for (r = 1; r <= 2; r++) { d = g[r] - w; if (d < 0) d = -d; if (d > 0.015) exit 1 } }'; then
        echo "ok   $1: optimizer state $2MiB per rank, expected $(awk -v b="$3" 'BEGIN { printf "%.3f", b / 1048576 }') ($n parameters)"
    else echo "FAIL $1: optimizer state $2MiB per rank, expected $(awk -v b="$3" 'BEGIN { printf "%.3f", b / 1048576 }')"; fail=1; fi
}
expect_mib "ddp adamw fp32" "$(report a32)" $((n * 8))
expect_mib "ddp adamw bf16" "$(report a16 --optim-state bf16)" $((n * 4))
expect_mib "zero-2 adamw bf16" "$(report z16 --optim-state bf16 --zero 2)" $((n * 2))
expect_mib "ddp sgd momentum bf16" "$(report s16 --optim sgd --momentum 0.9 --optim-state bf16)" $((n * 2))
exit $fail
