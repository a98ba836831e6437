#!/usr/bin/env bash
# --freeze PATTERN: the matching parameters keep their initial values bit for
# bit while the others train, with weight decay 0.1 and momentum (SGD 0.9,
# AdamW), in one process (NP 1) or under DDP and ZeRO 1/2/3 (NP 2|4). The
# initial values come from a run with --lr 0 (nothing moves). A pattern that
# matches no parameter is an error naming it.
# usage: test_freeze.sh DTRAIN CKPT_CMP NP [MPIEXEC ARGS...]
set -uo pipefail
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"   # (see test_recompute_bitwise.sh)
bin=$1 cmp=$2 np=$3; shift 3
mpiexec=("$@")
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
base=(--model mlp --hidden 32,32 --threads 1 --batch 16 --quiet)
fail=0
launch=("$bin")
[ "$np" -gt 1 ] && launch=("${mpiexec[@]}" -n "$np" "$bin")

# init.st: the initial parameters (one process, --lr 0)
if ! timeout 300 "$bin" train "${base[@]}" --steps 1 --lr 0 --save "$tmp/init.st" > "$tmp/init.out" 2>&1; then
    echo "FAIL: reference run:"; tail -5 "$tmp/init.out"; exit 1
fi

strategies=("ddp:")
[ "$np" -gt 1 ] && strategies+=("zero1:--zero 1" "zero2:--zero 2" "zero3:--zero 3")
for opt in "sgd:--optim sgd --lr 0.05 --momentum 0.9 --wd 0.1" "adamw:--optim adamw --lr 0.01 --wd 0.1"; do
    for strat in "${strategies[@]}"; do
        tag="${opt%%:*}-${strat%%:*}" out="$tmp/$tag.ck"
        # shellcheck disable=SC2206
        args=(${opt#*:} ${strat#*:})
        if ! timeout 300 "${launch[@]}" train "${base[@]}" "${args[@]}" --steps 4 --freeze 'fc1.*' --freeze fc3.bias \
                --save "$out" > "$tmp/$tag.out" 2>&1; then
            echo "FAIL $tag: run:"; tail -5 "$tmp/$tag.out"; fail=1; continue
        fi
        for frozen in 'fc1.*' fc3.bias; do
            if ! "$cmp" --only "$frozen" "$tmp/init.st" "$out" > "$tmp/$tag.cmp" 2>&1; then
                echo "FAIL $tag: frozen $frozen changed:"; cat "$tmp/$tag.cmp"; fail=1
            fi
        done
        # the others trained (ckpt_cmp exit 1: different)
        "$cmp" --only fc2.weight "$tmp/init.st" "$out" > "$tmp/$tag.cmp2" 2>&1
        if [ $? -ne 1 ]; then echo "FAIL $tag: fc2.weight did not train:"; cat "$tmp/$tag.cmp2"; fail=1; fi
        [ $fail -eq 0 ] && echo "ok $tag"
    done
done

# Frozen parameters take no gradient memory and no optimizer state: the DDP
# start-up report (MiB per rank: params / grads / optimizer state). By hand:
# MLP 784-32-32-10 is 25120 + 1056 + 330 = 26506 floats (0.10 MiB); with fc1
# and fc3.bias frozen 1056 + 320 = 1376 train: 5504 bytes of gradients
# (0.01 MiB, not 0.10) and 2 x 5504 of AdamW state (0.01).
if [ "$np" -gt 1 ]; then
    m="$tmp/mem"   # (base without its last word, --quiet: the report is wanted)
    if ! timeout 300 "${launch[@]}" train "${base[@]:0:${#base[@]}-1}" --optim adamw --steps 1 --freeze 'fc1.*' --freeze fc3.bias \
            > "$m.out" 2>&1; then
        echo "FAIL memory: run:"; tail -5 "$m.out"; fail=1
    elif ! grep -q "rank 0: 0.10 / 0.01 / 0.01 /" "$m.out"; then
        echo "FAIL memory: frozen parameters should take no gradient or optimizer memory:"; grep -A2 "memory per rank" "$m.out"; fail=1
    else
        echo "ok memory"
    fi
fi

# Frozen parameters have no optimizer state (DDP / one process: compact
# state), so the checkpoint holds none for them; resuming without --freeze
# unfreezes them: they start from zero state and train.
t="$tmp/thaw"
if ! timeout 300 "${launch[@]}" train "${base[@]}" --optim adamw --lr 0.01 --wd 0.1 --steps 2 --freeze 'fc1.*' \
        --save "$t.st" > "$t.out" 2>&1; then
    echo "FAIL thaw: frozen run:"; tail -5 "$t.out"; fail=1
elif grep -aq 'optim.exp_avg.fc1.weight' "$t.st" || ! grep -aq 'optim.exp_avg.fc2.weight' "$t.st"; then
    echo "FAIL thaw: the checkpoint should hold optimizer state for fc2 only"; fail=1
elif ! timeout 300 "${launch[@]}" train "${base[@]}" --optim adamw --lr 0.01 --wd 0.1 --steps 4 --resume "$t.st" \
        --save "$t-2.st" > "$t-2.out" 2>&1; then
    echo "FAIL thaw: resuming without --freeze:"; tail -5 "$t-2.out"; fail=1
else
    "$cmp" --only 'fc1.weight' "$tmp/init.st" "$t-2.st" > /dev/null 2>&1
    if [ $? -ne 1 ]; then echo "FAIL thaw: fc1.weight did not train after the resume"; fail=1; else echo "ok thaw"; fi
fi

# --unfreeze-at 2 == frozen for 2 steps, saved, resumed without --freeze
# (the refresh mid-run and a checkpoint round trip agree bit for bit: fresh
# optimizer state and own step count 0 for the unfrozen parameters, the
# others' carried over), one process, DDP and ZeRO 1/2/3; ZeRO 1/2 also with
# a 16-bit wire, where each rank holds the other ranks' shards rounded: the
# refresh re-shards without rounding the masters, and a resume gathers as a
# step does (both used to give other values than the uninterrupted run)
thaw=("${strategies[@]}")
[ "$np" -gt 1 ] && thaw+=("zero1bf16:--zero 1 --compress bf16" "zero2fp16:--zero 2 --compress fp16")
for strat in "${thaw[@]}"; do
    tag="thaw-${strat%%:*}" t="$tmp/thaw-${strat%%:*}"
    # shellcheck disable=SC2206
    sa=(${strat#*:})
    one=(); [ "${#sa[@]}" -gt 0 ] && one=(--save-format consolidated)
    common=(--optim adamw --lr 0.01 --wd 0.1 "${sa[@]}")
    if ! timeout 300 "${launch[@]}" train "${base[@]}" "${common[@]}" --steps 4 --freeze 'fc1.*' --unfreeze-at 2 \
            "${one[@]}" --save "$t-a.st" > "$t-a.out" 2>&1; then
        echo "FAIL $tag: --unfreeze-at run:"; tail -5 "$t-a.out"; fail=1; continue
    fi
    if ! timeout 300 "${launch[@]}" train "${base[@]}" "${common[@]}" --steps 2 --freeze 'fc1.*' --save "$t-mid" \
            > "$t-b.out" 2>&1 ||
       ! timeout 300 "${launch[@]}" train "${base[@]}" "${common[@]}" --steps 4 --resume "$t-mid" "${one[@]}" \
            --save "$t-b.st" >> "$t-b.out" 2>&1; then
        echo "FAIL $tag: frozen, saved, resumed:"; tail -5 "$t-b.out"; fail=1; continue
    fi
    if ! "$cmp" "$t-b.st" "$t-a.st" > "$t.cmp" 2>&1; then
        echo "FAIL $tag: --unfreeze-at differs from save + resume:"; cat "$t.cmp"; fail=1
    else
        echo "ok $tag"
    fi
    # the checkpoint at step --unfreeze-at itself, resumed with the job's own flags (as
    # --max-restarts does): its parameters are still frozen there, so it resumes (it was
    # refused as past --unfreeze-at) and equals the uninterrupted run
    if ! timeout 300 "${launch[@]}" train "${base[@]}" "${common[@]}" --steps 4 --freeze 'fc1.*' --unfreeze-at 2 \
            --resume "$t-mid" "${one[@]}" --save "$t-c.st" > "$t-c.out" 2>&1; then
        echo "FAIL $tag: resuming the step-2 checkpoint with --unfreeze-at 2:"; tail -3 "$t-c.out"; fail=1
    elif ! "$cmp" "$t-c.st" "$t-a.st" > "$t.cmp" 2>&1; then
        echo "FAIL $tag: resumed at --unfreeze-at differs from the uninterrupted run:"; cat "$t.cmp"; fail=1
    else
        echo "ok $tag: resumed at step --unfreeze-at"
    fi
done
if timeout 300 "${launch[@]}" train "${base[@]}" --steps 4 --freeze 'fc1.*' --unfreeze-at 1 --resume "$tmp/thaw-ddp-mid" \
        > "$tmp/late.out" 2>&1 || ! grep -q "not before --unfreeze-at 1" "$tmp/late.out"; then
    echo "FAIL: resuming past --unfreeze-at was not refused:"; cat "$tmp/late.out"; fail=1
else
    echo "ok resume past --unfreeze-at refused"
fi

# a pattern matching nothing: an error naming it
if timeout 300 "${launch[@]}" train "${base[@]}" --steps 1 --freeze 'fc1.*' --freeze 'nope*' > "$tmp/bad.out" 2>&1; then
    echo "FAIL: --freeze 'nope*' was accepted"; fail=1
elif ! grep -q "\-\-freeze 'nope\*' matches no parameter" "$tmp/bad.out"; then
    echo "FAIL: the error does not name the pattern:"; cat "$tmp/bad.out"; fail=1
else
    echo "ok unmatched pattern"
fi
exit $fail
