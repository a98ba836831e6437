#!/usr/bin/env bash
# Tensor parallelism (--tp, src/parallel/tp/) trains as the run it stands for:
#   --tp 2 on 2 ranks            ==  one process
#   --tp 2 x 2 replicas (np 4)   ==  DDP on 2 ranks (--nproc 2)
#   --tp 4 (np 4)                ==  one process
# (and with --recompute blocks, --accum 2, --dropout 0.1 together at np 2)
# with --clip (the global norm counts a split parameter's parts once and a
# replicated one once) under AdamW and SGD (SGD shows a wrong clip scale,
# AdamW mostly normalises it away). Equal within 1e-6 relative on every
# logged loss, evaluation included -- not bitwise: a row-parallel layer sums
# its partial products over the ranks (x0 W0 + x1 W1, then + b) where one
# process sums inside one GEMM, so the rounding differs. Checkpoints hold
# whole tensors: a --tp 2 checkpoint resumed in one process, and a
# one-process checkpoint resumed at --tp 2, continue within 1e-6. The
# vocabulary is split too (wte, the tied lm-head, a parallel cross-entropy):
# the evaluation's token accuracy (argmax over the split logits) equals one
# process's, and a vocabulary T does not divide (257 at --tp 2: one row of
# padding) trains as one process and saves a checkpoint one process resumes.
# --tp 2 --zero 3 at dp 1 (ZeRO on groups of one) trains as one process too,
# and so does --freeze with --unfreeze-at (at dp 2: as DDP).
# What is not built is refused up front, naming the flag. (--tp with --pp:
# test_tp_pipeline.sh; --tp with --zero across replicas: test_tp_zero.sh.)
# Sequence parallelism (--sequence-parallel: outside the split layers each
# rank holds --seq / T positions; all-gather / reduce-scatter boundaries; the
# replicated parameters' partial gradients summed over the group) passes the
# same checks: --tp 2 and --tp 4 against one process, dp 2 x tp 2 against
# DDP on 2, --clip under AdamW and SGD, recompute + --accum + dropout
# together (masks keyed by the global position), V = 257, equal accuracy,
# checkpoints both ways with one process; and it is refused without --tp
# and when T does not divide --seq. (With --pp: test_tp_pipeline.sh.)
# Sequence parallelism with --zero 1 and 3 (dp 1: ZeRO on groups of one, the
# replicated gradients summed on the owned shards) equals one process too
# (AdamW and SGD), and a --zero 3 checkpoint resumes in one process and back.
# (Across replicas: test_tp_zero.sh.)
# usage: test_tensor_parallel.sh DTRAIN NP   (NP: 2 or 4, the largest world used)
set -uo pipefail
# Ranks under mpirun: Open MPI unloads its plugins at finalize, so LeakSanitizer
# sees their allocations from an unknown module that no suppression can name
# (as test_recompute_bitwise.sh). The tp code's own: test_ops_tp and test_nn_tp;
# runs as these with OMPI_MCA_mca_base_component_disable_dlclose=1 and
# ASAN_OPTIONS=fast_unwind_on_malloc=0 leak nothing.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
bin=$1 np=$2
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
for i in $(seq 1 300); do echo "line $i: the quick brown fox jumps over the lazy dog $((i * 7919 % 1000))"; done > "$tmp/corpus.txt"
gpt2=(--model gpt2 --layers 2 --embd 32 --heads 4 --max-t 32 --seq 32 --data text --data-path "$tmp/corpus.txt"
      --eval-batches 2 --threads 1 --batch 4 --steps 4 --clip 0.05)
fail=0

# run TAG ARGS...: train, keep TAG.jsonl
run() {
    local tag=$1; shift
    if ! timeout 120 "$bin" train "${gpt2[@]}" "$@" --metrics "$tmp/$tag.jsonl" < /dev/null > "$tmp/$tag.out" 2>&1; then
        echo "FAIL $tag: $* (exit $?), got:"; cat "$tmp/$tag.out"; fail=1; return 1
    fi
}
# shellcheck source=lib/train_compare.sh
. "$(dirname "$0")/lib/train_compare.sh"
# near REF TAG: lib/train_compare.sh t_near_metrics
near() { t_near_metrics "$1" "$2"; }
# same_acc REF TAG: the evaluation's token accuracy is the same number
same_acc() {
    local a b
    a=$(grep -o '"eval_accuracy":[-0-9.e+]*' "$tmp/$1.jsonl") b=$(grep -o '"eval_accuracy":[-0-9.e+]*' "$tmp/$2.jsonl")
    if [ -n "$a" ] && [ "$a" = "$b" ]; then echo "ok   $2 accuracy = $1's ($a)"
    else echo "FAIL $2 accuracy '$b', $1 '$a'"; fail=1; fi
}
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

run single
run single_sgd --optim sgd --lr 0.5
if [ "$np" -eq 2 ]; then
    run tp2 --tp 2 --nproc 2 --quiet && near single tp2 && same_acc single tp2
    # V = 257: padded to 258 rows at --tp 2; the checkpoint holds [257, C]
    run single_v --vocab 257 --quiet && run tp2_v --vocab 257 --tp 2 --nproc 2 --quiet && near single_v tp2_v
    run tp2_v_half --vocab 257 --tp 2 --nproc 2 --steps 2 --save "$tmp/tp2v.st" --quiet &&
        run from_tp2_v --vocab 257 --resume "$tmp/tp2v.st" --quiet && near single_v from_tp2_v
    run tp2_sgd --tp 2 --nproc 2 --optim sgd --lr 0.5 && near single_sgd tp2_sgd
    # --unfreeze-at: the frozen block's parts start training at step 2, as in one process
    thaw=(--freeze 'h.0.*' --unfreeze-at 2)
    run single_thaw "${thaw[@]}" --quiet && run tp2_thaw "${thaw[@]}" --tp 2 --nproc 2 --quiet && near single_thaw tp2_thaw
    # recompute replays tp_reduce in backward; accumulation; dropout masks on whole tensors
    mix=(--recompute blocks --accum 2 --dropout 0.1)
    run single_mix "${mix[@]}" --quiet && run tp2_mix "${mix[@]}" --tp 2 --nproc 2 --quiet && near single_mix tp2_mix
    refused sample "sampling runs on one rank" --tp 2 --nproc 2 --sample-every 2
    if grep -c 'mesh: dp 1 x tp 2' "$tmp/tp2_sgd.out" > /dev/null; then echo "ok   mesh line"
    else echo "FAIL no 'mesh: dp 1 x tp 2' line, got:"; cat "$tmp/tp2_sgd.out"; fail=1; fi
    # checkpoints across layouts: saved at step 2, continued to 4
    run tp2_half --tp 2 --nproc 2 --steps 2 --save "$tmp/tp2.st" --quiet &&
        run from_tp2 --resume "$tmp/tp2.st" --quiet && near single from_tp2
    run single_half --steps 2 --save "$tmp/single.st" --quiet &&
        run tp2_from_single --tp 2 --nproc 2 --resume "$tmp/single.st" --quiet && near single tp2_from_single
    refused heads "arch.heads 3 is not divisible\|--heads 3 is not divisible" --heads 3 --embd 33 --tp 2 --nproc 2
    refused pp "ranks per replica does not divide --nproc 2" --tp 2 --pp 2 --nproc 2
    # ZeRO over the mesh's replicas (test_tp_zero.sh at 4 ranks); at dp 1 a group of one
    run tp2_z3 --tp 2 --nproc 2 --zero 3 --quiet && near single tp2_z3
    refused zero_node "does not combine with --node-params" --tp 2 --zero 2 --node-params --nproc 2
    refused world "does not divide --nproc 2" --tp 4 --nproc 2
    # (the MLP without gpt2's flags: those would be refused first, as settings of another model)
    if out=$(timeout 60 "$bin" train --model mlp --hidden 16 --threads 1 --steps 1 --tp 2 --nproc 2 < /dev/null 2>&1); then
        echo "FAIL mlp: --tp 2 was accepted"; fail=1
    elif grep -c -- "gpt2 only" <<< "$out" > /dev/null; then echo "ok   mlp refused: gpt2 only"
    else echo "FAIL mlp: want 'gpt2 only', got: $out"; fail=1; fi
    # sequence parallelism
    sp=(--tp 2 --nproc 2 --sequence-parallel)
    run sp2 "${sp[@]}" && near single sp2 && same_acc single sp2
    if grep -c 'sequence parallelism: .* 1/2 of the positions' "$tmp/sp2.out" > /dev/null; then echo "ok   sp line"
    else echo "FAIL no sequence-parallelism line, got:"; cat "$tmp/sp2.out"; fail=1; fi
    run sp2_sgd "${sp[@]}" --optim sgd --lr 0.5 --quiet && near single_sgd sp2_sgd
    run sp2_mix "${mix[@]}" "${sp[@]}" --quiet && near single_mix sp2_mix
    DTRAIN_NO_FUSE=1 run sp2_mix_nofuse "${mix[@]}" "${sp[@]}" --quiet && near single_mix sp2_mix_nofuse
    run sp2_v --vocab 257 "${sp[@]}" --quiet && near single_v sp2_v
    run sp2_half "${sp[@]}" --steps 2 --save "$tmp/sp2.st" --quiet &&
        run from_sp2 --resume "$tmp/sp2.st" --quiet && near single from_sp2
    run sp2_from_single "${sp[@]}" --resume "$tmp/single.st" --quiet && near single sp2_from_single
    refused sp_notp "needs --tp T > 1" --sequence-parallel
    refused sp_seq "--seq 31 is not divisible by --tp 2" --seq 31 "${sp[@]}"
    # with ZeRO on groups of one (dp 1): the replicated sum runs on the owned shards (tp/seq.c)
    run sp2_z1 "${sp[@]}" --zero 1 --quiet && near single sp2_z1
    run sp2_z3_sgd "${sp[@]}" --zero 3 --optim sgd --lr 0.5 --quiet && near single_sgd sp2_z3_sgd
    run sp2_z3_half "${sp[@]}" --zero 3 --steps 2 --save "$tmp/sp2_z3.st" --quiet &&
        run from_sp2_z3 --resume "$tmp/sp2_z3.st" --quiet && near single from_sp2_z3
    run sp2_z3_from_single "${sp[@]}" --zero 3 --resume "$tmp/single.st" --quiet && near single sp2_z3_from_single
else
    run ddp2 --nproc 2 --quiet
    run tp2_dp2 --tp 2 --nproc 4 && near ddp2 tp2_dp2
    if grep -c 'mesh: dp 2 x tp 2' "$tmp/tp2_dp2.out" > /dev/null; then echo "ok   mesh line"
    else echo "FAIL no 'mesh: dp 2 x tp 2' line, got:"; cat "$tmp/tp2_dp2.out"; fail=1; fi
    run tp4 --tp 4 --nproc 4 --quiet && near single tp4 && same_acc single tp4
    thaw=(--freeze 'h.0.*' --unfreeze-at 2)   # DDP over the replicas re-cuts its buckets
    run ddp2_thaw "${thaw[@]}" --nproc 2 --quiet && run tp2_dp2_thaw "${thaw[@]}" --tp 2 --nproc 4 --quiet &&
        near ddp2_thaw tp2_dp2_thaw
    run sp2_dp2 --tp 2 --nproc 4 --sequence-parallel --quiet && near ddp2 sp2_dp2
    run sp4 --tp 4 --nproc 4 --sequence-parallel --quiet && near single sp4 && same_acc single sp4
    mix=(--recompute blocks --accum 2 --dropout 0.1)
    run single_mix "${mix[@]}" --quiet && run sp4_mix "${mix[@]}" --tp 4 --nproc 4 --sequence-parallel --quiet &&
        near single_mix sp4_mix
fi
exit $fail
