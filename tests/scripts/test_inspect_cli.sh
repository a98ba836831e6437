#!/usr/bin/env bash
# dtrain inspect on every checkpoint kind, made by small `dtrain train` runs:
# one process (a file), DDP (a file), ZeRO-2 (a sharded set), ZeRO-1
# consolidated (a file) and a pipeline (a sharded set). Each shows the model,
# its arch.*, the step, the strategy and world it was saved with, the
# optimizer state and the tensor table, every checksum verified (exit 0), and
# `dtrain generate` samples from it. A flipped bit in a tensor's data (of a
# file, and of one shard of a set) is reported naming the tensor, exit 1; a
# truncated file (and shard) is one clear error line, exit 1.
# usage: test_inspect_cli.sh DTRAIN_BINARY
set -uo pipefail
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"   # ranks under mpirun (test_zero_wire_cli.sh)
bin=$1
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
for i in $(seq 1 200); do printf 'abcdefghij'; done > "$tmp/rep.txt"
model=(--model gpt2 --layers 2 --embd 32 --heads 2 --max-t 32 --seq 32 --batch 4 --data text
       --data-path "$tmp/rep.txt" --steps 20 --lr 1e-2 --threads 1 --quiet)
fail=0
ok()  { echo "ok   $1"; }
bad() { echo "FAIL $1"; fail=1; }
# flip bit 4 of the byte at offset $2 of file $1
flip() {
    local b; b=$(od -An -tu1 -j "$2" -N1 "$1" | tr -d ' ')
    # shellcheck disable=SC2059
    printf "$(printf '\\%03o' $((b ^ 16)))" | dd of="$1" bs=1 seek="$2" conv=notrunc status=none
}
# a tensor's file offset (single files) from inspect's table: the column before crc
offset_of() { "$bin" inspect "$1" | awk -v t="$2" '$1 == t {print $(NF-1)}'; }

while IFS='|' read -r tag strategy world extra; do
    # shellcheck disable=SC2086
    if ! "$bin" train "${model[@]}" $extra --save "$tmp/$tag" < /dev/null > "$tmp/$tag.train" 2>&1; then
        bad "$tag: did not train: $(cat "$tmp/$tag.train")"; continue
    fi
    out=$("$bin" inspect "$tmp/$tag" 2>&1); rc=$?
    miss=""
    for want in "model       gpt2" "arch        layers 2, embd 32, heads 2, vocab 256, max_t 32, dropout 0;" \
                "step        20 (optimizer step 20;" "strategy    $strategy; data-parallel world $world" \
                "optimizer   adamw: exp_avg for 28 parameters, exp_avg_sq for 28 parameters" "tensors     84" \
                "checksums   ok: 84 tensors verified"; do
        grep -qF -- "$want" <<< "$out" || miss="$miss [$want]"
    done
    grep -qE '^  h\.0\.mlp\.c_fc\.weight +F32 +\[32, 128\] +16384 ' <<< "$out" || miss="$miss [table row]"
    [ $rc -eq 0 ] && [ -z "$miss" ] && ok "$tag: inspect ($strategy, world $world)" || bad "$tag: exit $rc, missing$miss: $out"
    gen=$("$bin" generate --init "$tmp/$tag" --prompt abc --tokens 8 --temperature 0 --threads 1 2>&1)
    [ "${#gen}" -eq 11 ] && [[ "$gen" == abc* ]] && ok "$tag: generate: $gen" || bad "$tag: generate: $gen"
done <<'KINDS'
single.st|single|1|
ddp.st|ddp|2|--nproc 2
zero2|zero-2|2|--nproc 2 --zero 2
zero1.st|zero-1|2|--nproc 2 --zero 1 --save-format consolidated
pp|pipeline|1|--nproc 2 --pp 2
KINDS
grep -qF "written by 2 ranks (one file each)" <<< "$("$bin" inspect "$tmp/zero2")" && ok "zero2: the ranks that wrote it" ||
    bad "zero2: no 'written by 2 ranks'"

# a flipped bit in a file's tensor: that tensor named, BAD in the table, exit 1; generate refuses it
cp "$tmp/single.st" "$tmp/flip.st"
off=$(offset_of "$tmp/flip.st" h.1.mlp.c_fc.weight)
flip "$tmp/flip.st" $((off + 1000))
out=$("$bin" inspect "$tmp/flip.st" 2>&1); rc=$?
if [ $rc -eq 1 ] && grep -qE '^  h\.1\.mlp\.c_fc\.weight .* BAD$' <<< "$out" && [ "$(grep -c ' BAD$' <<< "$out")" = 1 ] &&
   grep -q "checksums   BAD: 1 of 84 tensors" <<< "$out" && grep -q "h.1.mlp.c_fc.weight: .*checksum mismatch" <<< "$out"; then
    ok "flipped bit at byte $((off + 1000)) (file): h.1.mlp.c_fc.weight reported, exit 1"
else
    bad "flipped bit (file): exit $rc: $out"
fi
out=$("$bin" generate --init "$tmp/flip.st" --tokens 2 2>&1); rc=$?
[ $rc -ne 0 ] && grep -q "c_fc.weight.*checksum mismatch" <<< "$out" && ok "generate refuses it: $out" || bad "generate on flip.st: exit $rc: $out"

# a flipped bit in one shard of a set (the shard file is a safetensors file: its offsets from inspect)
cp -r "$tmp/zero2" "$tmp/flipset"
shard=$(ls "$tmp"/flipset/shard-*-r1.safetensors)
piece=$("$bin" inspect "$shard" | awk '$1 ~ /^optim\.exp_avg_sq\.wte\.weight@/ {print $1}')
off=$(offset_of "$shard" "$piece")
if [ -n "$off" ]; then flip "$shard" $((off + 8)); fi
out=$("$bin" inspect "$tmp/flipset" 2>&1); rc=$?
if [ $rc -eq 1 ] && grep -qE '^  optim\.exp_avg_sq\.wte\.weight .* BAD$' <<< "$out" && [ "$(grep -c ' BAD$' <<< "$out")" = 1 ] &&
   grep -q "$(basename "$shard"): tensor '$piece': data checksum mismatch" <<< "$out"; then
    ok "flipped bit in $(basename "$shard") ($piece): optim.exp_avg_sq.wte.weight reported, exit 1"
else
    bad "flipped bit (set, piece '$piece' at '$off'): exit $rc: $out"
fi

# truncated: one error line naming the file, exit 1
head -c 100000 "$tmp/single.st" > "$tmp/trunc.st"
out=$("$bin" inspect "$tmp/trunc.st" 2>&1); rc=$?
[ $rc -eq 1 ] && [ "$(wc -l <<< "$out")" = 1 ] && grep -q "trunc.st: .*truncated file" <<< "$out" &&
    ok "truncated file: $out" || bad "truncated file: exit $rc: $out"
cp -r "$tmp/zero2" "$tmp/truncset"
shard=$(ls "$tmp"/truncset/shard-*-r0.safetensors)
truncate -s 5000 "$shard"
out=$("$bin" inspect "$tmp/truncset" 2>&1); rc=$?
[ $rc -eq 1 ] && [ "$(wc -l <<< "$out")" = 1 ] && grep -q "is 5000 bytes, index.json says .*truncated" <<< "$out" &&
    ok "truncated shard: $out" || bad "truncated shard: exit $rc: $out"

# usage
out=$("$bin" inspect 2>&1); rc=$?
[ $rc -eq 2 ] && ok "no argument: exit 2: $out" || bad "no argument: exit $rc: $out"
"$bin" inspect --help | grep -c "usage: dtrain inspect FILE|DIR" > /dev/null || bad "inspect --help"
# a safetensors file from elsewhere, without recorded checksums: nothing is
# verified, and inspect does not call that "ok"
hdr='{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}'   # (< 256 bytes); then 1.0f, 2.0f
# shellcheck disable=SC2059
{ printf "\\x$(printf %02x ${#hdr})\\0\\0\\0\\0\\0\\0\\0"; printf '%s' "$hdr"; printf '\0\0\x80\x3f\0\0\0\x40'; } \
    > "$tmp/foreign.safetensors"
out=$("$bin" inspect "$tmp/foreign.safetensors" 2>&1); rc=$?
if [ $rc -eq 0 ] && grep -q '^checksums   none recorded: 1 tensors not checked' <<< "$out" && ! grep -q 'checksums   ok' <<< "$out"; then
    ok "no recorded checksums: $(grep '^checksums' <<< "$out")"
else bad "no recorded checksums: exit $rc: $(grep '^checksums' <<< "$out")"; fi
exit $fail
