#!/usr/bin/env bash
# Tensor-parallel groups and machines, without namespaces (the library is
# told of simulated machines by DTRAIN_TEST_MACHINES; test_tp_multihost.sh
# runs real simulated hosts):
#  - the TP group's sums through node-shared memory (dt_allreduce_node, the
#    default on one machine, named on the start-up line) train bit-identically
#    to MPI's all-reduce (DTRAIN_TP_ALLREDUCE=mpi) at --tp 2 (both a + b), and
#    within 1e-6 at --tp 4 (rank order against MPI's order);
#  - dp 2 x tp 2 on 2 x 2 simulated machines equals one machine bit for bit;
#  - a TP group across machines is refused before training, naming the ranks
#    and machines and how to place them: --tp 2 on 1 + 1 and on 2 x 2 mapped
#    round-robin (machines 0,1,0,1), the mesh --tp 2 --pp 2 on 3 + 1;
#  - the mesh places by (machine, rank), so --tp 2 --pp 2 on machines 0,1,0,1
#    runs (its TP groups are ranks {0, 2} and {1, 3}) and equals one machine;
#  - ranks that disagree on DTRAIN_TP_ALLREDUCE fail at start-up, naming it.
# usage: test_tp_node.sh DTRAIN CKPT_CMP
set -uo pipefail
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
bin=$1 cmp=$2
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
for i in $(seq 1 300); do echo "line $i: the quick brown fox jumps over the lazy dog $((i * 7919 % 1000))"; done > "$tmp/corpus.txt"
gpt2=(--model gpt2 --layers 2 --embd 32 --heads 4 --max-t 32 --seq 32 --data text --data-path "$tmp/corpus.txt"
      --eval-batches 2 --threads 1 --steps 4 --batch 4)
fail=0
run() {
    local tag=$1; shift
    if ! timeout -k 15 120 "$bin" train "${gpt2[@]}" "$@" --metrics "$tmp/$tag.jsonl" --save "$tmp/$tag.ck" \
            < /dev/null > "$tmp/$tag.out" 2>&1; then
        echo "FAIL $tag: $* (exit $?), got:"; tail -20 "$tmp/$tag.out"; fail=1; return 1
    fi
}
losses() { grep -oE '"(step|loss|eval_loss|eval_accuracy)":[-0-9.e+]+' "$1"; }
same() {   # same REF TAG: checkpoints and logged values bitwise
    if "$cmp" "$tmp/$1.ck" "$tmp/$2.ck" step optim_step epoch cursor > "$tmp/cmp.out" &&
       diff <(losses "$tmp/$1.jsonl") <(losses "$tmp/$2.jsonl") > /dev/null; then
        echo "ok   $2 == $1 bit for bit: $(tail -1 "$tmp/cmp.out")"
    else echo "FAIL $2 != $1:"; tail -3 "$tmp/cmp.out"; diff <(losses "$tmp/$1.jsonl") <(losses "$tmp/$2.jsonl") | head -4; fail=1; fi
}
near() {   # near REF TAG: every logged value within 1e-6 relative
    if paste -d' ' <(losses "$tmp/$1.jsonl") <(losses "$tmp/$2.jsonl") | awk -F'[: ]' '
        { a = $2 + 0; b = $4 + 0; d = a - b; if (d < 0) d = -d; s = a < 0 ? -a : a; n++
          if ($1 != $3 || d > 1e-6 * s) { print "differs: " $0; bad = 1 } }
        END { exit bad || !n }'; then echo "ok   $2 ~ $1 (1e-6)"
    else echo "FAIL $2 vs $1"; fail=1; fi
}
says() {
    if grep -qE -- "$2" "$tmp/$1.out"; then echo "ok   $1 says: $(grep -m1 -oE -- "$2" "$tmp/$1.out")"
    else echo "FAIL $1 does not say /$2/:"; head -4 "$tmp/$1.out"; fail=1; fi
}
refused() {
    local tag=$1 want=$2; shift 2
    if timeout -k 15 60 env "$@" < /dev/null > "$tmp/$tag.out" 2>&1; then
        echo "FAIL $tag: accepted"; fail=1
    elif grep -qE -- "$want" "$tmp/$tag.out" && ! grep -q '^step ' "$tmp/$tag.out"; then
        echo "ok   $tag refused: $(grep -m1 -oE -- "$want" "$tmp/$tag.out")"
    else echo "FAIL $tag: want /$want/, got:"; head -5 "$tmp/$tag.out"; fail=1; fi
}

run tp2 --tp 2 --nproc 2 && says tp2 "all-reduces through node-shared memory"
DTRAIN_TP_ALLREDUCE=mpi run tp2_mpi --tp 2 --nproc 2 && says tp2_mpi "all-reduces through MPI" && same tp2 tp2_mpi
run tp4 --tp 4 --nproc 4 && DTRAIN_TP_ALLREDUCE=mpi run tp4_mpi --tp 4 --nproc 4 && near tp4 tp4_mpi
run dptp --tp 2 --nproc 4 && DTRAIN_TEST_MACHINES=0,0,1,1 run dptp_2x2 --tp 2 --nproc 4 && same dptp dptp_2x2
run mesh --tp 2 --pp 2 --nproc 4 && says mesh "all-reduces through node-shared memory" &&
    DTRAIN_TEST_MACHINES=0,1,0,1 run mesh_0101 --tp 2 --pp 2 --nproc 4 && same mesh mesh_0101

refused one_each "--tp 2: the tensor-parallel group of world ranks 0, 1 spans machines \(rank 0 on [^,]+, rank 1 on [^)]+\).*run a multiple of 2 ranks on every machine, placed by slot" \
    DTRAIN_TEST_MACHINES=0,1 "$bin" train "${gpt2[@]}" --tp 2 --nproc 2
refused round_robin "group of world ranks 0, 1 spans machines" \
    DTRAIN_TEST_MACHINES=0,1,0,1 "$bin" train "${gpt2[@]}" --tp 2 --nproc 4
refused mesh_31 "--tp 2: the tensor-parallel group of world ranks 2, 3 spans machines.*run a multiple of 2 ranks on every machine$" \
    DTRAIN_TEST_MACHINES=0,0,0,1 "$bin" train "${gpt2[@]}" --tp 2 --pp 2 --nproc 4
# the two paths cannot meet in one group: ranks that disagree fail at start-up
refused mixed "DTRAIN_TP_ALLREDUCE: rank 1 has node, rank 0 has mpi" \
    mpiexec --allow-run-as-root --oversubscribe -n 1 env DTRAIN_TP_ALLREDUCE=mpi "$bin" train "${gpt2[@]}" --tp 2 : \
    -n 1 "$bin" train "${gpt2[@]}" --tp 2
refused mixed_mesh "DTRAIN_TP_ALLREDUCE: rank" \
    mpiexec --allow-run-as-root --oversubscribe -n 2 env DTRAIN_TP_ALLREDUCE=mpi "$bin" train "${gpt2[@]}" --tp 2 --pp 2 : \
    -n 2 "$bin" train "${gpt2[@]}" --tp 2 --pp 2
exit $fail
