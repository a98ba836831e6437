#!/usr/bin/env bash
# Checkpoints written before the models were rebuilt on blocks still resume,
# and training continues as it did then. tests/data/pre_blocks/NAME.safetensors
# were saved by main 884f0b3 after 3 steps of `dtrain train $(cat NAME.args)`;
# NAME.continued.jsonl is what that main logged resuming them to step 5 -
# except gpt2's (trained with --dropout 0.1): since dropout masks are keyed by
# (seed, step, sample) its steps 4-5 draw other masks than the saved generator
# state (rng0 / rng1, now ignored) did, so that file is what the keyed
# dropout logs; the checkpoint itself is unchanged and must still load.
# Losses must match to 1e-4 relative (bitwise on the CPU they were made on;
# other CPUs' BLAS kernels round differently); accuracies, which move in
# steps of one sample or token (1/128 for gpt2's evaluation), to 0.02.
# usage: test_pre_blocks_checkpoints.sh DTRAIN_BINARY
set -uo pipefail
bin=$1
dir=$(cd "$(dirname "$0")/../data/pre_blocks" && pwd)
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail=0
for name in mlp cnn gpt2; do
    # shellcheck disable=SC2046
    if ! "$bin" train $(cat "$dir/$name.args") --steps 5 --threads 1 --quiet --resume "$dir/$name.safetensors" \
            --metrics "$tmp/$name.jsonl" > "$tmp/$name.out" 2>&1; then
        echo "FAIL $name: resume failed"; cat "$tmp/$name.out"; fail=1; continue
    fi
    sed 's/,"ms":[0-9.e+-]*//' "$tmp/$name.jsonl" > "$tmp/$name.now"
    if cmp -s "$tmp/$name.now" "$dir/$name.continued.jsonl"; then echo "ok   $name: identical"; continue; fi
    # same keys in the same order, numbers within 1e-4 relative
    if paste -d'\n' "$dir/$name.continued.jsonl" "$tmp/$name.now" | awk -F'[:,{}]' '
        NR % 2 == 1 { n = split($0, want, /[:,{}]/); next }
        { m = split($0, have, /[:,{}]/); if (m != n) bad = 1
          for (i = 1; i <= n; i++) if (want[i] != have[i]) {
              if (want[i] + 0 != want[i] || have[i] + 0 != have[i]) { bad = 1; continue }
              d = want[i] - have[i]; if (d < 0) d = -d; s = want[i] < 0 ? -want[i] : want[i]
              if (i > 1 && want[i - 1] ~ /accuracy/) { if (d > 0.02) bad = 1 }
              else if (d > 1e-4 * (s > 1 ? s : 1)) bad = 1 } }
        END { exit bad }'; then
        echo "ok   $name: within 1e-4"
    else
        echo "FAIL $name: metrics differ"; diff "$dir/$name.continued.jsonl" "$tmp/$name.now"; fail=1
    fi
done
exit $fail
