#!/usr/bin/env bash
# dtrain generate end to end: a tiny GPT-2 trained on a very repetitive text
# ("abcdefghij" over and over) continues a prompt with that text, greedy;
# the KV cache gives the tokens the whole-prefix recompute gives, also past
# the context (arch.max_t 32, refilled); sampling is the same for a seed and
# differs for another; a vocabulary that is not bytes prints ids and takes
# --prompt-ids; bad input is refused naming the flag. dtrain train
# --sample-every prints samples while training that continue the text; a
# full disk under its output is an error.
# usage: test_generate_cli.sh DTRAIN_BINARY
set -uo pipefail
bin=$1
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
for i in $(seq 1 400); do printf 'abcdefghij'; done > "$tmp/rep.txt"
model=(--model gpt2 --layers 2 --embd 32 --heads 2 --max-t 32 --seq 32 --batch 8 --data text
       --data-path "$tmp/rep.txt" --lr 1e-2 --threads 1 --quiet)
fail=0
ok()  { echo "ok   $1"; }
bad() { echo "FAIL $1"; fail=1; }

if ! "$bin" train "${model[@]}" --steps 100 --save "$tmp/rep.st" > "$tmp/train.out" 2>&1; then
    echo "FAIL training: $(cat "$tmp/train.out")"; exit 1
fi
"$bin" train "${model[@]}" --steps 2 --save "$tmp/early.st" > /dev/null 2>&1 || bad "training 2 steps"
gen() { "$bin" generate --threads 1 "$@" 2>&1; }

# greedy: the prompt, then the text it was trained on (60 tokens: past the context of 32)
want="abc$(for i in 1 2 3 4 5 6 7; do printf 'defghijabc'; done)"
want=${want:0:63}
out=$(gen --init "$tmp/rep.st" --prompt abc --tokens 60 --temperature 0)
[ "$out" = "$want" ] && ok "greedy continues the repetitive text: $out" || bad "greedy: want $want, got: $out"
out2=$(gen --init "$tmp/rep.st" --prompt abc --tokens 60 --temperature 0 --no-cache)
[ "$out2" = "$out" ] && ok "--no-cache (whole prefix per token) gives the KV cache's tokens" || bad "--no-cache: got: $out2"
out=$(gen --resume "$tmp/rep.st" --prompt fgh --tokens 12 --temperature 0.8 --seed 4)
[ "$out" = "fghijabcdefghij" ] && ok "sampled at 0.8 from the trained model: $out" || bad "sampled: got: $out"

# output that cannot be written (a full disk) is an error, not exit 0 with the text lost
if [ -w /dev/full ]; then
    err=$("$bin" generate --threads 1 --init "$tmp/rep.st" --prompt abc --tokens 60 2>&1 > /dev/full); rc=$?
    [ $rc -eq 1 ] && [[ "$err" == *"writing standard output"* ]] && ok "generate > /dev/full: exit 1, $err" \
        || bad "generate > /dev/full: want exit 1 naming the output, got (exit $rc): $err"
    # training's result is its checkpoint: a failed stdout only warns (a completed job must not look failed)
    err=$("$bin" train --model mlp --hidden 16 --batch 8 --steps 2 --threads 1 --save "$tmp/full.st" 2>&1 > /dev/full); rc=$?
    [ $rc -eq 0 ] && [ -s "$tmp/full.st" ] && [[ "$err" == *"warning: writing standard output"* ]] \
        && ok "train > /dev/full: exit 0, the checkpoint written, a warning" \
        || bad "train > /dev/full: want exit 0 and a warning, got (exit $rc): $err"
else
    echo "skip generate > /dev/full: no writable /dev/full"
fi

# sampling: the same seed gives the same text, another seed other text (a barely trained model)
a=$(gen --init "$tmp/early.st" --prompt abc --tokens 80 --temperature 1 --top-k 0 --seed 7)
b=$(gen --init "$tmp/early.st" --prompt abc --tokens 80 --temperature 1 --top-k 0 --seed 7)
c=$(gen --init "$tmp/early.st" --prompt abc --tokens 80 --temperature 1 --top-k 0 --seed 8)
d=$(gen --init "$tmp/early.st" --prompt abc --tokens 80 --temperature 1 --top-k 0 --seed 7 --no-cache)
[ "$a" = "$b" ] && [ "$a" = "$d" ] && ok "seed 7 twice (and without the cache): the same text" || bad "seed 7: '$a' vs '$b' vs '$d'"
[ "$a" != "$c" ] && ok "seed 8: other text" || bad "seed 8 gave seed 7's text: $a"
ids=$(gen --init "$tmp/rep.st" --prompt abc --tokens 5 --temperature 0 --ids)
[ "$ids" = "100,101,102,103,104" ] && ok "--ids: $ids" || bad "--ids: got: $ids"

# a vocabulary that is not bytes: ids in, ids out
"$bin" train "${model[@]}" --vocab 300 --steps 2 --save "$tmp/v300.st" > /dev/null 2>&1 || bad "training --vocab 300"
out=$(gen --init "$tmp/v300.st" --prompt-ids 0,299,7 --tokens 6 --seed 2)
if [[ "$out" =~ ^[0-9]+(,[0-9]+){5}$ ]]; then ok "vocab 300 prints ids: $out"; else bad "vocab 300: got: $out"; fi
out=$(gen --init "$tmp/v300.st" --prompt hi); rc=$?
[ $rc -ne 0 ] && grep -q -- "--prompt-ids" <<< "$out" && ok "--prompt on vocab 300 refused: $out" || bad "--prompt on vocab 300: exit $rc: $out"
out=$(gen --init "$tmp/v300.st" --prompt-ids 300); rc=$?
[ $rc -ne 0 ] && grep -q "id 300" <<< "$out" && ok "id outside the vocabulary refused: $out" || bad "id 300: exit $rc: $out"
# 256 ids from a token shard are a tokenizer's, not bytes: the checkpoint records its data,
# so generate asks for ids and prints ids (it used to print them as bytes and take --prompt)
{ printf '\210\330\064\001\001\000\000\000\000\020\000\000'; head -c 1012 /dev/zero
  printf "$(awk 'BEGIN {for (i = 0; i < 4096; i++) printf "\\%03o\\000", 32 + i % 90}')"; } > "$tmp/v256.bin"
"$bin" train "${model[@]}" --data shard --data-path "$tmp/v256.bin" --vocab 256 --steps 2 --save "$tmp/v256.st" \
    > "$tmp/v256.out" 2>&1 || bad "training on a shard, --vocab 256: $(tail -2 "$tmp/v256.out")"
out=$(gen --init "$tmp/v256.st" --prompt hi); rc=$?
[ $rc -ne 0 ] && grep -q -- "--data shard: token ids" <<< "$out" && ok "--prompt on a shard's vocab 256 refused: $out" ||
    bad "--prompt on a shard's vocab 256: exit $rc: $out"
out=$(gen --init "$tmp/v256.st" --prompt-ids 65,66 --tokens 4 --seed 2)
if [[ "$out" =~ ^[0-9]+(,[0-9]+){3}$ ]]; then ok "a shard's vocab 256 prints ids: $out"; else bad "shard vocab 256: got: $out"; fi
# refused before anything is printed (a byte vocabulary echoed 'A' and byte 300 % 256 first)
out=$("$bin" generate --threads 1 --init "$tmp/rep.st" --prompt-ids 65,300 2> /dev/null); rc=$?
[ $rc -eq 2 ] && [ -z "$out" ] && ok "id 300 on a byte vocabulary: exit 2, nothing on stdout" ||
    bad "id 300 on a byte vocabulary: exit $rc, stdout '$out'"

# refusals name the flag
while IFS='|' read -r what args want; do
    # shellcheck disable=SC2086
    out=$(gen $args); rc=$?
    [ $rc -ne 0 ] && grep -q -- "$want" <<< "$out" && ok "$what: $out" || bad "$what: exit $rc: $out"
done <<CASES
no checkpoint|--prompt abc|needs --init
missing file|--init $tmp/none.st|cannot open
negative temperature|--init $tmp/rep.st --temperature -1|--temperature must be >= 0 (got -1)
threads past the machine|--init $tmp/rep.st --threads 99999|--threads 99999: at most
bad id list|--init $tmp/rep.st --prompt-ids 1,,2|--prompt-ids: invalid list
both prompts|--init $tmp/rep.st --prompt a --prompt-ids 1|exclusive
CASES
# --sample-every during training: samples at steps 50 and 100 after the validation split's
# first 8 tokens (the held-out last 10% of rep.txt starts at token 3600: "abcdefgh"); by
# step 100 they continue the repetitive text (at temperature 0.8: 90% of the characters
# at least); a second run prints the same samples; a model without a KV cache is refused
"$bin" train "${model[@]}" --steps 100 --sample-every 50 --sample-tokens 30 > "$tmp/s1.out" 2>&1 || bad "--sample-every run failed"
"$bin" train "${model[@]}" --steps 100 --sample-every 50 --sample-tokens 30 > "$tmp/s2.out" 2>&1
steps=$(grep -o '^--- sample at step [0-9]*' "$tmp/s1.out" | awk '{print $5}' | tr '\n' ' ')
[ "$steps" = "50 100 " ] && ok "--sample-every 50: samples at steps $steps" || bad "--sample-every 50: samples at '$steps'"
s100=$(awk '/^--- sample at step 100 /{getline; print; exit}' "$tmp/s1.out")
want=$(for i in 1 2 3 4; do printf 'abcdefghij'; done); want=${want:0:38}
same=$(awk -v a="$s100" -v b="$want" 'BEGIN {n = 0; for (i = 1; i <= length(b); i++) n += substr(a, i, 1) == substr(b, i, 1); print n}')
[ ${#s100} -eq 38 ] && [ "$same" -ge 34 ] && ok "the step-100 sample continues the text: $s100" ||
    bad "step-100 sample: '$s100' ($same of 38 match $want)"
cmp -s "$tmp/s1.out" "$tmp/s2.out" && ok "the same samples in a second run" || bad "samples differ between runs"
out=$("$bin" train --model mlp --steps 2 --sample-every 1 --quiet 2>&1); rc=$?
[ $rc -ne 0 ] && grep -q -- "--sample-every" <<< "$out" && ok "--sample-every with an MLP refused: $out" ||
    bad "--sample-every with an MLP: exit $rc: $out"

help=$("$bin" generate --help)
for f in --init --resume --prompt --prompt-ids --tokens --temperature --top-k --seed --ids --no-cache --threads; do
    grep -q -- "^  $f " <<< "$help" || bad "--help lacks $f"
done
exit $fail
