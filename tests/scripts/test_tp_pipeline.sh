#!/usr/bin/env bash
# The process mesh dp x pp x tp (src/parallel/pipe/tp.c): pipeline stages
# built tensor-parallel, at np 4.
#   --tp 2 --pp 2 (1f1b, gpipe, interleaved, zb-h1)  ==  one process with
#       --batch B/M --accum M (the pipeline's micro-batches)
#   --tp 2 --pp 1 x 2 replicas (a pipeline of one stage)  ==  DDP on 2 ranks
# with --clip under AdamW and SGD (SGD shows a wrong clip norm: a split
# parameter's parts must count once each, a replicated one once per stage,
# not T times), evaluation included. Within 1e-6 relative on every logged
# loss, not bitwise: a row-parallel layer sums its partial products across
# the tp ranks (test_tensor_parallel.sh). Checkpoints hold whole tensors
# under global names: a set saved at (dp, pp, tp) = (1, 2, 2) resumes at
# (2, 1, 2) (--tp 2 on 4 ranks), whose file resumes in one process, the
# training losses continuing the uninterrupted one-process run within 1e-6;
# the set resumes at (1, 2, 2), at --pp 2 alone and at (4, 1, 1) too, and a
# one-process checkpoint at (1, 2, 2); so does a set whose vocabulary --tp
# does not divide. The start-up line
# prints the mesh; a world P x T does not divide is refused. (ZeRO inside
# tensor-parallel stages: test_tp_zero.sh.) With --sequence-parallel (the stages' activations and sends
# are each tp rank's positions; each stage sums its replicated gradients over
# its tp group): 1f1b, gpipe and interleaved against one process, zb-h1 with
# recompute and dropout 0.1 (masks of the global positions), dp 2 x tp 2 on
# one stage against DDP, and checkpoints both ways with one process; with
# --zero 1 (SGD) and 3 against one process too.
# usage: test_tp_pipeline.sh DTRAIN
set -uo pipefail
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"   # (see test_tensor_parallel.sh)
bin=$1
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
for i in $(seq 1 300); do echo "line $i: the quick brown fox jumps over the lazy dog $((i * 7919 % 1000))"; done > "$tmp/corpus.txt"
gpt2=(--model gpt2 --layers 2 --embd 32 --heads 4 --max-t 32 --seq 32 --data text --data-path "$tmp/corpus.txt"
      --eval-batches 2 --threads 1 --steps 4 --clip 0.05)
tpp=(--tp 2 --pp 2 --nproc 4)
sgd=(--optim sgd --lr 0.5)
fail=0

# run TAG ARGS...: train, keep TAG.jsonl
run() {
    local tag=$1; shift
    if ! timeout -k 15 120 "$bin" train "${gpt2[@]}" "$@" --metrics "$tmp/$tag.jsonl" < /dev/null > "$tmp/$tag.out" 2>&1; then
        echo "FAIL $tag: $* (exit $?), got:"; cat "$tmp/$tag.out"; fail=1; return 1
    fi
}
# shellcheck source=lib/train_compare.sh
. "$(dirname "$0")/lib/train_compare.sh"
# near REF TAG [train]: lib/train_compare.sh t_near_metrics
near() { t_near_metrics "$1" "$2" acc ${3:+train}; }
# refused TAG WANT ARGS...: fails before training, saying WANT
refused() {
    local tag=$1 want=$2; shift 2
    if timeout -k 15 60 "$bin" train "${gpt2[@]}" "$@" < /dev/null > "$tmp/$tag.out" 2>&1; then
        echo "FAIL $tag: $* was accepted"; fail=1
    elif grep -c -- "$want" "$tmp/$tag.out" > /dev/null && ! grep -c '^step ' "$tmp/$tag.out" > /dev/null; then
        echo "ok   $tag refused: $want"
    else
        echo "FAIL $tag: want '$want', got:"; cat "$tmp/$tag.out"; fail=1
    fi
}

# two micro-batches of 2 (--pp 2's default M = P), four of 1 for interleaved;
# --eval-batches counts batches of --batch, so a reference standing for M
# micro-batches evaluates N x M of its own (the pipeline's sequences)
run single --batch 2 --accum 2 --eval-batches 4 --quiet
run single_sgd --batch 2 --accum 2 --eval-batches 4 "${sgd[@]}" --quiet
run single4_sgd --batch 1 --accum 4 --eval-batches 8 "${sgd[@]}" --quiet
run single4 --batch 1 --accum 4 --eval-batches 8 --quiet
run tpp_1f1b "${tpp[@]}" --batch 4 && near single tpp_1f1b
run tpp_1f1b_sgd "${tpp[@]}" --batch 4 "${sgd[@]}" --quiet && near single_sgd tpp_1f1b_sgd
run tpp_gpipe_sgd "${tpp[@]}" --batch 4 --schedule gpipe "${sgd[@]}" --quiet && near single_sgd tpp_gpipe_sgd
run tpp_inter_sgd "${tpp[@]}" --batch 4 --microbatches 4 --schedule interleaved "${sgd[@]}" --quiet &&
    near single4_sgd tpp_inter_sgd
run tpp_zbh1 "${tpp[@]}" --batch 4 --microbatches 4 --schedule zb-h1 --recompute blocks --quiet && near single4 tpp_zbh1
if grep -c 'mesh: dp 1 x pp 2 x tp 2' "$tmp/tpp_1f1b.out" > /dev/null; then echo "ok   mesh line"
else echo "FAIL no 'mesh: dp 1 x pp 2 x tp 2' line, got:"; cat "$tmp/tpp_1f1b.out"; fail=1; fi
# the start-up line counts the whole model, as one process does, however it is
# held (a stage holds its part only: rank 0's stage was once counted)
if run count_single --batch 4 --steps 1 && run count_pp --pp 2 --nproc 2 --batch 4 --steps 1; then
    want=$(grep -m1 -oE '^dtrain: gpt2, [0-9]+ parameters' "$tmp/count_single.out")
    if [ -n "$want" ] && grep -q "^$want, pipeline x2," "$tmp/count_pp.out" &&
       grep -qE "^$want \([0-9]+ on each tensor-parallel rank\), pipeline x4," "$tmp/tpp_1f1b.out"; then
        echo "ok   parameter count: '$want' at pp 2 and at pp 2 x tp 2"
    else
        echo "FAIL parameter count: one process '$want', got:"; grep -h 'parameters' "$tmp/count_pp.out" "$tmp/tpp_1f1b.out"; fail=1
    fi
fi
# the data-parallel axis at np 4: one stage (--schedule makes it a pipeline)
# x 2 replicas x tp 2, DDP over the ranks of equal tp rank == DDP on 2 ranks
run ddp2_sgd --nproc 2 --batch 4 "${sgd[@]}" --quiet
run dp2_tp2_sgd --tp 2 --pp 1 --schedule 1f1b --nproc 4 --batch 4 "${sgd[@]}" && near ddp2_sgd dp2_tp2_sgd
if grep -c 'mesh: dp 2 x pp 1 x tp 2' "$tmp/dp2_tp2_sgd.out" > /dev/null; then echo "ok   mesh line dp 2"
else echo "FAIL no 'mesh: dp 2 x pp 1 x tp 2' line, got:"; cat "$tmp/dp2_tp2_sgd.out"; fail=1; fi

# resharding: 8 samples a step in every layout (one process: 4 x 2 micro-batches)
run chain_ref --batch 4 --accum 2 --steps 6 --quiet
if run chain_a "${tpp[@]}" --batch 8 --microbatches 2 --steps 2 --save "$tmp/a.ck" --quiet &&
   run chain_b --tp 2 --nproc 4 --batch 2 --accum 2 --resume "$tmp/a.ck" --save "$tmp/b.st" --quiet &&
   run chain_c --batch 4 --accum 2 --steps 6 --resume "$tmp/b.st" --quiet; then
    grep -v eval_loss "$tmp/chain_ref.jsonl" | head -2 > "$tmp/chain_ref2.jsonl"
    near chain_ref2 chain_a train
    grep -v eval_loss "$tmp/chain_ref.jsonl" | head -4 > "$tmp/chain_ref4.jsonl"
    near chain_ref4 chain_b train
    near chain_ref chain_c train
    # the set resumed by the layout that wrote it, at --pp 2 alone and at (4, 1, 1): DDP on 4 ranks
    run chain_a2 "${tpp[@]}" --batch 8 --microbatches 2 --resume "$tmp/a.ck" --quiet && near chain_ref4 chain_a2 train
    run chain_pp --pp 2 --nproc 2 --batch 8 --microbatches 2 --resume "$tmp/a.ck" --quiet && near chain_ref4 chain_pp train
    run chain_ddp4 --nproc 4 --batch 2 --resume "$tmp/a.ck" --quiet && near chain_ref4 chain_ddp4 train
fi
# and the other way: a one-process file resumed by tensor-parallel stages
run half_single --batch 2 --accum 2 --steps 2 --save "$tmp/single.st" --quiet &&
    run tpp_from_single "${tpp[@]}" --batch 4 --resume "$tmp/single.st" --quiet && near single tpp_from_single
# a vocabulary --tp does not divide (257: the last tp rank's part of wte holds
# a padding row) is saved whole and unpadded: the set, with ZeRO-1 inside the
# stages too, resumes in one process (its pieces once ran past the tensor)
run single_v --batch 2 --accum 2 --eval-batches 4 --vocab 257 --quiet
for z in "" "--zero 1"; do
    # shellcheck disable=SC2086
    run "tppv_half${z:+_z1}" "${tpp[@]}" --batch 4 --vocab 257 --steps 2 $z --save "$tmp/tppv${z:+_z1}.ck" --quiet &&
        run "from_tppv${z:+_z1}" --batch 2 --accum 2 --eval-batches 4 --resume "$tmp/tppv${z:+_z1}.ck" --quiet &&
        near single_v "from_tppv${z:+_z1}"
done

# sequence parallelism inside the stages
sp=(--sequence-parallel)
run tps_1f1b "${tpp[@]}" "${sp[@]}" --batch 4 --quiet && near single tps_1f1b
run tps_1f1b_sgd "${tpp[@]}" "${sp[@]}" --batch 4 "${sgd[@]}" --quiet && near single_sgd tps_1f1b_sgd
run tps_gpipe_sgd "${tpp[@]}" "${sp[@]}" --batch 4 --schedule gpipe "${sgd[@]}" --quiet && near single_sgd tps_gpipe_sgd
run tps_inter_sgd "${tpp[@]}" "${sp[@]}" --batch 4 --microbatches 4 --schedule interleaved "${sgd[@]}" --quiet &&
    near single4_sgd tps_inter_sgd
run single4_drop --batch 1 --accum 4 --eval-batches 8 --dropout 0.1 --quiet &&
    run tps_zbh1_drop "${tpp[@]}" "${sp[@]}" --batch 4 --microbatches 4 --schedule zb-h1 --recompute blocks --dropout 0.1 \
        --quiet && near single4_drop tps_zbh1_drop
run dp2_tps_sgd --tp 2 --pp 1 --schedule 1f1b --nproc 4 "${sp[@]}" --batch 4 "${sgd[@]}" --quiet && near ddp2_sgd dp2_tps_sgd
run tps_half "${tpp[@]}" "${sp[@]}" --batch 4 --steps 2 --save "$tmp/tps.ck" --quiet &&
    run from_tps --batch 2 --accum 2 --eval-batches 4 --resume "$tmp/tps.ck" --quiet && near single from_tps
run tps_from_single "${tpp[@]}" "${sp[@]}" --batch 4 --resume "$tmp/single.st" --quiet && near single tps_from_single

# with ZeRO inside the stages (dp 1; across replicas: test_tp_zero.sh)
run tps_z1_sgd "${tpp[@]}" "${sp[@]}" --batch 4 --zero 1 "${sgd[@]}" --quiet && near single_sgd tps_z1_sgd
run tps_z3 "${tpp[@]}" "${sp[@]}" --batch 4 --zero 3 --quiet && near single tps_z3
refused world "ranks per replica does not divide --nproc 2" --tp 2 --pp 2 --nproc 2 --batch 4
exit $fail
