#!/usr/bin/env bash
# Checkpoints drive the CLI (issue 27 item 2): for MLP, CNN and a non-default
# GPT-2, saved after 3 steps as a single file, a ZeRO-3 set (--nproc 2) and a
# pipeline set (--pp 2), `dtrain eval --init X` and `eval --resume X` without
# any model flag print the same result line as with every model flag given;
# `eval --metrics` appends that result to the training run's metrics file;
# eval allocates no gradient or optimizer memory in any layout, and refuses
# (and does not list) the flags of training alone;
# a pipeline evaluates the same sequences as one process (1e-6), at 2 or 8
# micro-batches;
# `train --resume X` without model flags trains on; a model flag (or --model,
# or --optim on --resume) that contradicts the file is refused, naming the
# flag's value and the file's. Results are compared between runs, never with
# constants.
# usage: test_eval_checkpoint.sh DTRAIN
set -uo pipefail
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"   # (see test_recompute_bitwise.sh)
bin=$1
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail=0
run=(--threads 1 --batch 8 --eval-batches 4)       # flags that are not the model's (both runs)
declare -A model=(
    [mlp]="--model mlp --hidden 24,16"
    [cnn]="--model cnn --channels 4,6 --fc 12"
    [gpt2]="--model gpt2 --layers 3 --embd 48 --heads 3 --max-t 24"
)
# contradiction per model: flag, a value the file does not have, the file's
declare -A contra=(
    [mlp]="--hidden 32 24,16"
    [cnn]="--fc 20 12"
    [gpt2]="--layers 2 3"
)
kinds=("single:" "zero3:--nproc 2 --zero 3" "pp:--nproc 2 --pp 2")

# result line of an eval (the last line of stdout), or FAIL text
evaluate() {   # evaluate OUT ARGS...
    local out=$1; shift
    timeout -k 15 300 "$bin" eval "$@" < /dev/null > "$out" 2> "$out.err" || { echo "exit $?: $(tail -2 "$out.err")"; return 1; }
    tail -1 "$out"
}

for m in mlp cnn gpt2; do
    # shellcheck disable=SC2206
    flags=(${model[$m]})
    for kind in "${kinds[@]}"; do
        tag="$m-${kind%%:*}" ck="$tmp/$m-${kind%%:*}.ck"
        # shellcheck disable=SC2206
        strat=(${kind#*:})
        if ! timeout -k 15 300 "$bin" train "${flags[@]}" "${run[@]}" "${strat[@]}" --steps 3 --quiet --save "$ck" \
                --metrics "$tmp/$tag.jsonl" < /dev/null > "$tmp/$tag.train" 2>&1; then
            echo "FAIL $tag: training run:"; tail -3 "$tmp/$tag.train"; fail=1; continue
        fi
        # eval --metrics appends its result to the training run's file: 3 step
        # lines, training's final evaluation, then eval's (in the same layout),
        # at the checkpoint's step 3, with the loss eval printed and the same
        # as training's
        res=$(evaluate "$tmp/$tag.metrics" --resume "$ck" "${run[@]}" "${strat[@]}" --metrics "$tmp/$tag.jsonl")
        printed=$(grep -oE 'loss: [0-9.]+' <<< "$res" | cut -d' ' -f2)
        mapfile -t ev < <(grep -oE '"step":3,"eval_loss":[0-9.e+-]+' "$tmp/$tag.jsonl" | cut -d: -f3)
        if [ "$(wc -l < "$tmp/$tag.jsonl")" -ne 5 ] || [ "${#ev[@]}" -ne 2 ] || [ "${ev[0]}" != "${ev[1]}" ] ||
           [ "$(printf '%.4f' "${ev[1]}")" != "$printed" ]; then
            echo "FAIL $tag eval --metrics: printed '$res', file:"; cat "$tmp/$tag.jsonl"; fail=1
        else
            echo "ok $tag eval --metrics appends {\"step\":3,\"eval_loss\":${ev[1]}}, training's lines kept"
        fi
        # evaluation trains nothing: no gradients and no optimizer state on any
        # rank (the memory report, MiB: params / grads / optimizer state / RSS;
        # before, DDP, ZeRO and pipelines allocated both for eval)
        if [ -n "${kind#*:}" ]; then
            mem=$(grep -A4 'memory per rank' "$tmp/$tag.metrics" | grep -E '^  rank [0-9]+:')
            if [ "$(wc -l <<< "$mem")" -ne 2 ] || grep -vqE '^  rank [0-9]+: [0-9.]+ / 0\.00 / 0\.00 / ' <<< "$mem"; then
                echo "FAIL $tag eval allocates gradients or optimizer state:"; cat "$tmp/$tag.metrics"; fail=1
            else
                echo "ok $tag eval: no gradient or optimizer memory on either rank"
            fi
        fi
        # the pipeline evaluates the sequences one process does, whatever its
        # micro-batches: --eval-batches counts batches of --batch (it counted
        # micro-batches once: 2 micro-batches evaluated half the set)
        if [ "${kind%%:*}" = pp ]; then
            evaluate "$tmp/$tag.one" --resume "$ck" "${run[@]}" --metrics "$tmp/$tag.one.jsonl" > /dev/null
            one=$(grep -oE '"eval_loss":[0-9.e+-]+' "$tmp/$tag.one.jsonl" | cut -d: -f2)
            for mb in 2 8; do
                evaluate "$tmp/$tag.mb$mb" --resume "$ck" "${run[@]}" "${strat[@]}" --microbatches $mb \
                    --metrics "$tmp/$tag.mb$mb.jsonl" > /dev/null
                got=$(grep -oE '"eval_loss":[0-9.e+-]+' "$tmp/$tag.mb$mb.jsonl" | cut -d: -f2)
                if [ -n "$one" ] && [ -n "$got" ] && awk -v a="$got" -v b="$one" 'BEGIN { d = a - b; exit !(d * d <= 1e-12 * b * b) }'; then
                    echo "ok $tag eval --microbatches $mb: loss $got, one process $one"
                else
                    echo "FAIL $tag eval --microbatches $mb: loss '$got', one process '$one'"; fail=1
                fi
            done
        fi
        for how in init resume; do
            full=$(evaluate "$tmp/$tag.$how.full" "--$how" "$ck" "${flags[@]}" "${run[@]}")
            bare=$(evaluate "$tmp/$tag.$how.bare" "--$how" "$ck" "${run[@]}")
            if [[ "$full" != *loss:* ]] || [ "$full" != "$bare" ]; then
                echo "FAIL $tag eval --$how: with model flags '$full', without '$bare'"; fail=1
            else
                echo "ok $tag eval --$how without model flags: $bare"
            fi
        done
    done
    # a contradicting flag is refused before anything runs, naming both values
    ck="$tmp/$m-single.ck"
    # shellcheck disable=SC2206
    c=(${contra[$m]})
    for how in init resume; do
        out=$(timeout -k 15 60 "$bin" eval "--$how" "$ck" "${run[@]}" "${c[0]}" "${c[1]}" < /dev/null 2>&1); rc=$?
        if [ $rc -eq 0 ] || [[ "$out" != *"${c[0]} ${c[1]}"* ]] || [[ "$out" != *"${c[0]} ${c[2]}"* ]]; then
            echo "FAIL $m eval --$how ${c[0]} ${c[1]}: want a refusal naming ${c[1]} and ${c[2]}, got (exit $rc): $out"; fail=1
        else
            echo "ok $m eval --$how: ${c[0]} ${c[1]} refused: $out"
        fi
    done
done

# --model and --optim (on --resume) contradicting the file; train --resume
# without model flags trains on from the file
ck="$tmp/gpt2-single.ck"
check_refused() {   # check_refused WHAT WANT1 WANT2 ARGS...
    local what=$1 w1=$2 w2=$3; shift 3
    local out rc
    out=$(timeout -k 15 60 "$bin" "$@" < /dev/null 2>&1); rc=$?
    if [ $rc -eq 0 ] || [[ "$out" != *"$w1"* ]] || [[ "$out" != *"$w2"* ]]; then
        echo "FAIL $what: want a refusal naming '$w1' and '$w2', got (exit $rc): $out"; fail=1
    else
        echo "ok $what refused: $out"
    fi
}
check_refused "eval --model cnn on a gpt2 file" "--model cnn" "--model gpt2" eval --resume "$ck" --model cnn "${run[@]}"
# one rank's file of a sharded set given where the set's directory belongs
shard0=$(ls "$tmp"/gpt2-zero3.ck/shard-*-r0.safetensors | head -1)
check_refused "eval --resume on one shard of a set" "$shard0" "give its directory" eval --resume "$shard0" "${run[@]}"
# flags of training alone are refused by eval (they were accepted and ignored:
# --save wrote nothing but created the directory's lock), and its --help lists none
# (and those evaluation has no use for: no optimizer, no random numbers, no
# backward, no progress lines, batches forward in order)
for tf in "--save $tmp/e-save" "--steps 10" "--lr 0.1" "--save-every 1" "--freeze h.0.*" "--optim adamw" "--seed 1" \
          "--saved-activations bf16" "--log-every 1"; do
    # shellcheck disable=SC2086
    out=$(timeout -k 15 60 "$bin" eval --resume "$ck" "${run[@]}" $tf < /dev/null 2>&1); rc=$?
    if [ $rc -eq 2 ] && [[ "$out" == "dtrain: ${tf%% *} applies to dtrain train"* ]] && [ ! -e "$tmp/e-save" ]; then
        echo "ok eval ${tf%% *} refused: $out"
    else
        echo "FAIL eval ${tf%% *}: want exit 2 and 'applies to dtrain train', got (exit $rc): $out"; fail=1
    fi
done
out=$(timeout -k 15 60 "$bin" eval --resume "$ck" "${run[@]}" --schedule gpipe --max-outstanding 1 < /dev/null 2>&1)
if [ $? -eq 2 ] && [[ "$out" == "dtrain: --max-outstanding applies to dtrain train"* ]]; then
    echo "ok eval --max-outstanding refused: $out"
else
    echo "FAIL eval --max-outstanding: want exit 2 and 'applies to dtrain train', got: $out"; fail=1
fi
help=$("$bin" eval --help 2>&1)
if grep -qE '^  --(save|steps|lr|save-every|freeze|optim|seed|saved-activations|log-every|max-outstanding) ' \
        <<< "$help" || ! grep -qE '^  --resume ' <<< "$help"; then
    echo "FAIL eval --help lists training flags (or not --resume)"; fail=1
else
    echo "ok eval --help lists eval's flags only"
fi
check_refused "train --resume --optim sgd on an adamw file" "--optim sgd" "--optim adamw" \
    train --resume "$ck" --optim sgd --steps 5 "${run[@]}"
check_refused "train --init --heads 4" "--heads 4" "--heads 3" train --init "$ck" --heads 4 --steps 1 "${run[@]}"
if ! timeout -k 15 300 "$bin" train --resume "$ck" --steps 5 "${run[@]}" < /dev/null > "$tmp/on.out" 2>&1 ||
   ! grep -q '^step 5/5' "$tmp/on.out"; then
    echo "FAIL train --resume without model flags:"; tail -3 "$tmp/on.out"; fail=1
else
    echo "ok train --resume without model flags trains steps 4-5"
fi
exit $fail
