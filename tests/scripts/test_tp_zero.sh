#!/usr/bin/env bash
# ZeRO over the replicas of a tensor-parallel mesh (--tp 2 --zero S at 4
# ranks: dp 2 x tp 2, each tensor-parallel rank's parts sharded over its 2
# replicas) trains bit-identically to the same mesh with DDP:
#   - stages 1, 2 and 3 (1 KB buckets, so stage 3 gathers and frees per
#     module between the tensor-parallel all-reduces), AdamW with --clip 0.05
#     (active at every step), SGD with --clip (SGD shows a wrong clip scale,
#     AdamW mostly normalises it away), and fp16 with dynamic loss scaling
#     started far too high (the first steps overflow and are skipped on every
#     rank): every tensor of the final checkpoint (tests/tools/ckpt_cmp) and
#     every logged loss, evaluation included, are the same bits. Why bitwise:
#     at 2 replicas an average is (a + b) / 2 whether DDP all-reduces or ZeRO
#     reduce-scatters, and each owned element steps as DDP's copy does. The
#     clip norm is summed per shard, DDP's per parameter: the doubles may
#     differ in their last bits, and the float clip scale rounds the same
#     here (a fixed computation: this holds or fails every run);
#   - checkpoints hold whole tensors under global names: a --tp 2 --zero 3
#     checkpoint saved after 2 of 4 steps resumes at --tp 2 with DDP and at
#     --tp 2 --zero 3 bit for bit as the uninterrupted run, at --zero 3 alone
#     (2 ranks) and in one process (--accum 2: the same global batch)
#     within 1e-6 of those layouts' own runs (a
#     row-parallel layer sums in another order: not bitwise); the reverse:
#     one process's and --zero 3's (a sharded set) resume at --tp 2 --zero 3
#     within 1e-6, a --tp 2 DDP checkpoint bit for bit;
#   - the memory report: at embd 128 each rank's parameter / gradient /
#     optimizer-state bytes are those of its tensor-parallel part, computed
#     here from the model's shape, halved by the stages that shard them
#     (1: the optimizer state, 2: also gradients, 3: also parameters);
#   - ZeRO inside tensor-parallel pipeline stages (--pp 2 --tp 2 --zero 1/3
#     at 4 ranks, so one replica: the norm over stages and tp parts, the
#     gathers per module, the sets) equals the same pipeline without ZeRO bit
#     for bit, and its sets resume in one process and back (1e-6); and the
#     full mesh dp 2 x pp 2 x tp 2 on 8 ranks (oversubscribed) with ZeRO 1
#     and 3 equals it with DDP bit for bit, a ZeRO-3 set resuming bitwise.
#   - sequence parallelism with ZeRO (--sequence-parallel --zero 1/2/3: the
#     replicated gradients' sum over the tp group runs on ZeRO's owned
#     shards): equals --sequence-parallel with DDP bit for bit (AdamW and
#     SGD with --clip; recompute + --accum 2 + dropout at --zero 3; fp16's
#     skipped steps at --zero 2), a --zero 3 checkpoint resumes with DDP bitwise and in
#     one process within 1e-6, and a one-process one at --zero 3; inside
#     tensor-parallel pipeline stages (pp 2 x tp 2, and dp 2 x pp 2 x tp 2)
#     ZeRO 1/3 equal the same pipeline without ZeRO bit for bit and one
#     process within 1e-6, their sets resume in one process and back; with
#     --overlap-step interleaved it is refused (shards would step before the sum).
# usage: test_tp_zero.sh DTRAIN CKPT_CMP
set -uo pipefail
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"   # (see test_recompute_bitwise.sh)
bin=$1 cmp=$2
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
for i in $(seq 1 300); do echo "line $i: the quick brown fox jumps over the lazy dog $((i * 7919 % 1000))"; done > "$tmp/corpus.txt"
gpt2=(--model gpt2 --layers 2 --embd 32 --heads 4 --max-t 32 --seq 32 --data text --data-path "$tmp/corpus.txt"
      --eval-batches 2 --threads 1 --batch 4 --steps 4 --clip 0.05)
mesh=(--tp 2 --nproc 4)
zb=(--bucket-mb 0.001 --first-bucket-mb 0.001)   # about 10 buckets per rank
fail=0

# run TAG ARGS...: train, keep TAG.ck, TAG.jsonl (timings dropped) and TAG.out
run() {
    local tag=$1; shift
    if ! timeout -k 15 120 "$bin" train "${gpt2[@]}" "$@" --save "$tmp/$tag.ck" --metrics "$tmp/$tag.jsonl" \
            < /dev/null > "$tmp/$tag.out" 2>&1; then
        echo "FAIL $tag: $*"; cat "$tmp/$tag.out"; fail=1; return 1
    fi
    sed -i 's/,"ms":[0-9.e+-]*//' "$tmp/$tag.jsonl"
}
# same REF TAG: TAG's final checkpoint has REF's tensors bit for bit, and
# every line TAG logged (a resumed run logs only the steps after its
# checkpoint) is REF's line, bit for bit, ending where REF ends
same() {
    if "$cmp" "$tmp/$1.ck" "$tmp/$2.ck" step optim_step epoch cursor > "$tmp/cmp.out" 2>&1 &&
        [ -s "$tmp/$2.jsonl" ] && ! grep -vxFf "$tmp/$1.jsonl" "$tmp/$2.jsonl" > /dev/null &&
        [ "$(tail -1 "$tmp/$1.jsonl")" = "$(tail -1 "$tmp/$2.jsonl")" ]; then
        echo "ok   $2 == $1 bit for bit ($(tail -1 "$tmp/cmp.out"))"
    else
        echo "FAIL $2 != $1:"; cat "$tmp/cmp.out"; diff "$tmp/$1.jsonl" "$tmp/$2.jsonl"; fail=1
    fi
}
# shellcheck source=lib/train_compare.sh
. "$(dirname "$0")/lib/train_compare.sh"
# near REF TAG: lib/train_compare.sh t_near_metrics
near() { t_near_metrics "$1" "$2"; }
# refused TAG WANT ARGS...: fails before training, saying WANT
refused() {
    local tag=$1 want=$2; shift 2
    if timeout 60 "$bin" train "${gpt2[@]}" "$@" < /dev/null > "$tmp/$tag.out" 2>&1; then
        echo "FAIL $tag: $* was accepted"; fail=1
    elif grep -c -- "$want" "$tmp/$tag.out" > /dev/null && ! grep -c '^step ' "$tmp/$tag.out" > /dev/null; then
        echo "ok   $tag refused: $want"
    else
        echo "FAIL $tag: want '$want', got:"; cat "$tmp/$tag.out"; fail=1
    fi
}

# ---- ZeRO 1/2/3 == DDP across the mesh's replicas ----
run ddp "${mesh[@]}"
for st in 1 2 3; do run "z$st" "${mesh[@]}" "${zb[@]}" --zero "$st" && same ddp "z$st"; done
if grep -c 'mesh: dp 2 x tp 2, ZeRO-3 over the replicas' "$tmp/z3.out" > /dev/null; then echo "ok   mesh line"
else echo "FAIL no 'mesh: dp 2 x tp 2, ZeRO-3 over the replicas' line, got:"; cat "$tmp/z3.out"; fail=1; fi
sgd=(--optim sgd --lr 0.5)
run ddp_sgd "${mesh[@]}" "${sgd[@]}" && for st in 1 3; do
    run "z${st}_sgd" "${mesh[@]}" "${zb[@]}" --zero "$st" "${sgd[@]}" && same ddp_sgd "z${st}_sgd"; done
# one replica (tp 2 on 2 ranks): TP-DDP's clip norm adds the same exact
# doubles in the same order as ZeRO's (tp/norm.c); a float all-reduce of the
# norm flipped the clip factor at step 3 of this run
run dp1d --tp 2 --nproc 2 && run dp1z2 --tp 2 --nproc 2 "${zb[@]}" --zero 2 && same dp1d dp1z2
# fp16: started at 2^28 the first steps overflow; every rank must skip them alike
fp16=(--precision fp16 --loss-scale-init 268435456 --steps 10 --deterministic)
run ddp_fp16 "${mesh[@]}" "${fp16[@]}" && run z2_fp16 "${mesh[@]}" "${zb[@]}" --zero 2 "${fp16[@]}" &&
    same ddp_fp16 z2_fp16 && {
    nskip=$(grep -c '"skipped":1' "$tmp/z2_fp16.jsonl")
    nclean=$(grep -c '"skipped":0' "$tmp/z2_fp16.jsonl")
    if [ "$nskip" -ge 1 ] && [ "$nclean" -ge 1 ]; then echo "ok   fp16: $nskip steps skipped, $nclean stepped"
    else echo "FAIL fp16: $nskip skipped and $nclean clean steps (want some of each)"; fail=1; fi
}

# ---- checkpoints: whole tensors, resumed across layouts ----
half=(--stop-after 2 --save-every 2)
# one process reads the mesh's global batch of 8 as 2 micro-batches of 4 (the 2 replicas' batches)
one=(--accum 2)
run dp2 --nproc 2 --quiet && run single "${one[@]}" --quiet && near dp2 single
if run z3_half "${mesh[@]}" "${zb[@]}" --zero 3 "${half[@]}"; then
    run from_z3_ddp "${mesh[@]}" --resume "$tmp/z3_half.ck" && same ddp from_z3_ddp
    run from_z3_z3 "${mesh[@]}" "${zb[@]}" --zero 3 --resume "$tmp/z3_half.ck" && same ddp from_z3_z3
    run from_z3_zero3 --nproc 2 --zero 3 --resume "$tmp/z3_half.ck" && near dp2 from_z3_zero3
    run from_z3_single "${one[@]}" --resume "$tmp/z3_half.ck" && near single from_z3_single
fi
run single_half "${one[@]}" "${half[@]}" && run z3_from_single "${mesh[@]}" "${zb[@]}" --zero 3 --resume "$tmp/single_half.ck" &&
    near single z3_from_single
run zero3_half --nproc 2 --zero 3 "${half[@]}" &&
    run z3_from_zero3 "${mesh[@]}" "${zb[@]}" --zero 3 --resume "$tmp/zero3_half.ck" && near dp2 z3_from_zero3
run ddp_half "${mesh[@]}" "${half[@]}" &&
    run z3_from_ddp "${mesh[@]}" "${zb[@]}" --zero 3 --resume "$tmp/ddp_half.ck" && same ddp z3_from_ddp
# inspect names the layout that wrote each (it said "tp" for --tp 2 --zero 3)
for w in "z3_half:tp+zero-3" "ddp_half:tp"; do
    got=$("$bin" inspect "$tmp/${w%%:*}.ck" 2> /dev/null | grep -m1 '^strategy')
    if [[ "$got" == "strategy"*" ${w#*:};"* ]]; then echo "ok   inspect ${w%%:*}: $got"
    else echo "FAIL inspect ${w%%:*}: want strategy ${w#*:}, got '$got'"; fail=1; fi
done

# ---- the memory report ----
# Each rank's tensor-parallel part of GPT-2 (C = 128, L = 2 blocks, V = 256,
# 32 positions, T = 2), in floats: per block ln_1 and ln_2 (2C each), c_attn
# [C, 3C/T] + 3C/T, attention c_proj [C/T, C] + C (its bias whole), c_fc
# [C, 4C/T] + 4C/T, MLP c_proj [4C/T, C] + C; then wte [V/T, C], wpe
# [32, C], ln_f 2C. AdamW keeps 2 states per element.
mem=(--embd 128 --vocab 256 --steps 1 --eval-batches 0)
P=$(awk 'BEGIN { C = 128; L = 2; T = 2; V = 256
    blk = 2*C + C*3*C/T + 3*C/T + C/T*C + C + 2*C + C*4*C/T + 4*C/T + 4*C/T*C + C
    print L*blk + V/T*C + 32*C + 2*C }')
# memcheck TAG PARAMS GRADS STATES (in floats): every rank's report line,
# within 0.006 MiB (printed to 0.01; ZeRO pads each bucket a little)
memcheck() {
    local tag=$1; shift
    if grep -A4 "memory per rank" "$tmp/$tag.out" | grep '^  rank [0-3]:' |
        awk -v p="$1" -v g="$2" -v o="$3" '{ n++; split($0, f, /[:\/]/)
            want[1] = p; want[2] = g; want[3] = o
            for (k = 1; k <= 3; k++) { d = f[k + 1] - want[k] * 4 / 1048576; if (d < 0) d = -d; if (d > 0.006) bad = 1 } }
            END { exit bad || n != 4 }'; then
        echo "ok   $tag memory per rank: params / grads / optimizer = $(grep -m1 '^  rank 0:' "$tmp/$tag.out" | cut -d: -f2) MiB"
    else
        echo "FAIL $tag memory report, want $1 / $2 / $3 floats per rank (P = $P), got:"; cat "$tmp/$tag.out"; fail=1
    fi
}
run mem_ddp "${mesh[@]}" "${mem[@]}" && memcheck mem_ddp "$P" "$P" $((2 * P))
run mem_z1 "${mesh[@]}" "${mem[@]}" --zero 1 && memcheck mem_z1 "$P" "$P" "$P"
run mem_z2 "${mesh[@]}" "${mem[@]}" --zero 2 && memcheck mem_z2 "$P" $((P / 2)) "$P"
run mem_z3 "${mesh[@]}" "${mem[@]}" --zero 3 && memcheck mem_z3 $((P / 2)) $((P / 2)) "$P"

# ---- ZeRO inside tensor-parallel pipeline stages (pp 2 x tp 2, dp 1) ----
# SGD with --clip: the norm over both stages and the tp parts decides the step
pp=(--batch 8 --microbatches 4 --pp 2 --pp-split 2,2 --tp 2 --nproc 4 "${sgd[@]}")
run ppd "${pp[@]}" && for st in 1 3; do run "ppz$st" "${pp[@]}" "${zb[@]}" --zero "$st" && same ppd "ppz$st"; done
# its sets hold whole tensors: one process (the same 4 micro-batches of 2) and --tp 2 --zero 3 resume them
# (--eval-batches counts batches of --batch: the pipeline's 2 of 8 are 8 of 2)
one_pp=(--batch 2 --accum 4 --eval-batches 8 "${sgd[@]}")
run single_pp "${one_pp[@]}" --quiet && near single_pp ppd
if run ppz3_half "${pp[@]}" "${zb[@]}" --zero 3 "${half[@]}"; then
    run from_ppz3_single "${one_pp[@]}" --resume "$tmp/ppz3_half.ck" && near single_pp from_ppz3_single
    run from_ppz3_ppd "${pp[@]}" --resume "$tmp/ppz3_half.ck" && same ppd from_ppz3_ppd
fi
run single_pp_half "${one_pp[@]}" "${half[@]}" &&
    run ppz3_from_single "${pp[@]}" "${zb[@]}" --zero 3 --resume "$tmp/single_pp_half.ck" && near single_pp ppz3_from_single

# the full mesh dp 2 x pp 2 x tp 2 on 8 ranks (oversubscribed; a tiny model,
# a few seconds a run): ZeRO over each (stage, tp rank)'s 2 replicas
pp8=(--batch 8 --microbatches 4 --pp 2 --pp-split 2,2 --tp 2 --nproc 8 "${sgd[@]}")
run pp8d "${pp8[@]}" && for st in 1 3; do run "pp8z$st" "${pp8[@]}" "${zb[@]}" --zero "$st" && same pp8d "pp8z$st"; done
run pp8z3_half "${pp8[@]}" "${zb[@]}" --zero 3 "${half[@]}" &&
    run from_pp8z3_ddp "${pp8[@]}" --resume "$tmp/pp8z3_half.ck" && same pp8d from_pp8z3_ddp

# ---- sequence parallelism with ZeRO (--sequence-parallel --zero S) ----
# The replicated parameters' partial gradients (each tp rank's positions) are
# summed over the tp group on the owned ranges of ZeRO's reduced shards
# (tp/seq.c) where DDP sums whole gradients after its average: at 2 replicas
# and 2 tp ranks both give (a + b) / 2 per replica, then the two tp ranks'
# values added, so the same bits (the norm as above). Without that sum each
# tp rank steps its shard of a replicated parameter with half its gradient.
spm=("${mesh[@]}" --sequence-parallel)
run spd "${spm[@]}" && for st in 1 2 3; do run "spz$st" "${spm[@]}" "${zb[@]}" --zero "$st" && same spd "spz$st"; done
run spd_sgd "${spm[@]}" "${sgd[@]}" && run spz2_sgd "${spm[@]}" "${zb[@]}" --zero 2 "${sgd[@]}" && same spd_sgd spz2_sgd
# ZeRO-3's gathers around recompute's replays of the sequence collectives, accumulation, dropout masks
spmix=(--recompute blocks --accum 2 --dropout 0.1)
run spd_mix "${spm[@]}" "${spmix[@]}" && run spz3_mix "${spm[@]}" "${zb[@]}" --zero 3 "${spmix[@]}" && same spd_mix spz3_mix
# fp16 skips (the verdict reads the norm after the sum on the shards): every rank skips alike
run spd_fp16 "${spm[@]}" "${fp16[@]}" && run spz2_fp16 "${spm[@]}" "${zb[@]}" --zero 2 "${fp16[@]}" && same spd_fp16 spz2_fp16
# its checkpoints are whole tensors: resumed with DDP bit for bit, in one process within 1e-6, and back
if run spz3_half "${spm[@]}" "${zb[@]}" --zero 3 "${half[@]}"; then
    run from_spz3_spd "${spm[@]}" --resume "$tmp/spz3_half.ck" && same spd from_spz3_spd
    run from_spz3_single "${one[@]}" --resume "$tmp/spz3_half.ck" && near single from_spz3_single
fi
run spz3_from_single "${spm[@]}" "${zb[@]}" --zero 3 --resume "$tmp/single_half.ck" && near single spz3_from_single
# inside tensor-parallel pipeline stages (pp 2 x tp 2; and the full mesh on 8 ranks)
run ppsd "${pp[@]}" --sequence-parallel &&
    for st in 1 3; do run "ppsz$st" "${pp[@]}" --sequence-parallel "${zb[@]}" --zero "$st" && same ppsd "ppsz$st"; done
near single_pp ppsz3
run pp8sd "${pp8[@]}" --sequence-parallel &&
    run pp8sz3 "${pp8[@]}" --sequence-parallel "${zb[@]}" --zero 3 && same pp8sd pp8sz3
if run ppsz3_half "${pp[@]}" --sequence-parallel "${zb[@]}" --zero 3 "${half[@]}"; then
    run from_ppsz3_single "${one_pp[@]}" --resume "$tmp/ppsz3_half.ck" && near single_pp from_ppsz3_single
fi
run ppsz3_from_single "${pp[@]}" --sequence-parallel "${zb[@]}" --zero 3 --resume "$tmp/single_pp_half.ck" &&
    near single_pp ppsz3_from_single

# ---- refused before anything starts ----
refused sp_interleaved "interleaved does not apply" "${spm[@]}" --zero 2 --overlap-step interleaved --clip 0
refused pp_sp_interleaved "interleaved step overlap" "${pp[@]}" --sequence-parallel --zero 1 --overlap-step interleaved \
    --clip 0
refused save_format "does not combine with --save-format" "${mesh[@]}" --zero 2 --save-format sharded
refused node_params "does not combine with --node-params" "${mesh[@]}" --zero 2 --node-params
exit $fail
