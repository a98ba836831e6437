#!/usr/bin/env bash
# --max-restarts (issue 28): a rank killed with SIGKILL at a random step, 5
# times in one run (--max-restarts 5 --save-every 2, background saves), for
# DDP, ZeRO-2 and a pipeline: every time the launcher says what failed and
# restarts from the newest complete checkpoint; the run completes, says how
# many restarts and recomputed steps, its final checkpoint equals an
# uninterrupted run's bit for bit, and its metrics hold every step once.
# Also: a failure with no restarts left ends the job (non-zero); one that
# repeats before the first step is not restarted again; another
# run's checkpoint already at --save is never resumed; --max-restarts without
# --save or without a launch is refused.
# usage: test_restart.sh DTRAIN CKPT_CMP NP [SEED]
set -uo pipefail
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
bin=$1 cmp=$2 np=$3
seed=${4:-$$}
RANDOM=$seed
echo "seed $seed (test_restart.sh ... $np $seed repeats this run)"
tmp=$(mktemp -d); trap 'pkill -9 -f "$tmp/" 2>/dev/null; rm -rf "$tmp"' EXIT
export OMP_NUM_THREADS=1
for i in $(seq 1 400); do echo "line $i: the quick brown fox jumps over the lazy dog $((i * 7919 % 1000))"; done > "$tmp/corpus.txt"
steps=160
base=(train --model gpt2 --layers 2 --embd 64 --heads 2 --max-t 64 --seq 64 --data text --data-path "$tmp/corpus.txt"
      --eval-batches 2 --threads 1 --steps $steps --deterministic --log-every 1000)
fail=0

last_step() { tail -n 1 "$1" 2>/dev/null | grep -oE '"step":[0-9]+' | cut -d: -f2; }
# kill_rank1_at JOB METRICS SAVE STEP: once METRICS logs STEP (or JOB ends), SIGKILL rank 1 of the job saving to SAVE
kill_rank1_at() {
    local job=$1 metrics=$2 save=$3 step=$4 s p
    while kill -0 "$job" 2>/dev/null; do s=$(last_step "$metrics"); [ -n "$s" ] && [ "$s" -ge "$step" ] && break; sleep 0.02; done
    for p in $(pgrep -f -- "--save $save"); do
        tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -c '^OMPI_COMM_WORLD_RANK=1$' > /dev/null && kill -9 "$p"
    done
}

# faulty TAG REF_ARGS -- ARGS: the uninterrupted reference (REF_ARGS), then the
# same run with 5 kills (ARGS); checkpoints compared
faulty() {
    local tag=$1; shift
    local ref=() args=()
    while [ "$1" != -- ]; do ref+=("$1"); shift; done
    shift; args=("$@")
    if ! "$bin" "${base[@]}" "${ref[@]}" --save "$tmp/$tag.ref" > "$tmp/$tag.ref.out" 2>&1; then
        echo "FAIL $tag: reference run:"; tail -5 "$tmp/$tag.ref.out"; fail=1; return
    fi
    "$bin" "${base[@]}" --nproc "$np" "${args[@]}" --save-every 2 --max-restarts 5 --save "$tmp/$tag.ck" \
        --metrics "$tmp/$tag.jsonl" < /dev/null > "$tmp/$tag.out" 2> "$tmp/$tag.err" &
    local job=$! kills=0 at=0
    while [ $kills -lt 5 ] && kill -0 $job 2>/dev/null; do
        local target=$((at + 3 + RANDOM % 18)) s
        while kill -0 $job 2>/dev/null; do
            s=$(last_step "$tmp/$tag.jsonl"); [ -n "$s" ] && [ "$s" -ge "$target" ] && break
            sleep 0.02
        done
        local victims=() p
        for p in $(pgrep -f -- "--save $tmp/$tag.ck"); do
            tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -c '^OMPI_COMM_WORLD_RANK=' > /dev/null && victims+=("$p")
        done
        [ ${#victims[@]} -eq 0 ] && continue
        local v=${victims[$((RANDOM % ${#victims[@]}))]}
        kill -9 "$v" 2>/dev/null && kills=$((kills + 1))
        at=${s:-$target}
        # wait for the restart to run a step past the checkpoint it resumed
        while kill -0 $job 2>/dev/null && [ "$(grep -c 'restart .* of 5' "$tmp/$tag.err")" -lt $kills ]; do sleep 0.05; done
    done
    wait $job; local rc=$?
    if [ $rc -ne 0 ] || [ $kills -ne 5 ]; then
        echo "FAIL $tag: exit $rc after $kills kills:"; tail -8 "$tmp/$tag.err"; fail=1; return
    fi
    local summary; summary=$(grep -oE "dtrain: 5 restarts .*" "$tmp/$tag.err")
    if [ -z "$summary" ]; then echo "FAIL $tag: no summary:"; tail -8 "$tmp/$tag.err"; fail=1; fi
    if "$cmp" "$tmp/$tag.ref" "$tmp/$tag.ck" step optim_step epoch cursor > "$tmp/cmp.out" 2>&1; then
        echo "ok   $tag: 5 kills, $summary; final checkpoint == uninterrupted: $(tail -1 "$tmp/cmp.out")"
    else echo "FAIL $tag: final checkpoint differs from the uninterrupted run:"; cat "$tmp/cmp.out"; fail=1; fi
    local logged; logged=$(grep -oE '"step":[0-9]+,"loss"' "$tmp/$tag.jsonl" | cut -d: -f2 | cut -d, -f1 | tr '\n' ' ')
    if [ "$logged" = "$(seq -s ' ' 1 $steps) " ]; then echo "ok   $tag: metrics hold steps 1..$steps once each"
    else echo "FAIL $tag: metrics steps: $(echo "$logged" | head -c 300)"; fail=1; fi
}

faulty ddp --nproc "$np" --batch 8 -- --batch 8
faulty zero2 --nproc "$np" --zero 2 --save-format consolidated --batch 8 -- --zero 2 --batch 8
if [ "$np" = 2 ]; then
    faulty pp --nproc 1 --batch 2 --accum 2 -- --pp 2 --microbatches 2 --batch 4
else
    faulty pp --nproc 2 --batch 2 --accum 2 -- --pp 2 --microbatches 2 --batch 4
fi

# no restarts left: the failure ends the job
"$bin" "${base[@]}" --nproc "$np" --batch 8 --save-every 2 --max-restarts 1 --save "$tmp/last.ck" --metrics "$tmp/last.jsonl" \
    < /dev/null > "$tmp/last.out" 2> "$tmp/last.err" &
job=$!
for k in 1 2; do
    kill_rank1_at $job "$tmp/last.jsonl" "$tmp/last.ck" $((k * 10))
    while [ $k = 1 ] && kill -0 $job 2>/dev/null && ! grep -q 'restart 1 of 1' "$tmp/last.err"; do sleep 0.05; done
done
wait $job; rc=$?
if [ $rc -ne 0 ] && grep -q "1 restart .*the job failed" "$tmp/last.err" &&
   grep -q "a rank was ended by signal 9 (.*): the kernel's out-of-memory killer" "$tmp/last.err"; then
    echo "ok   no restarts left: exit $rc, $(grep -m1 '1 restart' "$tmp/last.err"); the killed rank said"
else echo "FAIL no restarts left: exit $rc"; tail -5 "$tmp/last.err"; fail=1; fi

# a checkpoint of another run already at --save: a failure before this job's
# first save restarts the job as launched, not from that checkpoint (it did)
# (the metrics file already holds another run's line: it stays; the failed attempt's
# lines go, so steps 1..40 are logged once each -- they were logged twice up to the kill)
"$bin" "${base[@]}" --batch 8 --steps 30 --save "$tmp/prev.ck" > /dev/null 2>&1 || { echo "FAIL prev: the earlier run"; fail=1; }
echo '{"step":0,"loss":9}' > "$tmp/prev.jsonl"   # (step 0: below the kill's trigger)
"$bin" "${base[@]}" --nproc "$np" --batch 8 --steps 40 --max-restarts 1 --save "$tmp/prev.ck" --metrics "$tmp/prev.jsonl" \
    < /dev/null > "$tmp/prev.out" 2> "$tmp/prev.err" &
job=$!
kill_rank1_at $job "$tmp/prev.jsonl" "$tmp/prev.ck" 5
wait $job; rc=$?
if [ $rc -eq 0 ] && grep -q "no complete checkpoint of this job's at $tmp/prev.ck yet; restart 1 of 1 as first launched" "$tmp/prev.err" \
   && ! grep -q "restart 1 of 1 from" "$tmp/prev.err"; then
    echo "ok   another run's checkpoint at --save is not resumed: $(grep -m1 'restart 1 of 1' "$tmp/prev.err")"
else echo "FAIL another run's checkpoint at --save: exit $rc"; tail -5 "$tmp/prev.err"; fail=1; fi
logged=$(grep -oE '"step":[0-9]+,"loss"' "$tmp/prev.jsonl" | cut -d: -f2 | cut -d, -f1 | tr '\n' ' ')
if [ "$logged" = "0 $(seq -s ' ' 1 40) " ]; then echo "ok   restarted as first launched: metrics hold the earlier line, then steps 1..40 once each"
else echo "FAIL restarted as first launched: metrics steps: $(echo "$logged" | head -c 300)"; fail=1; fi

# the job resumes --save itself (--resume CK --save CK) and fails before its first save: the
# restart resumes CK again, and the summary counts from its step (it said "at the start", 35 again;
# CK spelt two ways, as one file: it was taken for another run's checkpoint)
# (its metrics file, from the first run, also holds 4 stale lines past step 30, longer than
# the steps that replace them: the resume drops them, leaving the file shorter than at
# launch; the restart must not grow it back -- that padded it with NUL bytes)
"$bin" "${base[@]}" --batch 8 --steps 30 --save "$tmp/own.ck" --metrics "$tmp/own.jsonl" > /dev/null 2>&1 ||
    { echo "FAIL own: the first run"; fail=1; }
pad=$(printf 'x%.0s' $(seq 1 300))
for s in 31 32 33 34; do echo "{\"step\":$s,\"loss\":9,\"pad\":\"$pad\"}"; done >> "$tmp/own.jsonl"
"$bin" "${base[@]}" --nproc "$np" --batch 8 --steps 60 --max-restarts 1 --resume "$tmp/./own.ck" --save "$tmp/own.ck" \
    --metrics "$tmp/own.jsonl" < /dev/null > "$tmp/own.out" 2> "$tmp/own.err" &
job=$!
kill_rank1_at $job "$tmp/own.jsonl" "$tmp/own.ck" 35
wait $job; rc=$?
again=$(grep -oE "; [0-9]+ steps? computed again" "$tmp/own.err" | grep -oE "[0-9]+")
if [ $rc -eq 0 ] && grep -q "restart 1 of 1 from $tmp/own.ck (step 30)" "$tmp/own.err" &&
   grep -q "1 restart (resumed at step 30)" "$tmp/own.err" && [ -n "$again" ] && [ "$again" -lt 30 ]; then
    echo "ok   the job's own --resume CK: $(grep -m1 '1 restart' "$tmp/own.err")"
else echo "FAIL the job's own --resume CK: exit $rc"; tail -4 "$tmp/own.err"; fail=1; fi
logged=$(grep -oE '"step":[0-9]+,"loss"' "$tmp/own.jsonl" | cut -d: -f2 | cut -d, -f1 | tr '\n' ' ')
if [ "$logged" = "$(seq -s ' ' 1 60) " ] && ! grep -qaP '\x00' "$tmp/own.jsonl" && ! grep -q '"pad"' "$tmp/own.jsonl"; then
    echo "ok   the job's own --resume CK: metrics hold steps 1..60 once each, no stale line, no NUL byte"
else echo "FAIL the job's own --resume CK: metrics steps: $(echo "$logged" | head -c 300)$(grep -caP '\x00' "$tmp/own.jsonl") lines with NUL"; fail=1; fi

# a failure that repeats before the first step (a missing data file) is not restarted again and again
"$bin" "${base[@]}" --data-path "$tmp/missing.txt" --nproc "$np" --batch 8 --max-restarts 5 --save "$tmp/miss.ck" \
    < /dev/null > "$tmp/miss.out" 2> "$tmp/miss.err"; rc=$?
if [ $rc -ne 0 ] && grep -q "before its first step again, from the same start .*; not restarting" "$tmp/miss.err" \
   && grep -q "dtrain: 1 restart (resumed at the start)" "$tmp/miss.err"; then
    echo "ok   a repeated failure before the first step ends the job after one restart: $(tail -1 "$tmp/miss.err")"
else echo "FAIL a repeated failure before the first step: exit $rc"; tail -4 "$tmp/miss.err"; fail=1; fi

for bad in "--max-restarts 2 --nproc $np|needs --save PATH" "--max-restarts 2 --save $tmp/x.st|needs a job dtrain launches" \
           "--max-restarts 1001 --nproc $np --save $tmp/x.st|is more than 1000"; do
    IFS='|' read -r flags want <<< "$bad"
    # shellcheck disable=SC2086
    out=$("$bin" "${base[@]}" $flags < /dev/null 2>&1); rc=$?
    if [ $rc -eq 2 ] && grep -q -- "$want" <<< "$out"; then echo "ok   refused: $out"
    else echo "FAIL $flags: exit $rc: $out"; fail=1; fi
done
exit $fail
