#!/usr/bin/env bash
# The full mesh dp 2 x pp 2 x tp 2 at 8 ranks (oversubscribed: --nproc 8
# adds --oversubscribe on a smaller machine) against DDP on 2 ranks, the
# pipeline's 2 micro-batches matching DDP's --accum 2: every logged training
# loss and every evaluation (loss within 1e-6 relative, token accuracy
# exactly) -- not bitwise, as each row-parallel layer sums partial products
# across the tp ranks (test_tensor_parallel.sh). A set saved by the mesh
# after 2 steps resumes at (dp, pp, tp) = (2, 1, 2) and in DDP on 2 ranks,
# and DDP's file resumes in the mesh, each continuing the uninterrupted DDP
# run within 1e-6. The start-up line names the mesh.
# usage: test_tp_mesh8.sh DTRAIN
set -uo pipefail
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
bin=$1
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
for i in $(seq 1 300); do echo "line $i: the quick brown fox jumps over the lazy dog $((i * 7919 % 1000))"; done > "$tmp/corpus.txt"
gpt2=(--model gpt2 --layers 2 --embd 32 --heads 4 --max-t 32 --seq 32 --data text --data-path "$tmp/corpus.txt"
      --eval-batches 2 --threads 1 --clip 0.05)
# (--eval-batches counts batches of --batch: 1 of 4 is DDP's 2 of 2)
mesh=(--tp 2 --pp 2 --nproc 8 --batch 4 --microbatches 2 --eval-batches 1)
ddp=(--nproc 2 --batch 2 --accum 2)
fail=0

run() {
    local tag=$1; shift
    if ! timeout -k 15 180 "$bin" train "${gpt2[@]}" "$@" --metrics "$tmp/$tag.jsonl" < /dev/null > "$tmp/$tag.out" 2>&1; then
        echo "FAIL $tag: $* (exit $?), got:"; tail -20 "$tmp/$tag.out"; fail=1; return 1
    fi
}
# shellcheck source=lib/train_compare.sh
. "$(dirname "$0")/lib/train_compare.sh"
# near REF TAG: lib/train_compare.sh t_near_metrics
near() { t_near_metrics "$1" "$2" acc; }

run ddp "${ddp[@]}" --steps 4 --quiet
run mesh "${mesh[@]}" --steps 4 && near ddp mesh
if grep -q 'mesh: dp 2 x pp 2 x tp 2' "$tmp/mesh.out"; then echo "ok   mesh line"
else echo "FAIL no 'mesh: dp 2 x pp 2 x tp 2' line, got:"; head -5 "$tmp/mesh.out"; fail=1; fi

# checkpoints across layouts, against the uninterrupted DDP run
grep -v '"step":[12][,}]' "$tmp/ddp.jsonl" > "$tmp/ddp_tail.jsonl"
if run half "${mesh[@]}" --steps 2 --save "$tmp/mesh.ck" --quiet; then
    run from_mesh_212 --tp 2 --nproc 4 --batch 2 --accum 2 --steps 4 --resume "$tmp/mesh.ck" --quiet &&
        near ddp_tail from_mesh_212
    run from_mesh_ddp "${ddp[@]}" --steps 4 --resume "$tmp/mesh.ck" --quiet && near ddp_tail from_mesh_ddp
fi
run ddp_half "${ddp[@]}" --steps 2 --save "$tmp/ddp.ck" --quiet &&
    run from_ddp_mesh "${mesh[@]}" --steps 4 --resume "$tmp/ddp.ck" --quiet && near ddp_tail from_ddp_mesh
exit $fail
