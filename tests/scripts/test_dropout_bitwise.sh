#!/usr/bin/env bash
# GPT-2 with --dropout draws the same masks in every layout of the same
# global batch: a mask is a function of (seed, step, the sample's global
# position, the dropout site, the element), not of a generator whose state
# depends on the layout (ops.h dt_op_dropout, train.h row_keys). So
#  - bit for bit (final checkpoint, tests/tools/ckpt_cmp, and the logged
#    losses): one process --batch 2 --accum 4 == --recompute blocks ==
#    --pp 2 --batch 8 --microbatches 4 (1F1B; ZB-H1 with recompute), and
#    DDP --nproc 2 --batch 2 --accum 2 --deterministic == ZeRO-1 at 2 ranks;
#  - to rounding (training losses within 1e-6 relative): one process ==
#    --batch 4 --accum 2 == DDP --nproc 2. These change how the global batch
#    is cut into micro-batches, i.e. the order of the loss and gradient sums,
#    and are not bitwise without dropout either (a different mask moves the
#    first loss by ~1e-3).
# usage: test_dropout_bitwise.sh DTRAIN CKPT_CMP
set -uo pipefail
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"   # (see test_recompute_bitwise.sh)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
bin=$1 cmp=$2
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
for i in $(seq 1 300); do echo "line $i: the quick brown fox jumps over the lazy dog $((i * 7919 % 1000))"; done > "$tmp/corpus.txt"
gpt2=(--model gpt2 --layers 2 --embd 32 --heads 2 --max-t 32 --seq 32 --dropout 0.1 --deterministic
      --data text --data-path "$tmp/corpus.txt" --eval-batches 2 --threads 1 --quiet --steps 3)
fail=0

run() {   # run TAG ARGS...: train, keep TAG.ck and TAG.loss (training losses)
    local tag=$1; shift
    if ! "$bin" train "${gpt2[@]}" "$@" --save "$tmp/$tag.ck" --metrics "$tmp/$tag.jsonl" < /dev/null > "$tmp/$tag.out" 2>&1; then
        echo "FAIL $tag: $*"; cat "$tmp/$tag.out"; fail=1; return 1
    fi
    grep '"loss"' "$tmp/$tag.jsonl" | grep -v eval | sed 's/.*"step":\([0-9]*\),"loss":\([0-9.e+-]*\).*/\1 \2/' > "$tmp/$tag.loss"
}

same() {   # same REF TAG: bitwise
    if "$cmp" "$tmp/$1.ck" "$tmp/$2.ck" step optim_step > "$tmp/cmp.out" && cmp -s "$tmp/$1.loss" "$tmp/$2.loss"; then
        echo "ok   $2 == $1 bit for bit"
    else
        echo "FAIL $2 != $1:"; cat "$tmp/cmp.out"; diff "$tmp/$1.loss" "$tmp/$2.loss"; fail=1
    fi
}
close() {   # close REF TAG: the training losses within 1e-6 relative
    if join "$tmp/$1.loss" "$tmp/$2.loss" |
        awk '{ d = $2 - $3; if (d < 0) d = -d; if (d > 1e-6 * $2) bad = 1; n++ } END { exit bad || n != 3 }'; then
        echo "ok   $2 == $1 to 1e-6"
    else
        echo "FAIL $2 losses differ from $1:"; join "$tmp/$1.loss" "$tmp/$2.loss"; fail=1
    fi
}

run single --batch 2 --accum 4 || exit 1
[ "$(wc -l < "$tmp/single.loss")" -eq 3 ] || { echo "FAIL: expected 3 logged losses"; cat "$tmp/single.jsonl"; exit 1; }
run ddp2 --batch 2 --accum 2 --nproc 2 && close single ddp2
while IFS='|' read -r how ref tag extra; do
    # shellcheck disable=SC2086
    run "$tag" $extra && "$how" "$ref" "$tag"
done <<'CONFIGS'
same|single|recompute|--batch 2 --accum 4 --recompute blocks
same|single|pp2|--batch 8 --microbatches 4 --pp 2 --nproc 2
same|single|pp2_zbh1_recompute|--batch 8 --microbatches 4 --pp 2 --nproc 2 --schedule zb-h1 --recompute blocks
same|ddp2|zero1_np2|--batch 2 --accum 2 --nproc 2 --zero 1
close|single|accum2|--batch 4 --accum 2
CONFIGS
exit $fail
