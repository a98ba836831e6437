#!/usr/bin/env bash
# --metrics never appends through a symbolic link another user planted in a
# shared sticky directory (/tmp-like, mode 1777): the job is refused before
# training and the link's target is untouched. A link of our own (or of the
# directory's owner) and a plain path still work. Needs root (to act as
# another user with setpriv); skipped (77) otherwise.
# usage: test_metrics_symlink.sh DTRAIN
set -uo pipefail
bin=$1
[ "$(id -u)" -eq 0 ] || { echo "SKIP: needs root to plant a link as another user"; exit 77; }
command -v setpriv > /dev/null || { echo "SKIP: setpriv (util-linux) not found"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
chmod 755 "$tmp"
mkdir "$tmp/shared" && chmod 1777 "$tmp/shared"
echo "precious" > "$tmp/victim"
fail=0
run=(train --model mlp --hidden 8 --batch 8 --steps 2 --threads 1 --quiet)

# another user's link in the sticky directory
setpriv --reuid=nobody --regid=nogroup --clear-groups ln -s "$tmp/victim" "$tmp/shared/metrics.jsonl"
out=$("$bin" "${run[@]}" --metrics "$tmp/shared/metrics.jsonl" 2>&1); rc=$?
if [ "$rc" -ne 0 ] && grep -q "a symbolic link owned by uid $(id -u nobody) in the shared directory" <<< "$out" &&
   [ "$(cat "$tmp/victim")" = "precious" ]; then
    echo "ok   another user's planted link refused, target untouched: $(head -1 <<< "$out")"
else
    echo "FAIL: planted link (rc $rc, victim now: $(head -c 80 "$tmp/victim")):"; echo "$out" | head -3; fail=1
fi

# our own link in the same directory is followed
: > "$tmp/mine.jsonl"
ln -s "$tmp/mine.jsonl" "$tmp/shared/own.jsonl"
if "$bin" "${run[@]}" --metrics "$tmp/shared/own.jsonl" > "$tmp/out" 2>&1 && [ "$(wc -l < "$tmp/mine.jsonl")" -ge 2 ]; then
    echo "ok   a link of our own is followed ($(wc -l < "$tmp/mine.jsonl") lines)"
else
    echo "FAIL: own link:"; cat "$tmp/out" | head -3; fail=1
fi

# a plain file in the shared directory is created and appended to
if "$bin" "${run[@]}" --metrics "$tmp/shared/plain.jsonl" > "$tmp/out" 2>&1 && [ "$(wc -l < "$tmp/shared/plain.jsonl")" -ge 2 ]; then
    echo "ok   a plain path works"
else
    echo "FAIL: plain path:"; head -3 "$tmp/out"; fail=1
fi
exit $fail
