#!/usr/bin/env bash
# A sharded --save DIR (issue 31 item 5) is never written through a symbolic
# link another user planted in a shared sticky directory (/tmp-like, mode
# 1777), nor into a directory another user owns or every user can write: the
# job is refused before training (one process ZeRO-2 and a 2-stage pipeline),
# naming the path, the owner's uid and why, and the link's target is untouched
# (not even a lock or probe file). A link of our own still works, and a
# single-file --save over another user's link replaces the link (temp file +
# rename), never the file it points at. Needs root (to act as another user
# with setpriv); skipped (77) otherwise.
# usage: test_save_dir_owner.sh DTRAIN
set -uo pipefail
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"   # (MPI's own allocations; see test_ckpt_dir_lock.sh)
bin=$1
[ "$(id -u)" -eq 0 ] || { echo "SKIP: needs root to plant a link as another user"; exit 77; }
command -v setpriv > /dev/null || { echo "SKIP: setpriv (util-linux) not found"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
chmod 755 "$tmp"
mkdir "$tmp/shared" && chmod 1777 "$tmp/shared"
mkdir "$tmp/victim" && echo "precious" > "$tmp/victim/file"
echo "precious" > "$tmp/victim.st"
nobody=$(id -u nobody)
as_nobody() { setpriv --reuid=nobody --regid=nogroup --clear-groups "$@"; }
mlp=(train --model mlp --hidden 8 --batch 8 --steps 2 --threads 1 --eval-batches 1 --quiet)
fail=0
untouched() { [ "$(ls -A "$tmp/victim")" = "file" ] && [ "$(cat "$tmp/victim/file")" = "precious" ]; }

# refused TAG WANT ARGS...: refused before step 1 with WANT in its one error line, the victim untouched
refused() {
    local tag=$1 want=$2; shift 2
    local out rc
    out=$(timeout -k 5 120 "$bin" "${mlp[@]}" "$@" < /dev/null 2>&1); rc=$?
    if [ $rc -eq 0 ] || [ $rc -ge 124 ]; then echo "FAIL $tag: exit status $rc"; echo "$out" | tail -3; fail=1
    elif ! untouched; then echo "FAIL $tag: the link's target changed: $(ls -A "$tmp/victim")"; fail=1
    elif [ "$(grep -c "^dtrain: error: --save: .*$want" <<< "$out")" -ne 1 ]; then
        echo "FAIL $tag: wanted one line 'dtrain: error: --save: ...$want', got:"; echo "$out" | tail -3; fail=1
    else echo "ok   $tag: $(grep '^dtrain: error' <<< "$out" | cut -c1-170)..."; fi
}

# another user's link in the sticky directory, pointing at our directory
as_nobody ln -s "$tmp/victim" "$tmp/shared/ck"
link="sharded checkpoint $tmp/shared/ck: a symbolic link owned by uid $nobody (this job runs as uid 0) in the shared directory $tmp/shared"
refused "planted link, one process ZeRO-2" "$link" --zero 2 --save "$tmp/shared/ck"
refused "planted link, pipeline x2" "$link" --nproc 2 --pp 2 --save "$tmp/shared/ck"
refused "planted link with a trailing slash" "a symbolic link owned by uid $nobody" --zero 2 --save "$tmp/shared/ck/"

# a directory another user owns; one every user can write
as_nobody mkdir "$tmp/shared/theirs"
refused "another user's directory" "sharded checkpoint $tmp/shared/theirs: the directory is owned by uid $nobody (this job runs as uid 0)" \
    --zero 2 --save "$tmp/shared/theirs"
[ -z "$(ls -A "$tmp/shared/theirs")" ] || { echo "FAIL: files written into another user's directory"; fail=1; }
mkdir "$tmp/open" && chmod 777 "$tmp/open"
refused "a world-writable directory" "sharded checkpoint $tmp/open: the directory (owner uid 0) is writable by every user (mode 0777, no sticky bit)" \
    --zero 2 --save "$tmp/open"

# our own link in the same shared directory is followed; the set lands in its target
mkdir "$tmp/mine"
ln -s "$tmp/mine" "$tmp/shared/own"
if "$bin" "${mlp[@]}" --zero 2 --save "$tmp/shared/own" > "$tmp/out" 2>&1 && [ -s "$tmp/mine/index.json" ]; then
    echo "ok   a link of our own is followed (the set is in its target)"
else echo "FAIL: own link:"; head -3 "$tmp/out"; fail=1; fi

# single file: the temp file + rename replaces another user's link, not its target
as_nobody ln -s "$tmp/victim.st" "$tmp/shared/one.st"
if "$bin" "${mlp[@]}" --save "$tmp/shared/one.st" > "$tmp/out" 2>&1 && [ "$(cat "$tmp/victim.st")" = "precious" ] &&
   [ -f "$tmp/shared/one.st" ] && [ ! -L "$tmp/shared/one.st" ]; then
    echo "ok   a single-file save replaces another user's link, its target untouched"
else echo "FAIL: single-file save over a planted link (victim: $(head -c 40 "$tmp/victim.st")):"; head -3 "$tmp/out"; fail=1; fi
exit $fail
