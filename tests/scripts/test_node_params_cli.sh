#!/usr/bin/env bash
# --node-params through the CLI, on 2 x 2 machines simulated on this one
# (DTRAIN_TEST_MACHINES; test_multihost.sh runs real hosts):
#  - --zero 1/2/3 --node-params --deterministic end bit for bit where the same
#    run with private parameters ends (every tensor of the final checkpoint);
#  - the start-up line says the parameters live once per machine, and the
#    memory report's machine lines hold one copy;
#  - a run saved at step 2 and resumed to step 4 ends where a 4-step run ends;
#  - flat collectives cannot fill a shared copy: said, and the run trains on
#    private parameters with the same result;
#  - --node-params without --zero is refused naming --zero.
# usage: test_node_params_cli.sh DTRAIN CKPT_CMP
set -uo pipefail
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
bin=$1 cmp=$2
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export DTRAIN_TEST_MACHINES=0,0,1,1 OMP_NUM_THREADS=1
for i in $(seq 1 300); do echo "line $i: the quick brown fox jumps over the lazy dog $((i * 7919 % 1000))"; done > "$tmp/corpus.txt"
base=(train --model gpt2 --layers 2 --embd 32 --heads 2 --max-t 32 --seq 32 --data text --data-path "$tmp/corpus.txt"
      --eval-batches 2 --threads 1 --batch 2 --deterministic --nproc 4)
gpt2=("${base[@]}" --save-format consolidated)
fail=0
run() {   # run TAG ARGS...
    local tag=$1; shift
    if "$bin" "${gpt2[@]}" "$@" --save "$tmp/$tag.st" < /dev/null > "$tmp/$tag.out" 2>&1; then return 0; fi
    echo "FAIL $tag: did not train:"; tail -5 "$tmp/$tag.out"; fail=1; return 1
}
same() {   # same A B WHAT
    if "$cmp" "$tmp/$1.st" "$tmp/$2.st" step optim_step epoch cursor > "$tmp/cmp.out" 2>&1; then
        echo "ok   $3: $(tail -1 "$tmp/cmp.out")"
    else echo "FAIL $3:"; cat "$tmp/cmp.out"; fail=1; fi
}
says() {   # says TAG PATTERN
    if grep -qE "$2" "$tmp/$1.out"; then echo "ok   $1 says: $(grep -m1 -oE "$2" "$tmp/$1.out")"
    else echo "FAIL $1 does not say /$2/:"; head -12 "$tmp/$1.out"; fail=1; fi
}

for z in 1 2 3; do
    run priv$z --zero "$z" --steps 4 && run node$z --zero "$z" --node-params --steps 4 &&
        same "priv$z" "node$z" "--zero $z --node-params == private parameters"
done
says node3 "zero-3: parameters once per machine in shared memory \([0-9.]+ MiB per machine\), each shard gathered into every other machine once per step; stage 3 keeps them whole like stage 2"
says node2 "zero-2: parameters once per machine in shared memory"
# memory: a machine's two ranks hold one copy between them (private: two)
pm() { grep -m1 -E "^  machine .*\(2 ranks\)" "$tmp/$1.out" | awk '{print $5}'; }
if awk -v a="$(pm node2)" -v b="$(pm priv2)" 'BEGIN {exit !(a > 0 && a * 2 > b * 0.99 && a * 2 < b * 1.01)}'; then
    echo "ok   machine parameter memory: $(pm node2) MiB shared vs $(pm priv2) MiB private"
else
    echo "FAIL machine parameter memory: node-shared $(pm node2), private $(pm priv2) (want half)"; fail=1
fi

run half --zero 2 --node-params --steps 2 && run resumed --zero 2 --node-params --steps 4 --resume "$tmp/half.st" &&
    same node2 resumed "--node-params saved at step 2, resumed to 4 == 4 steps"

if DTRAIN_COLLECTIVES=flat run flat --zero 2 --node-params --steps 4; then
    says flat "node-shared parameters unavailable \(the collectives are flat"
    same priv2 flat "--node-params under flat collectives == private parameters"
fi

out=$("$bin" "${base[@]}" --steps 1 --node-params < /dev/null 2>&1); rc=$?
if [ $rc -ne 0 ] && grep -q -- "--node-params applies to ZeRO (add --zero 1, 2 or 3)" <<< "$out"; then
    echo "ok   --node-params without --zero refused"
else echo "FAIL --node-params without --zero: exit $rc: $out"; fail=1; fi
exit $fail
