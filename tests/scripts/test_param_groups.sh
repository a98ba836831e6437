#!/usr/bin/env bash
# Parameter groups from the CLI, in one process (NP 1) or under DDP and
# ZeRO 2 (NP 2|4), SGD with momentum and AdamW, checked by equivalences that
# must hold bit for bit (checkpoints compared tensor by tensor, optimizer
# state included):
#   --wd 0.1 --no-decay '*'      == --wd 0
#   --lr 0.02 --lr-scale '*=0.5' == --lr 0.01 (halving is exact in binary)
#   --lr-scale 'fc1.*=0'         keeps fc1 at its initial values, fc2 trains
# and a malformed or unmatched --lr-scale / --no-decay is an error naming it.
# usage: test_param_groups.sh DTRAIN CKPT_CMP NP [MPIEXEC ARGS...]
set -uo pipefail
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"   # (see test_recompute_bitwise.sh)
bin=$1 cmp=$2 np=$3; shift 3
mpiexec=("$@")
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
base=(--model mlp --hidden 32,32 --threads 1 --batch 16 --steps 4 --quiet)
fail=0
launch=("$bin")
[ "$np" -gt 1 ] && launch=("${mpiexec[@]}" -n "$np" "$bin")

run() {   # run TAG ARGS...: trains, saves $tmp/TAG.st
    local tag=$1; shift
    if ! timeout 300 "${launch[@]}" train "${base[@]}" "$@" --save "$tmp/$tag.st" > "$tmp/$tag.out" 2>&1; then
        echo "FAIL $tag: run:"; tail -5 "$tmp/$tag.out"; fail=1; return 1
    fi
}
same() {   # same A B WHAT [--only GLOB]
    local a=$1 b=$2 what=$3; shift 3
    if ! "$cmp" "$@" "$tmp/$a.st" "$tmp/$b.st" > "$tmp/cmp.out" 2>&1; then
        echo "FAIL $what:"; cat "$tmp/cmp.out"; fail=1; return 1
    fi
    echo "ok $what"
}

run init --lr 0 --steps 1 || exit 1
strategies=("ddp:")
[ "$np" -gt 1 ] && strategies+=("zero2:--zero 2 --save-format consolidated")
for opt in "sgd:--optim sgd --momentum 0.9" "adamw:--optim adamw"; do
    for strat in "${strategies[@]}"; do
        t="${opt%%:*}-${strat%%:*}"
        # shellcheck disable=SC2206
        a=(${opt#*:} ${strat#*:})
        run "$t-nodecay" "${a[@]}" --lr 0.01 --wd 0.1 --no-decay '*' && run "$t-wd0" "${a[@]}" --lr 0.01 --wd 0 &&
            same "$t-wd0" "$t-nodecay" "$t: --no-decay '*' == --wd 0"
        # the control: decay does change the result
        run "$t-wd" "${a[@]}" --lr 0.01 --wd 0.1 &&
            if "$cmp" "$tmp/$t-wd0.st" "$tmp/$t-wd.st" > /dev/null 2>&1; then echo "FAIL $t: --wd 0.1 changed nothing"; fail=1; fi
        run "$t-half" "${a[@]}" --lr 0.02 --wd 0.1 --lr-scale '*=0.5' &&
            same "$t-wd" "$t-half" "$t: --lr 0.02 --lr-scale '*=0.5' == --lr 0.01"
        run "$t-fc1" "${a[@]}" --lr 0.01 --wd 0.1 --lr-scale 'fc1.*=0' && same init "$t-fc1" "$t: fc1 at lr x 0 keeps its values" --only 'fc1.*'
        "$cmp" --only 'fc2.weight' "$tmp/init.st" "$tmp/$t-fc1.st" > /dev/null 2>&1
        if [ $? -ne 1 ]; then echo "FAIL $t: fc2.weight did not train"; fail=1; fi
    done
done

bad() {   # bad NEEDLE ARGS...: must fail before training with NEEDLE in the output
    local needle=$1; shift
    if timeout 300 "${launch[@]}" train "${base[@]}" "$@" > "$tmp/bad.out" 2>&1; then
        echo "FAIL: $* was accepted"; fail=1
    elif ! grep -qF -- "$needle" "$tmp/bad.out" || grep -q "step 1/" "$tmp/bad.out"; then
        echo "FAIL: $*: expected '$needle' before training:"; cat "$tmp/bad.out"; fail=1
    else
        echo "ok refused: $*"
    fi
}
bad "--lr-scale 'fc1': expected PATTERN=F" --lr-scale fc1
bad "--lr-scale 'fc1.*=-1': expected PATTERN=F" --lr-scale 'fc1.*=-1'
bad "--lr-scale 'nope*' matches no parameter" --lr-scale 'nope*=2'
bad "--no-decay 'h.*' matches no parameter" --no-decay 'h.*'
exit $fail
